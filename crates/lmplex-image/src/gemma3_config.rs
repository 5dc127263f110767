//! `Gemma3Config`: the Gemma 3 image processor's settings and its prompt tokens, read from an HF
//! folder's `preprocessor_config.json`, `processor_config.json` and `tokenizer_config.json`.
//!
//! Where each value comes from, as in transformers 5:
//! - resize, rescale and normalize keys: `preprocessor_config.json`; a missing or null key takes
//!   `Gemma3ImageProcessorPil`'s class default (224 x 224, BILINEAR, 1/255, mean and std 0.5);
//! - pan-and-scan keys: `preprocessor_config.json`; a missing or null key takes
//!   `Gemma3Processor.images_kwargs` (off, 256, 4, 1.2). The real checkpoints leave all four null.
//!   transformers' `Gemma3Processor` passes those defaults *over* the config's values (only a
//!   caller's keyword turns pan-and-scan on); lmplex takes the config's values, which is what
//!   the image processor does when called with them, so a config that turns pan-and-scan on gets it;
//! - `image_seq_length`: `processor_config.json` (`Gemma3Processor`'s argument; the copy in
//!   `preprocessor_config.json` is not read by transformers, nor here), default 256;
//! - `boi_token`, `image_token`, `eoi_token`: the tokenizer's (`tokenizer_config.json`,
//!   `extra_special_tokens` first, then top-level keys); Gemma 3's strings when absent.
//!
//! Unknown keys are ignored. Every value is checked here, so the processor never meets a bad
//! one; errors are `ModelLoad` naming the file and the key.

use std::path::Path;

use lmplex_core::{Error, Result};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::config::{
    check_normalization, filter, number, read_optional, read_required, special_token, NormalizationJson, Size,
    PREPROCESSOR, PROCESSOR, TOKENIZER,
};
use crate::resample::Filter;

/// The Gemma 3 image processor's settings and prompt tokens (transformers' names and meanings).
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma3Config {
    /// Resize every view to `size`.
    pub do_resize: bool,
    /// The views' size: only `Size::Exact` (`{"height", "width"}`), 896 x 896 for the real models.
    pub size: Size,
    /// The resize filter.
    pub resample: Filter,
    /// Multiply the bytes by `rescale_factor`.
    pub do_rescale: bool,
    /// Usually 1/255.
    pub rescale_factor: f64,
    /// Subtract `image_mean` and divide by `image_std`, per channel.
    pub do_normalize: bool,
    /// Per-channel mean (R, G, B).
    pub image_mean: [f64; 3],
    /// Per-channel standard deviation (R, G, B).
    pub image_std: [f64; 3],
    /// Add crops of a long image after the whole image.
    pub do_pan_and_scan: bool,
    /// A crop's shorter side is at least this.
    pub pan_and_scan_min_crop_size: usize,
    /// At most this many crops per image.
    pub pan_and_scan_max_num_crops: usize,
    /// Crop only when the long side is at least this many times the short one.
    pub pan_and_scan_min_ratio_to_activate: f64,
    /// `image_token`s per view in the prompt.
    pub image_seq_length: usize,
    /// The placeholder the chat template renders per image, and the start of each view's text.
    pub boi_token: String,
    /// The token a view's embeddings take the place of.
    pub image_token: String,
    /// The end of each view's text.
    pub eoi_token: String,
}

impl Default for Gemma3Config {
    /// transformers' defaults (`Gemma3ImageProcessorPil`, `Gemma3Processor`) and Gemma 3's tokens.
    fn default() -> Self {
        Self {
            do_resize: true,
            size: Size::Exact { height: 224, width: 224 },
            resample: Filter::Bilinear,
            do_rescale: true,
            rescale_factor: 1.0 / 255.0,
            do_normalize: true,
            image_mean: [0.5; 3],
            image_std: [0.5; 3],
            do_pan_and_scan: false,
            pan_and_scan_min_crop_size: 256,
            pan_and_scan_max_num_crops: 4,
            pan_and_scan_min_ratio_to_activate: 1.2,
            image_seq_length: 256,
            boi_token: "<start_of_image>".into(),
            image_token: "<image_soft_token>".into(),
            eoi_token: "<end_of_image>".into(),
        }
    }
}

#[derive(Deserialize)]
struct SizeJson {
    height: Option<usize>,
    width: Option<usize>,
}

