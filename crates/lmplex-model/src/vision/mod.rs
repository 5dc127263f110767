//! The vision tower of Idefics3 / SmolVLM and of Gemma 3 on the CPU: a SigLIP encoder
//! (`encoder`) and the family's projector (`connector`: Idefics3's pixel shuffle then a
//! projection; `pool`: Gemma 3's average pooling, RMSNorm and projection), which turn image
//! tiles into the features that replace the image tokens' embeddings. The arithmetic is
//! transformers' (`get_image_features` of `Idefics3Model`, `Gemma3Model`) in f32.
//!
//! Data flow: `VisionArgs::from_hf_config(config.json)`, `VisionTower::load(weights, args)`,
//! then `encode(pixel_values, tiles)`: `[tiles, channels, image_size, image_size]`
//! channel-first pixel values (the HF processor's output, already rescaled and normalized; a
//! Gemma 3 image is one tile) to `[tiles * image_seq_len, text_hidden]` features, tile after
//! tile.
//!
//! Invariants:
//! - Each tile's features depend only on that tile: a tile gives the same bits encoded alone,
//!   with others, or in any order (every step is row-wise and batch-invariant, or runs within
//!   a tile; `encoder`, `connector`). So `encode` runs the tiles a few at a time (`PASS_ROWS`).
//! - Weights are read by their HF names through `WeightSource` (a safetensors folder), under
//!   the names transformers holds them by or, for Gemma 3, as checkpoints store them (the
//!   Hub's, transformers 5's: `Prefixes`), or from a llama.cpp mmproj file (`mmproj`); each
//!   matrix is held as the source's dtype says (`Matrix::dense`): with `Auto`, in its stored
//!   element type (f32, bf16 or f16) widened exactly as it is multiplied by f32 activations;
//!   with `BF16` (an all-bf16 folder's default in the engine) prompt rows are rounded to bf16
//!   as torch's bf16 path does. Every tensor's shape is checked against `VisionArgs` at load
//!   (a mismatch names the tensor).
//! - Tiles are full: every patch is valid and takes position `py * side + px`. A padded tile
//!   (transformers' `pixel_attention_mask` with zeros) would need its patch mask, the
//!   positions transformers computes for it (`bucketize` of the valid patches' fractional
//!   coordinates onto the full grid) and a key mask in attention; `encode` does not take one.
//!   Nor does it drop all-zero tiles as `get_image_features` does (its padding images of a
//!   batch): it encodes the tiles it is given.

mod args;
mod connector;
mod encoder;
mod mmproj;
mod ops;
mod pool;
mod qwen2vl;

pub use args::{VisionAct, VisionArgs, VisionFamily};
pub use mmproj::Mmproj;
pub use qwen2vl::{Qwen2VlAct, Qwen2VlFamily, Qwen2VlTower, Qwen2VlVisionArgs};

use crate::weights::{Linear, Matrix, WeightSource};
use candle_core::DType;
use connector::Connector;
use encoder::{Embeddings, EncoderLayer, Qkv};
use lmplex_core::{Error, Result};
use ops::LayerNorm;
use pool::AvgPoolProjector;

/// A vision-language `config.json`'s tower, by its `model_type`: a SigLIP tower (Idefics3,
/// SmolVLM, Gemma 3) or Qwen2-VL / Qwen2.5-VL's.
#[derive(Debug, Clone, PartialEq)]
pub enum TowerArgs {
    /// Idefics3 / SmolVLM, Gemma 3: `VisionTower`.
    Siglip(VisionArgs),
    /// Qwen2-VL, Qwen2.5-VL: `Qwen2VlTower`.
    Qwen2Vl(Qwen2VlVisionArgs),
}

