//! `Qwen2VlVisionArgs` from a Qwen2-VL or Qwen2.5-VL `config.json`: the vision transformer's
//! `vision_config`, the patch merger's output width and the image token.
//!
//! The two families name their keys differently: Qwen2-VL's width is `embed_dim`, its MLP
//! `embed_dim * mlp_ratio` and its `hidden_size` the merger's output (the text width);
//! Qwen2.5-VL's width is `hidden_size`, its MLP `intermediate_size` and the merger's output
//! `out_hidden_size`, with `window_size` and `fullatt_block_indexes` for window attention.
//!
//! Invariants: a key the config omits takes the default of transformers' `Qwen2VLVisionConfig`
//! or `Qwen2_5_VLVisionConfig` (the vision rotary base `rope_parameters.rope_theta`, else
//! `rope_theta`, else 10000; never the text model's top-level `rope_theta`); a key of the wrong
//! type, a zero size, heads that do not divide the width, a head width the 2D rotary cannot
//! split in four, a window smaller than one merged unit, a rotary type other than `axial`, an
//! unsupported `hidden_act`, or a merger width other than the text model's `hidden_size` (where
//! the config gives one) is `Error::ModelLoad` naming the key.

use lmplex_core::{Error, Result};
use serde::Deserialize;
use serde_json::Value;

/// Which of the two towers: they differ in norms, MLP and attention windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qwen2VlFamily {
    /// Qwen2-VL (`model_type` "qwen2_vl"): LayerNorm, an MLP `fc1 -> act -> fc2`, full
    /// attention per frame in every block.
    Qwen2Vl,
    /// Qwen2.5-VL (`model_type` "qwen2_5_vl"): RMSNorm, a SwiGLU-style MLP
    /// `down(act(gate) * up)`, window attention in the blocks not in `fullatt_block_indexes`.
    Qwen25Vl,
}

/// The vision MLP's activation (`vision_config.hidden_act`), as torch computes it in f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qwen2VlAct {
    /// `quick_gelu`: `x * sigmoid(1.702 x)` (Qwen2-VL's).
    QuickGelu,
    /// `silu`: `x * sigmoid(x)` (Qwen2.5-VL's).
    Silu,
    /// `gelu`: `0.5 x (1 + erf(x / sqrt(2)))`.
    Gelu,
    /// `gelu_pytorch_tanh`: `0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`.
    GeluTanh,
}

/// The shapes of a Qwen2-VL or Qwen2.5-VL vision tower (patch embedding, blocks, merger).
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen2VlVisionArgs {
    /// The family (`model_type`).
    pub family: Qwen2VlFamily,
    /// `depth`: vision blocks.
    pub depth: usize,
    /// The blocks' width: Qwen2-VL's `embed_dim`, Qwen2.5-VL's `hidden_size`.
    pub hidden_size: usize,
    /// The MLP's hidden width: Qwen2-VL's `int(embed_dim * mlp_ratio)`, Qwen2.5-VL's
    /// `intermediate_size`.
    pub intermediate_size: usize,
    /// `num_heads`.
    pub num_heads: usize,
    /// `in_channels`.
    pub in_channels: usize,
    /// `patch_size`: a patch's side in pixels.
    pub patch_size: usize,
    /// `temporal_patch_size`: frames per patch (an image is repeated to fill them).
    pub temporal_patch_size: usize,
    /// `spatial_merge_size`: patches per side of one merged unit (one image token).
    pub spatial_merge_size: usize,
    /// `hidden_act`.
    pub hidden_act: Qwen2VlAct,
    /// The 2D rotary base (`rope_parameters.rope_theta`).
    pub rope_theta: f64,
    /// Qwen2.5-VL's `window_size` in pixels (`None` for Qwen2-VL: full attention only).
    pub window_size: Option<usize>,
    /// Qwen2.5-VL's `fullatt_block_indexes`: the blocks that attend over whole frames.
    pub fullatt_block_indexes: Vec<usize>,
    /// The merger's output, the width of an image feature: Qwen2-VL's `hidden_size`,
    /// Qwen2.5-VL's `out_hidden_size`; equal to the text model's `hidden_size`.
    pub text_hidden_size: usize,
    /// `image_token_id`: the token whose embeddings the features replace.
    pub image_token_id: u32,
}