#[derive(Deserialize)]
struct PreprocessorJson {
    do_resize: Option<bool>,
    size: Option<SizeJson>,
    resample: Option<i64>,
    do_rescale: Option<bool>,
    rescale_factor: Option<Box<RawValue>>,
    do_normalize: Option<bool>,
    image_mean: Option<Box<RawValue>>,
    image_std: Option<Box<RawValue>>,
    do_pan_and_scan: Option<bool>,
    pan_and_scan_min_crop_size: Option<usize>,
    pan_and_scan_max_num_crops: Option<usize>,
    pan_and_scan_min_ratio_to_activate: Option<Box<RawValue>>,
}

#[derive(Deserialize)]
struct ProcessorJson {
    image_seq_length: Option<usize>,
}

impl Gemma3Config {
    /// Reads `preprocessor_config.json` (required), `processor_config.json` and
    /// `tokenizer_config.json` (both optional) from an HF model folder.
    pub fn from_folder(path: impl AsRef<Path>) -> Result<Self> {
        let dir = path.as_ref();
        let config = Self::from_json(&read_required(dir, PREPROCESSOR)?, read_optional(dir, PROCESSOR)?.as_deref())?;
        match read_optional(dir, TOKENIZER)? {
            Some(text) => config.with_tokenizer_config(&text),
            None => Ok(config),
        }
    }

    /// The config from `preprocessor_config.json` and `processor_config.json` (may be absent);
    /// the tokens are Gemma 3's until `with_tokenizer_config`.
    pub fn from_json(preprocessor_config: &str, processor_config: Option<&str>) -> Result<Self> {
        let bad = |file: &str, msg: String| Error::ModelLoad(format!("{file}: {msg}"));
        let p: PreprocessorJson =
            serde_json::from_str(preprocessor_config).map_err(|e| bad(PREPROCESSOR, e.to_string()))?;
        let mut c = Self::default();
        c.do_resize = p.do_resize.unwrap_or(c.do_resize);
        if let Some(s) = p.size {
            c.size = match (s.height, s.width) {
                (Some(height), Some(width)) => Size::Exact { height, width },
                _ => return Err(bad(PREPROCESSOR, "size needs height and width".into())),
            };
        }
        if let Some(code) = p.resample {
            c.resample = filter(code).map_err(|msg| bad(PREPROCESSOR, msg))?;
        }
        c.do_rescale = p.do_rescale.unwrap_or(c.do_rescale);
        c.do_normalize = p.do_normalize.unwrap_or(c.do_normalize);
        NormalizationJson { rescale_factor: p.rescale_factor, image_mean: p.image_mean, image_std: p.image_std }
            .read_into(&mut c.rescale_factor, &mut c.image_mean, &mut c.image_std)
            .map_err(|msg| bad(PREPROCESSOR, msg))?;
        c.do_pan_and_scan = p.do_pan_and_scan.unwrap_or(c.do_pan_and_scan);
        c.pan_and_scan_min_crop_size = p.pan_and_scan_min_crop_size.unwrap_or(c.pan_and_scan_min_crop_size);
        c.pan_and_scan_max_num_crops = p.pan_and_scan_max_num_crops.unwrap_or(c.pan_and_scan_max_num_crops);
        if let Some(raw) = p.pan_and_scan_min_ratio_to_activate {
            c.pan_and_scan_min_ratio_to_activate =
                number(&raw).ok_or_else(|| bad(PREPROCESSOR, format!("pan_and_scan_min_ratio_to_activate {raw}")))?;
        }
        if let Some(text) = processor_config {
            let q: ProcessorJson = serde_json::from_str(text).map_err(|e| bad(PROCESSOR, e.to_string()))?;
            c.image_seq_length = q.image_seq_length.unwrap_or(c.image_seq_length);
        }
        c.validate().map_err(|msg| bad(PREPROCESSOR, msg))?;
        Ok(c)
    }

    /// The image tokens of `tokenizer_config.json` in place of the ones held (each one it has).
    pub fn with_tokenizer_config(mut self, tokenizer_config: &str) -> Result<Self> {
        let bad = |msg: String| Error::ModelLoad(format!("{TOKENIZER}: {msg}"));
        let json: serde_json::Value = serde_json::from_str(tokenizer_config).map_err(|e| bad(e.to_string()))?;
        for (key, out) in [
            ("boi_token", &mut self.boi_token),
            ("image_token", &mut self.image_token),
            ("eoi_token", &mut self.eoi_token),
        ] {
            if let Some(token) = special_token(&json, key).map_err(bad)? {
                *out = token;
            }
        }
        Ok(self)
    }

