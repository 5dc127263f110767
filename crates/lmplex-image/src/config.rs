//! `Idefics3Config`: the Idefics3 / SmolVLM image processor's settings, read from an HF folder's
//! `preprocessor_config.json` and `processor_config.json`.
//!
//! A missing key takes the default of transformers' `Idefics3ImageProcessorPil` class (and
//! `Idefics3Processor`'s `image_seq_len` = 169), as transformers does; unknown keys are
//! ignored. Every value is checked here, so the processor never meets a bad one; errors are
//! `ModelLoad` naming the file and the key.
//!
//! Also the pieces every family's config shares: reading the folder's files, numbers parsed as
//! Python parses them, `resample` codes, rescale / normalize keys, special tokens from
//! `tokenizer_config.json`.

use std::path::Path;

use lmplex_core::{Error, Result};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::resample::Filter;

/// The target of the first resize (`size` in the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    /// `{"longest_edge": n}`: the longest side becomes `n` (up or down), the other keeps the
    /// aspect ratio and is made even, then both are capped at 4096.
    LongestEdge(usize),
    /// `{"height": h, "width": w}`: exactly this size.
    Exact {
        /// Rows.
        height: usize,
        /// Columns.
        width: usize,
    },
}

/// The Idefics3 image processor's settings (transformers' names and meanings).
#[derive(Debug, Clone, PartialEq)]
pub struct Idefics3Config {
    /// Resize to `size` first.
    pub do_resize: bool,
    /// The first resize's target.
    pub size: Size,
    /// The filter of every resize.
    pub resample: Filter,
    /// Split into `max_image_size` tiles plus a global view; otherwise one square view.
    pub do_image_splitting: bool,
    /// The tiles' side (`max_image_size.longest_edge`).
    pub max_image_size: usize,
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
    /// Pad the tiles of one call to the largest tile (bottom and right, zeros) with a mask.
    pub do_pad: bool,
    /// `<image>` tokens per tile in the prompt (`processor_config.json`).
    pub image_seq_len: usize,
}

impl Default for Idefics3Config {
    /// transformers' defaults (`Idefics3ImageProcessorPil`, `Idefics3Processor`).
    fn default() -> Self {
        Self {
            do_resize: true,
            size: Size::LongestEdge(4 * 364),
            resample: Filter::Lanczos,
            do_image_splitting: true,
            max_image_size: 364,
            do_rescale: true,
            rescale_factor: 1.0 / 255.0,
            do_normalize: true,
            image_mean: [0.5; 3],
            image_std: [0.5; 3],
            do_pad: true,
            image_seq_len: 169,
        }
    }
}

#[derive(Deserialize)]
struct SizeJson {
    longest_edge: Option<usize>,
    height: Option<usize>,
    width: Option<usize>,
}

#[derive(Deserialize)]
struct PreprocessorJson {
    do_resize: Option<bool>,
    size: Option<SizeJson>,
    resample: Option<i64>,
    do_image_splitting: Option<bool>,
    max_image_size: Option<SizeJson>,
    do_rescale: Option<bool>,
    rescale_factor: Option<Box<RawValue>>,
    do_normalize: Option<bool>,
    image_mean: Option<Box<RawValue>>,
    image_std: Option<Box<RawValue>>,
    do_pad: Option<bool>,
}

#[derive(Deserialize)]
struct ProcessorJson {
    image_seq_len: Option<usize>,
}

/// A JSON number, parsed by Rust's correctly rounded `f64` parser (serde_json's default float
/// parsing may be off by an ulp; Python's is exact, and a mean's last bit shows in the output).
pub(crate) fn number(raw: &RawValue) -> Option<f64> {
    let text = raw.get().trim();
    text.starts_with(|ch: char| ch == '-' || ch.is_ascii_digit()).then(|| text.parse().ok()).flatten()
}

/// One number for the three channels, or a list of three (HF accepts both).
pub(crate) fn three_numbers(raw: &RawValue) -> Option<[f64; 3]> {
    if let Some(v) = number(raw) {
        return Some([v; 3]);
    }
    let list: Vec<Box<RawValue>> = serde_json::from_str(raw.get()).ok()?;
    match list.iter().map(|r| number(r)).collect::<Option<Vec<f64>>>()?[..] {
        [r, g, b] => Some([r, g, b]),
        _ => None,
    }
}

pub(crate) const PREPROCESSOR: &str = "preprocessor_config.json";
pub(crate) const PROCESSOR: &str = "processor_config.json";
pub(crate) const TOKENIZER: &str = "tokenizer_config.json";

