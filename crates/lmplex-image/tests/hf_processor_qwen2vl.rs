//! The Qwen2-VL processor against transformers' `Qwen2VLImageProcessorPil` and
//! `Qwen2VLProcessor`, bit for bit.
//!
//! The fixtures come from `scripts/make_image_fixtures.py` (transformers and Pillow, not in CI):
//! config folders `qwen2vl` (Qwen2-VL-2B-Instruct's own `preprocessor_config.json`) and
//! `qwen2vl_small` (the transformers 5 `size` form, few pixels, patch 7, 3 frames, LANCZOS,
//! another image token), and `qwen2vl.json`: per image and config the hashes of `pixel_values`,
//! `image_grid_thw` and the text that replaces the image's placeholder; and `smart_resize`'s
//! output for random sizes, or its refusal. Every case starts from our decoding, JPEGs included
//! (Pillow's bytes, `hf_processor.rs`).

mod common;

use std::collections::HashMap;

use common::{check_pixels, processor_input, read_json, Pixels, Prompt};
use lmplex_core::Error;
use lmplex_image::{smart_resize, Qwen2VlConfig, Qwen2VlProcessor, RgbImage};
use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    image: String,
    config: String,
    grid_thw: [usize; 3],
    #[serde(flatten)]
    prompt: Prompt,
    #[serde(flatten)]
    pixels: Pixels,
}

#[derive(Deserialize)]
struct Sizes {
    config: String,
    /// `[height, width, resized height, resized width]`.
    resized: Vec<[usize; 4]>,
    /// `[height, width]` that transformers refuses.
    refused: Vec<[usize; 2]>,
}

#[derive(Deserialize)]
struct Fixture {
    transformers: String,
    cases: Vec<Case>,
    sizes: Vec<Sizes>,
}

fn processor(config: &str) -> Qwen2VlProcessor {
    Qwen2VlProcessor::from_folder(common::fixtures().join(config)).unwrap()
}

#[test]
fn fixtures_come_from_transformers_5() {
    let f: Fixture = read_json("qwen2vl.json");
    assert!(f.transformers.starts_with("5."), "{}", f.transformers);
    assert_eq!((f.cases.len(), f.sizes.len()), (20, 2));
}

#[test]
fn qwen2vl_matches_transformers_bit_for_bit() {
    let f: Fixture = read_json("qwen2vl.json");
    let mut processors = HashMap::new();
    let mut failures = vec![];
    for case in &f.cases {
        let p = processors.entry(case.config.clone()).or_insert_with(|| processor(&case.config));
        let what = format!("{} / {}", case.image, case.config);
        let image = p.process(&processor_input(&case.image)).unwrap();
        assert_eq!(image.grid_thw, case.grid_thw, "{what}: grid");
        let c = p.config();
        let row = 3 * c.temporal_patch_size * c.patch_size * c.patch_size;
        let patches = image.grid_thw.iter().product::<usize>();
        assert_eq!(&[patches, row][..], &case.pixels.shape[..], "{what}: shape");
        assert_eq!(image.pixel_values.len(), patches * row, "{what}");
        case.prompt.check(&what, &p.image_prompt(&image));
        // The fixture's tiles are merge windows: merge_size^2 rows each.
        let window = row * c.merge_size * c.merge_size;
        if let Err(e) = check_pixels(&what, &image.pixel_values, window, &case.pixels) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `smart_resize` for random sizes (log-uniform up to 20000 a side) and the edges of the
/// aspect-ratio limit: the same size as transformers, or refused where it refuses.
#[test]
fn smart_resize_matches_transformers_on_random_sizes() {
    let f: Fixture = read_json("qwen2vl.json");
    for sizes in &f.sizes {
        let p = processor(&sizes.config);
        let c = p.config();
        assert!(sizes.resized.len() > 100 && !sizes.refused.is_empty());
        for &[h, w, rh, rw] in &sizes.resized {
            let got = smart_resize(h, w, c.factor(), c.min_pixels, c.max_pixels).unwrap();
            assert_eq!(got, (rh, rw), "{}: {h}x{w}", sizes.config);
            assert_eq!(p.resized_size(h, w).unwrap(), (rh, rw));
        }
        for &[h, w] in &sizes.refused {
            let err = p.resized_size(h, w).unwrap_err();
            assert!(matches!(&err, Error::InvalidRequest(m) if m.contains("200 times")), "{h}x{w}: {err}");
        }
    }
}

/// Qwen2-VL-2B-Instruct's folder: its bounds, and the default image token (no tokenizer file).
#[test]
fn reads_the_real_config() {
    let c = Qwen2VlConfig::from_folder(common::fixtures().join("qwen2vl")).unwrap();
    assert_eq!((c.min_pixels, c.max_pixels, c.patch_size, c.merge_size), (3136, 12_845_056, 14, 2));
    assert_eq!(Qwen2VlProcessor::new(c).unwrap().placeholder(), "<|image_pad|>");
    assert_eq!(processor("qwen2vl_small").placeholder(), "<|img|>");
}

/// Thin images past transformers' aspect-ratio limit are refused; tiny ones scale up.
#[test]
fn extreme_and_tiny_images() {
    let p = processor("qwen2vl");
    for (w, h) in [(201, 1), (1, 201), (1000, 4), (3, 700)] {
        let img = RgbImage::new(w, h, vec![0; w * h * 3]).unwrap();
        let err = p.process(&img).unwrap_err();
        assert!(matches!(&err, Error::InvalidRequest(m) if m.contains("200 times")), "{w}x{h}: {err}");
    }
    for (w, h) in [(1, 1), (2, 3), (200, 1), (1, 200)] {
        let out = p.process(&RgbImage::new(w, h, vec![128; w * h * 3]).unwrap()).unwrap();
        let [t, gh, gw] = out.grid_thw;
        assert!(t == 1 && gh * gw * 14 * 14 >= 3136, "{w}x{h}: {:?}", out.grid_thw);
        assert_eq!(p.image_prompt(&out).matches("<|image_pad|>").count(), out.tokens(2));
    }
}
