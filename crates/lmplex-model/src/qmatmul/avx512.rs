//! AVX-512 (F, BW, VL) kernels: a unit's 32 integer weights fill one 512-bit register, so one
//! `vpmaddwd` per input row replaces AVX2's two plus an add, the fifth bit of Q5 formats is a
//! masked byte add straight from the block's 32-bit mask, and bytes widen to 16 bits in one
//! instruction. The 16 `i32` lanes (lane `l` holds elements `2l, 2l+1`) are converted and
//! scaled with one FMA per unit, as in `avx2`. K-quants reuse the AVX2 decoders.
//!
//! Results may differ from the AVX2 and portable builds in the last bits (a different lane
//! split of the same exact integer sums); the choice is made once per process.

#![allow(clippy::missing_safety_doc)] // every fn here needs AVX-512 F/BW/VL and AVX2/FMA/F16C

use super::acts::QRow;
use super::avx2::{hsum as hsum256, nibbles, Decode as Decode256};
use super::formats::*;
use std::arch::x86_64::*;

/// Decodes one block into units: `f(unit, w, c, mn)`, `w` the 32 weights as `i16`, `c` and `mn`
/// broadcast to every lane.
pub(super) trait Decode: Format {
    unsafe fn decode(b: *const u8, f: impl FnMut(usize, __m512i, __m512, __m512));
}

/// The f16 at `p`, as f32 in every lane.
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_set1_epi16(p.cast::<i16>().read_unaligned()))
}

/// Nibbles plus 16 where bit i of the little-endian u32 at `qh` is set (values 0..32).
#[inline(always)]
unsafe fn five_bits(qh: *const u8, qs: *const u8) -> __m256i {
    let v = nibbles(qs);
    let k = _cvtu32_mask32(qh.cast::<u32>().read_unaligned());
    _mm256_mask_add_epi8(v, k, v, _mm256_set1_epi8(16))
}

impl Decode for Q4_0 {
    #[inline(always)]
    unsafe fn decode(b: *const u8, mut f: impl FnMut(usize, __m512i, __m512, __m512)) {
        let w = _mm512_cvtepi8_epi16(_mm256_sub_epi8(nibbles(b.add(2)), _mm256_set1_epi8(8)));
        f(0, w, f16_at(b), _mm512_setzero_ps())
    }
}

impl Decode for Q4_1 {
    #[inline(always)]
    unsafe fn decode(b: *const u8, mut f: impl FnMut(usize, __m512i, __m512, __m512)) {
        f(0, _mm512_cvtepu8_epi16(nibbles(b.add(4))), f16_at(b), f16_at(b.add(2)))
    }
}

impl Decode for Q5_0 {
    #[inline(always)]
    unsafe fn decode(b: *const u8, mut f: impl FnMut(usize, __m512i, __m512, __m512)) {
        let v = _mm256_sub_epi8(five_bits(b.add(2), b.add(6)), _mm256_set1_epi8(16));
        f(0, _mm512_cvtepi8_epi16(v), f16_at(b), _mm512_setzero_ps())
    }
}

impl Decode for Q5_1 {
    #[inline(always)]
    unsafe fn decode(b: *const u8, mut f: impl FnMut(usize, __m512i, __m512, __m512)) {
        f(0, _mm512_cvtepu8_epi16(five_bits(b.add(4), b.add(8))), f16_at(b), f16_at(b.add(2)))
    }
}

impl Decode for Q8_0 {
    #[inline(always)]
    unsafe fn decode(b: *const u8, mut f: impl FnMut(usize, __m512i, __m512, __m512)) {
        f(0, _mm512_cvtepi8_epi16(_mm256_loadu_si256(b.add(2).cast())), f16_at(b), _mm512_setzero_ps())
    }
}

/// The AVX2 decoder's two halves joined, its broadcast scales widened.
#[inline(always)]
unsafe fn via_avx2<F: Decode256>(b: *const u8, mut f: impl FnMut(usize, __m512i, __m512, __m512)) {
    let wide = |v: __m256| _mm512_broadcastss_ps(_mm256_castps256_ps128(v));
    F::decode(b, |u, w0, w1, c, mn| f(u, _mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1), wide(c), wide(mn)))
}

impl Decode for Q4K {
    #[inline(always)]
    unsafe fn decode(b: *const u8, f: impl FnMut(usize, __m512i, __m512, __m512)) {
        via_avx2::<Q4K>(b, f)
    }
}

impl Decode for Q5K {
    #[inline(always)]
    unsafe fn decode(b: *const u8, f: impl FnMut(usize, __m512i, __m512, __m512)) {
        via_avx2::<Q5K>(b, f)
    }
}

impl Decode for Q6K {
    #[inline(always)]
    unsafe fn decode(b: *const u8, f: impl FnMut(usize, __m512i, __m512, __m512)) {
        via_avx2::<Q6K>(b, f)
    }
}

/// The sum of 16 lanes: the halves added, then the AVX2 reduction of 8 lanes.
#[inline(always)]
unsafe fn hsum(v: __m512) -> f32 {
    hsum256(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)))
}

/// `[dot(row, xs[r]) for r]` for one weight row of format `F`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub(super) unsafe fn qdot<F: Decode, const R: usize>(row: &[u8], xs: &[QRow; R]) -> [f32; R] {
    let mut acc = [_mm512_setzero_ps(); R];
    let mut off = [_mm512_setzero_ps(); R];
    let blocks = row.len() / F::BYTES;
    for bi in 0..blocks {
        F::decode(row.as_ptr().add(bi * F::BYTES), |u, w, c, mn| {
            let idx = bi * F::UNITS + u;
            for r in 0..R {
                let p = _mm512_madd_epi16(w, _mm512_loadu_si512(xs[r].q.as_ptr().add(idx * 32).cast()));
                let cd = _mm512_mul_ps(c, _mm512_set1_ps(*xs[r].d.get_unchecked(idx)));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), cd, acc[r]);
                if F::MIN {
                    // Every lane holds the same running sum; lane 0 is read at the end.
                    off[r] = _mm512_fmadd_ps(mn, _mm512_set1_ps(*xs[r].s.get_unchecked(idx)), off[r]);
                }
            }
        });
    }
    std::array::from_fn(|r| hsum(acc[r]) + _mm512_cvtss_f32(off[r]))
}