impl TowerArgs {
    /// Parses `config.json` with the family's own parser (`VisionArgs`, `Qwen2VlVisionArgs`).
    pub fn from_hf_config(json: &str) -> Result<Self> {
        let v: serde_json::Value =
            serde_json::from_str(json).map_err(|e| Error::model_load(format!("config.json is not valid JSON: {e}")))?;
        match v.get("model_type").and_then(|t| t.as_str()) {
            Some("qwen2_vl" | "qwen2_5_vl") => Qwen2VlVisionArgs::from_hf_config(json).map(Self::Qwen2Vl),
            _ => VisionArgs::from_hf_config(json).map(Self::Siglip),
        }
    }
}

/// Where a family's tower tensors live: the encoder's prefix and the projector's.
struct Prefixes {
    vision: &'static str,
    projector: &'static str,
}

/// Gemma 3's encoder prefixes: as transformers 5 holds them in memory, as the Hub's checkpoints
/// hold them, and as transformers 5 saves them (`vision_tower.` without SigLIP's `vision_model.`).
/// Patch rows run through the encoder together by default (whole tiles, at least one): enough to keep
/// the matrix products at full speed, few enough that a layer's intermediates (fc1's output is
/// `rows * intermediate_size` f32) are reused from the heap rather than mapped and faulted in
/// afresh for every layer, and that a pass over many images holds this much at a time.
const PASS_ROWS: usize = 1024;

const GEMMA3_VISION: [&str; 4] =
    ["model.vision_tower.vision_model", "vision_tower.vision_model", "model.vision_tower", "vision_tower"];
/// Gemma 3's projector prefixes, in memory and as stored.
const GEMMA3_PROJECTOR: [&str; 2] = ["model.multi_modal_projector", "multi_modal_projector"];

impl Prefixes {
    /// Idefics3's (`model.vision_model`, `model.connector`); Gemma 3's, the first of each list
    /// `src` holds tensors under (the first when it holds none: the load error names it).
    fn of(src: &WeightSource, family: VisionFamily) -> Self {
        match family {
            VisionFamily::Idefics3 { .. } => Self { vision: "model.vision_model", projector: "model.connector" },
            VisionFamily::Gemma3 { .. } => Self {
                vision: src.first_prefix(&GEMMA3_VISION, ".embeddings.patch_embedding.weight"),
                projector: src.first_prefix(&GEMMA3_PROJECTOR, ".mm_input_projection_weight"),
            },
        }
    }
}

/// A family's projector from encoder rows to image features.
enum Projector {
    PixelShuffle(Connector),
    AvgPool(AvgPoolProjector),
}

/// The encoder and projector of a vision-language checkpoint, ready to encode tiles.
pub struct VisionTower {
    args: VisionArgs,
    embeddings: Embeddings,
    layers: Vec<EncoderLayer>,
    post_layernorm: LayerNorm,
    projector: Projector,
    /// Patch rows one pass of the encoder holds (`PASS_ROWS` unless set).
    rows_per_pass: usize,
}

impl VisionTower {
    /// Reads the tower's tensors from `src` (`Prefixes`), checking each one's shape against
    /// `args`.
    pub fn load(src: &WeightSource, args: VisionArgs) -> Result<Self> {
        let a = &args;
        let (d, c, p) = (a.hidden_size, a.num_channels, a.patch_size);
        let at = Prefixes::of(src, a.family);
        let vision = at.vision;
        let e = format!("{vision}.embeddings");
        let patch_name = format!("{e}.patch_embedding.weight");
        let embeddings = Embeddings {
            patch: Linear {
                weight: matrix(src, &patch_name, &[d, c, p, p])?,
                bias: Some(vector(src, &format!("{e}.patch_embedding.bias"), d)?),
            },
            position: read(src, &format!("{e}.position_embedding.weight"), &[a.num_patches(), d])?,
        };
        let layers = (0..a.num_hidden_layers).map(|i| load_layer(src, a, vision, i)).collect::<Result<_>>()?;
        let post_layernorm = layer_norm(src, &format!("{vision}.post_layernorm"), a)?;
        let pj = at.projector;
        let projector = match a.family {
            VisionFamily::Idefics3 { scale_factor } => {
                let name = format!("{pj}.modality_projection.proj.weight");
                Projector::PixelShuffle(Connector {
                    proj: matrix(src, &name, &[a.text_hidden_size, a.connector_in()])?.into(),
                    scale_factor,
                })
            }
            VisionFamily::Gemma3 { .. } => {
                let name = format!("{pj}.mm_input_projection_weight");
                let norm = vector(src, &format!("{pj}.mm_soft_emb_norm.weight"), d)?;
                // llama.cpp's converter stores Gemma's RMSNorm weight with its `1 +` added.
                let plus_one = !src.is_gguf();
                Projector::AvgPool(AvgPoolProjector {
                    norm: norm.iter().map(|w| if plus_one { 1.0 + w } else { *w }).collect(),
                    proj: transposed(src, &name, [d, a.text_hidden_size])?.into(),
                })
            }
        };
        Ok(Self { args, embeddings, layers, post_layernorm, projector, rows_per_pass: PASS_ROWS })
    }

