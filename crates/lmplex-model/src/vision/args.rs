//! `VisionArgs` from a vision-language `config.json`: the SigLIP encoder's `vision_config`, the
//! family's projector (Idefics3 / SmolVLM: pixel shuffle by `scale_factor`; Gemma 3: average
//! pooling to `mm_tokens_per_image`), the text model's width and the image token.
//!
//! Invariants: a key the config omits takes transformers' default for the family
//! (`Idefics3VisionConfig`, `Idefics3Config` and `LlamaConfig` for a text model of no other
//! type; `SiglipVisionConfig`, `Gemma3Config` and `Gemma3TextConfig`); a key of the wrong type,
//! a zero size, a shape the encoder cannot tile (a patch that does not divide the image, heads
//! that do not divide the width, a scale factor that does not divide the patch grid, image
//! tokens that are not a square grid dividing it) or an activation other than
//! `gelu_pytorch_tanh` and `gelu` is `Error::ModelLoad` naming the key.

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

/// How a family turns an image's encoder rows into image tokens, and how its text model
/// attends to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VisionFamily {
    /// Idefics3 / SmolVLM: pixel shuffle merging `scale_factor^2` patches per token, then a
    /// projection (`Idefics3Connector`); image tokens are attended to causally, as text.
    Idefics3 {
        /// `scale_factor`.
        scale_factor: usize,
    },
    /// Gemma 3: the patch grid average-pooled to `mm_tokens_per_image` tokens, an RMSNorm and
    /// a projection (`Gemma3MultiModalProjector`); the tokens of one image attend to each other
    /// bidirectionally in the text model.
    Gemma3 {
        /// `mm_tokens_per_image`: a square number whose side divides the patches per side.
        mm_tokens_per_image: usize,
    },
}

/// The shapes of a vision tower (encoder and projector), from `config.json`.
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
    /// `vision_config.layer_norm_eps` (also the Gemma 3 projector's RMSNorm epsilon).
    pub layer_norm_eps: f64,
    /// `vision_config.hidden_act`.
    pub hidden_act: VisionAct,
    /// The family's projector and attention over image tokens.
    pub family: VisionFamily,
    /// `text_config.hidden_size`: the width of an image feature (a text embedding).
    pub text_hidden_size: usize,
    /// `image_token_id` (Gemma 3: `image_token_index`): the token whose embeddings the
    /// features replace.
    pub image_token_id: u32,
}

/// `vision_config` as the config holds it; absent keys take the family's defaults
/// (`RawVision::or`).
#[derive(Deserialize, Default)]
#[serde(default)]
struct RawVision {
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_channels: Option<usize>,
    image_size: Option<Value>,
    patch_size: Option<Value>,
    hidden_act: Option<String>,
    layer_norm_eps: Option<f64>,
}

/// A family's vision defaults: hidden, intermediate, layers, heads, image and patch sides.
struct VisionDefaults([usize; 6]);

/// `Idefics3VisionConfig`'s.
const IDEFICS3_VISION: VisionDefaults = VisionDefaults([1152, 3072, 12, 16, 224, 32]);
/// `SiglipVisionConfig`'s (Gemma 3's tower).
const SIGLIP_VISION: VisionDefaults = VisionDefaults([768, 3072, 12, 12, 224, 16]);

/// The part of `text_config` the connector needs.
#[derive(Deserialize, Default)]
#[serde(default)]
struct RawText {
    model_type: Option<String>,
    hidden_size: Option<usize>,
}

/// The top level: both families' keys, each absent one `None` (the family's default).
#[derive(Deserialize)]
struct RawConfig {
    vision_config: Option<RawVision>,
    text_config: Option<RawText>,
    scale_factor: Option<usize>,
    image_token_id: Option<u32>,
    image_token_index: Option<u32>,
    mm_tokens_per_image: Option<usize>,
}

/// `LlamaConfig`'s `hidden_size`, the text model transformers builds when `text_config` is
/// absent or names no other type.
const LLAMA_HIDDEN: usize = 4096;
/// `Gemma3TextConfig`'s `hidden_size`.
const GEMMA3_HIDDEN: usize = 2304;

