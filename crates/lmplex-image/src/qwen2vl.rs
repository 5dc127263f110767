//! The Qwen2-VL / Qwen2.5-VL image processor: transformers' `Qwen2VLImageProcessorPil` and the
//! prompt text of `Qwen2VLProcessor`, step for step.
//!
//! Per image: (1) `smart_resize`: both sides to multiples of `factor = patch_size * merge_size`,
//! nearest to the image's own (Python's round half to even), then scaled down or up, keeping
//! the aspect ratio, to within `[min_pixels, max_pixels]`; an aspect ratio over 200 is refused;
//! (2) a Pillow resize to that size with `resample`; (3) rescale and normalize to `f32`;
//! (4) `patchify`: `[grid_h * grid_w, 3 * temporal_patch_size * patch_size^2]`, rows ordered by
//! merge window (`grid_h / merge` x `grid_w / merge`, then `merge x merge` inside one), a row
//! holding channel, frame, patch row, patch column; a still image is its own
//! `temporal_patch_size` frames, so `grid_t` is 1.
//!
//! The prompt: the chat template renders `<|vision_start|><|image_pad|><|vision_end|>`;
//! `Qwen2VLProcessor` repeats `<|image_pad|>` `grid_t * grid_h * grid_w / merge_size^2` times.
//!
//! Invariants: the same bits as transformers (Pillow 13) for the same RGB8 image (checked by
//! `tests/hf_processor_qwen2vl.rs`); the output has at most about `max_pixels` pixels (or
//! `min_pixels` rounded up) whatever the input; `process` refuses with `InvalidRequest`, never
//! panics.

use lmplex_core::{Error, Result};

use crate::pixels::Normalization;
use crate::qwen2vl_config::Qwen2VlConfig;
use crate::resample::resize;
use crate::rgb::RgbImage;

/// transformers' `smart_resize` refuses a longer side more than this many times the shorter one.
const MAX_ASPECT_RATIO: f64 = 200.0;

/// One image's patches, as transformers' `pixel_values` and `image_grid_thw` for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen2VlImage {
    /// `[grid_t * grid_h * grid_w, 3 * temporal_patch_size * patch_size * patch_size]`, row-major.
    pub pixel_values: Vec<f32>,
    /// `[grid_t, grid_h, grid_w]`: frames (1 for an image), patch rows, patch columns.
    pub grid_thw: [usize; 3],
}

impl Qwen2VlImage {
    /// The number of placeholder tokens for this image: patches / `merge_size^2`.
    pub fn tokens(&self, merge_size: usize) -> usize {
        self.grid_thw.iter().product::<usize>() / (merge_size * merge_size).max(1)
    }
}

/// transformers' Qwen2-VL image processor (PIL backend) and its prompt text.
#[derive(Debug, Clone)]
pub struct Qwen2VlProcessor {
    config: Qwen2VlConfig,
}

impl Qwen2VlProcessor {
    /// A processor for `config`; `ModelLoad` when a value cannot be used.
    pub fn new(config: Qwen2VlConfig) -> Result<Self> {
        config.validate().map_err(Error::ModelLoad)?;
        Ok(Self { config })
    }

    /// A processor from an HF folder (see `Qwen2VlConfig::from_folder`).
    pub fn from_folder(path: impl AsRef<std::path::Path>) -> Result<Self> {
        Self::new(Qwen2VlConfig::from_folder(path)?)
    }

    /// The settings.
    pub fn config(&self) -> &Qwen2VlConfig {
        &self.config
    }

    /// The `(height, width)` an image of this size is resized to (`smart_resize` with this
    /// config); the image itself without `do_resize`. `InvalidRequest` as for `process`.
    pub fn resized_size(&self, height: usize, width: usize) -> Result<(usize, usize)> {
        let c = &self.config;
        if !c.do_resize {
            let f = c.factor();
            if !height.is_multiple_of(f) || !width.is_multiple_of(f) {
                return Err(Error::InvalidRequest(format!(
                    "a {width}x{height} image: without resizing, both sides must be multiples of {f}"
                )));
            }
            return Ok((height, width));
        }
        smart_resize(height, width, c.factor(), c.min_pixels, c.max_pixels)
    }

