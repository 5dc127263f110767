//! The Idefics3 / SmolVLM image processor: transformers' `Idefics3ImageProcessorPil` and the
//! prompt text of `Idefics3Processor`, step for step.
//!
//! Per image: (1) `do_resize`: the longest side to `size.longest_edge` (up or down; the other
//! side keeps the aspect ratio, made even), both capped at 4096; (2) with `do_image_splitting`,
//! a resize of each side up to a multiple of `max_image_size`, then `rows x cols` tiles of
//! `max_image_size` squared cut from it, row by row, plus the whole image resized to one tile
//! (the global view, last); without splitting, one resize to a `max_image_size` square and
//! `rows = cols = 0`; (3) rescale and normalize to `f32`, channel-first; (4) `do_pad`: every
//! tile of the call padded (bottom, right, zeros) to the largest tile of the call.
//!
//! Padding across images: transformers pads every image of a batch to the batch's largest
//! tile, and pads each prompt's list of tiles with all-zero tiles up to the longest list. One
//! `process` call is one prompt's images: their tiles are padded to the call's largest tile,
//! and the zero tiles that line up prompts of a batch are left to the batcher. Every tile is
//! `max_image_size` squared whatever the input, so the padding never changes a value and each
//! mask is all ones; it is still computed, as transformers does.

use lmplex_core::{Error, Result};

use crate::config::{Idefics3Config, Size};
use crate::pixels::{push_chw, Normalization};
use crate::resample::resize;
use crate::rgb::RgbImage;

/// transformers' `MAX_IMAGE_SIZE`: the longest side after the first resize.
const MAX_IMAGE_SIZE: usize = 4096;

/// One image's tiles, as transformers' `pixel_values` for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Idefics3Image {
    /// `[tiles, 3, height, width]`, channel-first, row-major: the `rows x cols` tiles row by
    /// row, then the global view.
    pub pixel_values: Vec<f32>,
    /// Number of tiles (`rows * cols + 1` when split, else 1).
    pub tiles: usize,
    /// Tile height after padding.
    pub height: usize,
    /// Tile width after padding.
    pub width: usize,
    /// Rows of the split (0 when the image is not split).
    pub rows: usize,
    /// Columns of the split (0 when the image is not split).
    pub cols: usize,
    /// With `do_pad`, per tile the `(height, width)` of its pixels before padding:
    /// transformers' `pixel_attention_mask` is 1 on `[..height, ..width]`, 0 elsewhere.
    pub unpadded: Option<Vec<(usize, usize)>>,
}

impl Idefics3Image {
    /// transformers' `pixel_attention_mask` for this image, `[tiles, height, width]` of 0 or 1;
    /// `None` without `do_pad`.
    pub fn pixel_attention_mask(&self) -> Option<Vec<u8>> {
        let unpadded = self.unpadded.as_ref()?;
        let mut mask = vec![0u8; self.tiles * self.height * self.width];
        for (t, &(h, w)) in unpadded.iter().enumerate() {
            for y in 0..h {
                let row = (t * self.height + y) * self.width;
                mask[row..row + w].fill(1);
            }
        }
        Some(mask)
    }
}

/// The result of one `process` call: one entry per input image, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Idefics3Pixels {
    /// Each image's tiles.
    pub images: Vec<Idefics3Image>,
}

/// transformers' Idefics3 image processor (PIL backend) and its prompt layout.
#[derive(Debug, Clone)]
pub struct Idefics3Processor {
    config: Idefics3Config,
}

impl Idefics3Processor {
    /// A processor for `config`; `ModelLoad` when a value cannot be used.
    pub fn new(config: Idefics3Config) -> Result<Self> {
        config.validate().map_err(Error::ModelLoad)?;
        Ok(Self { config })
    }

    /// A processor from an HF folder (see `Idefics3Config::from_folder`).
    pub fn from_folder(path: impl AsRef<std::path::Path>) -> Result<Self> {
        Self::new(Idefics3Config::from_folder(path)?)
    }

    /// The settings.
    pub fn config(&self) -> &Idefics3Config {
        &self.config
    }

