//! The Gemma 3 processor against transformers' `Gemma3ImageProcessorPil` and `Gemma3Processor`,
//! bit for bit.
//!
//! The fixtures come from `scripts/make_image_fixtures.py` (transformers and Pillow, not in CI):
//! config folders `gemma3` (gemma-3-4b-it's own files: 896 x 896, BILINEAR, no pan-and-scan) and
//! `gemma3_pan` (pan-and-scan on, small views, other tokens), and `gemma3.json`: per image and
//! config the hashes of `pixel_values`, `num_crops` and the text that replaces the image's
//! placeholder; and pan-and-scan's crop boxes for random sizes (checked in `gemma3.rs`'s unit
//! tests). Every case starts from our decoding, JPEGs included (Pillow's bytes, `hf_processor.rs`).

mod common;

use std::collections::HashMap;

use common::{check_pixels, processor_input, read_json, Pixels, Prompt};
use lmplex_core::Error;
use lmplex_image::{Gemma3Config, Gemma3Processor, RgbImage};
use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    image: String,
    config: String,
    num_crops: usize,
    #[serde(flatten)]
    prompt: Prompt,
    #[serde(flatten)]
    pixels: Pixels,
}

#[derive(Deserialize)]
struct Fixture {
    transformers: String,
    cases: Vec<Case>,
}

#[test]
fn fixtures_come_from_transformers_5() {
    let f: Fixture = read_json("gemma3.json");
    assert!(f.transformers.starts_with("5."), "{}", f.transformers);
    assert_eq!(f.cases.len(), 20);
    assert!(f.cases.iter().any(|c| c.num_crops == 3) && f.cases.iter().any(|c| c.num_crops == 2));
}

#[test]
fn gemma3_matches_transformers_bit_for_bit() {
    let f: Fixture = read_json("gemma3.json");
    let mut processors = HashMap::new();
    let mut failures = vec![];
    for case in &f.cases {
        let processor = processors
            .entry(case.config.clone())
            .or_insert_with(|| Gemma3Processor::from_folder(common::fixtures().join(&case.config)).unwrap());
        let what = format!("{} / {}", case.image, case.config);
        let image = processor.process(&processor_input(&case.image)).unwrap();
        assert_eq!(image.crops, case.num_crops + 1, "{what}: crops");
        assert_eq!(&[image.crops, 3, image.height, image.width][..], &case.pixels.shape[..], "{what}: shape");
        case.prompt.check(&what, &processor.image_prompt(&image));
        if let Err(e) = check_pixels(&what, &image.pixel_values, 3 * image.height * image.width, &case.pixels) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// gemma-3-4b-it's folder: its values, and the tokens of its tokenizer_config.json.
#[test]
fn reads_the_real_config() {
    let c = Gemma3Config::from_folder(common::fixtures().join("gemma3")).unwrap();
    assert_eq!(
        (c.size, c.do_pan_and_scan, c.image_seq_length),
        (lmplex_image::Size::Exact { height: 896, width: 896 }, false, 256)
    );
    let p = Gemma3Processor::new(c).unwrap();
    assert_eq!(p.placeholder(), "<start_of_image>");
    let pan = Gemma3Config::from_folder(common::fixtures().join("gemma3_pan")).unwrap();
    assert_eq!((&*pan.boi_token, &*pan.image_token, &*pan.eoi_token), ("<boi>", "<img>", "<eoi>"));
}

/// Long, thin and tiny images: views or `InvalidRequest`, never a panic.
#[test]
fn extreme_images_are_processed_or_refused() {
    let pan = Gemma3Processor::from_folder(common::fixtures().join("gemma3_pan")).unwrap();
    for (w, h) in [(1, 1), (2000, 1), (1, 2000), (33, 16), (16, 33), (3, 7)] {
        let img = RgbImage::new(w, h, vec![200; w * h * 3]).unwrap();
        match pan.process(&img) {
            Ok(out) => {
                assert_eq!(out.pixel_values.len(), out.crops * 3 * 40 * 48, "{w}x{h}");
                assert!(out.crops <= 4, "{w}x{h}: {} views", out.crops);
            }
            Err(Error::InvalidRequest(_)) => {}
            Err(e) => panic!("{w}x{h}: {e}"),
        }
    }
    // 33 x 16 is long enough for two crops of 17 and 16 columns, each at least 16 pixels.
    let img = RgbImage::new(33, 16, vec![1; 33 * 16 * 3]).unwrap();
    assert_eq!(pan.process(&img).unwrap().crops, 3);
}

/// The whole config refused at load when a value cannot be used.
#[test]
fn bad_configs_are_model_load_errors() {
    let err = Gemma3Config::from_json(r#"{"do_pan_and_scan": true, "pan_and_scan_min_crop_size": 0}"#, None);
    assert!(matches!(err, Err(Error::ModelLoad(m)) if m.contains("pan_and_scan_min_crop_size 0")));
    let config = Gemma3Config { image_std: [0.5, 0.0, 0.5], ..Gemma3Config::default() };
    assert!(matches!(Gemma3Processor::new(config), Err(Error::ModelLoad(_))));
}