    /// One image to patches, bit for bit what transformers' PIL processor gives.
    ///
    /// `InvalidRequest` when the aspect ratio is over 200 (transformers refuses it), or, without
    /// `do_resize`, when a side is not a multiple of `patch_size * merge_size`.
    pub fn process(&self, image: &RgbImage) -> Result<Qwen2VlImage> {
        let c = &self.config;
        let (height, width) = self.resized_size(image.height(), image.width())?;
        let resized;
        let image = if (height, width) == (image.height(), image.width()) {
            image
        } else {
            resized = resize(image, width, height, c.resample);
            &resized
        };
        let table = Normalization {
            rescale: c.do_rescale.then_some(c.rescale_factor),
            mean_std: c.do_normalize.then_some((c.image_mean, c.image_std)),
        }
        .table();
        let (p, m, t) = (c.patch_size, c.merge_size, c.temporal_patch_size);
        let (grid_h, grid_w) = (height / p, width / p);
        let mut pixel_values = Vec::with_capacity(height * width * 3 * t);
        let px = image.pixels();
        for block_y in 0..grid_h / m {
            for block_x in 0..grid_w / m {
                for my in 0..m {
                    for mx in 0..m {
                        let (y0, x0) = ((block_y * m + my) * p, (block_x * m + mx) * p);
                        for (ch, lut) in table.iter().enumerate() {
                            for _frame in 0..t {
                                for y in y0..y0 + p {
                                    let row = &px[(y * width + x0) * 3..(y * width + x0 + p) * 3];
                                    pixel_values.extend(row.chunks_exact(3).map(|rgb| lut[usize::from(rgb[ch])]));
                                }
                            }
                        }
                    }
                }
            }
        }
        Ok(Qwen2VlImage { pixel_values, grid_thw: [1, grid_h, grid_w] })
    }

    /// The placeholder the chat template renders per image (`<|image_pad|>`).
    pub fn placeholder(&self) -> &str {
        &self.config.image_token
    }

    /// The text that replaces one placeholder for `image` (`Qwen2VLProcessor.replace_image_token`):
    /// the placeholder, once per token.
    pub fn image_prompt(&self, image: &Qwen2VlImage) -> String {
        self.config.image_token.repeat(image.tokens(self.config.merge_size))
    }
}

