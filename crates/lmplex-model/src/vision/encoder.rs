//! The SigLIP encoder of an Idefics3 tower: patch and position embeddings, then pre-LayerNorm
//! layers of bidirectional multi-head attention (q/k/v/out projections with biases, scale
//! `head_dim^-0.5`) and an MLP (`fc1`, the activation, `fc2`), each added to the residual.
//!
//! Invariant: hidden states are `[tiles * num_patches, hidden]`, one row per patch, tile after
//! tile; projections, norms and activations are row-wise and batch-invariant (`Linear`'s
//! matmuls, `ops`), and a patch attends to the keys and values of its own tile only, so every
//! row of a tile depends on that tile alone, never on the other tiles or their order.
//!
//! Attention runs on the decoder's kernel (`attention::attend`, online softmax over chunks of
//! 16 keys): each tile's keys and values form one KV block, every query row attends to all of
//! them (context length = the tile's patches), so the causal kernel computes the bidirectional
//! attention exactly. The kernel scales the query before its dot products where transformers
//! scales their sums; for a power-of-two `head_dim` (64 in SigLIP-base) the scale is a power of
//! two and the two agree up to the order of the sums. A tower computing in bf16 (its weights
//! read as bf16) takes the kernel's bf16 products (`AttnOpts::bf16_prompt`), as torch's bf16
//! attention does; in f32 it takes the f32 kernel.

use super::args::VisionArgs;
use super::ops::{activate, LayerNorm};
use crate::attention::{attend, AttnOpts, PagedKv, Query};
use crate::kv::RowKinds;
use crate::ops::{AttnScratch, ATTN};
use crate::rowops::add_in_place;
use crate::thread_team::{parallel_for, Cells};
use crate::weights::Linear;

/// Query rows per attention task (one head of one tile).
const ROWS_PER_TASK: usize = 64;

/// Patch embedding (a stride-`patch_size` convolution, as a matrix over unfolded patches) and
/// learned position embeddings.
pub(super) struct Embeddings {
    /// `[hidden, channels * patch^2]`: the conv weight `[hidden, c, py, px]` flattened.
    pub(super) patch: Linear,
    /// `[num_patches, hidden]`.
    pub(super) position: Vec<f32>,
}

impl Embeddings {
    /// `pixels: [tiles, channels, image, image]` -> `[tiles * num_patches, hidden]`: patch
    /// `(py, px)` of a tile is row `py * side + px`, its values unfolded in the conv weight's
    /// order (channel, row, column); every patch takes position `py * side + px` (full tiles).
    pub(super) fn forward(&self, a: &VisionArgs, pixels: &[f32], tiles: usize) -> Vec<f32> {
        let (c, s, p, side) = (a.num_channels, a.image_size, a.patch_size, a.patches_per_side());
        let (n, k, d) = (a.num_patches(), c * p * p, a.hidden_size);
        let mut patches = vec![0f32; tiles * n * k];
        for (t, (tile, out)) in pixels.chunks_exact(c * s * s).zip(patches.chunks_exact_mut(n * k)).enumerate() {
            debug_assert!(t < tiles);
            for (i, row) in out.chunks_exact_mut(k).enumerate() {
                let (py, px) = (i / side, i % side);
                for ch in 0..c {
                    for ky in 0..p {
                        let src = ch * s * s + (py * p + ky) * s + px * p;
                        row[(ch * p + ky) * p..][..p].copy_from_slice(&tile[src..src + p]);
                    }
                }
            }
        }
        let mut h = self.patch.forward_rows(&patches, tiles * n, &RowKinds::uniform(tiles * n, true));
        for tile in h.chunks_exact_mut(n * d) {
            tile.iter_mut().zip(&self.position).for_each(|(x, pos)| *x += pos);
        }
        h
    }

    /// Bytes of the weights.
    pub(super) fn size_in_bytes(&self) -> usize {
        self.patch.size_in_bytes() + self.position.len() * 4
    }
}

/// q, k and v: one projection when their weights share a format (`Linear::concat`, the same
/// bits per row), else three.
pub(super) enum Qkv {
    Fused(Linear),
    Separate([Linear; 3]),
}

