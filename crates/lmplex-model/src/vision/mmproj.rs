//! `TowerArgs` from a llama.cpp multimodal projector file (`mmproj`, written by
//! `convert_hf_to_gguf.py --mmproj`): its `clip.*` metadata and its tensors' shapes. The tower's
//! weights are then read by HF name (`WeightSource::mmproj`).
//!
//! Invariants: a family is chosen by `clip.projector_type` (`idefics3`, `gemma3`,
//! `qwen2vl_merger`, `qwen2.5vl_merger`); any other is `Error::ModelLoad` naming it. What the
//! file does not record takes the value llama.cpp's `clip.cpp` assumes for that family, which is
//! the HF config's default: Idefics3's scale factor 2, Gemma 3's pooling of 4x4 patches, Qwen's
//! merge size 2, 2 frames per patch, rotary base 10000 and Qwen2.5-VL's 112-pixel windows, the
//! FFN activation from `clip.use_gelu` / `clip.use_silu` (neither: quick GELU). Widths llama.cpp
//! reads from tensors (the FFN's, the input channels) are read from them too. The layer-norm
//! epsilon, stored as f32, is taken at its shortest decimal (`1e-6`, as the HF config says it).
//! The shapes are validated as a `config.json`'s are.

use super::{Qwen2VlAct, Qwen2VlFamily, Qwen2VlVisionArgs, TowerArgs, VisionAct, VisionArgs, VisionFamily};
use crate::weights::WeightSource;
use candle_core::quantized::gguf_file::{Content, Value};
use lmplex_core::{Error, Result};
use std::path::Path;

/// The largest size any key may give (a negative one reads as more).
const MAX_SIZE: u64 = 1 << 20;

/// llama.cpp's window for Qwen2.5-VL when the file has no `clip.vision.window_size`.
const QWEN25_WINDOW: usize = 112;

/// The metadata of one mmproj file, read with errors naming the file and key.
struct Meta<'c> {
    c: &'c Content,
    path: &'c Path,
}

impl Meta<'_> {
    fn err(&self, what: impl std::fmt::Display) -> Error {
        Error::model_load(format!("{}: {what}", self.path.display()))
    }

    fn get(&self, key: &str) -> Option<&Value> {
        self.c.metadata.get(key)
    }

    fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?.ok_or_else(|| self.err(format!("mmproj has no '{key}'")))
    }

    /// A size key, bounded well above any real tower's (lists are built from these before any
    /// weight is read: a corrupt header is an error, not a huge allocation).
    fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let n =
            v.to_u32().map(u64::from).or_else(|_| v.to_u64()).or_else(|_| v.to_i32().map(i64::from).map(|x| x as u64));
        let n = n.map_err(|e| self.err(format!("'{key}': {e}")))?;
        if n > MAX_SIZE {
            return Err(self.err(format!("'{key}' is {n}, more than {MAX_SIZE}")));
        }
        Ok(Some(n as usize))
    }

    fn flag(&self, key: &str) -> bool {
        self.get(key).and_then(|v| v.to_bool().ok()).unwrap_or(false)
    }

    /// A stored tensor's shape as candle reads it (HF's dimension order).
    fn dims(&self, name: &str) -> Result<Vec<usize>> {
        let info = self.c.tensor_infos.get(name).ok_or_else(|| self.err(format!("mmproj has no tensor '{name}'")))?;
        Ok(info.shape.dims().to_vec())
    }

    /// `dims(name)[i]`, named in the error when the tensor has fewer dimensions.
    fn dim(&self, name: &str, i: usize) -> Result<usize> {
        let dims = self.dims(name)?;
        dims.get(i).copied().ok_or_else(|| self.err(format!("tensor '{name}' has shape {dims:?}")))
    }

    /// Maps a validation error (which names HF config keys) to one naming this file.
    fn invalid(&self, e: Error) -> Error {
        self.err(format!("the mmproj's tower does not fit together: {e}"))
    }
}

/// A multimodal projector file, opened: its tower's shapes, a source reading its tensors by HF
/// name, and what it records of the family's HF image processor.
pub struct Mmproj {
    /// The tower (`TowerArgs::from_mmproj`), for `VisionTower::load` or `Qwen2VlTower::load`.
    pub tower: TowerArgs,
    /// Its tensors by HF name (`WeightSource::mmproj`).
    pub weights: WeightSource,
    /// The family's `preprocessor_config.json` as far as the file records it (`image_mean`,
    /// `image_std`, sizes), under HF's keys; what it does not record is left to the processor's
    /// defaults, which are transformers'.
    pub preprocessor_config: serde_json::Value,
    /// The family's `processor_config.json` keys the file implies (image tokens per tile).
    pub processor_config: serde_json::Value,
}

