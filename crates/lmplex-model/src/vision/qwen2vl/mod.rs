//! The vision transformer and patch merger of Qwen2-VL and Qwen2.5-VL on the CPU, in f32:
//! transformers' `get_image_features` (`Qwen2VisionTransformerPretrainedModel`,
//! `Qwen2_5_VisionTransformerPretrainedModel`) for images of any grid.
//!
//! Data flow: `Qwen2VlVisionArgs::from_hf_config(config.json)`, `Qwen2VlTower::load(weights,
//! args)`, then `encode(patches, grids)`: the processor's patch rows (`[sum t * h * w,
//! in_channels * temporal_patch_size * patch_size^2]`, image after image, each in merge-unit
//! order: `grid`) and each image's `[t, h, w]` grid in patches, to `[sum t * h * w / m^2,
//! text_hidden]` features, image after image (`m = spatial_merge_size`).
//!
//! Steps: the patch embedding (a Conv3d whose kernel is its stride: one matrix over the patch
//! rows, no bias); Qwen2.5-VL then reorders the merged units by window (`grid::window_order`);
//! the 2D rotary angles of every row (`rotary`, in the same order); `depth` blocks (`block`)
//! attending within frames or, in Qwen2.5-VL's blocks not in `fullatt_block_indexes`, within
//! windows (`attention`, on the decoder's kernel); the merger (`merger`), one token per unit;
//! Qwen2.5-VL's tokens put back in the processor's order.
//!
//! Invariants:
//! - Each image's features depend on that image alone: the same bits encoded alone, beside
//!   other images or in any order. Every step is row-wise and batch-invariant or runs within a
//!   frame or window of one image, and the window order moves units within their frame only.
//!   So `encode` runs the images a few at a time (`PASS_ROWS`), and attention's products
//!   follow the weights' dtype as the SigLIP tower's do (bf16 in a bf16 tower).
//! - Bad input (patch values that do not match the grids, a side not divisible by the merge
//!   size, an empty or overflowing grid) is `Error::InvalidRequest`, never a panic.
//! - Weights are read by their HF names under the prefix transformers 5 holds them by
//!   (`model.visual.`) or the Hub's checkpoints store them by (`visual.`), whichever the source
//!   has, or from a llama.cpp mmproj file; each matrix is held as the source's dtype says (as
//!   the SigLIP tower's, `super`), and every tensor's shape is checked against the args at load
//!   (a missing or misshapen tensor is `Error::ModelLoad` naming it).

mod args;
mod attention;
mod block;
mod grid;
mod merger;
mod rotary;

pub use args::{Qwen2VlAct, Qwen2VlFamily, Qwen2VlVisionArgs};

use super::ops::LayerNorm;
use super::{matrix, vector};
use crate::kv::RowKinds;
use crate::weights::{Linear, WeightSource};
use block::{Block, GateUp, Mlp, Norm};
use lmplex_core::Result;
use merger::Merger;
use rotary::Rotary;
use std::ops::Range;

/// Where the tower's tensors live: transformers 5's name in memory, the Hub's stored name.
const PREFIXES: [&str; 2] = ["model.visual", "visual"];
/// The epsilon of every norm of the tower (transformers hard-codes it).
const NORM_EPS: f64 = 1e-6;

/// A Qwen2-VL or Qwen2.5-VL vision tower, ready to encode images.
pub struct Qwen2VlTower {
    args: Qwen2VlVisionArgs,
    /// `[hidden, in_channels * temporal_patch_size * patch_size^2]`, no bias.
    patch_embed: Linear,
    blocks: Vec<Block>,
    merger: Merger,
    /// Patch rows one pass of the blocks holds (`PASS_ROWS` unless set).
    rows_per_pass: usize,
}

/// Patch rows run through the blocks together by default (whole images, at least one), as the
/// SigLIP tower's `PASS_ROWS`: a pass over many images holds about this much at a time.
const PASS_ROWS: usize = 1024;

/// Patch rows of an image of grid `[t, h, w]`.
fn image_rows([t, h, w]: [usize; 3]) -> usize {
    t * h * w
}

impl Qwen2VlTower {
    /// Reads the tower's tensors from `src` (under `model.visual.` or `visual.`, whichever it
    /// holds), checking each one's shape against `args`.
    pub fn load(src: &WeightSource, args: Qwen2VlVisionArgs) -> Result<Self> {
        let a = &args;
        let p = src.first_prefix(&PREFIXES, ".patch_embed.proj.weight");
        let (d, ps) = (a.hidden_size, a.patch_size);
        let embed =
            matrix(src, &format!("{p}.patch_embed.proj.weight"), &[d, a.in_channels, a.temporal_patch_size, ps, ps])?;
        let blocks = (0..a.depth).map(|i| load_block(src, a, &format!("{p}.blocks.{i}"))).collect::<Result<_>>()?;
        let wide = d * a.merge_unit();
        let merger = Merger {
            ln_q: norm(src, a, &format!("{p}.merger.ln_q"))?,
            fc1: linear(src, &format!("{p}.merger.mlp.0"), wide, wide)?,
            fc2: linear(src, &format!("{p}.merger.mlp.2"), a.text_hidden_size, wide)?,
        };
        Ok(Self { args, patch_embed: embed.into(), blocks, merger, rows_per_pass: PASS_ROWS })
    }

    /// The tower's shapes.
    pub fn args(&self) -> &Qwen2VlVisionArgs {
        &self.args
    }

    /// Bytes the tower's weights take in memory.
    pub fn size_in_bytes(&self) -> usize {
        self.patch_embed.size_in_bytes()
            + self.blocks.iter().map(Block::size_in_bytes).sum::<usize>()
            + self.merger.size_in_bytes()
    }

