//! AVX2/FMA/F16C kernels: the portable kernels' arithmetic with 256-bit vectors. A unit's 32
//! integer weights are two vectors of 16 `i16`; `vpmaddwd` against the activations leaves the
//! eight `i32` lanes `portable::qdot` describes, converted to f32 and scaled with one FMA per
//! unit. Results may differ from the portable build in the last bits (FMA rounds once); the
//! choice between them is made once per process.

#![allow(clippy::missing_safety_doc)] // every fn here needs AVX2, FMA and F16C (checked by the caller)

use super::acts::QRow;
use super::formats::*;
use std::arch::x86_64::*;

/// Decodes one block into units: `f(unit, w[0..16], w[16..32], c, mn)`, units in value order,
/// with `c` and `mn` broadcast to every lane.
///
/// Scales travel as vectors on purpose: a scalar f16 conversion compiles to `vpinsrw` into a
/// free register, which can be the accumulator, and that false dependency serialises the
/// whole loop (measured: 14 instead of 6 cycles per block). Broadcast loads have no input.
pub(super) trait Decode: Format {
    unsafe fn decode(b: *const u8, f: impl FnMut(usize, __m256i, __m256i, __m256, __m256));
}

/// The f16 at `p`, as f32 in every lane (a broadcast load, then a conversion).
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16(p.cast::<i16>().read_unaligned()))
}

/// Zero-extends the two 16-byte halves of `v` to 16-bit lanes.
#[inline(always)]
unsafe fn widen_u8(v: __m256i) -> (__m256i, __m256i) {
    (_mm256_cvtepu8_epi16(_mm256_castsi256_si128(v)), _mm256_cvtepu8_epi16(_mm256_extracti128_si256(v, 1)))
}

/// Sign-extends the two 16-byte halves of `v` to 16-bit lanes.
#[inline(always)]
unsafe fn widen_i8(v: __m256i) -> (__m256i, __m256i) {
    (_mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)), _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)))
}

/// 16 bytes of nibbles as 32 bytes: low nibbles (values 0..16) then high nibbles (16..32).
#[inline(always)]
pub(super) unsafe fn nibbles(p: *const u8) -> __m256i {
    let q = _mm_loadu_si128(p.cast());
    let m = _mm_set1_epi8(0xF);
    _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m))
}

/// Byte i is 0x10 where bit i of the little-endian u32 at `p` is set, else 0.
#[inline(always)]
unsafe fn fifth_bits(p: *const u8) -> __m256i {
    let bits = p.cast::<u32>().read_unaligned() as i32;
    let shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits), shuf);
    let set = _mm256_cmpeq_epi8(_mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)), _mm256_set1_epi8(-1));
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

impl Decode for Q4_0 {
    #[inline(always)]
    unsafe fn decode(b: *const u8, mut f: impl FnMut(usize, __m256i, __m256i, __m256, __m256)) {
        let (w0, w1) = widen_i8(_mm256_sub_epi8(nibbles(b.add(2)), _mm256_set1_epi8(8)));
        f(0, w0, w1, f16_at(b), _mm256_setzero_ps())
    }
}

impl Decode for Q4_1 {
    #[inline(always)]
    unsafe fn decode(b: *const u8, mut f: impl FnMut(usize, __m256i, __m256i, __m256, __m256)) {
        let (w0, w1) = widen_u8(nibbles(b.add(4)));
        f(0, w0, w1, f16_at(b), f16_at(b.add(2)))
    }
}

impl Decode for Q5_0 {
    #[inline(always)]
    unsafe fn decode(b: *const u8, mut f: impl FnMut(usize, __m256i, __m256i, __m256, __m256)) {
        let v = _mm256_or_si256(nibbles(b.add(6)), fifth_bits(b.add(2)));
        let (w0, w1) = widen_i8(_mm256_sub_epi8(v, _mm256_set1_epi8(16)));
        f(0, w0, w1, f16_at(b), _mm256_setzero_ps())
    }
}

impl Decode for Q5_1 {
    #[inline(always)]
    unsafe fn decode(b: *const u8, mut f: impl FnMut(usize, __m256i, __m256i, __m256, __m256)) {
        let (w0, w1) = widen_u8(_mm256_or_si256(nibbles(b.add(8)), fifth_bits(b.add(4))));
        f(0, w0, w1, f16_at(b), f16_at(b.add(2)))
    }
}

impl Decode for Q8_0 {
    #[inline(always)]
    unsafe fn decode(b: *const u8, mut f: impl FnMut(usize, __m256i, __m256i, __m256, __m256)) {
        let w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(2).cast()));
        let w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(18).cast()));
        f(0, w0, w1, f16_at(b), _mm256_setzero_ps())
    }
}