    /// The tower running at most `rows` patch rows (whole tiles, at least one) through its
    /// encoder at a time (default 1,024): less memory for larger tiles, the same features.
    pub fn with_rows_per_pass(self, rows: usize) -> Self {
        Self { rows_per_pass: rows, ..self }
    }

    /// The tower's shapes.
    pub fn args(&self) -> &VisionArgs {
        &self.args
    }

    /// Bytes the tower's weights take in memory.
    pub fn size_in_bytes(&self) -> usize {
        self.embeddings.size_in_bytes()
            + self.layers.iter().map(EncoderLayer::size_in_bytes).sum::<usize>()
            + self.post_layernorm.size_in_bytes()
            + match &self.projector {
                Projector::PixelShuffle(c) => c.size_in_bytes(),
                Projector::AvgPool(p) => p.size_in_bytes(),
            }
    }

    /// `pixels: [tiles, num_channels, image_size, image_size]` (channel-first, full tiles) ->
    /// image features `[tiles * image_seq_len, text_hidden_size]`, row-major, tile after tile:
    /// transformers' `get_image_features` of the same tiles. `pixels` must hold
    /// `tiles * args().tile_len()` values (else `InvalidRequest`).
    pub fn encode(&self, pixels: &[f32], tiles: usize) -> Result<Vec<f32>> {
        let a = &self.args;
        if pixels.len() != tiles * a.tile_len() {
            return Err(Error::invalid(format!(
                "{} pixel values for {tiles} tiles of {} values each",
                pixels.len(),
                a.tile_len()
            )));
        }
        let mut out = Vec::with_capacity(tiles * a.image_seq_len() * a.text_hidden_size);
        let per_pass = (self.rows_per_pass / a.num_patches()).max(1);
        for group in pixels.chunks(per_pass * a.tile_len()) {
            out.extend(self.encode_group(group, group.len() / a.tile_len()));
        }
        Ok(out)
    }

    /// `encode` of a few tiles at once.
    fn encode_group(&self, pixels: &[f32], tiles: usize) -> Vec<f32> {
        let a = &self.args;
        let mut h = self.embeddings.forward(a, pixels, tiles);
        for layer in &self.layers {
            layer.forward(a, &mut h, tiles);
        }
        self.post_layernorm.forward_in_place(&mut h);
        match &self.projector {
            Projector::PixelShuffle(c) => c.forward(a, &h, tiles),
            Projector::AvgPool(p) => p.forward(a, &h, tiles),
        }
    }
}

