//! The AVX-512 attention kernel. One vector holds the 16 keys of a chunk, so scores need no
//! horizontal sums: per dimension, one load of the transposed K and one FMA per row (up to 8
//! rows share the load). Values are added four rows by 64 dimensions at a time, each value
//! row loaded once for the four. `exp` is a Cephes-style polynomial finished by `vscalefps`.
//!
//! Requires a block size that is a multiple of 16 (a chunk's keys are consecutive) and a
//! head_dim that is a multiple of 16. Keys and values are loaded 16 at a time as f32 lanes
//! (`load16`: f16 widened by `vcvtph2ps`, i8 by `vpmovsxbd` and `vcvtdq2ps`, both exact).

use super::{drive, AttnOpts, ChunkAt, Kernel, PagedKv, Query, Rows, Scratch, CHUNK};
use crate::kv_elem::{KvDtype, KvElem};
use std::arch::x86_64::*;

struct Avx512;

/// The 16 values at `p` as f32 lanes.
#[inline(always)]
pub(super) unsafe fn load16<T: KvElem>(p: *const T) -> __m512 {
    match T::DTYPE {
        KvDtype::F32 => _mm512_loadu_ps(p.cast()),
        KvDtype::F16 => _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())),
        KvDtype::I8 => _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast()))),
    }
}

/// `e^x` per lane: within 2 ulp of the exact value for x in [-87, 88]; x below about -104
/// gives 0, above 88.37 the result for 88.37.
#[inline(always)]
pub(super) unsafe fn exp(x: __m512) -> __m512 {
    let x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.376_26)), _mm512_set1_ps(-104.0));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
        x,
        _mm512_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
    let mut y = _mm512_set1_ps(1.987_569_1e-4);
    for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5] {
        y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(c));
    }
    let y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0)));
    _mm512_scalef_ps(y, n)
}

/// Scores of `R` rows (queries at `q`, `hd` apart) against one chunk (`kt`, `stride` apart):
/// per row, the even dimensions and the odd ones in two sums, added at the end. Twice the
/// independent FMA chains: a decode step's rows are one GQA group (3 to 7 rows), and with one
/// chain per row the scores waited on FMA latency.
#[inline(always)]
unsafe fn score_rows<T: KvElem, const R: usize>(q: *const f32, hd: usize, kt: *const T, stride: usize, s: *mut f32) {
    let mut even = [_mm512_setzero_ps(); R];
    let mut odd = [_mm512_setzero_ps(); R];
    for d in (0..hd).step_by(2) {
        let (k0, k1) = (load16(kt.add(d * stride)), load16(kt.add((d + 1) * stride)));
        for r in 0..R {
            even[r] = _mm512_fmadd_ps(_mm512_set1_ps(*q.add(r * hd + d)), k0, even[r]);
            odd[r] = _mm512_fmadd_ps(_mm512_set1_ps(*q.add(r * hd + d + 1)), k1, odd[r]);
        }
    }
    for r in 0..R {
        _mm512_storeu_ps(s.add(r * CHUNK), _mm512_add_ps(even[r], odd[r]));
    }
}

/// What the value steps of `R` rows share: head_dim, the rows' weights (`p`, `CHUNK` apart),
/// rescale factors and valid key counts, and where the chunk's values are.
struct Weights<'a> {
    hd: usize,
    p: *const f32,
    alpha: &'a [f32],
    valid: &'a [usize],
    at: &'a ChunkAt,
}

/// `NV` vectors (16 dims each) of `R` rows' accumulators (`acc`, `hd` apart; values from `v`):
/// rescaled, then the chunk's values added in key order, each row up to its own valid count.
#[inline(always)]
unsafe fn value_rows<T: KvElem, const R: usize, const NV: usize>(acc: *mut f32, v: *const T, w: &Weights<'_>) {
    let mut a = [[_mm512_setzero_ps(); NV]; R];
    let (mut lo, mut hi) = (CHUNK, 0);
    for (r, ar) in a.iter_mut().enumerate() {
        let s = _mm512_set1_ps(w.alpha[r]);
        for (i, x) in ar.iter_mut().enumerate() {
            *x = _mm512_mul_ps(_mm512_loadu_ps(acc.add(r * w.hd + 16 * i)), s);
        }
        (lo, hi) = (lo.min(w.valid[r]), hi.max(w.valid[r]));
    }
    // Keys every row has, then (in a chunk that holds some rows' last key) the rest, each row
    // up to its own count: the same FMA per row and key either way.
    for j in 0..lo {
        add_key::<T, R, NV>(&mut a, v.add(w.at.v[j]), w.p, j, [true; R]);
    }
    for j in lo..hi {
        add_key::<T, R, NV>(&mut a, v.add(w.at.v[j]), w.p, j, std::array::from_fn(|r| j < w.valid[r]));
    }
    for (r, ar) in a.iter().enumerate() {
        for (i, x) in ar.iter().enumerate() {
            _mm512_storeu_ps(acc.add(r * w.hd + 16 * i), *x);
        }
    }
}

