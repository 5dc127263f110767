//! Dense f32 weight matrix times f32 activations, batch-invariant.
//!
//! Why not candle's gemm: a BLAS-style gemm picks its blocking and micro-kernels by the shape of
//! the product, so the same input row can round differently in a batch of 1 and of 37. Here
//! `out[i, r] = dot(w[r], x[i])` with `qmatmul::dot_f32`, whose reduction order depends only on
//! `k`: a row's result is bit-identical whatever else is in the batch (the engine's
//! determinism guarantee rests on it, as it does on `QWeight::matmul` for GGUF weights).
//!
//! Cost: one pass over the weights per call, amortised over the batch's rows; slower than a
//! tuned gemm for long prefills, the same for decode (memory-bound). Work is split over output
//! rows on the forward pass's thread team (`team`).

use crate::qmatmul::{by_weight_rows, dot_f32};

/// A `[n, k]` row-major f32 matrix.
pub struct DenseWeight {
    n: usize,
    k: usize,
    data: Vec<f32>,
}

impl DenseWeight {
    /// Wraps `data`, `n` rows of `k` values row-major. Panics unless `data.len() == n * k`.
    pub fn new(n: usize, k: usize, data: Vec<f32>) -> Self {
        assert_eq!(data.len(), n * k, "dense weight [{n}, {k}] needs {} values", n * k);
        Self { n, k, data }
    }

    /// The rows of `parts` one after another, when they share the row length.
    pub fn concat(parts: &[&DenseWeight]) -> Option<DenseWeight> {
        let k = parts.first()?.k;
        if parts.iter().any(|p| p.k != k) {
            return None;
        }
        let data: Vec<f32> = parts.iter().flat_map(|p| p.data.iter().copied()).collect();
        Some(Self::new(data.len() / k.max(1), k, data))
    }

    /// `(n, k)`: rows (outputs) and row length (inputs).
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// Bytes the values take.
    pub fn size_in_bytes(&self) -> usize {
        self.data.len() * 4
    }

    /// Weight row `r` (`k` values).
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.k..(r + 1) * self.k]
    }

    /// `x: [m, k]` row-major -> `[m, n]` row-major.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        let k = self.k;
        debug_assert_eq!(x.len(), m * k);
        by_weight_rows(self.n, m, |b, _| {
            let w = self.row(b.r);
            for i in 0..b.li {
                let row = b.i0 + i;
                b.set(i, 0, dot_f32(w, &x[row * k..(row + 1) * k]));
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_reference_and_is_batch_invariant() {
        let (n, k, m) = (37, 100, 9);
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
        let x: Vec<f32> = (0..m * k).map(|i| ((i * 104729) % 997) as f32 / 498.0 - 1.0).collect();
        let dw = DenseWeight::new(n, k, w.clone());
        let y = dw.matmul(&x, m);
        for i in 0..m {
            for r in 0..n {
                let want: f32 = (0..k).map(|j| w[r * k + j] * x[i * k + j]).sum();
                assert!((want - y[i * n + r]).abs() < 1e-4 * (1.0 + want.abs()));
            }
            for sub in [1, 2, 5] {
                let lo = i.min(m - sub);
                let part = dw.matmul(&x[lo * k..(lo + sub) * k], sub);
                let got = &part[(i - lo) * n..(i - lo + 1) * n];
                assert_eq!(got, &y[i * n..(i + 1) * n], "row {i} changes with a batch of {sub}");
            }
        }
    }
}