/// Layer `i` of the encoder.
fn load_layer(src: &WeightSource, a: &VisionArgs, vision: &str, i: usize) -> Result<EncoderLayer> {
    let p = format!("{vision}.encoder.layers.{i}");
    let (d, f) = (a.hidden_size, a.intermediate_size);
    let lin = |name: &str, out: usize, inp: usize| -> Result<Linear> {
        let weight = matrix(src, &format!("{p}.{name}.weight"), &[out, inp])?;
        Ok(Linear { weight, bias: Some(vector(src, &format!("{p}.{name}.bias"), out)?) })
    };
    let [q, k, v] = ["q_proj", "k_proj", "v_proj"].map(|n| lin(&format!("self_attn.{n}"), d, d));
    let (q, k, v) = (q?, k?, v?);
    let qkv = match Linear::concat(&[&q, &k, &v]) {
        Some(fused) => Qkv::Fused(fused),
        None => Qkv::Separate([q, k, v]),
    };
    Ok(EncoderLayer {
        layer_norm1: layer_norm(src, &format!("{p}.layer_norm1"), a)?,
        qkv,
        out_proj: lin("self_attn.out_proj", d, d)?,
        layer_norm2: layer_norm(src, &format!("{p}.layer_norm2"), a)?,
        fc1: lin("mlp.fc1", f, d)?,
        fc2: lin("mlp.fc2", d, f)?,
        bf16: src.dtype() == lmplex_core::DType::BF16,
    })
}

/// `{prefix}.weight` and `{prefix}.bias` of a LayerNorm over `hidden_size`.
fn layer_norm(src: &WeightSource, prefix: &str, a: &VisionArgs) -> Result<LayerNorm> {
    Ok(LayerNorm {
        weight: vector(src, &format!("{prefix}.weight"), a.hidden_size)?,
        bias: vector(src, &format!("{prefix}.bias"), a.hidden_size)?,
        eps: a.layer_norm_eps,
    })
}

/// Tensor `name` as f32 values, checked to be of `shape`.
fn read(src: &WeightSource, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
    let t = read_tensor(src, name, shape)?;
    t.flatten_all().and_then(|t| t.to_vec1::<f32>()).map_err(|e| Error::model_load(format!("tensor '{name}': {e}")))
}

/// A vector of `len` values.
fn vector(src: &WeightSource, name: &str, len: usize) -> Result<Vec<f32>> {
    read(src, name, &[len])
}

/// Tensor `name` as f32 (`WeightSource::tensor`), checked to be of `shape`.
fn read_tensor(src: &WeightSource, name: &str, shape: &[usize]) -> Result<candle_core::Tensor> {
    let t = src.tensor(name)?;
    if t.dims() != shape {
        return Err(Error::model_load(format!(
            "tensor '{name}' has shape {:?}, the vision config needs {shape:?}",
            t.dims()
        )));
    }
    Ok(t)
}

/// Tensor `name` of `shape` as a matrix `[shape[0], product of the rest]` in its stored
/// element type: bf16 and f16 are read as f32 and narrowed back (exactly), so the matrix keeps
/// the checkpoint's bytes and multiplies f32 activations (`Matrix::dense` with `Auto`).
fn matrix(src: &WeightSource, name: &str, shape: &[usize]) -> Result<Matrix> {
    let t = read_tensor(src, name, shape)?;
    let cols = shape[1..].iter().product::<usize>();
    stored_matrix(src, name, t.reshape((shape[0], cols)))
}

/// Tensor `name` of `shape` `[rows, cols]` (multiplied as `x @ W`) as the matrix `[cols, rows]`
/// of `x W^T`, in its stored element type (`matrix`).
fn transposed(src: &WeightSource, name: &str, shape: [usize; 2]) -> Result<Matrix> {
    let t = read_tensor(src, name, &shape)?;
    stored_matrix(src, name, t.t().and_then(|t| t.contiguous()))
}

/// `t` (tensor `name` read as f32) narrowed back to its stored element type, as a matrix
/// multiplied as `src`'s dtype says (`Matrix::dense`: `Auto` widens the stored values exactly;
/// `BF16`, what a bf16 folder loads as by default, rounds prompt rows to bf16 as torch's bf16
/// path does).
fn stored_matrix(src: &WeightSource, name: &str, t: candle_core::Result<candle_core::Tensor>) -> Result<Matrix> {
    let stored = src.stored_float(name).unwrap_or(DType::F32);
    t.and_then(|t| t.to_dtype(stored))
        .and_then(|t| Matrix::dense(t, src.dtype()))
        .map_err(|e| Error::model_load(format!("tensor '{name}': {e}")))
}
