//! AVX2/FMA/F16C kernels: the AVX-512 build's scheme (`avx512`) with 256-bit vectors, a group
//! of 16 units taken as two halves of 8 lanes. `vpmaddwd` and an add accumulate each unit's
//! exact integer sum in its lane; the float work is once per 8 units. Results may differ from
//! the other builds in the last bits; the choice between them is made once per process.

#![allow(clippy::missing_safety_doc)] // every fn here needs AVX2, FMA and F16C (checked by the caller)

use super::acts::QRow;
use super::formats::{Format, Scales};
use super::pack::lanes;
use super::prefetch_ahead;
use std::arch::x86_64::*;

/// `x` shifted so that bit `from` of each 16-bit lane lands on bit `to`.
#[inline(always)]
unsafe fn move_bits(x: __m256i, from: usize, to: usize) -> __m256i {
    if from >= to {
        _mm256_srl_epi16(x, _mm_cvtsi32_si128((from - to) as i32))
    } else {
        _mm256_sll_epi16(x, _mm_cvtsi32_si128((to - from) as i32))
    }
}

/// Calls `f(t, w)` for t in 0..16 with vector `t` of the half group whose planes start at `p`
/// (`stride` bytes apart): lane `j` holds values `2t` and `2t + 1` of its unit as `i16`.
#[inline(always)]
unsafe fn weights<F: Format>(p: *const u8, stride: usize, mut f: impl FnMut(usize, __m256i)) {
    let ld = |q: usize| _mm256_loadu_si256(p.add(q * stride).cast());
    if F::BITS == 8 {
        for q in 0..8 {
            let x = ld(q);
            f(2 * q, _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(x)));
            f(2 * q + 1, _mm256_srai_epi16::<8>(x));
        }
        return;
    }
    let m4 = _mm256_set1_epi16(0xF);
    let high = [ld(4.min(F::BITS - 1)), ld(5.min(F::BITS - 1))];
    for q in 0..4 {
        let x = ld(q);
        let nib = [
            _mm256_and_si256(x, m4),
            _mm256_and_si256(_mm256_srli_epi16::<4>(x), m4),
            _mm256_and_si256(_mm256_srli_epi16::<8>(x), m4),
            _mm256_srli_epi16::<12>(x),
        ];
        for (i, mut w) in nib.into_iter().enumerate() {
            let t = 4 * q + i;
            if F::BITS == 5 {
                let bit = _mm256_and_si256(move_bits(high[0], t, 4), _mm256_set1_epi16(0x10));
                w = _mm256_or_si256(w, bit);
            }
            if F::BITS == 6 {
                let bits = _mm256_and_si256(move_bits(high[t / 8], 2 * (t % 8), 4), _mm256_set1_epi16(0x30));
                w = _mm256_sub_epi16(_mm256_or_si256(w, bits), _mm256_set1_epi16(32));
            }
            f(t, w);
        }
    }
}

/// Half `hf` of group `g`: scales `(c[0], c[1], mn)` per lane (`s`: the row's scale region),
/// lanes past the row's last unit zero.
#[inline(always)]
unsafe fn scales<F: Format>(s: *const u8, units: usize, g: usize, hf: usize) -> (__m256, __m256, __m256) {
    let live = (lanes(units, g) - 8 * hf) as i32;
    let keep =
        _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(live), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
    let at = |p: *const u8| p.add(16 * g + 8 * hf);
    let f16s = |p: *const u8| _mm256_and_ps(keep, _mm256_cvtph_ps(_mm_loadu_si128(p.add(32 * g + 16 * hf).cast())));
    let u8s = |p: *const u8| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(at(p).cast())));
    let i8s = |p: *const u8| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(at(p).cast())));
    let d = s.add(2 * units).cast::<f32>().add(2 * g + hf);
    let dv = _mm256_set1_ps(d.read_unaligned());
    match F::SCALES {
        Scales::F16 => {
            let c = f16s(s);
            (c, c, _mm256_mul_ps(c, _mm256_set1_ps(-F::OFFSET)))
        }
        Scales::F16Min => {
            let c = f16s(s);
            (c, c, f16s(s.add(2 * units)))
        }
        Scales::K => {
            let c = _mm256_and_ps(keep, _mm256_mul_ps(u8s(s), dv));
            let dmin = _mm256_set1_ps(d.add(units.div_ceil(8)).read_unaligned());
            let m = _mm256_and_ps(keep, _mm256_mul_ps(u8s(s.add(units)), dmin));
            (c, c, _mm256_sub_ps(_mm256_setzero_ps(), m))
        }
        Scales::K6 => {
            let c0 = _mm256_and_ps(keep, _mm256_mul_ps(i8s(s), dv));
            (c0, _mm256_and_ps(keep, _mm256_mul_ps(i8s(s.add(units)), dv)), _mm256_setzero_ps())
        }
    }
}

