//! Quantized matrix times activations, straight from the GGUF blocks: each weight block is
//! decoded to exact integers in registers and multiplied with the activations quantized to
//! 16 bits per 32-value block (`acts`), one scale per block; dense types (F32/F16/BF16) and
//! the rare Q2_K/Q3_K dequantize one row into a per-thread buffer and use an f32 dot.
//!
//! Why not candle's `QMatMul` or ggml's kernels: they quantize activations to 8 bits, which
//! moves logits by up to ~1 versus the dequantized model, and pick kernels by batch size, so a
//! row's result changes with the batch. Here:
//! - numerics: the only rounding beyond f32 is the 16-bit activation step (at most 1.5e-5 of
//!   a block's largest value), so logits stay within the HF-transformers oracle's tolerance;
//! - `out[i, r]` depends only on row `r` of the weights and row `i` of the input, with a fixed
//!   reduction order, so results are bit-identical whatever the batch (the engine's
//!   determinism guarantee rests on it);
//! - the kernel (AVX2 or portable) is chosen once per process, never per batch.
//!
//! Cost: one pass over the weight bytes per call, amortised over the batch's rows (a decoded
//! block serves up to `GROUP` input rows); work is split over output rows on the shared rayon
//! pool.

mod acts;
#[cfg(target_arch = "x86_64")]
mod avx2;
mod formats;
mod portable;

use acts::{QActs, QRow};
use candle_core::quantized::k_quants::{self, GgmlType};
use candle_core::quantized::{GgmlDType, QTensor};
use formats::*;
use half::f16;
use lmplex_core::{Error, Result};
use rayon::prelude::*;

pub(crate) fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Formats with an integer kernel in both builds.
#[cfg(target_arch = "x86_64")]
trait Kernel: portable::Decode + avx2::Decode {}
#[cfg(target_arch = "x86_64")]
impl<T: portable::Decode + avx2::Decode> Kernel for T {}
#[cfg(not(target_arch = "x86_64"))]
trait Kernel: portable::Decode {}
#[cfg(not(target_arch = "x86_64"))]
impl<T: portable::Decode> Kernel for T {}

/// `[dot(row, xs[r]) for r]` with the process-wide kernel choice.
#[inline(always)]
fn qdot<F: Kernel, const R: usize>(avx2: bool, row: &[u8], xs: &[QRow; R]) -> [f32; R] {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: `avx2` comes from `has_avx2()`, runtime detection of avx2, fma and f16c.
        return unsafe { avx2::qdot::<F, R>(row, xs) };
    }
    let _ = avx2;
    portable::qdot::<F, R>(row, xs)
}

/// `dot(a, b)` with the process-wide kernel choice; the reduction order depends only on the
/// length, so it is the building block of every batch-invariant f32 product.
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: guarded by runtime detection of avx2, fma and f16c.
        return unsafe { avx2::dot(a, b) };
    }
    portable::dot(a, b)
}

/// The portable f32 dot (the reference the AVX2 build mirrors).
pub(crate) fn portable_dot(a: &[f32], b: &[f32]) -> f32 {
    portable::dot(a, b)
}

/// Input rows that share one decode of a weight block.
const GROUP: usize = 4;

/// A `[n, k]` quantized weight in GGUF block layout.
pub struct QWeight {
    dtype: GgmlDType,
    n: usize,
    k: usize,
    row_bytes: usize,
    /// Block bytes, stored in u16s so every block (all sizes are even) is 2-byte aligned.
    data: Vec<u16>,
}

fn bytes_of(data: &[u16]) -> &[u8] {
    // SAFETY: u16 has no padding and any byte pattern is a valid u8.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), data.len() * 2) }
}

/// Reinterprets aligned block bytes as candle block structs (all `repr(C)`, alignment <= 2).
fn blocks<T: GgmlType>(b: &[u8]) -> &[T] {
    let size = std::mem::size_of::<T>();
    debug_assert_eq!(b.len() % size, 0);
    debug_assert_eq!(b.as_ptr() as usize % std::mem::align_of::<T>(), 0);
    // SAFETY: the bytes come from a GGUF tensor of type T::DTYPE (checked at construction),
    // the slice is aligned (u16 storage, even block sizes) and its length a multiple of size.
    unsafe { std::slice::from_raw_parts(b.as_ptr().cast::<T>(), b.len() / size) }
}