    /// The tower running at most `rows` patch rows (whole images, at least one) through its
    /// blocks at a time (default 1,024): less memory for many images, the same features.
    pub fn with_rows_per_pass(self, rows: usize) -> Self {
        Self { rows_per_pass: rows, ..self }
    }

    /// `patches: [sum t * h * w, patch_len]` (the processor's `pixel_values`, images in the
    /// order of `grids`) and each image's `[t, h, w]` (`image_grid_thw`) -> image features
    /// `[sum t * h * w / spatial_merge_size^2, text_hidden_size]`, row-major, image after image:
    /// transformers' `get_image_features` of the same images, concatenated. A grid whose sides
    /// are not positive multiples of the merge size, or patches that do not hold exactly the
    /// grids' rows, are `InvalidRequest`.
    pub fn encode(&self, patches: &[f32], grids: &[[usize; 3]]) -> Result<Vec<f32>> {
        let a = &self.args;
        grid::check(a, patches.len(), grids)?;
        let mut out = Vec::new();
        let (mut start, mut i) = (0, 0);
        while i < grids.len() {
            // Whole images, at least one, up to `rows_per_pass` rows.
            let (mut j, mut rows) = (i, 0);
            while j < grids.len() && (j == i || rows + image_rows(grids[j]) <= self.rows_per_pass) {
                rows += image_rows(grids[j]);
                j += 1;
            }
            let len = a.patch_len();
            out.extend(self.encode_group(&patches[start * len..(start + rows) * len], &grids[i..j], rows));
            (start, i) = (start + rows, j);
        }
        Ok(out)
    }

    /// `encode` of a few images at once, `rows` patches in all.
    fn encode_group(&self, patches: &[f32], grids: &[[usize; 3]], rows: usize) -> Vec<f32> {
        let a = &self.args;
        let (d, m, unit) = (a.hidden_size, a.spatial_merge_size, a.merge_unit());
        let mut h = self.patch_embed.forward_rows(patches, rows, &RowKinds::uniform(rows, true));
        let mut positions = grid::positions(grids, m);
        // Frames are the same ranges in the window order, which moves units within a frame.
        let frames = grid::frames(grids);
        let windowed = a.window_size.map(|_| grid::window_order(grids, m, a.window_units()));
        let mut windows: Vec<Range<usize>> = Vec::new();
        if let Some((order, units)) = &windowed {
            h = grid::gather_units(&h, order, unit * d);
            positions = grid::gather_units(&positions, order, unit);
            windows = units.iter().map(|w| w.start * unit..w.end * unit).collect();
        }
        let rotary = Rotary::new(&positions, a.head_dim(), a.rope_theta);
        for (i, block) in self.blocks.iter().enumerate() {
            let segments = if a.windowed_block(i) { &windows } else { &frames };
            block.forward(a, &mut h, &rotary, segments);
        }
        let features = self.merger.forward(&h, d, unit);
        match &windowed {
            Some((order, _)) => grid::scatter_rows(&features, order, a.text_hidden_size),
            None => features,
        }
    }
}

/// Block `{p}` (`….blocks.{i}`).
fn load_block(src: &WeightSource, a: &Qwen2VlVisionArgs, p: &str) -> Result<Block> {
    let (d, f) = (a.hidden_size, a.intermediate_size);
    let mlp = match a.family {
        Qwen2VlFamily::Qwen2Vl => Mlp::Plain {
            fc1: linear(src, &format!("{p}.mlp.fc1"), f, d)?,
            fc2: linear(src, &format!("{p}.mlp.fc2"), d, f)?,
        },
        Qwen2VlFamily::Qwen25Vl => {
            let gate = linear(src, &format!("{p}.mlp.gate_proj"), f, d)?;
            let up = linear(src, &format!("{p}.mlp.up_proj"), f, d)?;
            let gate_up = match Linear::concat(&[&gate, &up]) {
                Some(fused) => GateUp::Fused(fused),
                None => GateUp::Separate(gate, up),
            };
            Mlp::Gated { gate_up, down: linear(src, &format!("{p}.mlp.down_proj"), d, f)? }
        }
    };
    Ok(Block {
        norm1: norm(src, a, &format!("{p}.norm1"))?,
        qkv: linear(src, &format!("{p}.attn.qkv"), 3 * d, d)?,
        proj: linear(src, &format!("{p}.attn.proj"), d, d)?,
        norm2: norm(src, a, &format!("{p}.norm2"))?,
        mlp,
        bf16: src.dtype() == lmplex_core::DType::BF16,
    })
}

/// `{p}.weight` `[out, inp]` and `{p}.bias` `[out]`.
fn linear(src: &WeightSource, p: &str, out: usize, inp: usize) -> Result<Linear> {
    Ok(Linear {
        weight: matrix(src, &format!("{p}.weight"), &[out, inp])?,
        bias: Some(vector(src, &format!("{p}.bias"), out)?),
    })
}

/// The family's norm over the tower's width at `{p}`: Qwen2-VL's LayerNorm (weight and bias),
/// Qwen2.5-VL's RMSNorm (weight).
fn norm(src: &WeightSource, a: &Qwen2VlVisionArgs, p: &str) -> Result<Norm> {
    let weight = vector(src, &format!("{p}.weight"), a.hidden_size)?;
    Ok(match a.family {
        Qwen2VlFamily::Qwen2Vl => {
            Norm::Layer(LayerNorm { weight, bias: vector(src, &format!("{p}.bias"), a.hidden_size)?, eps: NORM_EPS })
        }
        Qwen2VlFamily::Qwen25Vl => Norm::Rms { weight, eps: NORM_EPS as f32 },
    })
}
