//! `VisionArgs` from an Idefics3 (SmolVLM) `config.json`: the SigLIP encoder's `vision_config`,
//! the connector's `scale_factor`, the text model's width and the `<image>` token.
//!
//! Invariants: a key the config omits takes transformers' default (`Idefics3VisionConfig`,
//! `Idefics3Config`, and `LlamaConfig` for a text model of no other type); a key of the wrong
//! type, a zero size, a shape the encoder cannot tile (a patch that does not divide the image,
//! heads that do not divide the width, a scale factor that does not divide the patch grid) or
//! an activation other than `gelu_pytorch_tanh` and `gelu` is `Error::ModelLoad` naming the key.

use lmplex_core::{Error, Result};
use serde::Deserialize;
use serde_json::Value;

/// The MLP activation of the encoder layers (`vision_config.hidden_act`), as torch computes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VisionAct {
    /// `gelu_pytorch_tanh`: `0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`.
    GeluTanh,
    /// `gelu`: `0.5 x (1 + erf(x / sqrt(2)))`.
    Gelu,
}

/// The shapes of an Idefics3 vision tower (encoder and connector), from `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct VisionArgs {
    /// `vision_config.hidden_size`: the encoder's width.
    pub hidden_size: usize,
    /// `vision_config.intermediate_size`: the encoder MLP's hidden width.
    pub intermediate_size: usize,
    /// `vision_config.num_hidden_layers`.
    pub num_hidden_layers: usize,
    /// `vision_config.num_attention_heads`.
    pub num_attention_heads: usize,
    /// `vision_config.image_size`: a tile's side in pixels.
    pub image_size: usize,
    /// `vision_config.patch_size`: a patch's side in pixels.
    pub patch_size: usize,
    /// `vision_config.num_channels`.
    pub num_channels: usize,
    /// `vision_config.layer_norm_eps`.
    pub layer_norm_eps: f64,
    /// `vision_config.hidden_act`.
    pub hidden_act: VisionAct,
    /// `scale_factor`: the connector's pixel shuffle merges `scale_factor^2` patches per token.
    pub scale_factor: usize,
    /// `text_config.hidden_size`: the width of an image feature (a text embedding).
    pub text_hidden_size: usize,
    /// `image_token_id`: the `<image>` token whose embeddings the features replace.
    pub image_token_id: u32,
}

/// `vision_config` as transformers reads it (`Idefics3VisionConfig`'s defaults).
#[derive(Deserialize)]
#[serde(default)]
struct RawVision {
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_channels: usize,
    image_size: Value,
    patch_size: Value,
    hidden_act: String,
    layer_norm_eps: f64,
}

impl Default for RawVision {
    fn default() -> Self {
        Self {
            hidden_size: 1152,
            intermediate_size: 3072,
            num_hidden_layers: 12,
            num_attention_heads: 16,
            num_channels: 3,
            image_size: Value::from(224),
            patch_size: Value::from(32),
            hidden_act: "gelu_pytorch_tanh".into(),
            layer_norm_eps: 1e-6,
        }
    }
}

/// The part of `text_config` the connector needs.
#[derive(Deserialize, Default)]
#[serde(default)]
struct RawText {
    model_type: Option<String>,
    hidden_size: Option<usize>,
}

/// The top level (`Idefics3Config`'s defaults).
#[derive(Deserialize)]
struct RawConfig {
    vision_config: Option<RawVision>,
    text_config: Option<RawText>,
    #[serde(default = "default_scale_factor")]
    scale_factor: usize,
    #[serde(default = "default_image_token_id")]
    image_token_id: u32,
}

fn default_scale_factor() -> usize {
    2
}

fn default_image_token_id() -> u32 {
    128_257
}

/// `LlamaConfig`'s `hidden_size`, the text model transformers builds when `text_config` is
/// absent or names no other type.
const LLAMA_HIDDEN: usize = 4096;

fn bad(msg: impl std::fmt::Display) -> Error {
    Error::model_load(format!("config.json is not a valid Idefics3 config: {msg}"))
}

/// `image_size` / `patch_size`: a number, or `[h, w]` with `h == w` (square tiles only).
fn side(v: &Value, key: &str) -> Result<usize> {
    let n = match v {
        Value::Number(n) => n.as_u64(),
        Value::Array(a) if a.len() == 2 && a[0] == a[1] => a[0].as_u64(),
        _ => None,
    };
    n.map(|n| n as usize).ok_or_else(|| bad(format!("vision_config.{key}: expected a positive integer, got {v}")))
}

