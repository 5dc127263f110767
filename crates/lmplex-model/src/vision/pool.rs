//! The Gemma 3 projector (`Gemma3MultiModalProjector`): each image's `side x side` grid of
//! encoder rows average-pooled in `k x k` windows to `mm_tokens_per_image` tokens, then
//! `mm_soft_emb_norm` (Gemma's RMSNorm, `x / rms(x) * (1 + w)`) and the projection
//! `mm_input_projection_weight` (stored `[vision_hidden, text_hidden]`, multiplied as `x @ W`).
//!
//! Invariant: pooling reads one image's rows only, in a fixed order (the window's rows top to
//! bottom, each left to right, as torch's `avg_pool2d` sums them, then divides by `k^2`); the
//! norm and projection are row-wise and batch-invariant, so an image's tokens depend on that
//! image alone.

use super::args::VisionArgs;
use crate::kv::RowKinds;
use crate::rowops::rms_norm_in_place;
use crate::weights::Linear;

/// `Gemma3MultiModalProjector`.
pub(super) struct AvgPoolProjector {
    /// `1 + mm_soft_emb_norm.weight`, `[vision_hidden]` (f32, as transformers adds them).
    pub(super) norm: Vec<f32>,
    /// `mm_input_projection_weight` transposed: `[text_hidden, vision_hidden]`.
    pub(super) proj: Linear,
}

impl AvgPoolProjector {
    /// `h: [images * num_patches, hidden]` (post-layernormed) -> `[images * tokens,
    /// text_hidden]`, token `(i, j)` of an image at row `i * tokens_side + j`.
    pub(super) fn forward(&self, a: &VisionArgs, h: &[f32], images: usize) -> Vec<f32> {
        let tokens = a.image_seq_len();
        let mut x = avg_pool(h, images, a.patches_per_side(), a.hidden_size, tokens.isqrt());
        rms_norm_in_place(&mut x, &self.norm, a.layer_norm_eps as f32);
        let m = images * tokens;
        self.proj.forward_rows(&x, m, &RowKinds::uniform(m, true))
    }

    /// Bytes of the norm and the projection.
    pub(super) fn size_in_bytes(&self) -> usize {
        self.norm.len() * 4 + self.proj.size_in_bytes()
    }
}

/// `images` grids of `side x side` rows of `d` values pooled to `out x out` rows: row
/// `i * out + j` is the mean of the `k x k` window at rows `i * k..`, columns `j * k..`
/// (`k = side / out`).
pub(super) fn avg_pool(x: &[f32], images: usize, side: usize, d: usize, out: usize) -> Vec<f32> {
    let k = side / out;
    let div = (k * k) as f32;
    let mut y = vec![0f32; images * out * out * d];
    for (img, dst) in x.chunks_exact(side * side * d).zip(y.chunks_exact_mut(out * out * d)).take(images) {
        for (t, row) in dst.chunks_exact_mut(d).enumerate() {
            let (i, j) = (t / out, t % out);
            for di in 0..k {
                for dj in 0..k {
                    let src = ((i * k + di) * side + j * k + dj) * d;
                    row.iter_mut().zip(&img[src..src + d]).for_each(|(o, v)| *o += v);
                }
            }
            row.iter_mut().for_each(|o| *o /= div);
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 4x4 grid of 2-value rows pooled to 2x2: each token is its 2x2 window's mean.
    #[test]
    fn avg_pool_takes_each_windows_mean() {
        let x: Vec<f32> = (0..32).map(|i| i as f32).collect();
        let y = avg_pool(&x, 1, 4, 2, 2);
        // Token 0: rows 0, 1, 4, 5 -> values (0, 2, 8, 10) and (1, 3, 9, 11).
        assert_eq!(y[..2], [5.0, 6.0]);
        // Token 3: rows 10, 11, 14, 15.
        assert_eq!(y[6..], [(20 + 22 + 28 + 30) as f32 / 4.0, (21 + 23 + 29 + 31) as f32 / 4.0]);
        let two: Vec<f32> = x.iter().chain(&x).copied().collect();
        assert_eq!(avg_pool(&two, 2, 4, 2, 2), [y.clone(), y].concat());
    }
}
