//! Activations quantized for the integer kernels: each 32-value block of an input row becomes
//! 32 `i16` values `q` and a scale `d = amax / 32767`, so `x ≈ d * q` with an error of at most
//! `amax / 65534` per value (about 1.5e-5 of the block's largest value: far below bf16's 2^-8,
//! and 256 times finer than the 8-bit activations ggml uses). `s = d * sum(q)` serves the types
//! whose weights carry an additive minimum (Q4_1, Q5_1, K-quants).
//!
//! Layout: the packed weights' order (`pack`). A row is padded to whole groups of 16 units
//! (`units_pad`, zeros past the row's end); in group `g`, vector `t` (32 `i16`) holds in lane
//! `j` the values `2t` and `2t + 1` of block `16g + j`; `d` and `s` are per block, padded alike.
//!
//! Quad tails: when a row's last group has 1 to 4 units (SmolLM2's 576: 16 + 2), the AVX-512
//! kernel runs that group for four input rows in one vector, lane `4r + j` holding unit `j` of
//! row `4Q + r`; `quad` holds those vectors and scales for every whole quad of rows
//! `4Q..4Q + 4`. They are copies of the same values.
//!
//! Invariants: a row's blocks depend only on that row, so quantizing a batch or one row of it
//! gives the same values (batch invariance); `k` is a multiple of 32.

/// Quantization step count: the largest magnitude of a block maps to ±QMAX.
pub(super) const QMAX: f32 = 32767.0;

/// `m` rows of `k` activations in 32-value integer blocks.
pub struct QActs {
    /// Blocks per row, padded to whole groups of 16.
    pub units_pad: usize,
    /// `[m * units_pad * 32]` quantized values in packed order.
    pub q: Vec<i16>,
    /// `[m * units_pad]` block scales.
    pub d: Vec<f32>,
    /// `[m * units_pad]` `d * sum(q)` per block.
    pub s: Vec<f32>,
    /// One per whole quad of rows (none unless the last group has 1 to 4 units).
    pub quad: Vec<QuadTail>,
}

/// The last groups of four input rows, lane `4r + j` = row `r`'s unit `j`.
pub struct QuadTail {
    /// `[16 t][32]`, as `QActs::q`.
    pub q: [i16; 512],
    pub d: [f32; 16],
    pub s: [f32; 16],
}

/// Units in the last group when a quad tail applies (1 to 4), else 0.
pub(super) fn quad_lanes(units: usize) -> usize {
    match units % 16 {
        l @ 1..=4 => l,
        _ => 0,
    }
}

/// Quantizes 32 values into `q`; returns the scale and the sum of `q`. Rounds half to even,
/// as `vcvtps2dq` does in the AVX2 build.
pub(super) fn quantize_block(x: &[f32], q: &mut [i16]) -> (f32, i32) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let scale = amax / QMAX;
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    let mut sum = 0i32;
    for (qi, &xi) in q.iter_mut().zip(x) {
        let v = (xi * inv).round_ties_even().clamp(-QMAX, QMAX) as i16;
        sum += v as i32;
        *qi = v;
    }
    (scale, sum)
}

/// `quantize_block` with AVX2 vectors: the same scale, the same values (`vcvtps2dq` rounds
/// half to even), the same sum.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_block_avx2(x: &[f32], q: &mut [i16]) -> (f32, i32) {
    use std::arch::x86_64::*;
    debug_assert!(x.len() == 32 && q.len() == 32);
    let p = x.as_ptr();
    let v = [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24))];
    let sign = _mm256_set1_ps(-0.0);
    let abs = |a: __m256| _mm256_andnot_ps(sign, a);
    let m = _mm256_max_ps(_mm256_max_ps(abs(v[0]), abs(v[1])), _mm256_max_ps(abs(v[2]), abs(v[3])));
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
    let scale = amax / QMAX;
    let inv = _mm256_set1_ps(if scale > 0.0 { 1.0 / scale } else { 0.0 });
    let i = |a: __m256| _mm256_cvtps_epi32(_mm256_mul_ps(a, inv));
    // packs interleaves 128-bit halves; the permute puts the 16 values back in order.
    let lo = _mm256_permute4x64_epi64(_mm256_packs_epi32(i(v[0]), i(v[1])), 0b11_01_10_00);
    let hi = _mm256_permute4x64_epi64(_mm256_packs_epi32(i(v[2]), i(v[3])), 0b11_01_10_00);
    _mm256_storeu_si256(q.as_mut_ptr().cast(), lo);
    _mm256_storeu_si256(q.as_mut_ptr().add(16).cast(), hi);
    let ones = _mm256_set1_epi16(1);
    let s = _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones));
    let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    (scale, _mm_cvtsi128_si32(s))
}