/// `[dot(row, xs[r]) for r]` for one packed row of `units` units of format `F`; with `stream`
/// (`STREAM_UNITS`), each group also prefetches the row's bytes `STREAM_AHEAD` ahead.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn qdot<F: Format, const R: usize>(
    row: &[u8],
    units: usize,
    xs: &[QRow; R],
    stream: bool,
) -> [f32; R] {
    let split = F::SCALES == Scales::K6;
    let mut acc = [_mm256_setzero_ps(); R];
    let mut off = [_mm256_setzero_ps(); R];
    let s = row.as_ptr().add(units * 4 * F::BITS);
    for g in 0..units.div_ceil(16) {
        let l = lanes(units, g);
        if stream {
            prefetch_ahead(row.as_ptr().add(g * 64 * F::BITS), 64 * F::BITS);
        }
        for hf in 0..l.div_ceil(8) {
            let (c0, c1, mn) = scales::<F>(s, units, g, hf);
            let mut sums = [[_mm256_setzero_si256(); R]; 2];
            weights::<F>(row.as_ptr().add(g * 64 * F::BITS + 32 * hf), 4 * l, |t, w| {
                let h = usize::from(split && t >= 8);
                for r in 0..R {
                    let a = _mm256_loadu_si256(xs[r].q.as_ptr().add(512 * g + 32 * t + 16 * hf).cast());
                    sums[h][r] = _mm256_add_epi32(sums[h][r], _mm256_madd_epi16(w, a));
                }
            });
            let at = 16 * g + 8 * hf;
            for r in 0..R {
                let ad = _mm256_loadu_ps(xs[r].d.as_ptr().add(at));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[0][r]), _mm256_mul_ps(c0, ad), acc[r]);
                if split {
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[1][r]), _mm256_mul_ps(c1, ad), acc[r]);
                }
                if F::MIN {
                    off[r] = _mm256_fmadd_ps(mn, _mm256_loadu_ps(xs[r].s.as_ptr().add(at)), off[r]);
                }
            }
        }
    }
    // A loop, not `array::from_fn`: its closure would not inherit the target features, and
    // every intrinsic in it would become a call.
    let mut out = [0f32; R];
    for r in 0..R {
        out[r] = hsum(acc[r]) + hsum(off[r]);
    }
    out
}

/// Group `g` of a packed row as f32 (`c * v + mn`, one FMA per value) into `out[32t + 2j + h]`
/// (512 values; lanes past the group's end hold garbage or are not written).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn decode_group<F: Format>(row: &[u8], units: usize, g: usize, out: *mut f32) {
    let l = lanes(units, g);
    let s = row.as_ptr().add(units * 4 * F::BITS);
    let lo = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    let hi = _mm256_add_epi32(lo, _mm256_set1_epi32(4));
    let spread = |v: __m256| (_mm256_permutevar8x32_ps(v, lo), _mm256_permutevar8x32_ps(v, hi));
    for hf in 0..l.div_ceil(8) {
        let (c0, c1, mn) = scales::<F>(s, units, g, hf);
        let (c0, c1, mn) = (spread(c0), spread(c1), spread(mn));
        weights::<F>(row.as_ptr().add(g * 64 * F::BITS + 32 * hf), 4 * l, |t, w| {
            let c = if F::SCALES == Scales::K6 && t >= 8 { c1 } else { c0 };
            let a = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(w)));
            let b = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256::<1>(w)));
            let o = out.add(32 * t + 16 * hf);
            _mm256_storeu_ps(o, _mm256_fmadd_ps(a, c.0, mn.0));
            _mm256_storeu_ps(o.add(8), _mm256_fmadd_ps(b, c.1, mn.1));
        });
    }
}

#[inline(always)]
pub(super) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
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