/// The text of `dir/name`; `None` when the file does not exist, `ModelLoad` when it cannot be read.
pub(crate) fn read_optional(dir: &Path, name: &str) -> Result<Option<String>> {
    match std::fs::read_to_string(dir.join(name)) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::ModelLoad(format!("cannot read {}: {e}", dir.join(name).display()))),
    }
}

/// The text of `dir/name`, which must exist.
pub(crate) fn read_required(dir: &Path, name: &str) -> Result<String> {
    std::fs::read_to_string(dir.join(name))
        .map_err(|e| Error::ModelLoad(format!("cannot read {}: {e}", dir.join(name).display())))
}

/// The filter of a config's `resample` code, or why it cannot be used.
pub(crate) fn filter(code: i64) -> std::result::Result<Filter, String> {
    Filter::from_pil(code)
        .ok_or_else(|| format!("resample {code} is not supported (1 LANCZOS, 2 BILINEAR, 3 BICUBIC, 4 BOX, 5 HAMMING)"))
}

/// `rescale_factor`, `image_mean` and `image_std` as a config gives them (absent or null: `None`).
pub(crate) struct NormalizationJson {
    pub rescale_factor: Option<Box<RawValue>>,
    pub image_mean: Option<Box<RawValue>>,
    pub image_std: Option<Box<RawValue>>,
}

impl NormalizationJson {
    /// Overwrites the given values with those present; the message names the bad key.
    pub fn read_into(
        self,
        rescale_factor: &mut f64,
        image_mean: &mut [f64; 3],
        image_std: &mut [f64; 3],
    ) -> std::result::Result<(), String> {
        if let Some(raw) = self.rescale_factor {
            *rescale_factor = number(&raw).ok_or_else(|| format!("rescale_factor {raw}"))?;
        }
        for (key, raw, out) in [("image_mean", self.image_mean, image_mean), ("image_std", self.image_std, image_std)] {
            if let Some(raw) = raw {
                *out = three_numbers(&raw).ok_or_else(|| format!("{key} {raw}: need a number or 3 numbers"))?;
            }
        }
        Ok(())
    }
}

/// Why `rescale_factor`, `image_mean` and `image_std` cannot be used, if they cannot.
pub(crate) fn check_normalization(
    rescale_factor: f64,
    image_mean: &[f64; 3],
    image_std: &[f64; 3],
) -> std::result::Result<(), String> {
    if !rescale_factor.is_finite() {
        return Err(format!("rescale_factor {rescale_factor} is not finite"));
    }
    if image_mean.iter().chain(image_std).any(|v| !v.is_finite()) || image_std.contains(&0.0) {
        return Err(format!("image_mean {image_mean:?} / image_std {image_std:?}: need finite values, std not 0"));
    }
    Ok(())
}

/// A special token's text from `tokenizer_config.json`, read as transformers 5 reads it: the
/// `extra_special_tokens` map first, then the top-level key; a string, or an `AddedToken` object's
/// `content`. `Ok(None)` when neither has it.
pub(crate) fn special_token(
    tokenizer_config: &serde_json::Value,
    key: &str,
) -> std::result::Result<Option<String>, String> {
    let extra = tokenizer_config.get("extra_special_tokens").and_then(|e| e.as_object()).and_then(|e| e.get(key));
    let Some(value) = extra.or_else(|| tokenizer_config.get(key)).filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match value.as_str().or_else(|| value.get("content").and_then(|c| c.as_str())) {
        Some(text) if !text.is_empty() => Ok(Some(text.to_string())),
        _ => Err(format!("{key} {value}: need a non-empty string or {{\"content\": ...}}")),
    }
}

impl Idefics3Config {
    /// Reads `preprocessor_config.json` (required) and `processor_config.json` (optional: without
    /// it `image_seq_len` is transformers' default, 169) from an HF model folder.
    pub fn from_folder(path: impl AsRef<Path>) -> Result<Self> {
        let dir = path.as_ref();
        Self::from_json(&read_required(dir, PREPROCESSOR)?, read_optional(dir, PROCESSOR)?.as_deref())
    }