impl QWeight {
    pub fn from_qtensor(q: &QTensor) -> Result<Self> {
        let (n, k) = q.shape().dims2().map_err(Error::internal)?;
        let dtype = q.dtype();
        if k % dtype.block_size() != 0 {
            return Err(Error::model_load(format!("row length {k} is not a multiple of the {dtype:?} block size")));
        }
        let raw = q.data().map_err(Error::internal)?;
        let row_bytes = k / dtype.block_size() * dtype.type_size();
        if raw.len() != n * row_bytes || !row_bytes.is_multiple_of(2) {
            return Err(Error::model_load(format!("{dtype:?} tensor [{n}, {k}] has {} bytes", raw.len())));
        }
        let data = raw.chunks_exact(2).map(|c| u16::from_ne_bytes([c[0], c[1]])).collect();
        Ok(Self { dtype, n, k, row_bytes, data })
    }

    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    pub fn dtype(&self) -> GgmlDType {
        self.dtype
    }

    pub fn size_in_bytes(&self) -> usize {
        self.data.len() * 2
    }

    fn row(&self, r: usize) -> &[u8] {
        &bytes_of(&self.data)[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// Row `r` as f32 into `out` (`k` values): embeddings and the generic kernel.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let b = self.row(r);
        match self.dtype {
            GgmlDType::F32 => out
                .iter_mut()
                .zip(b.chunks_exact(4))
                .for_each(|(o, c)| *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            GgmlDType::F16 => {
                out.iter_mut().zip(b.chunks_exact(2)).for_each(|(o, c)| *o = f16::from_le_bytes([c[0], c[1]]).to_f32())
            }
            GgmlDType::BF16 => out
                .iter_mut()
                .zip(b.chunks_exact(2))
                .for_each(|(o, c)| *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32()),
            GgmlDType::Q4_0 => k_quants::BlockQ4_0::to_float(blocks(b), out),
            GgmlDType::Q4_1 => k_quants::BlockQ4_1::to_float(blocks(b), out),
            GgmlDType::Q5_0 => k_quants::BlockQ5_0::to_float(blocks(b), out),
            GgmlDType::Q5_1 => k_quants::BlockQ5_1::to_float(blocks(b), out),
            GgmlDType::Q8_0 => k_quants::BlockQ8_0::to_float(blocks(b), out),
            GgmlDType::Q2K => k_quants::BlockQ2K::to_float(blocks(b), out),
            GgmlDType::Q3K => k_quants::BlockQ3K::to_float(blocks(b), out),
            GgmlDType::Q4K => k_quants::BlockQ4K::to_float(blocks(b), out),
            GgmlDType::Q5K => k_quants::BlockQ5K::to_float(blocks(b), out),
            GgmlDType::Q6K => k_quants::BlockQ6K::to_float(blocks(b), out),
            GgmlDType::Q8_1 | GgmlDType::Q8K => out.fill(f32::NAN), // rejected at load
        }
    }

    /// `x: [m, k]` row-major -> `[m, n]` row-major.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        let (n, k) = (self.n, self.k);
        debug_assert_eq!(x.len(), m * k);
        let avx2 = has_avx2();
        macro_rules! int {
            ($f:ty) => {{
                let acts = QActs::new(x, k);
                by_weight_rows(n, m, |r, o, _| self.row_times::<$f>(r, &acts, o, avx2))
            }};
        }
        match self.dtype {
            GgmlDType::Q4_0 => int!(Q4_0),
            GgmlDType::Q4_1 => int!(Q4_1),
            GgmlDType::Q5_0 => int!(Q5_0),
            GgmlDType::Q5_1 => int!(Q5_1),
            GgmlDType::Q8_0 => int!(Q8_0),
            GgmlDType::Q4K => int!(Q4K),
            GgmlDType::Q5K => int!(Q5K),
            GgmlDType::Q6K => int!(Q6K),
            _ => by_weight_rows(n, m, |r, o, buf| {
                buf.resize(k, 0.0);
                self.dequantize_row(r, buf);
                for (i, oi) in o.iter_mut().enumerate() {
                    *oi = dot_f32(buf, &x[i * k..(i + 1) * k]);
                }
            }),
        }
    }

    /// `o[i] = dot(row r, x[i])` for every input row i. Each weight block is decoded once per
    /// group of `GROUP` input rows (then a pair, then one); the arithmetic of one input row is
    /// the same in a group and alone, so the result does not depend on the grouping.
    fn row_times<F: Kernel>(&self, r: usize, acts: &QActs, o: &mut [f32], avx2: bool) {
        let row = self.row(r);
        let m = o.len();
        let mut i = 0;
        while i + GROUP <= m {
            let xs: [QRow; GROUP] = std::array::from_fn(|g| acts.row(i + g));
            o[i..i + GROUP].copy_from_slice(&qdot::<F, GROUP>(avx2, row, &xs));
            i += GROUP;
        }
        if i + 2 <= m {
            o[i..i + 2].copy_from_slice(&qdot::<F, 2>(avx2, row, &[acts.row(i), acts.row(i + 1)]));
            i += 2;
        }
        if i < m {
            o[i] = qdot::<F, 1>(avx2, row, &[acts.row(i)])[0];
        }
    }
}

/// The `[m, n]` product computed by weight row: `f(r, o, scratch)` fills `o[i] = out[i, r]` for
/// every input row i. Rows are split over the shared rayon pool; each task has its own scratch.
pub(crate) fn by_weight_rows(
    n: usize,
    m: usize,
    f: impl Fn(usize, &mut [f32], &mut Vec<f32>) + Sync + Send,
) -> Vec<f32> {
    // Work on the transpose `[n, m]` so each task owns whole output rows.
    let mut out_t = vec![0f32; n * m];
    let rows_per_task = (4096 / m.max(1)).clamp(1, 64);
    out_t.par_chunks_mut(rows_per_task * m).enumerate().for_each_with(Vec::<f32>::new(), |buf, (ti, chunk)| {
        for (j, o) in chunk.chunks_exact_mut(m).enumerate() {
            f(ti * rows_per_task + j, o, buf);
        }
    });
    if m == 1 {
        return out_t;
    }
    let mut out = vec![0f32; m * n];
    for r in 0..n {
        for i in 0..m {
            out[i * n + r] = out_t[r * m + i];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    /// Every supported type: fused or generic kernel equals dequantize-then-f32-matmul, and a
    /// row's output is bit-identical for batch sizes 1 and 5.
    #[test]
    fn matches_dequantized_reference_and_is_batch_invariant() {
        let (n, k, m) = (48, 512, 7); // groups of 4, 2 and 1
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
        let x: Vec<f32> = (0..m * k).map(|i| ((i * 104729) % 997) as f32 / 498.0 - 1.0).collect();
        let wt = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        for dt in [
            GgmlDType::Q4_0,
            GgmlDType::Q4_1,
            GgmlDType::Q5_0,
            GgmlDType::Q5_1,
            GgmlDType::Q8_0,
            GgmlDType::Q2K,
            GgmlDType::Q3K,
            GgmlDType::Q4K,
            GgmlDType::Q5K,
            GgmlDType::Q6K,
            GgmlDType::F16,
        ] {
            let q = QTensor::quantize(&wt, dt).unwrap();
            let deq = q.dequantize(&Device::Cpu).unwrap().to_vec2::<f32>().unwrap();
            let qw = QWeight::from_qtensor(&q).unwrap();
            let y = qw.matmul(&x, m);
            for i in 0..m {
                for r in 0..n {
                    let want: f32 = (0..k).map(|j| deq[r][j] * x[i * k + j]).sum();
                    let got = y[i * n + r];
                    assert!((want - got).abs() < 1e-3 * (1.0 + want.abs()), "{dt:?} [{i},{r}]: {want} vs {got}");
                }
                let alone = qw.matmul(&x[i * k..(i + 1) * k], 1);
                assert_eq!(alone, y[i * n..(i + 1) * n].to_vec(), "{dt:?}: row {i} changes with the batch");
            }
        }
    }
}