/// `a[r] += p[r][j] * value_j` for the rows in `rows`.
#[inline(always)]
unsafe fn add_key<T: KvElem, const R: usize, const NV: usize>(
    a: &mut [[__m512; NV]; R],
    vj: *const T,
    p: *const f32,
    j: usize,
    rows: [bool; R],
) {
    let mut vv = [_mm512_setzero_ps(); NV];
    for (i, x) in vv.iter_mut().enumerate() {
        *x = load16(vj.add(16 * i));
    }
    for r in 0..R {
        if rows[r] {
            let w = _mm512_set1_ps(*p.add(r * CHUNK + j));
            for (x, y) in a[r].iter_mut().zip(&vv) {
                *x = _mm512_fmadd_ps(w, *y, *x);
            }
        }
    }
}

/// `value_rows` for `R` rows over all of head_dim: 64 dimensions at a time, then 16.
#[inline(always)]
unsafe fn value_dims<T: KvElem, const R: usize>(acc: *mut f32, v: *const T, w: &Weights<'_>) {
    let mut c = 0;
    while c + 64 <= w.hd {
        value_rows::<T, R, 4>(acc.add(c), v.add(c), w);
        c += 64;
    }
    while c < w.hd {
        value_rows::<T, R, 1>(acc.add(c), v.add(c), w);
        c += 16;
    }
}

impl Kernel for Avx512 {
    #[inline(always)]
    unsafe fn scores<T: KvElem>(q: &[f32], n: usize, hd: usize, k: &[T], at: &ChunkAt, s: &mut [f32]) {
        debug_assert!(at.consecutive && q.len() >= n * hd && s.len() >= n * CHUNK);
        let (q, kt, s) = (q.as_ptr(), k.as_ptr().add(at.k[0]), s.as_mut_ptr());
        let mut r = 0;
        while r < n {
            let (q, s) = (q.add(r * hd), s.add(r * CHUNK));
            let rows = (n - r).min(8);
            match rows {
                8 => score_rows::<T, 8>(q, hd, kt, at.kstride, s),
                7 => score_rows::<T, 7>(q, hd, kt, at.kstride, s),
                6 => score_rows::<T, 6>(q, hd, kt, at.kstride, s),
                5 => score_rows::<T, 5>(q, hd, kt, at.kstride, s),
                4 => score_rows::<T, 4>(q, hd, kt, at.kstride, s),
                3 => score_rows::<T, 3>(q, hd, kt, at.kstride, s),
                2 => score_rows::<T, 2>(q, hd, kt, at.kstride, s),
                _ => score_rows::<T, 1>(q, hd, kt, at.kstride, s),
            }
            r += rows;
        }
    }

    #[inline(always)]
    unsafe fn softmax(s: &mut [f32], lo: usize, valid: usize, m: &mut f32, l: &mut f32) -> f32 {
        assert!(s.len() >= CHUNK && lo < valid && valid <= CHUNK);
        let mask = (((1u32 << valid) - 1) & !((1u32 << lo) - 1)) as __mmask16;
        let x = _mm512_loadu_ps(s.as_ptr());
        let mn = m.max(_mm512_mask_reduce_max_ps(mask, x));
        let p = _mm512_maskz_mov_ps(mask, exp(_mm512_sub_ps(x, _mm512_set1_ps(mn))));
        let alpha = _mm512_cvtss_f32(exp(_mm512_set1_ps(*m - mn)));
        *l = *l * alpha + _mm512_reduce_add_ps(p);
        *m = mn;
        _mm512_storeu_ps(s.as_mut_ptr(), p);
        alpha
    }

    #[inline(always)]
    unsafe fn values<T: KvElem>(rows: Rows<'_>, hd: usize, v: &[T], at: &ChunkAt) {
        let Rows { acc, p, alpha, valid, n } = rows;
        debug_assert!(acc.len() >= n * hd && p.len() >= n * CHUNK && alpha.len() >= n && valid.len() >= n);
        let (acc, v) = (acc.as_mut_ptr(), v.as_ptr());
        let mut r = 0;
        while r < n {
            let w = Weights { hd, p: p.as_ptr().add(r * CHUNK), alpha: &alpha[r..], valid: &valid[r..], at };
            let acc = acc.add(r * hd);
            let rows = (n - r).min(4);
            match rows {
                4 => value_dims::<T, 4>(acc, v, &w),
                3 => value_dims::<T, 3>(acc, v, &w),
                2 => value_dims::<T, 2>(acc, v, &w),
                _ => value_dims::<T, 1>(acc, v, &w),
            }
            r += rows;
        }
    }
}

/// # Safety
/// The CPU has AVX-512 F/BW/VL/DQ, AVX2, FMA and F16C; block_size and head_dim are multiples
/// of 16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub(super) unsafe fn run<T: KvElem>(
    query: Query<'_>,
    kv: &PagedKv<'_, T>,
    opts: &AttnOpts,
    out: &mut [f32],
    sc: &mut Scratch,
) {
    drive::<Avx512, T>(query, kv, opts, out, sc)
}