fn bad(msg: impl std::fmt::Display) -> Error {
    Error::model_load(format!("config.json is not a valid vision-language config: {msg}"))
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

impl RawVision {
    /// The encoder's shapes: each key the config gives, else the family's default.
    fn or(self, d: &VisionDefaults, family: VisionFamily) -> Result<VisionArgs> {
        let [hidden, inter, layers, heads, image, patch] = d.0;
        let hidden_act = match self.hidden_act.as_deref().unwrap_or("gelu_pytorch_tanh") {
            "gelu_pytorch_tanh" => VisionAct::GeluTanh,
            "gelu" => VisionAct::Gelu,
            other => {
                return Err(bad(format!(
                    "vision_config.hidden_act '{other}' is not supported (gelu_pytorch_tanh, gelu)"
                )))
            }
        };
        Ok(VisionArgs {
            hidden_size: self.hidden_size.unwrap_or(hidden),
            intermediate_size: self.intermediate_size.unwrap_or(inter),
            num_hidden_layers: self.num_hidden_layers.unwrap_or(layers),
            num_attention_heads: self.num_attention_heads.unwrap_or(heads),
            image_size: self.image_size.as_ref().map_or(Ok(image), |v| side(v, "image_size"))?,
            patch_size: self.patch_size.as_ref().map_or(Ok(patch), |v| side(v, "patch_size"))?,
            num_channels: self.num_channels.unwrap_or(3),
            layer_norm_eps: self.layer_norm_eps.unwrap_or(1e-6),
            hidden_act,
            family,
            text_hidden_size: 0,
            image_token_id: 0,
        })
    }
}

impl VisionArgs {
    /// Parses an Idefics3 (or SmolVLM, the same tower) or a Gemma 3 `config.json`.
    pub fn from_hf_config(json: &str) -> Result<Self> {
        let v: Value =
            serde_json::from_str(json).map_err(|e| Error::model_load(format!("config.json is not valid JSON: {e}")))?;
        let gemma3 = match v.get("model_type").and_then(Value::as_str) {
            Some("idefics3" | "smolvlm") => false,
            Some("gemma3") => true,
            Some(other) => return Err(bad(format!("model_type is '{other}', expected 'idefics3' or 'gemma3'"))),
            None => return Err(bad("model_type is missing (expected 'idefics3' or 'gemma3')")),
        };
        // The error names the key at fault (`vision_config.hidden_size: invalid type: ...`).
        let raw: RawConfig = serde_path_to_error::deserialize(v).map_err(|e| {
            let at = e.path().to_string();
            bad(format!("{at}: {}", e.into_inner()))
        })?;
        let text = raw.text_config.unwrap_or_default();
        let vision = raw.vision_config.unwrap_or_default();
        let args = if gemma3 {
            let family = VisionFamily::Gemma3 { mm_tokens_per_image: raw.mm_tokens_per_image.unwrap_or(256) };
            let mut a = vision.or(&SIGLIP_VISION, family)?;
            a.text_hidden_size = text.hidden_size.unwrap_or(GEMMA3_HIDDEN);
            a.image_token_id = raw.image_token_index.or(raw.image_token_id).unwrap_or(262_144);
            a
        } else {
            let family = VisionFamily::Idefics3 { scale_factor: raw.scale_factor.unwrap_or(2) };
            let mut a = vision.or(&IDEFICS3_VISION, family)?;
            a.text_hidden_size = match (text.hidden_size, text.model_type.as_deref()) {
                (Some(h), _) => h,
                (None, None | Some("llama")) => LLAMA_HIDDEN,
                (None, Some(t)) => return Err(bad(format!("text_config.hidden_size is missing (text model '{t}')"))),
            };
            a.image_token_id = raw.image_token_id.unwrap_or(128_257);
            a
        };
        args.validate()?;
        Ok(args)
    }

    /// Sizes that are zero or do not divide what they must, each named by its key.
    pub(crate) fn validate(&self) -> Result<()> {
        let sizes = [
            ("vision_config.hidden_size", self.hidden_size),
            ("vision_config.intermediate_size", self.intermediate_size),
            ("vision_config.num_hidden_layers", self.num_hidden_layers),
            ("vision_config.num_attention_heads", self.num_attention_heads),
            ("vision_config.image_size", self.image_size),
            ("vision_config.patch_size", self.patch_size),
            ("vision_config.num_channels", self.num_channels),
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
        match self.family {
            VisionFamily::Idefics3 { scale_factor: 0 } => Err(bad("scale_factor is 0")),
            VisionFamily::Idefics3 { scale_factor } => {
                divides((scale_factor, "scale_factor"), (self.patches_per_side(), "the patches per side"))
            }
            VisionFamily::Gemma3 { mm_tokens_per_image: n } => {
                let side = n.isqrt();
                if n == 0 || side * side != n {
                    return Err(bad(format!("mm_tokens_per_image ({n}) is not a positive square")));
                }
                divides((side, "the side of mm_tokens_per_image"), (self.patches_per_side(), "the patches per side"))
            }
        }
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

    /// Image tokens (features) per tile: Idefics3's `num_patches / scale_factor^2`
    /// (transformers' `image_seq_len`), Gemma 3's `mm_tokens_per_image`.
    pub fn image_seq_len(&self) -> usize {
        match self.family {
            VisionFamily::Idefics3 { scale_factor: s } => self.num_patches() / (s * s),
            VisionFamily::Gemma3 { mm_tokens_per_image } => mm_tokens_per_image,
        }
    }

    /// Whether the tokens of one image attend to each other bidirectionally in the text model
    /// (`InputEmbeds::bidirectional`).
    pub fn bidirectional_images(&self) -> bool {
        matches!(self.family, VisionFamily::Gemma3 { .. })
    }

    /// Pixel values per tile: `num_channels * image_size^2`.
    pub fn tile_len(&self) -> usize {
        self.num_channels * self.image_size * self.image_size
    }

    /// The projector's input width: Idefics3's `hidden_size * scale_factor^2`, Gemma 3's
    /// `hidden_size`.
    pub fn connector_in(&self) -> usize {
        match self.family {
            VisionFamily::Idefics3 { scale_factor: s } => self.hidden_size * s * s,
            VisionFamily::Gemma3 { .. } => self.hidden_size,
        }
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
        assert_eq!(
            (d.family, d.text_hidden_size, d.image_token_id),
            (VisionFamily::Idefics3 { scale_factor: 2 }, 4096, 128_257)
        );
        let listed = r#"{"model_type": "smolvlm", "vision_config": {"image_size": [64, 64], "patch_size": [8, 8],
            "hidden_act": "gelu", "hidden_size": 32, "num_attention_heads": 2}, "text_config": {"hidden_size": 16}}"#;
        let l = VisionArgs::from_hf_config(listed).unwrap();
        assert_eq!((l.image_size, l.patch_size, l.hidden_act, l.image_seq_len()), (64, 8, VisionAct::Gelu, 16));
    }

    /// gemma-3-4b-it's config.json (its vision part, the top level and the text width), and
    /// the families' defaults where keys are absent.
    #[test]
    fn a_gemma3_config_gives_its_shapes_and_defaults() {
        let real = r#"{"model_type": "gemma3", "mm_tokens_per_image": 256, "image_token_index": 262144,
            "text_config": {"hidden_size": 2560, "model_type": "gemma3_text"},
            "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                "patch_size": 14, "vision_use_head": false}}"#;
        let a = VisionArgs::from_hf_config(real).unwrap();
        assert_eq!((a.num_patches(), a.image_seq_len(), a.connector_in()), (4096, 256, 1152));
        assert_eq!((a.text_hidden_size, a.image_token_id, a.bidirectional_images()), (2560, 262_144, true));
        let d = VisionArgs::from_hf_config(r#"{"model_type": "gemma3", "vision_config": {"image_size": 224}}"#);
        // SigLIP's defaults: 224 / 16 = 14 patches a side, which 16 tokens (4 a side) cannot pool.
        assert!(d.unwrap_err().to_string().contains("mm_tokens_per_image"));
        let d = VisionArgs::from_hf_config(r#"{"model_type": "gemma3", "mm_tokens_per_image": 49}"#).unwrap();
        assert_eq!((d.hidden_size, d.num_attention_heads, d.patch_size, d.image_seq_len()), (768, 12, 16, 49));
        assert_eq!((d.text_hidden_size, d.image_token_id), (2304, 262_144));
        let idefics = VisionArgs::from_hf_config(SMOLVLM_256M).unwrap();
        assert!(!idefics.bidirectional_images());
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
            (r#"{"model_type": "gemma3", "mm_tokens_per_image": 48}"#, "mm_tokens_per_image"),
            (r#"{"model_type": "gemma3", "mm_tokens_per_image": 0}"#, "mm_tokens_per_image"),
            (r#"{"model_type": "gemma3", "image_token_index": -4}"#, "image_token_index"),
        ];
        for (json, key) in cases {
            match VisionArgs::from_hf_config(json) {
                Err(Error::ModelLoad(m)) => assert!(m.contains(key), "{json}: '{m}' does not name {key}"),
                other => panic!("{json}: expected a ModelLoad error naming {key}, got {other:?}"),
            }
        }
    }
}