/// transformers' `smart_resize`: the `(height, width)` to resize a `height x width` image to.
/// Both are multiples of `factor`; the area is within `[min_pixels, max_pixels]` but for the
/// rounding to `factor`. Python's float maths, in `f64` as Python computes it.
///
/// `InvalidRequest` when the longer side is more than 200 times the shorter, or a side is 0.
pub fn smart_resize(
    height: usize,
    width: usize,
    factor: usize,
    min_pixels: usize,
    max_pixels: usize,
) -> Result<(usize, usize)> {
    let ratio = height.max(width) as f64 / height.min(width) as f64;
    if height == 0 || width == 0 || ratio > MAX_ASPECT_RATIO {
        return Err(Error::InvalidRequest(format!(
            "a {width}x{height} image: the longer side may be at most {MAX_ASPECT_RATIO} times the shorter"
        )));
    }
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    // `as usize` of a non-negative float truncates (saturates), as Python's int() of floor / ceil.
    let times_factor = |v: f64| (v as usize).saturating_mul(factor);
    let mut h_bar = times_factor((h / f).round_ties_even());
    let mut w_bar = times_factor((w / f).round_ties_even());
    // Python divides the exact int product; f64 holds it exactly below 2^53 pixels.
    let pixels = h * w;
    if h_bar.saturating_mul(w_bar) > max_pixels {
        let beta = (pixels / max_pixels as f64).sqrt();
        h_bar = factor.max(times_factor((h / beta / f).floor()));
        w_bar = factor.max(times_factor((w / beta / f).floor()));
    } else if h_bar.saturating_mul(w_bar) < min_pixels {
        let beta = (min_pixels as f64 / pixels).sqrt();
        h_bar = times_factor((h * beta / f).ceil());
        w_bar = times_factor((w * beta / f).ceil());
    }
    if h_bar == 0 || w_bar == 0 {
        return Err(Error::InvalidRequest(format!("a {width}x{height} image would be resized to {w_bar}x{h_bar}")));
    }
    Ok((h_bar, w_bar))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smart_resize_follows_transformers() {
        // Values from transformers 5's smart_resize (factor 28, Qwen2-VL's bounds).
        let r = |h, w| smart_resize(h, w, 28, 3136, 12_845_056).unwrap();
        assert_eq!(r(1, 1), (56, 56));
        assert_eq!(r(1, 200), (28, 812));
        assert_eq!(r(53, 37), (84, 56));
        // 42 / 28 = 1.5 and 70 / 28 = 2.5 round half to even: 2 and 2.
        assert_eq!(smart_resize(42, 70, 28, 1, 1 << 30).unwrap(), (56, 56));
        assert_eq!(smart_resize(10_000, 10_000, 28, 3136, 1_003_520).unwrap(), (980, 980));
    }

    #[test]
    fn extreme_aspect_ratios_are_refused() {
        for (h, w) in [(1, 201), (201, 1), (2, 401), (0, 5)] {
            let err = smart_resize(h, w, 28, 3136, 12_845_056).unwrap_err();
            assert!(matches!(&err, Error::InvalidRequest(m) if m.contains("200 times")), "{h}x{w}: {err}");
        }
    }

    #[test]
    fn patches_are_ordered_like_transformers() {
        // 4x4 image, patch 2, merge 2, 2 frames, raw bytes: one merge window of 4 patches.
        let config = Qwen2VlConfig {
            do_resize: false,
            do_rescale: false,
            do_normalize: false,
            patch_size: 2,
            ..Qwen2VlConfig::default()
        };
        let p = Qwen2VlProcessor::new(config).unwrap();
        let px: Vec<u8> = (0..16u8).flat_map(|i| [i, 100 + i, 200]).collect();
        let out = p.process(&RgbImage::new(4, 4, px).unwrap()).unwrap();
        assert_eq!(out.grid_thw, [1, 2, 2]);
        assert_eq!(out.pixel_values.len(), 4 * 3 * 2 * 2 * 2);
        // Patch (0, 1): pixels 2, 3, 6, 7; red twice (two frames), then green.
        assert_eq!(&out.pixel_values[24..36], &[2.0, 3.0, 6.0, 7.0, 2.0, 3.0, 6.0, 7.0, 102.0, 103.0, 106.0, 107.0]);
        assert_eq!(out.tokens(2), 1);
        assert_eq!(p.image_prompt(&out), "<|image_pad|>");
        let odd = RgbImage::new(6, 4, vec![0; 72]).unwrap();
        assert!(matches!(p.process(&odd), Err(Error::InvalidRequest(m)) if m.contains("multiples of 4")));
    }

    #[test]
    fn tiny_and_extreme_images_never_panic() {
        let p = Qwen2VlProcessor::new(Qwen2VlConfig::default()).unwrap();
        let one = p.process(&RgbImage::new(1, 1, vec![9, 9, 9]).unwrap()).unwrap();
        assert_eq!((one.grid_thw, one.tokens(2)), ([1, 4, 4], 4));
        let wide = RgbImage::new(201, 1, vec![0; 603]).unwrap();
        assert!(matches!(p.process(&wide), Err(Error::InvalidRequest(_))));
        let edge = p.process(&RgbImage::new(200, 1, vec![0; 600]).unwrap()).unwrap();
        assert_eq!(edge.grid_thw, [1, 2, 58]);
    }
}
