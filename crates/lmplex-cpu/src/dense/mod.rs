//! Dense weight matrices (f32, bf16 or f16) times f32 activations, batch-invariant.
//!
//! Layout: the `[n, k]` matrix is repacked at load into panels of `PANEL` weight rows, k-major
//! inside a panel (element `(r, j)` at `panel r / PANEL`, offset `j * PANEL + r % PANEL`; the
//! last panel padded with zeros), in the checkpoint's own element type: a bf16 checkpoint takes
//! two bytes per weight, and the repacked copy replaces the original.
//!
//! Arithmetic: `out[i, r]` is one f32 fused multiply-add chain over `j = 0..k` in order,
//! `acc = fma(w[r, j], x[i, j], acc)` from `acc = 0`, with each weight widened to f32 exactly
//! (bf16 and f16 values are all f32 values). Every kernel family (AVX-512, AVX2, portable) and
//! every register block (1 to `MR` input rows) computes exactly that chain, one vector lane per
//! output, so a row's result is bit-identical whatever else is in the batch, whichever thread
//! ran it, whether it is a prompt or a generated row, and on whichever CPU (the engine's
//! determinism guarantee rests on it, as it does on `QWeight::matmul` for GGUF weights).
//!
//! Why not a BLAS gemm: it picks blocking and micro-kernels by the shape of the product (and
//! may split the reduction), so a row rounds differently in a batch of 1 and of 37.
//!
//! Speed: a block of up to `MR` input rows by one panel keeps `MR x PANEL` sums in registers,
//! so each widened weight vector feeds `MR` FMAs and each activation one broadcast: prefill is
//! bound by the FMA units, decode (one row) by the memory stream of the panels. Work is split
//! over panels and input tiles on the forward pass's thread team (`qmatmul::by_weight_row_blocks`).

mod kernels;
#[cfg(test)]
mod tests;

use crate::qmatmul::by_weight_row_blocks;
use half::{bf16, f16};

/// Weight rows per panel: two AVX-512 vectors of f32 sums per input row.
pub const PANEL: usize = 32;

/// The element type a dense matrix is stored in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DenseDtype {
    /// IEEE single precision, 4 bytes.
    F32,
    /// bfloat16, 2 bytes.
    Bf16,
    /// IEEE half precision, 2 bytes.
    F16,
}

impl DenseDtype {
    /// Bytes per stored weight.
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::Bf16 | Self::F16 => 2,
        }
    }
}

/// The panels, in the stored element type (bf16 and f16 as their bits).
#[derive(Clone)]
enum Panels {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
    F16(Vec<u16>),
}

/// A `[n, k]` matrix (n outputs of k inputs) repacked into panels (module docs).
pub struct DenseWeight {
    n: usize,
    k: usize,
    panels: Panels,
}

/// Repacks row-major `data` (`n` rows of `k`) into panels, padding with `zero`.
fn pack<T: Copy>(n: usize, k: usize, data: &[T], zero: T) -> Vec<T> {
    assert_eq!(data.len(), n * k, "dense weight [{n}, {k}] needs {} values", n * k);
    let np = n.div_ceil(PANEL);
    let mut out = vec![zero; np * PANEL * k];
    for (r, row) in data.chunks_exact(k.max(1)).enumerate().take(n) {
        let base = r / PANEL * PANEL * k + r % PANEL;
        for (j, &v) in row.iter().enumerate() {
            out[base + j * PANEL] = v;
        }
    }
    out
}

impl DenseWeight {
    /// Packs `data`, `n` f32 rows of `k` values row-major. Panics unless `data.len() == n * k`.
    pub fn new(n: usize, k: usize, data: Vec<f32>) -> Self {
        Self { n, k, panels: Panels::F32(pack(n, k, &data, 0.0)) }
    }

    /// Packs `n` rows of `k` bf16 values row-major (raw bits).
    pub fn from_bf16(n: usize, k: usize, bits: &[u16]) -> Self {
        Self { n, k, panels: Panels::Bf16(pack(n, k, bits, 0)) }
    }

    /// Packs `n` rows of `k` f16 values row-major (raw bits).
    pub fn from_f16(n: usize, k: usize, bits: &[u16]) -> Self {
        Self { n, k, panels: Panels::F16(pack(n, k, bits, 0)) }
    }