impl VisionArgs {
    /// Parses an Idefics3 (or SmolVLM, the same tower) `config.json`.
    pub fn from_hf_config(json: &str) -> Result<Self> {
        let v: Value =
            serde_json::from_str(json).map_err(|e| Error::model_load(format!("config.json is not valid JSON: {e}")))?;
        match v.get("model_type").and_then(Value::as_str) {
            Some("idefics3" | "smolvlm") => {}
            Some(other) => return Err(bad(format!("model_type is '{other}', expected 'idefics3'"))),
            None => return Err(bad("model_type is missing (expected 'idefics3')")),
        }
        // The error names the key at fault (`vision_config.hidden_size: invalid type: ...`).
        let raw: RawConfig = serde_path_to_error::deserialize(v).map_err(|e| {
            let at = e.path().to_string();
            bad(format!("{at}: {}", e.into_inner()))
        })?;
        let vis = raw.vision_config.unwrap_or_default();
        let text = raw.text_config.unwrap_or_default();
        let text_hidden_size = match (text.hidden_size, text.model_type.as_deref()) {
            (Some(h), _) => h,
            (None, None | Some("llama")) => LLAMA_HIDDEN,
            (None, Some(t)) => return Err(bad(format!("text_config.hidden_size is missing (text model '{t}')"))),
        };
        let hidden_act = match vis.hidden_act.as_str() {
            "gelu_pytorch_tanh" => VisionAct::GeluTanh,
            "gelu" => VisionAct::Gelu,
            other => {
                return Err(bad(format!(
                    "vision_config.hidden_act '{other}' is not supported (gelu_pytorch_tanh, gelu)"
                )))
            }
        };
        let args = Self {
            hidden_size: vis.hidden_size,
            intermediate_size: vis.intermediate_size,
            num_hidden_layers: vis.num_hidden_layers,
            num_attention_heads: vis.num_attention_heads,
            image_size: side(&vis.image_size, "image_size")?,
            patch_size: side(&vis.patch_size, "patch_size")?,
            num_channels: vis.num_channels,
            layer_norm_eps: vis.layer_norm_eps,
            hidden_act,
            scale_factor: raw.scale_factor,
            text_hidden_size,
            image_token_id: raw.image_token_id,
        };
        args.validate()?;
        Ok(args)
    }

