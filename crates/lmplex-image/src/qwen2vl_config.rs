//! `Qwen2VlConfig`: the Qwen2-VL / Qwen2.5-VL image processor's settings and its image token,
//! read from an HF folder's `preprocessor_config.json` and `tokenizer_config.json`.
//!
//! As transformers 5's `Qwen2VLImageProcessorPil.__init__` reads them: the pixel bounds come from
//! `size` (`{"shortest_edge", "longest_edge"}`, the transformers 5 form) or its class default
//! (56 x 56 and 28 x 28 x 1280 pixels), each replaced by the top-level `min_pixels` / `max_pixels`
//! when given (the form of the released checkpoints); resizing needs both, above 0. Other missing
//! or null keys take the class defaults (BICUBIC, 1/255, CLIP mean and std, patch 14, temporal
//! patch 2, merge 2). The image token is the tokenizer's `image_token` when it has one
//! (`tokenizer_config.json`, `extra_special_tokens` first), else `<|image_pad|>`, as
//! `Qwen2VLProcessor` picks it.
//!
//! Unknown keys are ignored. Every value is checked here, so the processor never meets a bad
//! one; errors are `ModelLoad` naming the file and the key.

use std::path::Path;

use lmplex_core::{Error, Result};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::config::{
    check_normalization, filter, read_optional, read_required, special_token, NormalizationJson, PREPROCESSOR,
    TOKENIZER,
};
use crate::resample::Filter;

/// OpenAI CLIP's per-channel mean (transformers' `OPENAI_CLIP_MEAN`).
const CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
/// OpenAI CLIP's per-channel standard deviation (`OPENAI_CLIP_STD`).
const CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];

/// The Qwen2-VL image processor's settings and image token (transformers' names and meanings).
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen2VlConfig {
    /// Resize with `smart_resize`; without it a side must already be a multiple of
    /// `patch_size * merge_size`.
    pub do_resize: bool,
    /// The fewest pixels after resizing (`min_pixels`, or `size.shortest_edge`).
    pub min_pixels: usize,
    /// The most pixels after resizing (`max_pixels`, or `size.longest_edge`).
    pub max_pixels: usize,
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
    /// A patch's side in pixels.
    pub patch_size: usize,
    /// Frames per patch: a still image is repeated this many times.
    pub temporal_patch_size: usize,
    /// `merge_size x merge_size` patches become one token.
    pub merge_size: usize,
    /// The placeholder the chat template renders per image, repeated once per token.
    pub image_token: String,
}

impl Default for Qwen2VlConfig {
    /// transformers' defaults (`Qwen2VLImageProcessorPil`, `Qwen2VLProcessor`).
    fn default() -> Self {
        Self {
            do_resize: true,
            min_pixels: 56 * 56,
            max_pixels: 28 * 28 * 1280,
            resample: Filter::Bicubic,
            do_rescale: true,
            rescale_factor: 1.0 / 255.0,
            do_normalize: true,
            image_mean: CLIP_MEAN,
            image_std: CLIP_STD,
            patch_size: 14,
            temporal_patch_size: 2,
            merge_size: 2,
            image_token: "<|image_pad|>".into(),
        }
    }
}

#[derive(Deserialize)]
struct SizeJson {
    shortest_edge: Option<usize>,
    longest_edge: Option<usize>,
}

#[derive(Deserialize)]
struct PreprocessorJson {
    do_resize: Option<bool>,
    size: Option<SizeJson>,
    min_pixels: Option<usize>,
    max_pixels: Option<usize>,
    resample: Option<i64>,
    do_rescale: Option<bool>,
    rescale_factor: Option<Box<RawValue>>,
    do_normalize: Option<bool>,
    image_mean: Option<Box<RawValue>>,
    image_std: Option<Box<RawValue>>,
    patch_size: Option<usize>,
    temporal_patch_size: Option<usize>,
    merge_size: Option<usize>,
}

impl Qwen2VlConfig {
    /// Reads `preprocessor_config.json` (required) and `tokenizer_config.json` (optional) from an
    /// HF model folder.
    pub fn from_folder(path: impl AsRef<Path>) -> Result<Self> {
        let dir = path.as_ref();
        let config = Self::from_json(&read_required(dir, PREPROCESSOR)?, None)?;
        match read_optional(dir, TOKENIZER)? {
            Some(text) => config.with_tokenizer_config(&text),
            None => Ok(config),
        }
    }

