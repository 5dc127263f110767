//! Quantized matrix times f32 activations, straight from the GGUF blocks (W4A32/W8A32):
//! each weight row is dequantized block by block and dotted with f32 activations in f32.
//!
//! Why not candle's `QMatMul`: it quantizes the activations to 8 bits (as ggml does), which
//! moves logits by up to ~1 versus the dequantized model, and picks kernels by batch size, so
//! a row's result changes with the batch. Here:
//! - numerics match the dequantized checkpoint to f32 rounding (the HF-transformers oracle);
//! - `out[i, r]` depends only on row `r` of the weights and row `i` of the input, with a fixed
//!   reduction order, so results are bit-identical whatever the batch;
//! - Q4_0, Q4_1 and Q8_0 have fused kernels; other types (k-quants, Q5_x) dequantize one row
//!   into a per-thread buffer with candle's block decoders, then dot.
//!
//! Cost: one pass over the weight bytes per call, amortised over the batch's rows; work is
//! split over output rows on the shared rayon pool.

use candle_core::quantized::k_quants::{self, GgmlType};
use candle_core::quantized::{GgmlDType, QTensor};
use half::f16;
use lmplex_core::{Error, Result};
use rayon::prelude::*;

fn has_avx2() -> bool {
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

/// Calls the AVX2/FMA/F16C kernel when the CPU has them, else the portable one. The choice is
/// made per process, never per batch, so results stay reproducible on one machine; the two
/// builds round differently (FMA) and may differ in the last bits.
macro_rules! dispatch {
    ($avx2:expr, $f:ident($($a:expr),*)) => {{
        #[cfg(target_arch = "x86_64")]
        {
            if $avx2 {
                // SAFETY: guarded by runtime detection of avx2 and fma.
                unsafe { avx2::$f($($a),*) }
            } else {
                // SAFETY: the portable build has no target-feature requirement.
                unsafe { portable::$f($($a),*) }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = $avx2;
            // SAFETY: the portable build has no target-feature requirement.
            unsafe { portable::$f($($a),*) }
        }
    }};
}

/// `dot(a, b)` with the process-wide kernel choice; the reduction order depends only on the
/// length, so it is the building block of every batch-invariant product.
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    dispatch!(has_avx2(), dot(a, b))
}

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
        let use_avx2 = has_avx2();
        by_weight_rows(n, m, |r, o, buf| self.row_times(r, x, o, buf, use_avx2))
    }

    /// `o[i] = dot(row r, x[i])` for every input row i. Fused types decode each weight block
    /// once per group of `GROUP` input rows (then a pair, then one); the arithmetic of one input
    /// row is the same in a group and alone, so the result does not depend on the grouping.
    fn row_times(&self, r: usize, x: &[f32], o: &mut [f32], buf: &mut Vec<f32>, avx2: bool) {
        let k = self.k;
        let row = self.row(r);
        let m = o.len();
        macro_rules! fused {
            ($f:ident) => {{
                let mut i = 0;
                while i + GROUP <= m {
                    let xs: [&[f32]; GROUP] = std::array::from_fn(|g| &x[(i + g) * k..(i + g + 1) * k]);
                    o[i..i + GROUP].copy_from_slice(&dispatch!(avx2, $f(row, &xs)));
                    i += GROUP;
                }
                if i + 2 <= m {
                    let xs: [&[f32]; 2] = std::array::from_fn(|g| &x[(i + g) * k..(i + g + 1) * k]);
                    o[i..i + 2].copy_from_slice(&dispatch!(avx2, $f(row, &xs)));
                    i += 2;
                }
                for (j, oj) in o.iter_mut().enumerate().skip(i) {
                    *oj = dispatch!(avx2, $f(row, &[&x[j * k..(j + 1) * k]]))[0];
                }
            }};
        }
        match self.dtype {
            GgmlDType::Q4_0 => fused!(dot_q4_0),
            GgmlDType::Q4_1 => fused!(dot_q4_1),
            GgmlDType::Q8_0 => fused!(dot_q8_0),
            _ => {
                buf.resize(k, 0.0);
                self.dequantize_row(r, buf);
                for (i, oi) in o.iter_mut().enumerate() {
                    *oi = dispatch!(avx2, dot(buf, &x[i * k..(i + 1) * k]));
                }
            }
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

/// Input rows that share one decode of a weight block in the fused kernels.
const GROUP: usize = 4;

/// The kernels, written once and compiled twice (portable and AVX2).
macro_rules! kernels {
    () => {
        use half::f16;

        #[inline(always)]
        fn sum8(acc: [f32; 8]) -> f32 {
            ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
        }

        /// Per-lane sums of w[j] * x[j] over one 32-value block (lane = j % 8).
        #[inline(always)]
        fn block_dot(w: &[f32; 32], x: &[f32; 32]) -> [f32; 8] {
            let mut a = [0f32; 8];
            for c in 0..4 {
                for l in 0..8 {
                    a[l] += w[c * 8 + l] * x[c * 8 + l];
                }
            }
            a
        }

        #[inline(always)]
        fn nibbles(qs: &[u8], offset: f32) -> [f32; 32] {
            let mut w = [0f32; 32];
            for j in 0..16 {
                w[j] = (qs[j] & 0xF) as f32 - offset;
                w[j + 16] = (qs[j] >> 4) as f32 - offset;
            }
            w
        }

        pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
            let mut acc = [0f32; 8];
            let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
            let (ra, rb) = (ca.remainder(), cb.remainder());
            for (x, y) in ca.zip(cb) {
                for l in 0..8 {
                    acc[l] += x[l] * y[l];
                }
            }
            let mut s = sum8(acc);
            for (x, y) in ra.iter().zip(rb) {
                s += x * y;
            }
            s
        }

        /// The 32 values of block `bi` of input row `x`.
        #[inline(always)]
        fn xblock(x: &[f32], bi: usize) -> &[f32; 32] {
            x[bi * 32..bi * 32 + 32].try_into().unwrap()
        }

        /// Q4_0: 18-byte blocks, d (f16) then 16 bytes of nibbles; value = (q - 8) * d.
        pub unsafe fn dot_q4_0<const R: usize>(row: &[u8], xs: &[&[f32]; R]) -> [f32; R] {
            let mut acc = [[0f32; 8]; R];
            for (bi, b) in row.chunks_exact(18).enumerate() {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                let w = nibbles(&b[2..18], 8.0);
                for r in 0..R {
                    let p = block_dot(&w, xblock(xs[r], bi));
                    for l in 0..8 {
                        acc[r][l] += d * p[l];
                    }
                }
            }
            acc.map(sum8)
        }

        /// Q4_1: 20-byte blocks, d and m (f16) then nibbles; value = q * d + m.
        pub unsafe fn dot_q4_1<const R: usize>(row: &[u8], xs: &[&[f32]; R]) -> [f32; R] {
            let mut acc = [[0f32; 8]; R];
            for (bi, b) in row.chunks_exact(20).enumerate() {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                let m = f16::from_le_bytes([b[2], b[3]]).to_f32();
                let w = nibbles(&b[4..20], 0.0);
                for r in 0..R {
                    let xb = xblock(xs[r], bi);
                    let p = block_dot(&w, xb);
                    let mut sx = [0f32; 8];
                    for c in 0..4 {
                        for l in 0..8 {
                            sx[l] += xb[c * 8 + l];
                        }
                    }
                    for l in 0..8 {
                        acc[r][l] += d * p[l] + m * sx[l];
                    }
                }
            }
            acc.map(sum8)
        }

        /// Q8_0: 34-byte blocks, d (f16) then 32 signed bytes; value = q * d.
        pub unsafe fn dot_q8_0<const R: usize>(row: &[u8], xs: &[&[f32]; R]) -> [f32; R] {
            let mut acc = [[0f32; 8]; R];
            for (bi, b) in row.chunks_exact(34).enumerate() {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                let mut w = [0f32; 32];
                for j in 0..32 {
                    w[j] = b[2 + j] as i8 as f32;
                }
                for r in 0..R {
                    let p = block_dot(&w, xblock(xs[r], bi));
                    for l in 0..8 {
                        acc[r][l] += d * p[l];
                    }
                }
            }
            acc.map(sum8)
        }
    };
}

mod portable {
    #![allow(clippy::missing_safety_doc, unused_unsafe)]
    kernels!();
}

/// Hand-written AVX2/FMA/F16C versions: same blocks, 8-wide FMA accumulation.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    #![allow(clippy::missing_safety_doc)]
    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    #[inline(always)]
    unsafe fn f16_at(b: &[u8], i: usize) -> f32 {
        let bits = u16::from_le_bytes([b[i], b[i + 1]]);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }

    /// Four 8-lane vectors of the 32 x values of one block.
    #[inline(always)]
    unsafe fn load_x(x: &[f32]) -> [__m256; 4] {
        let p = x.as_ptr();
        [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24))]
    }

    /// The 32 4-bit values of a block as four 8-lane vectors (x order: lo, lo+8, hi, hi+8).
    #[inline(always)]
    unsafe fn nibble_weights(qs: *const u8) -> [__m256; 4] {
        let q = _mm_loadu_si128(qs.cast());
        let mask = _mm_set1_epi8(0xF);
        let lo = _mm_and_si128(q, mask);
        let hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
        let w = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
        [w(lo), w(_mm_srli_si128(lo, 8)), w(hi), w(_mm_srli_si128(hi, 8))]
    }

    /// The 32 signed bytes of a Q8_0 block as four 8-lane vectors.
    #[inline(always)]
    unsafe fn byte_weights(q: *const u8) -> [__m256; 4] {
        let w = |o: usize| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(q.add(o).cast())));
        [w(0), w(8), w(16), w(24)]
    }

    /// Per-lane sum of w[j] * x[j] over one block.
    #[inline(always)]
    unsafe fn wdot(w: &[__m256; 4], x: &[__m256; 4]) -> __m256 {
        let mut p = _mm256_mul_ps(w[0], x[0]);
        p = _mm256_fmadd_ps(w[1], x[1], p);
        p = _mm256_fmadd_ps(w[2], x[2], p);
        _mm256_fmadd_ps(w[3], x[3], p)
    }

    #[inline(always)]
    unsafe fn xsum(x: &[__m256; 4]) -> __m256 {
        _mm256_add_ps(_mm256_add_ps(x[0], x[1]), _mm256_add_ps(x[2], x[3]))
    }

    #[inline(always)]
    unsafe fn sums<const R: usize>(acc: &[__m256; R]) -> [f32; R] {
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = hsum(acc[r]);
        }
        out
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i + 8 <= n {
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i)), _mm256_loadu_ps(b.as_ptr().add(i)), acc);
            i += 8;
        }
        let mut s = hsum(acc);
        while i < n {
            s += a[i] * b[i];
            i += 1;
        }
        s
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q4_0<const R: usize>(row: &[u8], xs: &[&[f32]; R]) -> [f32; R] {
        let mut acc = [_mm256_setzero_ps(); R];
        for (bi, b) in row.chunks_exact(18).enumerate() {
            let d = _mm256_set1_ps(f16_at(b, 0));
            let w = nibble_weights(b.as_ptr().add(2));
            for r in 0..R {
                let x = load_x(&xs[r][bi * 32..]);
                // (q - 8) * d * x = d * (q.x - 8 * sum x)
                acc[r] = _mm256_fmadd_ps(d, _mm256_fnmadd_ps(_mm256_set1_ps(8.0), xsum(&x), wdot(&w, &x)), acc[r]);
            }
        }
        sums(&acc)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q4_1<const R: usize>(row: &[u8], xs: &[&[f32]; R]) -> [f32; R] {
        let mut acc = [_mm256_setzero_ps(); R];
        for (bi, b) in row.chunks_exact(20).enumerate() {
            let (d, m) = (_mm256_set1_ps(f16_at(b, 0)), _mm256_set1_ps(f16_at(b, 2)));
            let w = nibble_weights(b.as_ptr().add(4));
            for r in 0..R {
                let x = load_x(&xs[r][bi * 32..]);
                acc[r] = _mm256_fmadd_ps(d, wdot(&w, &x), acc[r]);
                acc[r] = _mm256_fmadd_ps(m, xsum(&x), acc[r]);
            }
        }
        sums(&acc)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q8_0<const R: usize>(row: &[u8], xs: &[&[f32]; R]) -> [f32; R] {
        let mut acc = [_mm256_setzero_ps(); R];
        for (bi, b) in row.chunks_exact(34).enumerate() {
            let d = _mm256_set1_ps(f16_at(b, 0));
            let w = byte_weights(b.as_ptr().add(2));
            for r in 0..R {
                let x = load_x(&xs[r][bi * 32..]);
                acc[r] = _mm256_fmadd_ps(d, wdot(&w, &x), acc[r]);
            }
        }
        sums(&acc)
    }
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
        for dt in [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q8_0, GgmlDType::Q4K, GgmlDType::Q5K, GgmlDType::Q6K] {
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