impl Qkv {
    /// `x: [m, hidden]` -> `[m, 3 * hidden]`, each row q, then k, then v.
    fn forward(&self, x: &[f32], m: usize, d: usize) -> Vec<f32> {
        let kinds = RowKinds::uniform(m, true);
        match self {
            Self::Fused(qkv) => qkv.forward_rows(x, m, &kinds),
            Self::Separate(parts) => {
                let outs: Vec<Vec<f32>> = parts.iter().map(|p| p.forward_rows(x, m, &kinds)).collect();
                let mut y = Vec::with_capacity(m * 3 * d);
                for r in 0..m {
                    outs.iter().for_each(|o| y.extend_from_slice(&o[r * d..(r + 1) * d]));
                }
                y
            }
        }
    }

    fn size_in_bytes(&self) -> usize {
        match self {
            Self::Fused(l) => l.size_in_bytes(),
            Self::Separate(ls) => ls.iter().map(Linear::size_in_bytes).sum(),
        }
    }
}

/// One encoder layer (`Idefics3EncoderLayer`).
pub(super) struct EncoderLayer {
    pub(super) layer_norm1: LayerNorm,
    pub(super) qkv: Qkv,
    pub(super) out_proj: Linear,
    pub(super) layer_norm2: LayerNorm,
    pub(super) fc1: Linear,
    pub(super) fc2: Linear,
    /// Attention's products in bf16 (`AttnOpts::bf16_prompt`), where the tower computes in bf16.
    pub(super) bf16: bool,
}

impl EncoderLayer {
    /// `h: [tiles * num_patches, hidden]`, updated in place:
    /// `h += attn(ln1(h))`, then `h += fc2(act(fc1(ln2(h))))`.
    pub(super) fn forward(&self, a: &VisionArgs, h: &mut [f32], tiles: usize) {
        let (d, n) = (a.hidden_size, a.num_patches());
        let m = tiles * n;
        let kinds = RowKinds::uniform(m, true);
        let x = self.layer_norm1.forward(h);
        let qkv = self.qkv.forward(&x, m, d);
        let attn = attention(&qkv, tiles, n, a.num_attention_heads, a.head_dim(), self.bf16);
        add_in_place(h, &self.out_proj.forward_rows(&attn, m, &kinds), d);
        let x = self.layer_norm2.forward(h);
        let mut y = self.fc1.forward_rows(&x, m, &kinds);
        activate(a.hidden_act, &mut y, a.intermediate_size);
        add_in_place(h, &self.fc2.forward_rows(&y, m, &kinds), d);
    }

    /// Bytes of the weights.
    pub(super) fn size_in_bytes(&self) -> usize {
        self.layer_norm1.size_in_bytes()
            + self.qkv.size_in_bytes()
            + self.out_proj.size_in_bytes()
            + self.layer_norm2.size_in_bytes()
            + self.fc1.size_in_bytes()
            + self.fc2.size_in_bytes()
    }
}