impl Mmproj {
    /// Opens the mmproj file at `path`. `image_token_id` gives the text model's id of the
    /// family's image token (`<image>`, `<image_soft_token>`, `<|image_pad|>`), which the file
    /// does not hold.
    pub fn open(path: &Path, image_token_id: impl FnOnce(&str) -> Result<u32>) -> Result<Self> {
        let (content, _) = crate::loader::read_gguf_header(path)?;
        let m = Meta { c: &content, path };
        let token = match projector_type(&m)?.as_str() {
            "idefics3" => "<image>",
            "gemma3" => "<image_soft_token>",
            _ => "<|image_pad|>",
        };
        let tower = TowerArgs::from_mmproj(&content, path, image_token_id(token)?)?;
        let (preprocessor_config, processor_config) = processor_configs(&m, &tower)?;
        Ok(Self { tower, weights: WeightSource::mmproj(path, content)?, preprocessor_config, processor_config })
    }
}

/// `clip.projector_type` (or `clip.vision.projector_type`) of a projector file with a vision
/// encoder (a text model's GGUF, or an audio projector, is refused saying so).
fn projector_type(m: &Meta) -> Result<String> {
    match m.get("general.architecture").and_then(|v| v.to_string().ok()).map(String::as_str) {
        None | Some("clip") => {}
        Some(other) => return Err(m.err(format!("is a '{other}' model, not a multimodal projector (mmproj)"))),
    }
    if m.get("clip.has_vision_encoder").is_some_and(|v| !v.to_bool().unwrap_or(true)) {
        return Err(m.err("mmproj has no vision encoder"));
    }
    m.get("clip.projector_type")
        .or_else(|| m.get("clip.vision.projector_type"))
        .and_then(|v| v.to_string().ok().cloned())
        .ok_or_else(|| m.err("mmproj has no 'clip.projector_type'"))
}

/// The HF `preprocessor_config.json` and `processor_config.json` keys the file records.
fn processor_configs(m: &Meta, tower: &TowerArgs) -> Result<(serde_json::Value, serde_json::Value)> {
    use serde_json::json;
    let stats = |key: &str| -> Result<Vec<f32>> {
        let v = m.get(key).ok_or_else(|| m.err(format!("mmproj has no '{key}'")))?;
        let values = v.to_vec().map_err(|e| m.err(format!("'{key}': {e}")))?;
        let floats = values.iter().map(|x| x.to_f32()).collect::<candle_core::Result<Vec<f32>>>();
        floats.map_err(|e| m.err(format!("'{key}': {e}")))
    };
    // At their shortest decimals, as the HF config wrote them (0.5, not 0.5 widened from f32).
    let decimal =
        |v: Vec<f32>| v.iter().map(|x| x.to_string().parse::<f64>().unwrap_or(f64::from(*x))).collect::<Vec<_>>();
    let mut pre = json!({
        "image_mean": decimal(stats("clip.vision.image_mean")?),
        "image_std": decimal(stats("clip.vision.image_std")?),
    });
    let processor = match tower {
        TowerArgs::Siglip(a) => match a.family {
            VisionFamily::Idefics3 { .. } => {
                pre["max_image_size"] = json!({"longest_edge": a.image_size});
                if let Some(edge) = m.opt_usize("clip.vision.preproc_image_size")? {
                    pre["size"] = json!({"longest_edge": edge});
                }
                json!({"image_seq_len": a.image_seq_len()})
            }
            VisionFamily::Gemma3 { mm_tokens_per_image } => {
                pre["size"] = json!({"height": a.image_size, "width": a.image_size});
                json!({"image_seq_length": mm_tokens_per_image})
            }
        },
        TowerArgs::Qwen2Vl(a) => {
            pre["patch_size"] = json!(a.patch_size);
            pre["temporal_patch_size"] = json!(a.temporal_patch_size);
            pre["merge_size"] = json!(a.spatial_merge_size);
            json!({})
        }
    };
    Ok((pre, processor))
}

impl TowerArgs {
    /// The tower of an mmproj file whose header is `c` (read from `path`); `image_token_id` is
    /// the text model's image token (the file does not name one).
    pub fn from_mmproj(c: &Content, path: &Path, image_token_id: u32) -> Result<Self> {
        let m = Meta { c, path };
        let projector = projector_type(&m)?;
        match projector.as_str() {
            "idefics3" | "gemma3" => siglip(&m, &projector, image_token_id).map(Self::Siglip),
            "qwen2vl_merger" => qwen(&m, Qwen2VlFamily::Qwen2Vl, image_token_id).map(Self::Qwen2Vl),
            "qwen2.5vl_merger" => qwen(&m, Qwen2VlFamily::Qwen25Vl, image_token_id).map(Self::Qwen2Vl),
            other => Err(m.err(format!(
                "mmproj projector type '{other}' is not supported (idefics3, gemma3, qwen2vl_merger, qwen2.5vl_merger)"
            ))),
        }
    }
}