    /// The config from the two files' text (`processor_config.json` may be absent).
    pub fn from_json(preprocessor_config: &str, processor_config: Option<&str>) -> Result<Self> {
        let bad = |file: &str, msg: String| Error::ModelLoad(format!("{file}: {msg}"));
        let p: PreprocessorJson =
            serde_json::from_str(preprocessor_config).map_err(|e| bad(PREPROCESSOR, e.to_string()))?;
        let mut c = Self::default();
        c.do_resize = p.do_resize.unwrap_or(c.do_resize);
        if let Some(s) = p.size {
            c.size = match (s.longest_edge, s.height, s.width) {
                (Some(n), _, _) => Size::LongestEdge(n),
                (None, Some(height), Some(width)) => Size::Exact { height, width },
                _ => return Err(bad(PREPROCESSOR, "size needs longest_edge, or height and width".into())),
            };
        }
        if let Some(code) = p.resample {
            c.resample = filter(code).map_err(|msg| bad(PREPROCESSOR, msg))?;
        }
        c.do_image_splitting = p.do_image_splitting.unwrap_or(c.do_image_splitting);
        if let Some(m) = p.max_image_size {
            c.max_image_size =
                m.longest_edge.ok_or_else(|| bad(PREPROCESSOR, "max_image_size needs longest_edge".into()))?;
        }
        c.do_rescale = p.do_rescale.unwrap_or(c.do_rescale);
        c.do_normalize = p.do_normalize.unwrap_or(c.do_normalize);
        NormalizationJson { rescale_factor: p.rescale_factor, image_mean: p.image_mean, image_std: p.image_std }
            .read_into(&mut c.rescale_factor, &mut c.image_mean, &mut c.image_std)
            .map_err(|msg| bad(PREPROCESSOR, msg))?;
        c.do_pad = p.do_pad.unwrap_or(c.do_pad);
        if let Some(text) = processor_config {
            let q: ProcessorJson = serde_json::from_str(text).map_err(|e| bad(PROCESSOR, e.to_string()))?;
            c.image_seq_len = q.image_seq_len.unwrap_or(c.image_seq_len);
        }
        c.validate().map_err(|msg| bad(PREPROCESSOR, msg))?;
        Ok(c)
    }

    /// Why this config cannot be used, if it cannot.
    pub(crate) fn validate(&self) -> std::result::Result<(), String> {
        let size_ok = match self.size {
            Size::LongestEdge(n) => n > 0,
            Size::Exact { height, width } => height > 0 && width > 0,
        };
        if !size_ok {
            return Err(format!("size {:?} has a side of 0", self.size));
        }
        if self.max_image_size == 0 {
            return Err("max_image_size.longest_edge is 0".into());
        }
        check_normalization(self.rescale_factor, &self.image_mean, &self.image_std)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_parse_to_the_nearest_f64() {
        // The nearest f64 to each literal, as Python's float() gives it.
        let c = Idefics3Config::from_json(
            r#"{"rescale_factor": 0.00392156862745098, "image_mean": [0.48145466, 0.4578275, 0.40821073]}"#,
            None,
        )
        .unwrap();
        assert_eq!(c.rescale_factor.to_bits(), 0x3f70_1010_1010_1010);
        assert_eq!(c.image_mean[0].to_bits(), 0x3fde_d027_34cd_3c33);
    }

    #[test]
    fn missing_keys_take_transformers_defaults() {
        let c = Idefics3Config::from_json("{}", None).unwrap();
        assert_eq!(c, Idefics3Config::default());
        assert_eq!(c.size, Size::LongestEdge(1456));
        assert_eq!(c.image_seq_len, 169);
    }

    #[test]
    fn reads_keys_and_refuses_bad_values() {
        let c = Idefics3Config::from_json(
            r#"{"size": {"height": 20, "width": 30}, "resample": 3, "image_mean": 0.25, "image_std": [1, 2, 3]}"#,
            Some(r#"{"image_seq_len": 81}"#),
        )
        .unwrap();
        assert_eq!(c.size, Size::Exact { height: 20, width: 30 });
        assert_eq!(
            (c.resample, c.image_mean, c.image_std, c.image_seq_len),
            (Filter::Bicubic, [0.25; 3], [1.0, 2.0, 3.0], 81)
        );
        for (json, needle) in [
            (r#"{"resample": 0}"#, "resample 0"),
            (r#"{"image_std": [0.5, 0, 0.5]}"#, "std not 0"),
            (r#"{"max_image_size": {"height": 3}}"#, "max_image_size needs longest_edge"),
            (r#"{"size": {"longest_edge": 0}}"#, "side of 0"),
            (r#"{"image_mean": [0.5, 0.5]}"#, "image_mean [0.5, 0.5]"),
            (r#"{"rescale_factor": "x"}"#, "rescale_factor"),
            ("[", "preprocessor_config.json"),
        ] {
            let err = Idefics3Config::from_json(json, None).unwrap_err();
            assert!(matches!(&err, Error::ModelLoad(m) if m.contains(needle)), "{json}: {err}");
        }
    }
}
