//! The vision tower of Idefics3 / SmolVLM on the CPU: a SigLIP encoder (`encoder`) and the
//! connector (`connector`: pixel shuffle, then a projection to the text model's width), which
//! turn image tiles into the features that replace the `<image>` tokens' embeddings. The
//! arithmetic is transformers' (`Idefics3Model.get_image_features`) in f32.
//!
//! Data flow: `VisionArgs::from_hf_config(config.json)`, `VisionTower::load(weights, args)`,
//! then `encode(pixel_values, tiles)`: `[tiles, channels, image_size, image_size]`
//! channel-first pixel values (the HF processor's output, already rescaled and normalized) to
//! `[tiles * image_seq_len, text_hidden]` features, tile after tile.
//!
//! Invariants:
//! - Each tile's features depend only on that tile: a tile gives the same bits encoded alone,
//!   with others, or in any order (every step is row-wise and batch-invariant, or runs within
//!   a tile; `encoder`, `connector`).
//! - Weights are read by their HF names through `WeightSource` (a safetensors folder); each
//!   matrix is kept in its stored element type (f32, bf16 or f16, widened exactly as it is
//!   multiplied) with f32 activations, whatever dtype the source was set to, and every
//!   tensor's shape is checked against `VisionArgs` at load (a mismatch names the tensor).
//! - Tiles are full: every patch is valid and takes position `py * side + px`. A padded tile
//!   (transformers' `pixel_attention_mask` with zeros) would need its patch mask, the
//!   positions transformers computes for it (`bucketize` of the valid patches' fractional
//!   coordinates onto the full grid) and a key mask in attention; `encode` does not take one.
//!   Nor does it drop all-zero tiles as `get_image_features` does (its padding images of a
//!   batch): it encodes the tiles it is given.

mod args;
mod connector;
mod encoder;
mod ops;

pub use args::{VisionAct, VisionArgs};

use crate::weights::{Linear, Matrix, WeightSource};
use candle_core::DType;
use connector::Connector;
use encoder::{Embeddings, EncoderLayer, Qkv};
use lmplex_core::{Error, Result};
use ops::LayerNorm;

/// Prefix of the encoder's tensors.
const VISION: &str = "model.vision_model";

/// The encoder and connector of an Idefics3 checkpoint, ready to encode tiles.
pub struct VisionTower {
    args: VisionArgs,
    embeddings: Embeddings,
    layers: Vec<EncoderLayer>,
    post_layernorm: LayerNorm,
    connector: Connector,
}

impl VisionTower {
    /// Reads the tower's tensors from `src` (`model.vision_model.*`, `model.connector.*`),
    /// checking each one's shape against `args`.
    pub fn load(src: &WeightSource, args: VisionArgs) -> Result<Self> {
        let a = &args;
        let (d, c, p) = (a.hidden_size, a.num_channels, a.patch_size);
        let e = format!("{VISION}.embeddings");
        let patch_name = format!("{e}.patch_embedding.weight");
        let embeddings = Embeddings {
            patch: Linear {
                weight: matrix(src, &patch_name, &[d, c, p, p])?,
                bias: Some(vector(src, &format!("{e}.patch_embedding.bias"), d)?),
            },
            position: read(src, &format!("{e}.position_embedding.weight"), &[a.num_patches(), d])?,
        };
        let layers = (0..a.num_hidden_layers).map(|i| load_layer(src, a, i)).collect::<Result<_>>()?;
        let post_layernorm = layer_norm(src, &format!("{VISION}.post_layernorm"), a)?;
        let proj_name = "model.connector.modality_projection.proj.weight";
        let connector = Connector { proj: matrix(src, proj_name, &[a.text_hidden_size, a.connector_in()])?.into() };
        Ok(Self { args, embeddings, layers, post_layernorm, connector })
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
            + self.connector.size_in_bytes()
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
        if tiles == 0 {
            return Ok(Vec::new());
        }
        let mut h = self.embeddings.forward(a, pixels, tiles);
        for layer in &self.layers {
            layer.forward(a, &mut h, tiles);
        }
        self.post_layernorm.forward_in_place(&mut h);
        Ok(self.connector.forward(a, &h, tiles))
    }
}

/// Layer `i` of the encoder.
fn load_layer(src: &WeightSource, a: &VisionArgs, i: usize) -> Result<EncoderLayer> {
    let p = format!("{VISION}.encoder.layers.{i}");
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
    let stored = match src.stored_bytes(name).map(|(dtype, _)| dtype) {
        Some(safetensors::Dtype::BF16) => DType::BF16,
        Some(safetensors::Dtype::F16) => DType::F16,
        _ => DType::F32,
    };
    t.reshape((shape[0], cols))
        .and_then(|t| t.to_dtype(stored))
        .and_then(|t| Matrix::dense(t, lmplex_core::DType::Auto))
        .map_err(|e| Error::model_load(format!("tensor '{name}': {e}")))
}