    /// The views' `(height, width)` when resized.
    pub(crate) fn target(&self) -> (usize, usize) {
        match self.size {
            Size::Exact { height, width } => (height, width),
            Size::LongestEdge(n) => (n, n), // refused by `validate`
        }
    }

    /// Why this config cannot be used, if it cannot.
    pub(crate) fn validate(&self) -> std::result::Result<(), String> {
        match self.size {
            Size::Exact { height, width } if height > 0 && width > 0 => {}
            Size::Exact { .. } => return Err(format!("size {:?} has a side of 0", self.size)),
            Size::LongestEdge(_) => return Err("size needs height and width".into()),
        }
        check_normalization(self.rescale_factor, &self.image_mean, &self.image_std)?;
        if self.do_pan_and_scan {
            if !self.do_resize {
                return Err("do_pan_and_scan needs do_resize: crops of different sizes cannot be stacked".into());
            }
            if self.pan_and_scan_min_crop_size == 0 || self.pan_and_scan_max_num_crops == 0 {
                return Err(format!(
                    "pan_and_scan_min_crop_size {} / pan_and_scan_max_num_crops {}: need at least 1",
                    self.pan_and_scan_min_crop_size, self.pan_and_scan_max_num_crops
                ));
            }
            if !self.pan_and_scan_min_ratio_to_activate.is_finite() {
                return Err(format!(
                    "pan_and_scan_min_ratio_to_activate {} is not finite",
                    self.pan_and_scan_min_ratio_to_activate
                ));
            }
        }
        if [&self.boi_token, &self.image_token, &self.eoi_token].iter().any(|t| t.is_empty()) {
            return Err("boi_token, image_token and eoi_token must not be empty".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nulls_and_missing_keys_take_transformers_defaults() {
        let c = Gemma3Config::from_json(
            r#"{"do_pan_and_scan": null, "pan_and_scan_min_crop_size": null, "resample": 2, "image_seq_length": 7}"#,
            None,
        )
        .unwrap();
        assert_eq!(c, Gemma3Config::default());
        assert_eq!(c.image_seq_length, 256, "the preprocessor's image_seq_length is not read");
    }

    #[test]
    fn reads_keys_and_tokens() {
        let c = Gemma3Config::from_json(
            r#"{"size": {"height": 896, "width": 896}, "do_pan_and_scan": true, "pan_and_scan_min_crop_size": 16,
                "pan_and_scan_max_num_crops": 3, "pan_and_scan_min_ratio_to_activate": 2.5}"#,
            Some(r#"{"image_seq_length": 3, "processor_class": "Gemma3Processor"}"#),
        )
        .unwrap();
        assert_eq!((c.target(), c.do_pan_and_scan, c.image_seq_length), ((896, 896), true, 3));
        assert_eq!((c.pan_and_scan_min_crop_size, c.pan_and_scan_max_num_crops), (16, 3));
        assert_eq!(c.pan_and_scan_min_ratio_to_activate, 2.5);
        let c = c
            .with_tokenizer_config(
                r#"{"boi_token": "<top>", "image_token": {"content": "<img>"},
                    "extra_special_tokens": {"boi_token": "<boi>"}}"#,
            )
            .unwrap();
        assert_eq!((&*c.boi_token, &*c.image_token, &*c.eoi_token), ("<boi>", "<img>", "<end_of_image>"));
    }

    #[test]
    fn refuses_bad_values_naming_the_key() {
        for (json, needle) in [
            (r#"{"size": {"longest_edge": 896}}"#, "size needs height and width"),
            (r#"{"size": {"height": 0, "width": 4}}"#, "side of 0"),
            (r#"{"resample": 0}"#, "resample 0"),
            (r#"{"image_std": 0}"#, "std not 0"),
            (r#"{"do_pan_and_scan": true, "pan_and_scan_max_num_crops": 0}"#, "pan_and_scan_max_num_crops 0"),
            (r#"{"do_pan_and_scan": true, "do_resize": false}"#, "do_pan_and_scan needs do_resize"),
            (r#"{"pan_and_scan_min_ratio_to_activate": "x"}"#, "pan_and_scan_min_ratio_to_activate"),
            ("[", "preprocessor_config.json"),
        ] {
            let err = Gemma3Config::from_json(json, None).unwrap_err();
            assert!(matches!(&err, Error::ModelLoad(m) if m.contains(needle)), "{json}: {err}");
        }
        let err = Gemma3Config::default().with_tokenizer_config(r#"{"boi_token": 5}"#).unwrap_err();
        assert!(matches!(&err, Error::ModelLoad(m) if m.contains("tokenizer_config.json: boi_token 5")), "{err}");
    }
}
