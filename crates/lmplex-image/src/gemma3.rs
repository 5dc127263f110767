//! The Gemma 3 image processor: transformers' `Gemma3ImageProcessorPil` and the prompt text of
//! `Gemma3Processor`, step for step.
//!
//! Per image: (1) with `do_pan_and_scan`, the crops of a long image (`pan_and_scan`: 2 to
//! `pan_and_scan_max_num_crops` equal cuts along the long side, the last one cut short at the
//! edge, none when the image is not long enough or a crop would be under
//! `pan_and_scan_min_crop_size`), cut from the image as given; (2) the whole image, then each crop,
//! resized to `size` with `resample` (Pillow's resampler; a view already of that size is kept);
//! (3) rescale and normalize to `f32`, channel-first. The views are stacked whole image first:
//! `[1 + crops, 3, height, width]`.
//!
//! The prompt: the chat template renders `boi_token` once per image; `Gemma3Processor` replaces
//! it with `"\n\n" + boi + image_token x image_seq_length + eoi + "\n\n"` (one view), or with
//! pan-and-scan crops, `"Here is the original image " + view + " and here are some crops to help
//! you see better " + view x crops joined by spaces`.
//!
//! Invariants: the same bits as transformers (Pillow 13) for the same RGB8 image (checked by
//! `tests/hf_processor_gemma3.rs`); `process` refuses with `InvalidRequest`, never panics.

use lmplex_core::{Error, Result};

use crate::gemma3_config::Gemma3Config;
use crate::pixels::{push_chw, Normalization};
use crate::resample::resize;
use crate::rgb::RgbImage;

/// One image's views, as transformers' `pixel_values` for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma3Image {
    /// `[crops, 3, height, width]`, channel-first, row-major: the whole image first, then the
    /// pan-and-scan crops row by row.
    pub pixel_values: Vec<f32>,
    /// Views, the whole image included (transformers' `num_crops` + 1).
    pub crops: usize,
    /// A view's height.
    pub height: usize,
    /// A view's width.
    pub width: usize,
}

/// transformers' Gemma 3 image processor (PIL backend) and its prompt text.
#[derive(Debug, Clone)]
pub struct Gemma3Processor {
    config: Gemma3Config,
    /// One view's text: `"\n\n" + boi + image x n + eoi + "\n\n"`.
    full_image_sequence: String,
}

impl Gemma3Processor {
    /// A processor for `config`; `ModelLoad` when a value cannot be used.
    pub fn new(config: Gemma3Config) -> Result<Self> {
        config.validate().map_err(Error::ModelLoad)?;
        let c = &config;
        let full_image_sequence =
            format!("\n\n{}{}{}\n\n", c.boi_token, c.image_token.repeat(c.image_seq_length), c.eoi_token);
        Ok(Self { config, full_image_sequence })
    }

    /// A processor from an HF folder (see `Gemma3Config::from_folder`).
    pub fn from_folder(path: impl AsRef<std::path::Path>) -> Result<Self> {
        Self::new(Gemma3Config::from_folder(path)?)
    }

    /// The settings.
    pub fn config(&self) -> &Gemma3Config {
        &self.config
    }

    /// One image to pixel values, bit for bit what transformers' PIL processor gives.
    ///
    /// `InvalidRequest` when a pan-and-scan crop would lie outside the image (only with a tiny
    /// `pan_and_scan_min_crop_size`; transformers fails there too).
    pub fn process(&self, image: &RgbImage) -> Result<Gemma3Image> {
        let c = &self.config;
        let boxes = if c.do_pan_and_scan {
            pan_and_scan(
                image.height(),
                image.width(),
                c.pan_and_scan_min_crop_size,
                c.pan_and_scan_max_num_crops,
                c.pan_and_scan_min_ratio_to_activate,
            )
        } else {
            vec![]
        };
        let mut views = Vec::with_capacity(1 + boxes.len());
        views.push(self.resize(image));
        for &CropBox { x, y, width, height } in &boxes {
            if x >= image.width() || y >= image.height() {
                return Err(Error::InvalidRequest(format!(
                    "a {}x{} image: pan-and-scan crop at ({x}, {y}) lies outside it (pan_and_scan_min_crop_size {})",
                    image.width(),
                    image.height(),
                    c.pan_and_scan_min_crop_size
                )));
            }
            // numpy's slice stops at the edge: the last crop may be short.
            let (w, h) = (width.min(image.width() - x), height.min(image.height() - y));
            views.push(self.resize(&image.crop(x, y, w, h)));
        }
        // Without `do_resize` there is one view (pan-and-scan needs resizing; see the config).
        let (height, width) = (views[0].height(), views[0].width());
        let table = Normalization {
            rescale: c.do_rescale.then_some(c.rescale_factor),
            mean_std: c.do_normalize.then_some((c.image_mean, c.image_std)),
        }
        .table();
        let mut pixel_values = Vec::with_capacity(views.len() * 3 * height * width);
        for view in &views {
            push_chw(view, &table, height, width, &mut pixel_values);
        }
        Ok(Gemma3Image { pixel_values, crops: views.len(), height, width })
    }