/// Q4_K and Q5_K: for each 64-value chunk j, the low nibbles of 32 bytes are unit 2j and the
/// high nibbles unit 2j+1; Q5_K adds bit u of each `qh` byte as the fifth bit of unit u.
#[inline(always)]
unsafe fn k_quant<const FIVE: bool>(b: *const u8, mut f: impl FnMut(usize, __m256i, __m256i, __m256, __m256)) {
    // The 6-bit scales and mins of the 8 units as two f32 vectors (ggml's 12-byte unpacking:
    // bytes 0..8 of `aux` become the scales, bytes 8..16 the mins).
    let mut aux = [0u32; 4];
    std::ptr::copy_nonoverlapping(b.add(4), aux.as_mut_ptr().cast::<u8>(), 12);
    let (k1, k2, k3) = (0x3f3f3f3f, 0x0f0f0f0f, 0x03030303);
    aux[3] = ((aux[2] >> 4) & k2) | (((aux[1] >> 6) & k3) << 4);
    let mins_lo = aux[1] & k1;
    aux[1] = (aux[2] & k2) | (((aux[0] >> 6) & k3) << 4);
    aux[2] = mins_lo;
    aux[0] &= k1;
    let bytes = _mm_loadu_si128(aux.as_ptr().cast());
    let sc = _mm256_mul_ps(f16_at(b), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)));
    let mn = _mm256_mul_ps(f16_at(b.add(2)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8))));
    let mn = _mm256_sub_ps(_mm256_setzero_ps(), mn);
    let qs = b.add(if FIVE { 48 } else { 16 });
    let qh = if FIVE { _mm256_loadu_si256(b.add(16).cast()) } else { _mm256_setzero_si256() };
    let m4 = _mm256_set1_epi8(0xF);
    for j in 0..4 {
        let q = _mm256_loadu_si256(qs.add(32 * j).cast());
        let halves = [_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_srli_epi16(q, 4), m4)];
        for (h, mut v) in halves.into_iter().enumerate() {
            let u = 2 * j + h;
            if FIVE {
                let bit = _mm256_set1_epi8((1u8 << u) as i8);
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
                v = _mm256_or_si256(v, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
            }
            let (w0, w1) = widen_u8(v);
            let lane = _mm256_set1_epi32(u as i32);
            f(u, w0, w1, _mm256_permutevar8x32_ps(sc, lane), _mm256_permutevar8x32_ps(mn, lane));
        }
    }
}

impl Decode for Q4K {
    #[inline(always)]
    unsafe fn decode(b: *const u8, f: impl FnMut(usize, __m256i, __m256i, __m256, __m256)) {
        k_quant::<false>(b, f)
    }
}

impl Decode for Q5K {
    #[inline(always)]
    unsafe fn decode(b: *const u8, f: impl FnMut(usize, __m256i, __m256i, __m256, __m256)) {
        k_quant::<true>(b, f)
    }
}

impl Decode for Q6K {
    #[inline(always)]
    unsafe fn decode(b: *const u8, mut f: impl FnMut(usize, __m256i, __m256i, __m256, __m256)) {
        let d = f16_at(b.add(208));
        let (m4, m2) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(3));
        for n in 0..2 {
            let ql0 = _mm256_loadu_si256(b.add(64 * n).cast());
            let ql1 = _mm256_loadu_si256(b.add(64 * n + 32).cast());
            let qh = _mm256_loadu_si256(b.add(128 + 32 * n).cast());
            let sc = b.add(192 + 8 * n).cast::<i8>();
            let high = |s: i32| _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(s)), m2), 4);
            let low = [
                _mm256_and_si256(ql0, m4),
                _mm256_and_si256(ql1, m4),
                _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
            ];
            for (u, lo) in low.into_iter().enumerate() {
                let v = _mm256_sub_epi8(_mm256_or_si256(lo, high(2 * u as i32)), _mm256_set1_epi8(32));
                let (w0, w1) = widen_i8(v);
                let w0 = _mm256_mullo_epi16(w0, _mm256_set1_epi16(*sc.add(2 * u) as i16));
                let w1 = _mm256_mullo_epi16(w1, _mm256_set1_epi16(*sc.add(2 * u + 1) as i16));
                f(4 * n + u, w0, w1, d, _mm256_setzero_ps());
            }
        }
    }
}

#[inline(always)]
pub(super) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// `[dot(row, xs[r]) for r]` for one weight row of format `F`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn qdot<F: Decode, const R: usize>(row: &[u8], xs: &[QRow; R]) -> [f32; R] {
    let mut acc = [_mm256_setzero_ps(); R];
    let mut off = [_mm256_setzero_ps(); R];
    let blocks = row.len() / F::BYTES;
    for bi in 0..blocks {
        F::decode(row.as_ptr().add(bi * F::BYTES), |u, w0, w1, c, mn| {
            let idx = bi * F::UNITS + u;
            for r in 0..R {
                let x = xs[r].q.as_ptr().add(idx * 32);
                let p0 = _mm256_madd_epi16(w0, _mm256_loadu_si256(x.cast()));
                let p1 = _mm256_madd_epi16(w1, _mm256_loadu_si256(x.add(16).cast()));
                let cd = _mm256_mul_ps(c, _mm256_broadcast_ss(xs[r].d.get_unchecked(idx)));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(p0, p1)), cd, acc[r]);
                if F::MIN {
                    // Every lane holds the same running sum; lane 0 is read at the end.
                    off[r] = _mm256_fmadd_ps(mn, _mm256_broadcast_ss(xs[r].s.get_unchecked(idx)), off[r]);
                }
            }
        });
    }
    std::array::from_fn(|r| hsum(acc[r]) + _mm256_cvtss_f32(off[r]))
}

/// `acts::quantize_block` with vectors: the same scale, the same values (`vcvtps2dq` rounds
/// half to even), the same sum.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_block(x: &[f32], q: &mut [i16]) -> (f32, i32) {
    debug_assert!(x.len() == 32 && q.len() == 32);
    let p = x.as_ptr();
    let v = [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24))];
    let sign = _mm256_set1_ps(-0.0);
    let abs = |a: __m256| _mm256_andnot_ps(sign, a);
    let m = _mm256_max_ps(_mm256_max_ps(abs(v[0]), abs(v[1])), _mm256_max_ps(abs(v[2]), abs(v[3])));
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
    let scale = amax / super::acts::QMAX;
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

/// f32 dot product, eight lanes, reduced as the portable `dot`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
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