/// `rope_parameters` of `vision_config`.
#[derive(Deserialize, Default)]
#[serde(default)]
struct RawRope {
    rope_theta: Option<f64>,
    rope_type: Option<String>,
}

/// `vision_config` as the config holds it, both families' keys; absent ones take defaults.
#[derive(Deserialize, Default)]
#[serde(default)]
struct RawVision {
    #[serde(alias = "num_hidden_layers")]
    depth: Option<usize>,
    embed_dim: Option<usize>,
    hidden_size: Option<usize>,
    mlp_ratio: Option<f64>,
    intermediate_size: Option<usize>,
    out_hidden_size: Option<usize>,
    #[serde(alias = "num_attention_heads")]
    num_heads: Option<usize>,
    in_channels: Option<usize>,
    patch_size: Option<usize>,
    temporal_patch_size: Option<usize>,
    spatial_merge_size: Option<usize>,
    hidden_act: Option<String>,
    window_size: Option<usize>,
    fullatt_block_indexes: Option<Vec<usize>>,
    rope_theta: Option<f64>,
    rope_parameters: Option<RawRope>,
}

/// The part of `text_config` the merger must agree with.
#[derive(Deserialize, Default)]
#[serde(default)]
struct RawText {
    hidden_size: Option<usize>,
}

/// The top level. The Hub's configs are flat (the text model's keys at the top, no
/// `text_config`); transformers 5 saves a `text_config`.
#[derive(Deserialize)]
struct RawConfig {
    vision_config: Option<RawVision>,
    text_config: Option<RawText>,
    hidden_size: Option<usize>,
    image_token_id: Option<u32>,
}

/// `Qwen2VLConfig`'s and `Qwen2_5_VLConfig`'s `image_token_id`.
const IMAGE_TOKEN_ID: u32 = 151_655;
/// `PreTrainedConfig.default_theta`, the vision configs' rotary base.
const ROPE_THETA: f64 = 10_000.0;

fn bad(msg: impl std::fmt::Display) -> Error {
    Error::model_load(format!("config.json is not a valid Qwen2-VL config: {msg}"))
}

impl RawVision {
    /// The tower's shapes: each key the config gives, else the family's default.
    fn resolve(self, family: Qwen2VlFamily) -> Result<Qwen2VlVisionArgs> {
        let act = self.hidden_act.as_deref().unwrap_or(match family {
            Qwen2VlFamily::Qwen2Vl => "quick_gelu",
            Qwen2VlFamily::Qwen25Vl => "silu",
        });
        let hidden_act = match act {
            "quick_gelu" => Qwen2VlAct::QuickGelu,
            "silu" => Qwen2VlAct::Silu,
            "gelu" => Qwen2VlAct::Gelu,
            "gelu_pytorch_tanh" => Qwen2VlAct::GeluTanh,
            other => {
                return Err(bad(format!(
                    "vision_config.hidden_act '{other}' is not supported (quick_gelu, silu, gelu, gelu_pytorch_tanh)"
                )))
            }
        };
        let rope = self.rope_parameters.unwrap_or_default();
        if let Some(t) = rope.rope_type.as_deref().filter(|t| *t != "axial") {
            return Err(bad(format!("vision_config.rope_parameters.rope_type is '{t}', only 'axial' is supported")));
        }
        let rope_theta = rope.rope_theta.or(self.rope_theta).unwrap_or(ROPE_THETA);
        let (hidden_size, intermediate_size, text_hidden_size, window_size, fullatt) = match family {
            Qwen2VlFamily::Qwen2Vl => {
                let embed = self.embed_dim.unwrap_or(1280);
                let ratio = self.mlp_ratio.unwrap_or(4.0);
                if !(ratio.is_finite() && ratio > 0.0) {
                    return Err(bad(format!("vision_config.mlp_ratio is {ratio}")));
                }
                // transformers' `int(embed_dim * mlp_ratio)`.
                let mlp = (embed as f64 * ratio) as usize;
                (embed, mlp, self.hidden_size.unwrap_or(3584), None, Vec::new())
            }
            Qwen2VlFamily::Qwen25Vl => (
                self.hidden_size.unwrap_or(3584),
                self.intermediate_size.unwrap_or(3420),
                self.out_hidden_size.unwrap_or(3584),
                Some(self.window_size.unwrap_or(112)),
                self.fullatt_block_indexes.unwrap_or_else(|| vec![7, 15, 23, 31]),
            ),
        };
        Ok(Qwen2VlVisionArgs {
            family,
            depth: self.depth.unwrap_or(32),
            hidden_size,
            intermediate_size,
            num_heads: self.num_heads.unwrap_or(16),
            in_channels: self.in_channels.unwrap_or(3),
            patch_size: self.patch_size.unwrap_or(14),
            temporal_patch_size: self.temporal_patch_size.unwrap_or(2),
            spatial_merge_size: self.spatial_merge_size.unwrap_or(2),
            hidden_act,
            rope_theta,
            window_size,
            fullatt_block_indexes: fullatt,
            text_hidden_size,
            image_token_id: IMAGE_TOKEN_ID,
        })
    }
}

