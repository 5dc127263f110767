//! Row-wise operations of the forward pass on plain `[rows, width]` f32 buffers: RMSNorm,
//! SiLU-times-up, residual add, bias add. Large buffers are split over the thread team by
//! rows; each row's arithmetic is sequential in a fixed order, so a row's result depends only
//! on that row (batch invariance) and not on the split.

use crate::team::{parallel_for, Cells};

/// Elements below which an operation runs on the calling thread alone.
const PARALLEL_MIN: usize = 1 << 16;

/// Applies `f(row index, row)` to every row of `x` (`width` values each).
fn by_rows(x: &mut [f32], width: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let rows = x.len() / width.max(1);
    if x.len() < PARALLEL_MIN || rows < 2 {
        x.chunks_exact_mut(width).enumerate().for_each(|(i, r)| f(i, r));
        return;
    }
    let per_task = (PARALLEL_MIN / width).clamp(1, rows);
    let cells = Cells::new(x);
    parallel_for(rows.div_ceil(per_task), &|t| {
        let (r0, r1) = (t * per_task, ((t + 1) * per_task).min(rows));
        // SAFETY: task t owns rows r0..r1, a disjoint range of `x`.
        let chunk = unsafe { cells.slice(r0 * width, (r1 - r0) * width) };
        chunk.chunks_exact_mut(width).enumerate().for_each(|(i, r)| f(r0 + i, r));
    });
}

/// `y = x / sqrt(mean(x^2) + eps) * w` per row of `w.len()` values.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let mut y = x.to_vec();
    rms_norm_in_place(&mut y, w, eps);
    y
}

pub fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let d = w.len();
    by_rows(x, d, |_, r| {
        let ms = r.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        r.iter_mut().zip(w).for_each(|(v, wi)| *v = *v * inv * wi);
    });
}

/// `silu(gate) * up`, where row i of `gu` is `[gate | up]` (`2 * width` values) when `up` is
/// `None`, else `gu` is the gate and `up` the up projection. Returns `[rows, width]`.
pub fn silu_mul(gate: Vec<f32>, up: Option<&[f32]>, width: usize) -> Vec<f32> {
    let silu = |g: f32| g / (1.0 + (-g).exp());
    match up {
        Some(up) => {
            let mut g = gate;
            by_rows(&mut g, width, |i, r| {
                let u = &up[i * width..(i + 1) * width];
                r.iter_mut().zip(u).for_each(|(gi, ui)| *gi = silu(*gi) * ui);
            });
            g
        }
        None => {
            let rows = gate.len() / (2 * width);
            let mut out = vec![0f32; rows * width];
            by_rows(&mut out, width, |i, r| {
                let (g, u) = gate[i * 2 * width..(i + 1) * 2 * width].split_at(width);
                r.iter_mut().zip(g.iter().zip(u)).for_each(|(o, (gi, ui))| *o = silu(*gi) * ui);
            });
            out
        }
    }
}

/// `x += y` elementwise.
pub fn add_in_place(x: &mut [f32], y: &[f32], width: usize) {
    by_rows(x, width, |i, r| {
        r.iter_mut().zip(&y[i * width..(i + 1) * width]).for_each(|(a, b)| *a += b);
    });
}

/// `x[row] += b` for every row.
pub fn add_bias(x: &mut [f32], b: &[f32]) {
    by_rows(x, b.len(), |_, r| r.iter_mut().zip(b).for_each(|(a, bi)| *a += bi));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows are computed alone and in a large (parallel) buffer alike.
    #[test]
    fn rows_do_not_depend_on_the_buffer() {
        let (w, rows) = (96, 2000); // 192k values: split over the team
        let x: Vec<f32> = (0..w * rows).map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0).collect();
        let nw: Vec<f32> = (0..w).map(|i| 0.5 + i as f32 / w as f32).collect();
        let all = rms_norm(&x, &nw, 1e-6);
        let act = silu_mul(x.clone(), None, w / 2);
        for i in [0, 777, rows - 1] {
            assert_eq!(rms_norm(&x[i * w..(i + 1) * w], &nw, 1e-6), all[i * w..(i + 1) * w]);
            assert_eq!(silu_mul(x[i * w..(i + 1) * w].to_vec(), None, w / 2), act[i * w / 2..(i + 1) * w / 2]);
        }
        let r = &x[..w];
        let ms = r.iter().map(|v| v * v).sum::<f32>() / w as f32;
        assert!((all[3] - r[3] / (ms + 1e-6).sqrt() * nw[3]).abs() < 1e-6);
    }
}
