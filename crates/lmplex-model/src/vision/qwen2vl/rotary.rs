//! The vision tower's 2D rotary embedding (transformers' `VisionRotaryEmbedding` with
//! `rope_type` "axial" and `apply_rotary_pos_emb_vision`): a head of width `hd` rotates its
//! halves' pairs `(x[i], x[i + hd/2])` by angles `[h * f | w * f]` (`f` the `hd/4`
//! frequencies `theta^(-2j / (hd/2))`), so the first quarter of each half turns with the
//! patch's row and the second with its column.
//!
//! Invariant: a row's rotation depends on its position only; it is computed in f32 as torch
//! computes it (`pos * inv_freq`, then `cos` / `sin`; `x * cos + rotate_half(x) * sin`, each
//! product rounded before the sum), one row at a time, so rows are independent of the batch.

use crate::thread_team::{parallel_for, Cells};

/// Rows per task of `Rotary::apply`.
const ROWS_PER_TASK: usize = 64;

/// The cosines and sines of every row of a batch, `[rows, head_dim]` each.
pub(super) struct Rotary {
    cos: Vec<f32>,
    sin: Vec<f32>,
    head_dim: usize,
}

/// transformers' `compute_axial_rope_parameters`: `1 / theta^(2j / (hd / 2))` for `j < hd / 4`,
/// in f32.
pub(super) fn inv_freq(head_dim: usize, theta: f64) -> Vec<f32> {
    let spatial = head_dim / 2;
    (0..spatial.div_ceil(2)).map(|j| 1.0 / (theta as f32).powf((2 * j) as f32 / spatial as f32)).collect()
}

impl Rotary {
    /// The tables for rows at `positions` (`[h, w]` each, in patches).
    pub(super) fn new(positions: &[[usize; 2]], head_dim: usize, theta: f64) -> Self {
        let inv = inv_freq(head_dim, theta);
        let (mut cos, mut sin) = (Vec::with_capacity(positions.len() * head_dim), Vec::new());
        sin.reserve_exact(positions.len() * head_dim);
        let mut angles = Vec::with_capacity(head_dim / 2);
        for &[h, w] in positions {
            angles.clear();
            angles.extend(inv.iter().map(|f| h as f32 * f));
            angles.extend(inv.iter().map(|f| w as f32 * f));
            for _ in 0..2 {
                cos.extend(angles.iter().map(|a| a.cos()));
                sin.extend(angles.iter().map(|a| a.sin()));
            }
        }
        Self { cos, sin, head_dim }
    }

    /// Rotates the queries and keys of `qkv` (`[rows, 3 * d]`, each row q | k | v with heads
    /// of `head_dim`), row `r` by the angles of row `r` of the tables; values stay.
    pub(super) fn apply(&self, qkv: &mut [f32], d: usize) {
        let hd = self.head_dim;
        let rows = qkv.len() / (3 * d);
        debug_assert_eq!(rows * hd, self.cos.len());
        let cells = Cells::new(qkv);
        parallel_for(rows.div_ceil(ROWS_PER_TASK), &|t| {
            let r0 = t * ROWS_PER_TASK;
            let r1 = (r0 + ROWS_PER_TASK).min(rows);
            // SAFETY: task t alone owns rows r0..r1 of `qkv`, which outlives the loop.
            let chunk = unsafe { cells.slice(r0 * 3 * d, (r1 - r0) * 3 * d) };
            for (i, row) in chunk.chunks_exact_mut(3 * d).enumerate() {
                let (cos, sin) = (&self.cos[(r0 + i) * hd..][..hd], &self.sin[(r0 + i) * hd..][..hd]);
                row[..2 * d].chunks_exact_mut(hd).for_each(|head| rotate(head, cos, sin));
            }
        });
    }
}

/// `x * cos + rotate_half(x) * sin` in place (`rotate_half(x) = [-x2, x1]` for halves x1, x2).
fn rotate(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = x.len() / 2;
    for i in 0..half {
        let (a, b) = (x[i], x[i + half]);
        x[i] = a * cos[i] + -b * sin[i];
        x[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One head of width 8 at position (h, w) = (3, 5): the pairs (0, 4) and (1, 5) turn by
    /// 3 * f0 and 3 * f1, the pairs (2, 6) and (3, 7) by 5 * f0 and 5 * f1 (f = 1, theta^-1/2).
    #[test]
    fn rows_turn_their_pairs_by_row_and_column_angles() {
        let (hd, theta) = (8, 100.0);
        assert_eq!(inv_freq(hd, theta), [1.0, 0.1]);
        let rot = Rotary::new(&[[3, 5], [0, 0]], hd, theta);
        let d = 2 * hd; // two heads
        let mut qkv: Vec<f32> = (0..2 * 3 * d).map(|i| (i % 13) as f32 * 0.25 - 1.0).collect();
        let before = qkv.clone();
        rot.apply(&mut qkv, d);
        let angles = [3.0, 0.3, 5.0, 0.5f64];
        for part in 0..2 {
            for head in 0..2 {
                let o = part * d + head * hd;
                for (i, a) in angles.iter().enumerate() {
                    let (x, y) = (before[o + i] as f64, before[o + i + 4] as f64);
                    let want = (x * a.cos() - y * a.sin(), y * a.cos() + x * a.sin());
                    assert!((qkv[o + i] as f64 - want.0).abs() < 1e-6, "part {part} head {head} pair {i}");
                    assert!((qkv[o + i + 4] as f64 - want.1).abs() < 1e-6, "part {part} head {head} pair {i}");
                }
            }
        }
        assert_eq!(qkv[2 * d..3 * d], before[2 * d..3 * d], "values stay");
        assert_eq!(qkv[3 * d..], before[3 * d..], "position (0, 0) does not turn");
    }
}