    /// One prompt's images to pixel values, bit for bit what transformers' PIL processor gives.
    ///
    /// `InvalidRequest` when an image would be resized to 0 pixels (a side shorter than one
    /// pixel after keeping its aspect ratio).
    pub fn process(&self, images: &[RgbImage]) -> Result<Idefics3Pixels> {
        let split: Vec<(Vec<RgbImage>, usize, usize)> = images.iter().map(|i| self.tiles(i)).collect::<Result<_>>()?;
        let all = || split.iter().flat_map(|(tiles, _, _)| tiles);
        let height = all().map(RgbImage::height).max().unwrap_or(0);
        let width = all().map(RgbImage::width).max().unwrap_or(0);
        let c = &self.config;
        let table = Normalization {
            rescale: c.do_rescale.then_some(c.rescale_factor),
            mean_std: c.do_normalize.then_some((c.image_mean, c.image_std)),
        }
        .table();
        let images = split
            .into_iter()
            .map(|(tiles, rows, cols)| {
                let (h, w) = if c.do_pad { (height, width) } else { (tiles[0].height(), tiles[0].width()) };
                let mut pixel_values = Vec::with_capacity(tiles.len() * 3 * h * w);
                for tile in &tiles {
                    push_chw(tile, &table, h, w, &mut pixel_values);
                }
                let unpadded = c.do_pad.then(|| tiles.iter().map(|t| (t.height(), t.width())).collect());
                Idefics3Image { pixel_values, tiles: tiles.len(), height: h, width: w, rows, cols, unpadded }
            })
            .collect();
        Ok(Idefics3Pixels { images })
    }

    /// The prompt text that stands for an image of `rows x cols` tiles (`prompt_string`
    /// with this processor's `image_seq_len`).
    pub fn image_prompt(&self, rows: usize, cols: usize) -> String {
        prompt_string(rows, cols, self.config.image_seq_len)
    }

    /// Steps 1 and 2: the resized tiles of one image, and its rows and columns.
    fn tiles(&self, image: &RgbImage) -> Result<(Vec<RgbImage>, usize, usize)> {
        let c = &self.config;
        let resized;
        let mut image = image;
        if c.do_resize {
            let (h, w) = match c.size {
                Size::LongestEdge(n) => {
                    let (h, w) = rescale_to_max_len(image.height(), image.width(), n);
                    scale_below_upper_bound(h, w, MAX_IMAGE_SIZE)
                }
                Size::Exact { height, width } => (height, width),
            };
            resized = self.resize(image, h, w)?;
            image = &resized;
        }
        let m = c.max_image_size;
        if !c.do_image_splitting {
            return Ok((vec![self.resize(image, m, m)?], 0, 0));
        }
        let (h, w) = resize_for_vision_encoder(image.height(), image.width(), m);
        let image = self.resize(image, h, w)?;
        if h <= m && w <= m {
            return Ok((vec![image], 0, 0));
        }
        let (rows, cols) = ((h - m) / m + 1, (w - m) / m + 1);
        let mut tiles = Vec::with_capacity(rows * cols + 1);
        for r in 0..rows {
            for col in 0..cols {
                tiles.push(image.crop(col * m, r * m, m, m));
            }
        }
        tiles.push(self.resize(&image, m, m)?);
        Ok((tiles, rows, cols))
    }

    fn resize(&self, image: &RgbImage, height: usize, width: usize) -> Result<RgbImage> {
        if height == 0 || width == 0 {
            return Err(Error::InvalidRequest(format!(
                "a {}x{} image would be resized to {width}x{height}",
                image.width(),
                image.height()
            )));
        }
        Ok(resize(image, width, height, self.config.resample))
    }
}

/// `_resize_output_size_rescale_to_max_len`: the longest side becomes `max_len`, the other
/// keeps the aspect ratio (Python's float division and `int()`), made even, at least 1.
fn rescale_to_max_len(height: usize, width: usize, max_len: usize) -> (usize, usize) {
    let aspect = width as f64 / height as f64;
    let (mut h, mut w) = (height, width);
    if w >= h {
        w = max_len;
        h = (w as f64 / aspect) as usize;
        h += h % 2;
    } else {
        h = max_len;
        w = (h as f64 * aspect) as usize;
        w += w % 2;
    }
    (h.max(1), w.max(1))
}