    /// The placeholder the chat template renders per image (`boi_token`).
    pub fn placeholder(&self) -> &str {
        &self.config.boi_token
    }

    /// The text that replaces one placeholder for `image` (`Gemma3Processor.replace_image_token`).
    pub fn image_prompt(&self, image: &Gemma3Image) -> String {
        let crops = image.crops.saturating_sub(1);
        if crops == 0 {
            return self.full_image_sequence.clone();
        }
        let views = vec![self.full_image_sequence.as_str(); crops].join(" ");
        format!(
            "Here is the original image {} and here are some crops to help you see better {views}",
            self.full_image_sequence
        )
    }

    fn resize(&self, image: &RgbImage) -> RgbImage {
        if !self.config.do_resize {
            return image.clone();
        }
        let (height, width) = self.config.target();
        resize(image, width, height, self.config.resample)
    }
}

/// A crop's top-left corner and size, before numpy's slicing stops it at the image's edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CropBox {
    pub x: usize,
    pub y: usize,
    pub width: usize,
    pub height: usize,
}

/// `Gemma3ImageProcessorPil.pan_and_scan`: the crops of a `height x width` image, row by row
/// (Python's float division, `math.floor` and `math.ceil`, in `f64` as Python computes them).
pub(crate) fn pan_and_scan(
    height: usize,
    width: usize,
    min_crop_size: usize,
    max_num_crops: usize,
    min_ratio_to_activate: f64,
) -> Vec<CropBox> {
    let (h, w, min_crop) = (height as f64, width as f64, min_crop_size as f64);
    // Along the long side: close to the aspect ratio, no crop under `min_crop_size`, 2 at least.
    let count = |long: f64, short: f64| ((long / short + 0.5).floor() as usize).min((long / min_crop).floor() as usize);
    let (crops_w, crops_h) = if width >= height {
        if w / h < min_ratio_to_activate {
            return vec![];
        }
        (count(w, h).max(2).min(max_num_crops), 1)
    } else {
        if h / w < min_ratio_to_activate {
            return vec![];
        }
        (1, count(h, w).max(2).min(max_num_crops))
    };
    let crop_w = (w / crops_w as f64).ceil() as usize;
    let crop_h = (h / crops_h as f64).ceil() as usize;
    if crop_w.min(crop_h) < min_crop_size {
        return vec![];
    }
    (0..crops_h)
        .flat_map(|r| {
            (0..crops_w).map(move |c| CropBox { x: c * crop_w, y: r * crop_h, width: crop_w, height: crop_h })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn processor(json: &str, seq: usize) -> Gemma3Processor {
        let proc = format!(r#"{{"image_seq_length": {seq}}}"#);
        Gemma3Processor::new(Gemma3Config::from_json(json, Some(&proc)).unwrap()).unwrap()
    }

    #[test]
    fn pan_and_scan_cuts_long_images() {
        // 200 x 31 (the CMYK fixture), crops of at least 16, at most 3: 3 crops of 67, the last 66.
        let boxes = pan_and_scan(31, 200, 16, 3, 1.2);
        let xs: Vec<(usize, usize)> = boxes.iter().map(|b| (b.x, b.width)).collect();
        assert_eq!(xs, [(0, 67), (67, 67), (134, 67)]);
        // Square enough, or crops too small: none.
        assert!(pan_and_scan(64, 64, 16, 3, 1.2).is_empty());
        assert!(pan_and_scan(100, 300, 256, 4, 1.2).is_empty());
        // Portrait: crops stacked.
        let boxes = pan_and_scan(1000, 300, 256, 4, 1.2);
        assert_eq!(boxes.iter().map(|b| (b.y, b.height)).collect::<Vec<_>>(), [(0, 334), (334, 334), (668, 334)]);
    }

    /// transformers' crops for random sizes and three settings (`pan_and_scan` in
    /// `tests/fixtures/images/gemma3.json`, made by scripts/make_image_fixtures.py).
    #[test]
    fn pan_and_scan_matches_transformers_on_random_sizes() {
        #[derive(serde::Deserialize)]
        struct Setting {
            min_crop_size: usize,
            max_num_crops: usize,
            min_ratio_to_activate: f64,
            /// `[height, width, [[x, y, width, height], ...]]`, boxes cut at the image's edge.
            cases: Vec<(usize, usize, Vec<[usize; 4]>)>,
        }
        #[derive(serde::Deserialize)]
        struct Fixture {
            pan_and_scan: Vec<Setting>,
        }
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/images/gemma3.json");
        let fixture: Fixture = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert_eq!(fixture.pan_and_scan.len(), 3);
        for s in &fixture.pan_and_scan {
            assert!(s.cases.iter().filter(|c| !c.2.is_empty()).count() >= 10);
            for (h, w, want) in &s.cases {
                let got: Vec<[usize; 4]> =
                    pan_and_scan(*h, *w, s.min_crop_size, s.max_num_crops, s.min_ratio_to_activate)
                        .iter()
                        .map(|b| [b.x, b.y, b.width.min(w - b.x), b.height.min(h - b.y)])
                        .collect();
                assert_eq!(&got, want, "{h}x{w} with {} / {}", s.min_crop_size, s.max_num_crops);
            }
        }
    }

    #[test]
    fn prompt_follows_gemma3_processor() {
        let p = processor(r#"{"size": {"height": 4, "width": 4}}"#, 2);
        let view = "\n\n<start_of_image><image_soft_token><image_soft_token><end_of_image>\n\n";
        let one = Gemma3Image { pixel_values: vec![], crops: 1, height: 4, width: 4 };
        assert_eq!(p.image_prompt(&one), view);
        assert_eq!(p.placeholder(), "<start_of_image>");
        let three = Gemma3Image { crops: 3, ..one };
        assert_eq!(
            p.image_prompt(&three),
            format!("Here is the original image {view} and here are some crops to help you see better {view} {view}")
        );
    }

    #[test]
    fn tiny_and_extreme_images_never_panic() {
        let p = processor(
            r#"{"size": {"height": 5, "width": 6}, "do_pan_and_scan": true, "pan_and_scan_min_crop_size": 1,
                "pan_and_scan_min_ratio_to_activate": 0.5, "pan_and_scan_max_num_crops": 8}"#,
            1,
        );
        for (w, h) in [(1, 1), (1, 300), (300, 1), (12, 2), (2, 12), (5, 4)] {
            let img = RgbImage::new(w, h, vec![7; w * h * 3]).unwrap();
            match p.process(&img) {
                Ok(out) => assert_eq!(out.pixel_values.len(), out.crops * 3 * 5 * 6, "{w}x{h}"),
                Err(Error::InvalidRequest(msg)) => assert!(msg.contains("outside"), "{msg}"),
                Err(e) => panic!("{w}x{h}: {e}"),
            }
        }
        // A 1x1 image with 2 forced crops: the second starts past the edge.
        let img = RgbImage::new(1, 1, vec![1, 2, 3]).unwrap();
        assert!(matches!(p.process(&img), Err(Error::InvalidRequest(_))));
    }

    #[test]
    fn without_resize_the_image_keeps_its_size() {
        let p = processor(r#"{"do_resize": false, "do_normalize": false, "do_rescale": false}"#, 1);
        let img = RgbImage::new(2, 1, vec![1, 2, 3, 4, 5, 6]).unwrap();
        let out = p.process(&img).unwrap();
        assert_eq!((out.crops, out.height, out.width), (1, 1, 2));
        assert_eq!(out.pixel_values, [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    }
}