    /// The rows of `parts` one after another, when they share the row length and element type.
    pub fn concat(parts: &[&DenseWeight]) -> Option<DenseWeight> {
        let first = parts.first()?;
        let (k, dtype) = (first.k, first.dtype());
        if parts.iter().any(|p| p.k != k || p.dtype() != dtype) {
            return None;
        }
        let n = parts.iter().map(|p| p.n).sum();
        Some(match dtype {
            DenseDtype::F32 => {
                let data: Vec<f32> = parts.iter().flat_map(|p| p.row_major_f32()).collect();
                Self::new(n, k, data)
            }
            DenseDtype::Bf16 => {
                Self::from_bf16(n, k, &parts.iter().flat_map(|p| p.row_major_bits()).collect::<Vec<_>>())
            }
            DenseDtype::F16 => Self::from_f16(n, k, &parts.iter().flat_map(|p| p.row_major_bits()).collect::<Vec<_>>()),
        })
    }

    /// `(n, k)`: rows (outputs) and row length (inputs).
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// The element type the weights are stored in.
    pub fn dtype(&self) -> DenseDtype {
        match self.panels {
            Panels::F32(_) => DenseDtype::F32,
            Panels::Bf16(_) => DenseDtype::Bf16,
            Panels::F16(_) => DenseDtype::F16,
        }
    }

    /// Bytes the stored panels take (padding included).
    pub fn size_in_bytes(&self) -> usize {
        match &self.panels {
            Panels::F32(v) => v.len() * 4,
            Panels::Bf16(v) | Panels::F16(v) => v.len() * 2,
        }
    }

    /// Weight `(r, j)` as f32 (exact).
    fn get(&self, r: usize, j: usize) -> f32 {
        let at = r / PANEL * PANEL * self.k + j * PANEL + r % PANEL;
        match &self.panels {
            Panels::F32(v) => v[at],
            Panels::Bf16(v) => bf16::from_bits(v[at]).to_f32(),
            Panels::F16(v) => f16::from_bits(v[at]).to_f32(),
        }
    }

    /// Weight row `r` widened to f32 into `out` (`k` values): an embedding lookup.
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.n && out.len() == self.k, "row {r} of [{}, {}]", self.n, self.k);
        for (j, o) in out.iter_mut().enumerate() {
            *o = self.get(r, j);
        }
    }

    fn row_major_f32(&self) -> Vec<f32> {
        (0..self.n).flat_map(|r| (0..self.k).map(move |j| self.get(r, j))).collect()
    }

    fn row_major_bits(&self) -> Vec<u16> {
        let (Panels::Bf16(v) | Panels::F16(v)) = &self.panels else { return Vec::new() };
        let k = self.k;
        (0..self.n).flat_map(|r| (0..k).map(move |j| v[r / PANEL * PANEL * k + j * PANEL + r % PANEL])).collect()
    }

    /// `x: [m, k]` row-major -> `[m, n]` row-major.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        let k = self.k;
        assert_eq!(x.len(), m * k, "activations of {m} rows of {k}");
        if k == 0 {
            return vec![0.0; m * self.n];
        }
        let isa = kernels::Isa::detect();
        by_weight_row_blocks(self.n, m, PANEL, |b, _| {
            let p = b.r / PANEL;
            let (out, stride) = b.at(0, b.li);
            let rows = &x[b.i0 * k..(b.i0 + b.li) * k];
            // SAFETY: `Block::at` checked that input rows 0..li of the block's `nr` weight rows
            // are its cells (`stride` apart), which only this task writes.
            unsafe {
                match &self.panels {
                    Panels::F32(v) => {
                        kernels::panel::<kernels::F32>(isa, &v[p * PANEL * k..][..PANEL * k], rows, out, stride, b.nr)
                    }
                    Panels::Bf16(v) => {
                        kernels::panel::<kernels::Bf16>(isa, &v[p * PANEL * k..][..PANEL * k], rows, out, stride, b.nr)
                    }
                    Panels::F16(v) => {
                        kernels::panel::<kernels::F16>(isa, &v[p * PANEL * k..][..PANEL * k], rows, out, stride, b.nr)
                    }
                }
            }
        })
    }
}