/// `qkv: [tiles * n, 3 * d]` (rows q | k | v, `heads` heads of `hd`) -> `[tiles * n, d]`:
/// `softmax(q k^T * hd^-0.5) v` per tile and head, over the tile's `n` patches; with `bf16`,
/// the products in bf16 (the kernel's `bf16_prompt`, as the text model's prompt rows in bf16).
fn attention(qkv: &[f32], tiles: usize, n: usize, heads: usize, hd: usize, bf16: bool) -> Vec<f32> {
    let d = heads * hd;
    // Each tile's keys and values as one KV block of `n` slots in the kernel's layout
    // (`attention`'s docs): K `[heads, hd, n]` (transposed), V `[n, heads, hd]`.
    let mut k = vec![0f32; tiles * n * d];
    let mut v = vec![0f32; tiles * n * d];
    for (row, src) in qkv.chunks_exact(3 * d).enumerate() {
        let (t, r) = (row / n, row % n);
        let kt = &mut k[t * n * d..(t + 1) * n * d];
        src[d..2 * d].iter().enumerate().for_each(|(e, &x)| kt[e * n + r] = x);
        v[row * d..(row + 1) * d].copy_from_slice(&src[2 * d..]);
    }
    let opts = AttnOpts { bf16_prompt: bf16, ..AttnOpts::scaled((hd as f64).powf(-0.5) as f32) };
    let chunks = n.div_ceil(ROWS_PER_TASK);
    let mut out = vec![0f32; tiles * n * d];
    let dst = Cells::new(&mut out);
    parallel_for(tiles * heads * chunks, &|i| {
        let (t, h, c) = (i / (heads * chunks), i / chunks % heads, i % chunks);
        let rows = c * ROWS_PER_TASK..((c + 1) * ROWS_PER_TASK).min(n);
        let kv = PagedKv {
            k: &k[t * n * d..(t + 1) * n * d],
            v: &v[t * n * d..(t + 1) * n * d],
            block_table: &[0],
            block_size: n,
            num_kv_heads: heads,
            head_dim: hd,
            kv_head: h,
            scales: None,
        };
        ATTN.with_borrow_mut(|AttnScratch { q, lens, out: o, work }| {
            q.clear();
            for r in rows.clone() {
                q.extend_from_slice(&qkv[(t * n + r) * 3 * d + h * hd..][..hd]);
            }
            lens.clear();
            lens.resize(rows.len(), n);
            o.clear();
            o.resize(q.len(), 0.0);
            attend(Query { q, lens, prompt: true }, &kv, &opts, o, work);
            for (r, src) in rows.zip(o.chunks_exact(hd)) {
                // SAFETY: task i alone writes head h of its tile's rows `rows`: disjoint cells.
                unsafe { dst.slice((t * n + r) * d + h * hd, hd) }.copy_from_slice(src);
            }
        });
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel-based attention equals a naive softmax(q k^T * scale) v in f64, per tile:
    /// to 1e-5 in f32, and to bf16's precision with the products in bf16 (its kernel needs a
    /// head_dim of a multiple of 32 and a tile of a multiple of 16 patches; elsewhere, or on a
    /// CPU without BF16, the f32 kernel runs).
    #[test]
    fn attention_matches_a_naive_softmax_per_tile() {
        // n = 70: not a multiple of the task rows or chunk.
        for (n, hd, bf16, tol) in [(70, 16, false, 1e-5), (64, 64, true, 2e-2)] {
            check_attention(2, n, 3, hd, bf16, tol);
        }
    }

    fn check_attention(tiles: usize, n: usize, heads: usize, hd: usize, bf16: bool, tol: f64) {
        let d = heads * hd;
        let qkv: Vec<f32> =
            (0..tiles * n * 3 * d).map(|i| ((i * 2_654_435_761usize) % 2001) as f32 / 1000.0 - 1.0).collect();
        let got = attention(&qkv, tiles, n, heads, hd, bf16);
        let scale = (hd as f64).powf(-0.5);
        let at = |t: usize, r: usize, part: usize, h: usize, e: usize| {
            qkv[(t * n + r) * 3 * d + part * d + h * hd + e] as f64
        };
        for t in 0..tiles {
            for h in 0..heads {
                for r in (0..n).step_by(7) {
                    let s: Vec<f64> = (0..n)
                        .map(|j| (0..hd).map(|e| at(t, r, 0, h, e) * at(t, j, 1, h, e)).sum::<f64>() * scale)
                        .collect();
                    let max = s.iter().copied().fold(f64::MIN, f64::max);
                    let w: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
                    let sum: f64 = w.iter().sum();
                    for e in 0..hd {
                        let want = (0..n).map(|j| w[j] * at(t, j, 2, h, e)).sum::<f64>() / sum;
                        let g = got[(t * n + r) * d + h * hd + e] as f64;
                        assert!(
                            (g - want).abs() < tol,
                            "bf16 {bf16}: tile {t} head {h} row {r} dim {e}: {g} vs {want}"
                        );
                    }
                }
            }
        }
        // Tile 1 alone gives the same bits as next to tile 0.
        let alone = attention(&qkv[n * 3 * d..], 1, n, heads, hd, bf16);
        assert_eq!(alone, got[n * d..]);
    }
}