/// `_resize_output_size_scale_below_upper_bound`: caps the longest side at `max_len`.
fn scale_below_upper_bound(height: usize, width: usize, max_len: usize) -> (usize, usize) {
    let aspect = width as f64 / height as f64;
    let (mut h, mut w) = (height, width);
    if w >= h && w > max_len {
        w = max_len;
        h = (w as f64 / aspect) as usize;
    } else if h > w && h > max_len {
        h = max_len;
        w = (h as f64 * aspect) as usize;
    }
    (h.max(1), w.max(1))
}

/// `resize_for_vision_encoder`: the longest side up to a multiple of `m`, the other from the
/// aspect ratio, then up to a multiple of `m` too.
fn resize_for_vision_encoder(height: usize, width: usize, m: usize) -> (usize, usize) {
    let aspect = width as f64 / height as f64;
    let up = |v: usize| (v as f64 / m as f64).ceil() as usize * m;
    if width >= height {
        let w = up(width);
        (up((w as f64 / aspect) as usize), w)
    } else {
        let h = up(height);
        (h, up((h as f64 * aspect) as usize))
    }
}

/// The text that stands for one image in an Idefics3 prompt (transformers'
/// `Idefics3Processor.replace_image_token`): per tile `<fake_token_around_image><row_R_col_C>`
/// and `image_seq_len` `<image>`, a newline after each row, then a newline and the global view
/// `<fake_token_around_image><global-img>` + `<image>` x n + `<fake_token_around_image>`.
/// An image that was not split (`rows = cols = 0`) is the global view alone.
pub fn prompt_string(rows: usize, cols: usize, image_seq_len: usize) -> String {
    const FAKE: &str = "<fake_token_around_image>";
    let images = "<image>".repeat(image_seq_len);
    let global = format!("{FAKE}<global-img>{images}{FAKE}");
    if rows == 0 && cols == 0 {
        return global;
    }
    let mut text = String::new();
    for r in 1..=rows {
        for c in 1..=cols {
            text.push_str(&format!("{FAKE}<row_{r}_col_{c}>{images}"));
        }
        text.push('\n');
    }
    text.push('\n');
    text.push_str(&global);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_transformers() {
        // 37 wide x 53 high, SmolVLM: longest edge 2048, width int(2048 * 37 / 53) = 1429 -> 1430.
        assert_eq!(rescale_to_max_len(53, 37, 2048), (2048, 1430));
        assert_eq!(rescale_to_max_len(80, 120, 2048), (1366, 2048));
        assert_eq!(scale_below_upper_bound(100, 5000, 4096), (81, 4096));
        assert_eq!(resize_for_vision_encoder(2048, 1430, 512), (2048, 1536));
        assert_eq!(resize_for_vision_encoder(1366, 2048, 512), (1536, 2048));
        assert_eq!(resize_for_vision_encoder(10, 10, 512), (512, 512));
    }

    #[test]
    fn prompt_string_layout() {
        let fake = "<fake_token_around_image>";
        assert_eq!(prompt_string(0, 0, 2), format!("{fake}<global-img><image><image>{fake}"));
        assert_eq!(
            prompt_string(1, 2, 1),
            format!("{fake}<row_1_col_1><image>{fake}<row_1_col_2><image>\n\n{fake}<global-img><image>{fake}")
        );
    }

    #[test]
    fn mask_marks_the_unpadded_region() {
        let img = Idefics3Image {
            pixel_values: vec![0.0; 3 * 2 * 2],
            tiles: 1,
            height: 2,
            width: 2,
            rows: 0,
            cols: 0,
            unpadded: Some(vec![(1, 2)]),
        };
        assert_eq!(img.pixel_attention_mask(), Some(vec![1, 1, 0, 0]));
    }
}