    /// The config from `preprocessor_config.json`. `processor_config.json` holds nothing
    /// `Qwen2VLProcessor` reads for images; it is accepted (and must be JSON) for symmetry.
    pub fn from_json(preprocessor_config: &str, processor_config: Option<&str>) -> Result<Self> {
        let bad = |file: &str, msg: String| Error::ModelLoad(format!("{file}: {msg}"));
        let p: PreprocessorJson =
            serde_json::from_str(preprocessor_config).map_err(|e| bad(PREPROCESSOR, e.to_string()))?;
        if let Some(text) = processor_config {
            serde_json::from_str::<serde::de::IgnoredAny>(text)
                .map_err(|e| bad(crate::config::PROCESSOR, e.to_string()))?;
        }
        let mut c = Self::default();
        c.do_resize = p.do_resize.unwrap_or(c.do_resize);
        // `size` replaces the default bounds as a whole; then the top-level keys replace one each.
        let (mut min_pixels, mut max_pixels) = match &p.size {
            Some(s) => (s.shortest_edge, s.longest_edge),
            None => (Some(c.min_pixels), Some(c.max_pixels)),
        };
        min_pixels = p.min_pixels.or(min_pixels);
        max_pixels = p.max_pixels.or(max_pixels);
        match (min_pixels, max_pixels) {
            (Some(min), Some(max)) => (c.min_pixels, c.max_pixels) = (min, max),
            _ if c.do_resize => {
                return Err(bad(
                    PREPROCESSOR,
                    "resizing needs size.shortest_edge and size.longest_edge (or min_pixels and max_pixels)".into(),
                ))
            }
            _ => {}
        }
        if let Some(code) = p.resample {
            c.resample = filter(code).map_err(|msg| bad(PREPROCESSOR, msg))?;
        }
        c.do_rescale = p.do_rescale.unwrap_or(c.do_rescale);
        c.do_normalize = p.do_normalize.unwrap_or(c.do_normalize);
        NormalizationJson { rescale_factor: p.rescale_factor, image_mean: p.image_mean, image_std: p.image_std }
            .read_into(&mut c.rescale_factor, &mut c.image_mean, &mut c.image_std)
            .map_err(|msg| bad(PREPROCESSOR, msg))?;
        c.patch_size = p.patch_size.unwrap_or(c.patch_size);
        c.temporal_patch_size = p.temporal_patch_size.unwrap_or(c.temporal_patch_size);
        c.merge_size = p.merge_size.unwrap_or(c.merge_size);
        c.validate().map_err(|msg| bad(PREPROCESSOR, msg))?;
        Ok(c)
    }

    /// The tokenizer's `image_token` in place of the one held, when it has one.
    pub fn with_tokenizer_config(mut self, tokenizer_config: &str) -> Result<Self> {
        let bad = |msg: String| Error::ModelLoad(format!("{TOKENIZER}: {msg}"));
        let json: serde_json::Value = serde_json::from_str(tokenizer_config).map_err(|e| bad(e.to_string()))?;
        if let Some(token) = special_token(&json, "image_token").map_err(bad)? {
            self.image_token = token;
        }
        Ok(self)
    }

    /// `patch_size * merge_size`: the sides of a resized image are multiples of it.
    pub fn factor(&self) -> usize {
        self.patch_size * self.merge_size
    }

    /// Why this config cannot be used, if it cannot.
    pub(crate) fn validate(&self) -> std::result::Result<(), String> {
        if self.do_resize && (self.min_pixels == 0 || self.max_pixels == 0) {
            return Err(format!(
                "min_pixels {} / max_pixels {} (size.shortest_edge / size.longest_edge): need at least 1",
                self.min_pixels, self.max_pixels
            ));
        }
        let sizes = [self.patch_size, self.temporal_patch_size, self.merge_size];
        // A factor past 2^16 would make a single patch row larger than any image the decoder accepts.
        if sizes.contains(&0) || self.patch_size.checked_mul(self.merge_size).is_none_or(|f| f > 1 << 16) {
            return Err(format!(
                "patch_size {} / temporal_patch_size {} / merge_size {}: need at least 1, patch_size * merge_size \
                 at most 65536",
                self.patch_size, self.temporal_patch_size, self.merge_size
            ));
        }
        if self.image_token.is_empty() {
            return Err("image_token must not be empty".into());
        }
        check_normalization(self.rescale_factor, &self.image_mean, &self.image_std)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_keys_take_transformers_defaults() {
        let c = Qwen2VlConfig::from_json("{}", None).unwrap();
        assert_eq!(c, Qwen2VlConfig::default());
        assert_eq!((c.min_pixels, c.max_pixels, c.factor()), (3136, 1_003_520, 28));
    }

    #[test]
    fn both_forms_of_the_pixel_bounds() {
        let old = Qwen2VlConfig::from_json(r#"{"min_pixels": 3136, "max_pixels": 12845056}"#, None).unwrap();
        assert_eq!((old.min_pixels, old.max_pixels), (3136, 12_845_056));
        let new = r#"{"size": {"shortest_edge": 100, "longest_edge": 900}, "max_pixels": 5000}"#;
        let new = Qwen2VlConfig::from_json(new, Some("{}")).unwrap();
        assert_eq!((new.min_pixels, new.max_pixels), (100, 5000));
        let c = Qwen2VlConfig::default().with_tokenizer_config(r#"{"image_token": "<x>"}"#).unwrap();
        assert_eq!(c.image_token, "<x>");
        let c = Qwen2VlConfig::default().with_tokenizer_config(r#"{"model_max_length": 5}"#).unwrap();
        assert_eq!(c.image_token, "<|image_pad|>");
    }

    #[test]
    fn refuses_bad_values_naming_the_key() {
        for (json, needle) in [
            (r#"{"size": {"shortest_edge": 100}}"#, "size.shortest_edge and size.longest_edge"),
            (r#"{"min_pixels": 0}"#, "min_pixels 0"),
            (r#"{"merge_size": 0}"#, "merge_size 0"),
            (r#"{"patch_size": 100000}"#, "at most 65536"),
            (r#"{"resample": 7}"#, "resample 7"),
            (r#"{"image_mean": [1, 2]}"#, "image_mean [1, 2]"),
            ("[", "preprocessor_config.json"),
        ] {
            let err = Qwen2VlConfig::from_json(json, None).unwrap_err();
            assert!(matches!(&err, Error::ModelLoad(m) if m.contains(needle)), "{json}: {err}");
        }
        assert!(Qwen2VlConfig::from_json(r#"{"size": {"height": 1, "width": 1}, "do_resize": false}"#, None).is_ok());
    }
}