/// The layer-norm epsilon at its shortest decimal (the f32 the file holds, as the HF config
/// wrote it), `default` when absent.
fn epsilon(m: &Meta, default: f64) -> f64 {
    let eps = m.get("clip.vision.attention.layer_norm_epsilon").and_then(|v| v.to_f32().ok());
    eps.map_or(default, |e| e.to_string().parse().unwrap_or(f64::from(e)))
}

/// Idefics3's or Gemma 3's SigLIP tower and projector.
fn siglip(m: &Meta, projector: &str, image_token_id: u32) -> Result<VisionArgs> {
    let hidden_act = match (m.flag("clip.use_gelu"), m.flag("clip.use_silu")) {
        (true, false) => VisionAct::GeluTanh,
        _ => return Err(m.err("a SigLIP tower needs 'clip.use_gelu' (GELU, tanh approximation)")),
    };
    let (image_size, patch_size) = (m.usize("clip.vision.image_size")?, m.usize("clip.vision.patch_size")?);
    let scale = m.opt_usize("clip.vision.projector.scale_factor")?;
    let family = if projector == "gemma3" {
        let side = (image_size / patch_size.max(1)) / scale.unwrap_or(4).max(1);
        VisionFamily::Gemma3 { mm_tokens_per_image: side * side }
    } else {
        VisionFamily::Idefics3 { scale_factor: scale.unwrap_or(2) }
    };
    let args = VisionArgs {
        hidden_size: m.usize("clip.vision.embedding_length")?,
        intermediate_size: m.usize("clip.vision.feed_forward_length")?,
        num_hidden_layers: m.usize("clip.vision.block_count")?,
        num_attention_heads: m.usize("clip.vision.attention.head_count")?,
        image_size,
        patch_size,
        num_channels: m.dim("v.patch_embd.weight", 1)?,
        layer_norm_eps: epsilon(m, 1e-6),
        hidden_act,
        family,
        text_hidden_size: m.usize("clip.vision.projection_dim")?,
        image_token_id,
    };
    args.validate().map_err(|e| m.invalid(e))?;
    Ok(args)
}

/// Qwen2-VL's or Qwen2.5-VL's tower and merger.
fn qwen(m: &Meta, family: Qwen2VlFamily, image_token_id: u32) -> Result<Qwen2VlVisionArgs> {
    let hidden_act = match (m.flag("clip.use_gelu"), m.flag("clip.use_silu")) {
        (false, false) => Qwen2VlAct::QuickGelu,
        (false, true) => Qwen2VlAct::Silu,
        (true, false) => Qwen2VlAct::GeluTanh,
        (true, true) => return Err(m.err("mmproj sets both 'clip.use_gelu' and 'clip.use_silu'")),
    };
    let depth = m.usize("clip.vision.block_count")?;
    let (window_size, fullatt_block_indexes) = match family {
        Qwen2VlFamily::Qwen2Vl => (None, Vec::new()),
        Qwen2VlFamily::Qwen25Vl => {
            // llama.cpp's rule: block `i` attends over whole frames when `(i + 1) % n == 0`.
            let n = m.usize("clip.vision.n_wa_pattern")?.max(1);
            let window = m.opt_usize("clip.vision.window_size")?.unwrap_or(QWEN25_WINDOW);
            (Some(window), (0..depth).filter(|i| (i + 1) % n == 0).collect())
        }
    };
    let args = Qwen2VlVisionArgs {
        family,
        depth,
        hidden_size: m.usize("clip.vision.embedding_length")?,
        // Qwen2-VL's converter writes the text width as `feed_forward_length`; the tensor is right.
        intermediate_size: m.dim("v.blk.0.ffn_up.weight", 0)?,
        num_heads: m.usize("clip.vision.attention.head_count")?,
        in_channels: m.dim("v.patch_embd.weight", 1)?,
        patch_size: m.usize("clip.vision.patch_size")?,
        // The converter splits the Conv3d's two frames (`v.patch_embd.weight`, `.weight.1`).
        temporal_patch_size: 2,
        spatial_merge_size: m.opt_usize("clip.vision.spatial_merge_size")?.unwrap_or(2),
        hidden_act,
        rope_theta: 10_000.0,
        window_size,
        fullatt_block_indexes,
        text_hidden_size: m.usize("clip.vision.projection_dim")?,
        image_token_id,
    };
    args.validate().map_err(|e| m.invalid(e))?;
    Ok(args)
}