/// One input row's view of a `QActs`.
#[derive(Clone, Copy)]
pub struct QRow<'a> {
    pub q: &'a [i16],
    pub d: &'a [f32],
    pub s: &'a [f32],
}

impl QActs {
    /// Quantizes `x: [m, k]` row-major.
    pub fn new(x: &[f32], k: usize) -> Self {
        debug_assert!(k.is_multiple_of(32) && x.len().is_multiple_of(k.max(1)));
        let m = x.len().checked_div(k).unwrap_or(0);
        let up = (k / 32).next_multiple_of(16);
        let (mut q, mut d, mut s) = (vec![0i16; m * up * 32], vec![0f32; m * up], vec![0f32; m * up]);
        let avx2 = super::has_avx2();
        let mut tmp = [0i16; 32];
        for (b, xb) in x.chunks_exact(32).enumerate() {
            #[cfg(target_arch = "x86_64")]
            let (scale, sum) = if avx2 {
                // SAFETY: avx2 was detected at run time; both slices hold 32 values.
                unsafe { quantize_block_avx2(xb, &mut tmp) }
            } else {
                quantize_block(xb, &mut tmp)
            };
            #[cfg(not(target_arch = "x86_64"))]
            let (scale, sum) = {
                let _ = avx2;
                quantize_block(xb, &mut tmp)
            };
            let (i, u) = (b / (k / 32), b % (k / 32));
            let (g, j) = (u / 16, u % 16);
            let base = (i * up + 16 * g) * 32 + 2 * j;
            for t in 0..16 {
                q[base + 32 * t..][..2].copy_from_slice(&tmp[2 * t..2 * t + 2]);
            }
            d[i * up + u] = scale;
            s[i * up + u] = scale * sum as f32;
        }
        let mut acts = Self { units_pad: up, q, d, s, quad: vec![] };
        acts.quad_tails(k / 32, m);
        acts
    }

    /// Fills `quad` from the rows' last groups.
    fn quad_tails(&mut self, units: usize, m: usize) {
        let (l, up, g) = (quad_lanes(units), self.units_pad, units / 16);
        if l == 0 || m < 4 {
            return;
        }
        for qd in 0..m / 4 {
            let mut tail = QuadTail { q: [0; 512], d: [0.0; 16], s: [0.0; 16] };
            for r in 0..4 {
                let (i, lane) = (4 * qd + r, 4 * r);
                let base = (i * up + 16 * g) * 32;
                for t in 0..16 {
                    let src = base + 32 * t;
                    tail.q[32 * t + 2 * lane..][..8].copy_from_slice(&self.q[src..src + 8]);
                }
                let src = i * up + 16 * g;
                tail.d[lane..lane + 4].copy_from_slice(&self.d[src..src + 4]);
                tail.s[lane..lane + 4].copy_from_slice(&self.s[src..src + 4]);
            }
            self.quad.push(tail);
        }
    }

    /// The quad tail of rows `i..i + 4`, if `i` starts a whole quad and the rows have one.
    #[inline]
    pub fn quad(&self, i: usize) -> Option<&QuadTail> {
        if i.is_multiple_of(4) {
            self.quad.get(i / 4)
        } else {
            None
        }
    }

    #[inline]
    pub fn row(&self, i: usize) -> QRow<'_> {
        let up = self.units_pad;
        QRow {
            q: &self.q[i * up * 32..(i + 1) * up * 32],
            d: &self.d[i * up..(i + 1) * up],
            s: &self.s[i * up..(i + 1) * up],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_error_is_below_half_a_step() {
        let x: Vec<f32> = (0..96).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013).collect();
        let a = QActs::new(&x, 96);
        assert_eq!(a.units_pad, 16);
        for (b, xb) in x.chunks_exact(32).enumerate() {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            let mut sum = 0f32;
            for (j, &v) in xb.iter().enumerate() {
                // Value j of block b: vector j / 2, lane b, half j % 2.
                let q = a.q[(j / 2) * 32 + 2 * b + j % 2] as f32;
                let back = a.d[b] * q;
                assert!((back - v).abs() <= amax / 65534.0 * 1.0001, "{v} -> {back}");
                sum += q;
            }
            assert_eq!(a.s[b], a.d[b] * sum);
        }
        let zero = QActs::new(&[0.0; 32], 32);
        assert_eq!((zero.d[0], zero.q.iter().all(|&q| q == 0)), (0.0, true));
    }
}