    /// Sizes that are zero or do not divide what they must, each named by its key.
    fn validate(&self) -> Result<()> {
        let sizes = [
            ("vision_config.hidden_size", self.hidden_size),
            ("vision_config.intermediate_size", self.intermediate_size),
            ("vision_config.num_hidden_layers", self.num_hidden_layers),
            ("vision_config.num_attention_heads", self.num_attention_heads),
            ("vision_config.image_size", self.image_size),
            ("vision_config.patch_size", self.patch_size),
            ("vision_config.num_channels", self.num_channels),
            ("scale_factor", self.scale_factor),
            ("text_config.hidden_size", self.text_hidden_size),
        ];
        if let Some((key, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return Err(bad(format!("{key} is 0")));
        }
        if !(self.layer_norm_eps.is_finite() && self.layer_norm_eps >= 0.0) {
            return Err(bad(format!("vision_config.layer_norm_eps is {}", self.layer_norm_eps)));
        }
        let divides = |(a, ak): (usize, &str), (b, bk): (usize, &str)| {
            if b.is_multiple_of(a) {
                Ok(())
            } else {
                Err(bad(format!("{ak} ({a}) does not divide {bk} ({b})")))
            }
        };
        divides(
            (self.num_attention_heads, "vision_config.num_attention_heads"),
            (self.hidden_size, "vision_config.hidden_size"),
        )?;
        divides((self.patch_size, "vision_config.patch_size"), (self.image_size, "vision_config.image_size"))?;
        divides((self.scale_factor, "scale_factor"), (self.patches_per_side(), "the patches per side"))
    }

    /// Patches along a tile's side (`image_size / patch_size`).
    pub fn patches_per_side(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// Patches per tile: the encoder's sequence length.
    pub fn num_patches(&self) -> usize {
        self.patches_per_side() * self.patches_per_side()
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// Image tokens (features) per tile: `num_patches / scale_factor^2` (transformers'
    /// `image_seq_len`).
    pub fn image_seq_len(&self) -> usize {
        self.num_patches() / (self.scale_factor * self.scale_factor)
    }

    /// Pixel values per tile: `num_channels * image_size^2`.
    pub fn tile_len(&self) -> usize {
        self.num_channels * self.image_size * self.image_size
    }

    /// The connector's input width: `hidden_size * scale_factor^2`.
    pub fn connector_in(&self) -> usize {
        self.hidden_size * self.scale_factor * self.scale_factor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolVLM-256M-Instruct's shapes (its config.json's vision part and connector).
    const SMOLVLM_256M: &str = r#"{"model_type": "idefics3", "image_token_id": 49190, "scale_factor": 4,
        "text_config": {"model_type": "llama", "hidden_size": 576},
        "vision_config": {"hidden_size": 768, "image_size": 512, "intermediate_size": 3072,
            "num_attention_heads": 12, "num_hidden_layers": 12, "patch_size": 16}}"#;

    #[test]
    fn a_real_config_gives_its_shapes_and_defaults_fill_the_rest() {
        let a = VisionArgs::from_hf_config(SMOLVLM_256M).unwrap();
        assert_eq!((a.hidden_size, a.head_dim(), a.num_patches(), a.image_seq_len()), (768, 64, 1024, 64));
        assert_eq!((a.connector_in(), a.text_hidden_size, a.image_token_id), (768 * 16, 576, 49190));
        assert_eq!((a.num_channels, a.layer_norm_eps, a.hidden_act), (3, 1e-6, VisionAct::GeluTanh));
        // transformers' defaults everywhere but the image size (its default 224 / 32 = 7 patches
        // a side cannot be shuffled by the default scale factor 2, in transformers either).
        let d =
            VisionArgs::from_hf_config(r#"{"model_type": "idefics3", "vision_config": {"image_size": 256}}"#).unwrap();
        assert_eq!((d.hidden_size, d.intermediate_size, d.num_hidden_layers), (1152, 3072, 12));
        assert_eq!((d.num_attention_heads, d.image_size, d.patch_size), (16, 256, 32));
        assert_eq!((d.scale_factor, d.text_hidden_size, d.image_token_id), (2, 4096, 128_257));
        let listed = r#"{"model_type": "smolvlm", "vision_config": {"image_size": [64, 64], "patch_size": [8, 8],
            "hidden_act": "gelu", "hidden_size": 32, "num_attention_heads": 2}, "text_config": {"hidden_size": 16}}"#;
        let l = VisionArgs::from_hf_config(listed).unwrap();
        assert_eq!((l.image_size, l.patch_size, l.hidden_act, l.image_seq_len()), (64, 8, VisionAct::Gelu, 16));
    }

    #[test]
    fn a_bad_or_missing_key_is_a_load_error_naming_it() {
        let cases = [
            (r#"{"vision_config": {}}"#, "model_type"),
            (r#"{"model_type": "llama"}"#, "model_type"),
            (r#"{"model_type": "idefics3", "vision_config": {"hidden_size": "big"}}"#, "vision_config.hidden_size"),
            (r#"{"model_type": "idefics3", "vision_config": {"hidden_act": "relu"}}"#, "vision_config.hidden_act"),
            (r#"{"model_type": "idefics3", "vision_config": {"image_size": [32, 64]}}"#, "vision_config.image_size"),
            (r#"{"model_type": "idefics3", "vision_config": {"patch_size": 0}}"#, "vision_config.patch_size"),
            (r#"{"model_type": "idefics3", "vision_config": {"patch_size": 30}}"#, "vision_config.patch_size"),
            (r#"{"model_type": "idefics3", "vision_config": {"num_attention_heads": 5}}"#, "num_attention_heads"),
            (r#"{"model_type": "idefics3"}"#, "scale_factor"),
            (r#"{"model_type": "idefics3", "vision_config": {"image_size": 256}, "scale_factor": 3}"#, "scale_factor"),
            (r#"{"model_type": "idefics3", "scale_factor": -1}"#, "scale_factor"),
            (r#"{"model_type": "idefics3", "image_token_id": "x"}"#, "image_token_id"),
            (r#"{"model_type": "idefics3", "text_config": {"model_type": "qwen2"}}"#, "text_config.hidden_size"),
        ];
        for (json, key) in cases {
            match VisionArgs::from_hf_config(json) {
                Err(Error::ModelLoad(m)) => assert!(m.contains(key), "{json}: '{m}' does not name {key}"),
                other => panic!("{json}: expected a ModelLoad error naming {key}, got {other:?}"),
            }
        }
    }
}