impl Qwen2VlVisionArgs {
    /// Parses a Qwen2-VL (`model_type` "qwen2_vl") or Qwen2.5-VL ("qwen2_5_vl") `config.json`.
    pub fn from_hf_config(json: &str) -> Result<Self> {
        let v: Value =
            serde_json::from_str(json).map_err(|e| Error::model_load(format!("config.json is not valid JSON: {e}")))?;
        let family = match v.get("model_type").and_then(Value::as_str) {
            Some("qwen2_vl") => Qwen2VlFamily::Qwen2Vl,
            Some("qwen2_5_vl") => Qwen2VlFamily::Qwen25Vl,
            Some(other) => return Err(bad(format!("model_type is '{other}', expected 'qwen2_vl' or 'qwen2_5_vl'"))),
            None => return Err(bad("model_type is missing (expected 'qwen2_vl' or 'qwen2_5_vl')")),
        };
        // The error names the key at fault (`vision_config.depth: invalid type: ...`).
        let raw: RawConfig = serde_path_to_error::deserialize(v).map_err(|e| {
            let at = e.path().to_string();
            bad(format!("{at}: {}", e.into_inner()))
        })?;
        let mut args = raw.vision_config.unwrap_or_default().resolve(family)?;
        args.image_token_id = raw.image_token_id.unwrap_or(IMAGE_TOKEN_ID);
        // The text width: `text_config`'s, or the flat Hub config's top-level one.
        let text = match raw.text_config {
            Some(t) => t.hidden_size.map(|h| ("text_config.hidden_size", h)),
            None => raw.hidden_size.map(|h| ("hidden_size", h)),
        };
        if let Some((key, width)) = text.filter(|&(_, w)| w != args.text_hidden_size) {
            let merger = args.merger_out_key();
            return Err(bad(format!("{merger} ({}) differs from {key} ({width})", args.text_hidden_size)));
        }
        args.validate()?;
        Ok(args)
    }

