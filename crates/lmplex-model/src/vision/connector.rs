//! The Idefics3 connector: pixel shuffle (space to depth), then the modality projection to the
//! text model's width (`modality_projection.proj`, no bias).
//!
//! Invariant: `pixel_shuffle` only moves values (the same values, no arithmetic), within a
//! tile; the projection is row-wise and batch-invariant, so a tile's features depend on that
//! tile's encoder rows alone.

use super::args::VisionArgs;
use crate::kv::RowKinds;
use crate::weights::Linear;

/// `Idefics3Connector`.
pub(super) struct Connector {
    /// `[text_hidden, hidden * scale_factor^2]`.
    pub(super) proj: Linear,
    /// `VisionFamily::Idefics3`'s `scale_factor`.
    pub(super) scale_factor: usize,
}

impl Connector {
    /// `h: [tiles * num_patches, hidden]` (post-layernormed) -> `[tiles * image_seq_len,
    /// text_hidden]`.
    pub(super) fn forward(&self, a: &VisionArgs, h: &[f32], tiles: usize) -> Vec<f32> {
        let x = pixel_shuffle(h, tiles, a.patches_per_side(), a.hidden_size, self.scale_factor);
        let m = tiles * a.image_seq_len();
        self.proj.forward_rows(&x, m, &RowKinds::uniform(m, true))
    }

    /// Bytes of the projection.
    pub(super) fn size_in_bytes(&self) -> usize {
        self.proj.size_in_bytes()
    }
}

/// transformers' `Idefics3Connector.pixel_shuffle` over `tiles` grids of `side x side` rows of
/// `d` values: output token `(i, j)` of a tile (row `i * (side / s) + j`) is the `s x s`
/// block of patches at rows `i * s + di`, columns `j * s + dj`, concatenated with `di` outer
/// and `dj` inner (`d * s^2` values). This is the order transformers' view / permute /
/// reshape / permute / reshape gives.
pub(super) fn pixel_shuffle(x: &[f32], tiles: usize, side: usize, d: usize, s: usize) -> Vec<f32> {
    let out_side = side / s;
    let mut out = Vec::with_capacity(x.len());
    for t in 0..tiles {
        let tile = &x[t * side * side * d..(t + 1) * side * side * d];
        for i in 0..out_side {
            for j in 0..out_side {
                for di in 0..s {
                    for dj in 0..s {
                        let src = (i * s + di) * side + j * s + dj;
                        out.extend_from_slice(&tile[src * d..(src + 1) * d]);
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 6x6 grid of 2-value patches shuffled by 3, against transformers' output (computed with
    /// its `pixel_shuffle` on `arange(72).view(1, 36, 2)`): token 1 is the block of rows 0..3,
    /// columns 3..6.
    #[test]
    fn pixel_shuffle_is_transformers_order() {
        let x: Vec<f32> = (0..72).map(|i| i as f32).collect();
        let y = pixel_shuffle(&x, 1, 6, 2, 3);
        assert_eq!(y.len(), 72);
        let want: Vec<f32> =
            [6, 7, 8, 9, 10, 11, 18, 19, 20, 21, 22, 23, 30, 31, 32, 33, 34, 35].iter().map(|&v| v as f32).collect();
        assert_eq!(y[18..36], want[..]);
        assert_eq!(y[..6], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        // Two tiles: the second tile's tokens are the first's pattern over its own values.
        let x2: Vec<f32> = (0..144).map(|i| i as f32).collect();
        let y2 = pixel_shuffle(&x2, 2, 6, 2, 3);
        assert_eq!(y2[..72], y[..]);
        assert!(y2[72..].iter().zip(&y).all(|(a, b)| *a == b + 72.0));
    }
}