    /// The key of the merger's output width.
    fn merger_out_key(&self) -> &'static str {
        match self.family {
            Qwen2VlFamily::Qwen2Vl => "vision_config.hidden_size",
            Qwen2VlFamily::Qwen25Vl => "vision_config.out_hidden_size",
        }
    }

    /// Sizes that are zero or do not fit together, each named by its key.
    pub(crate) fn validate(&self) -> Result<()> {
        let (width, inter) = match self.family {
            Qwen2VlFamily::Qwen2Vl => ("vision_config.embed_dim", "vision_config.embed_dim * mlp_ratio"),
            Qwen2VlFamily::Qwen25Vl => ("vision_config.hidden_size", "vision_config.intermediate_size"),
        };
        let sizes = [
            ("vision_config.depth", self.depth),
            (width, self.hidden_size),
            (inter, self.intermediate_size),
            ("vision_config.num_heads", self.num_heads),
            ("vision_config.in_channels", self.in_channels),
            ("vision_config.patch_size", self.patch_size),
            ("vision_config.temporal_patch_size", self.temporal_patch_size),
            ("vision_config.spatial_merge_size", self.spatial_merge_size),
            (self.merger_out_key(), self.text_hidden_size),
        ];
        if let Some((key, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return Err(bad(format!("{key} is 0")));
        }
        if !self.hidden_size.is_multiple_of(self.num_heads) {
            return Err(bad(format!(
                "vision_config.num_heads ({}) does not divide {width} ({})",
                self.num_heads, self.hidden_size
            )));
        }
        if !self.head_dim().is_multiple_of(4) {
            return Err(bad(format!(
                "{width} / vision_config.num_heads ({}) is not a multiple of 4, which the 2D rotary needs",
                self.head_dim()
            )));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(bad(format!("vision_config.rope_parameters.rope_theta is {}", self.rope_theta)));
        }
        if self.window_size.is_some() && self.window_units() == 0 {
            return Err(bad(format!(
                "vision_config.window_size ({}) is smaller than one merged unit ({} pixels)",
                self.window_size.unwrap_or(0),
                self.spatial_merge_size * self.patch_size
            )));
        }
        Ok(())
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// Values in one row of `pixel_values` (one patch): `in_channels * temporal_patch_size *
    /// patch_size^2`, in the order channel, frame, row, column.
    pub fn patch_len(&self) -> usize {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// Patches per image token: `spatial_merge_size^2`.
    pub fn merge_unit(&self) -> usize {
        self.spatial_merge_size * self.spatial_merge_size
    }

    /// Image tokens (features) of an image of grid `[t, h, w]` (in patches):
    /// `t * h * w / spatial_merge_size^2`.
    pub fn tokens(&self, grid: [usize; 3]) -> usize {
        grid.iter().product::<usize>() / self.merge_unit()
    }

    /// Qwen2.5-VL's window side in merged units (`window_size / spatial_merge_size /
    /// patch_size`, as transformers divides); 0 without windows.
    pub fn window_units(&self) -> usize {
        self.window_size.map_or(0, |w| w / self.spatial_merge_size / self.patch_size)
    }

    /// Whether block `i` attends within windows (Qwen2.5-VL, `i` not in
    /// `fullatt_block_indexes`) rather than over whole frames.
    pub fn windowed_block(&self, i: usize) -> bool {
        self.window_size.is_some() && !self.fullatt_block_indexes.contains(&i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen2-VL-2B-Instruct's config.json (flat: the text model's keys at the top level).
    const QWEN2_VL_2B: &str = r#"{"model_type": "qwen2_vl", "hidden_size": 1536, "hidden_act": "silu",
        "image_token_id": 151655, "rope_theta": 1000000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "vision_config": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16, "in_chans": 3,
            "hidden_size": 1536, "patch_size": 14, "spatial_merge_size": 2, "spatial_patch_size": 14,
            "temporal_patch_size": 2}}"#;

    /// Qwen2.5-VL-3B-Instruct's config.json.
    const QWEN2_5_VL_3B: &str = r#"{"model_type": "qwen2_5_vl", "hidden_size": 2048, "rope_theta": 1000000.0,
        "image_token_id": 151655,
        "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
            "num_heads": 16, "in_chans": 3, "out_hidden_size": 2048, "patch_size": 14, "spatial_merge_size": 2,
            "spatial_patch_size": 14, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
            "tokens_per_second": 2, "temporal_patch_size": 2}}"#;

    #[test]
    fn real_configs_give_their_shapes() {
        let a = Qwen2VlVisionArgs::from_hf_config(QWEN2_VL_2B).unwrap();
        assert_eq!((a.family, a.depth, a.hidden_size, a.intermediate_size), (Qwen2VlFamily::Qwen2Vl, 32, 1280, 5120));
        assert_eq!((a.head_dim(), a.patch_len(), a.merge_unit(), a.text_hidden_size), (80, 1176, 4, 1536));
        // The top-level rope_theta and hidden_act are the text model's.
        assert_eq!((a.rope_theta, a.hidden_act, a.image_token_id), (10_000.0, Qwen2VlAct::QuickGelu, 151_655));
        assert_eq!((a.window_size, a.window_units(), a.windowed_block(0)), (None, 0, false));
        let b = Qwen2VlVisionArgs::from_hf_config(QWEN2_5_VL_3B).unwrap();
        assert_eq!(
            (b.family, b.hidden_size, b.intermediate_size, b.text_hidden_size),
            (Qwen2VlFamily::Qwen25Vl, 1280, 3420, 2048)
        );
        assert_eq!((b.hidden_act, b.window_units(), b.rope_theta), (Qwen2VlAct::Silu, 4, 10_000.0));
        assert!(b.windowed_block(0) && b.windowed_block(6) && !b.windowed_block(7) && !b.windowed_block(31));
        assert_eq!(b.tokens([1, 4, 6]), 6);
    }

    #[test]
    fn absent_keys_take_transformers_defaults() {
        let a = Qwen2VlVisionArgs::from_hf_config(r#"{"model_type": "qwen2_vl"}"#).unwrap();
        assert_eq!((a.depth, a.hidden_size, a.intermediate_size, a.num_heads), (32, 1280, 5120, 16));
        assert_eq!((a.patch_size, a.temporal_patch_size, a.spatial_merge_size, a.in_channels), (14, 2, 2, 3));
        assert_eq!(a.text_hidden_size, 3584);
        let b = Qwen2VlVisionArgs::from_hf_config(r#"{"model_type": "qwen2_5_vl", "text_config": {}}"#).unwrap();
        assert_eq!((b.hidden_size, b.intermediate_size, b.text_hidden_size), (3584, 3420, 3584));
        assert_eq!(
            (b.window_size, b.fullatt_block_indexes.clone(), b.hidden_act),
            (Some(112), vec![7, 15, 23, 31], Qwen2VlAct::Silu)
        );
        let c = Qwen2VlVisionArgs::from_hf_config(
            r#"{"model_type": "qwen2_vl", "vision_config": {"rope_parameters": {"rope_type": "axial", "rope_theta": 500.0},
                "num_attention_heads": 8, "num_hidden_layers": 3, "hidden_act": "gelu"}}"#,
        )
        .unwrap();
        assert_eq!((c.rope_theta, c.num_heads, c.depth, c.hidden_act), (500.0, 8, 3, Qwen2VlAct::Gelu));
    }

    #[test]
    fn a_bad_key_is_a_load_error_naming_it() {
        let cases = [
            (r#"{"vision_config": {}}"#, "model_type"),
            (r#"{"model_type": "idefics3"}"#, "model_type"),
            (r#"{"model_type": "qwen2_vl", "vision_config": {"depth": "deep"}}"#, "vision_config.depth"),
            (r#"{"model_type": "qwen2_vl", "vision_config": {"depth": 0}}"#, "vision_config.depth"),
            (r#"{"model_type": "qwen2_vl", "vision_config": {"patch_size": [14, 14]}}"#, "vision_config.patch_size"),
            (r#"{"model_type": "qwen2_vl", "vision_config": {"num_heads": 3}}"#, "vision_config.num_heads"),
            (r#"{"model_type": "qwen2_vl", "vision_config": {"embed_dim": 48, "num_heads": 8}}"#, "multiple of 4"),
            (r#"{"model_type": "qwen2_vl", "vision_config": {"mlp_ratio": -1}}"#, "vision_config.mlp_ratio"),
            (r#"{"model_type": "qwen2_vl", "vision_config": {"hidden_act": "relu"}}"#, "vision_config.hidden_act"),
            (
                r#"{"model_type": "qwen2_vl", "vision_config": {"rope_parameters": {"rope_type": "default"}}}"#,
                "rope_type",
            ),
            (r#"{"model_type": "qwen2_vl", "vision_config": {"rope_theta": -1.0}}"#, "rope_theta"),
            (r#"{"model_type": "qwen2_vl", "hidden_size": 1536}"#, "vision_config.hidden_size"),
            (r#"{"model_type": "qwen2_5_vl", "text_config": {"hidden_size": 64}}"#, "vision_config.out_hidden_size"),
            (r#"{"model_type": "qwen2_5_vl", "vision_config": {"window_size": 27}}"#, "vision_config.window_size"),
            (
                r#"{"model_type": "qwen2_5_vl", "vision_config": {"fullatt_block_indexes": [-1]}}"#,
                "fullatt_block_indexes",
            ),
            (r#"{"model_type": "qwen2_5_vl", "image_token_id": "x"}"#, "image_token_id"),
        ];
        for (json, key) in cases {
            match Qwen2VlVisionArgs::from_hf_config(json) {
                Err(Error::ModelLoad(m)) => assert!(m.contains(key), "{json}: '{m}' does not name {key}"),
                other => panic!("{json}: expected a ModelLoad error naming {key}, got {other:?}"),
            }
        }
    }
}
