//! The AVX-512 kernel's parts for four input rows at once: a row's last group of 1 to 4 units
//! run for the four in one vector (`tail4`, given the rows' `QuadTail`), and the final
//! reduction of a call's 16 accumulators (`hsum16`).
//!
//! Invariant: each lane sees the operations `qdot`'s plain path does for its (row, unit), and
//! each sum is reduced in `hsum`'s order, so results are the same bits as without these.

use super::*;

/// The 16 vectors' sums reduced together, each lane pairing as `hsum` pairs them (lane `i`
/// with `i + 8`, then `i + 4`, then `(0 + 2) + (1 + 3)`), so each sum is `hsum`'s bits: lanes 0
/// and 1 of block `b` hold `hsum(v[b]) + hsum(v[8 + b])` and `hsum(v[4 + b]) + hsum(v[12 + b])`.
/// 47 shuffles and adds for the 16 and the pairwise sums, where `hsum` takes 5 or 6 per vector.
#[inline(always)]
pub(super) unsafe fn hsum16(v: &[__m512; 16]) -> __m512 {
    // a[p]: blocks [v[2p]'s i + (i + 8) for i in 0..4, for i in 4..8, then v[2p + 1]'s]
    let mut a = [_mm512_setzero_ps(); 8];
    for (p, a) in a.iter_mut().enumerate() {
        let (x, y) = (v[2 * p], v[2 * p + 1]);
        *a = _mm512_add_ps(_mm512_shuffle_f32x4::<0b01_00_01_00>(x, y), _mm512_shuffle_f32x4::<0b11_10_11_10>(x, y));
    }
    // b[q]: block j holds v[4q + j]'s four partial sums (j with j + 4 added)
    let mut b = [_mm512_setzero_ps(); 4];
    for (q, b) in b.iter_mut().enumerate() {
        let (x, y) = (a[2 * q], a[2 * q + 1]);
        *b = _mm512_add_ps(_mm512_shuffle_f32x4::<0b10_00_10_00>(x, y), _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y));
    }
    // per block: [t0, t0', t1, t1'] with t0 = s0 + s2, t1 = s1 + s3 of the two vectors
    let t01 = _mm512_add_ps(_mm512_unpacklo_ps(b[0], b[1]), _mm512_unpackhi_ps(b[0], b[1]));
    let t23 = _mm512_add_ps(_mm512_unpacklo_ps(b[2], b[3]), _mm512_unpackhi_ps(b[2], b[3]));
    // block j: the sums of v[j], v[4 + j], v[8 + j], v[12 + j] (t0 + t1)
    let r = _mm512_add_ps(_mm512_shuffle_ps::<0b01_00_01_00>(t01, t23), _mm512_shuffle_ps::<0b11_10_11_10>(t01, t23));
    _mm512_add_ps(r, _mm512_shuffle_ps::<0b11_10_11_10>(r, r))
}

/// The last group `g` (1 to 4 units, `acts::quad_lanes`) of `qdot` for `R = 4` input rows in
/// one vector: lane `4r + j` is unit `j` for input row `r` (`quad`: the rows' values so laid
/// out), the weights' 4 lanes repeated in each 128-bit block. One `vpmaddwd` per weight row
/// and `t` instead of four. Each lane's operations are those `group` does in lane `j` for that
/// row, and `group`'s other lanes only add zeros (their scales are zero, and no lane is ever
/// -0), so the results are the same bits. `v` is `acc` (first pass: the sums, scaled) or, with
/// `OFF`, `off` (second pass: `mn * s`).
#[inline(always)]
pub(super) unsafe fn tail4<F: Format, const W: usize, const R: usize, const OFF: bool, const V: bool>(
    rows: &[&[u8]; W],
    units: usize,
    g: usize,
    quad: &QuadTail,
    v: &mut [[__m512; R]; W],
) {
    debug_assert!(R == 4 && F::SCALES != Scales::K6);
    let l = lanes(units, g);
    let mut sums = [[_mm512_setzero_si512(); W]; 2];
    let planes = group_planes::<F, W>(rows, g);
    if !OFF {
        weights_w::<F, true, W>(
            planes,
            4 * l,
            #[inline(always)]
            |t, w| {
                let a = _mm512_loadu_si512(quad.q.as_ptr().add(32 * t).cast());
                let c = usize::from(two_chains::<F, V, R>() && t % 2 == 1);
                for k in 0..W {
                    sums[c][k] = dot_add::<F, V, R>(sums[c][k], w[k], a);
                }
            },
        );
    }
    let (ad, s) = (_mm512_loadu_ps(quad.d.as_ptr()), _mm512_loadu_ps(quad.s.as_ptr()));
    for k in 0..W {
        let sc = rows[k].as_ptr().add(units * 4 * F::BITS);
        let (c0, _, mn) = scales::<F>(sc, units, g, ((1u32 << l) - 1) as u16);
        let (c0, mn) = (_mm512_shuffle_f32x4::<0>(c0, c0), _mm512_shuffle_f32x4::<0>(mn, mn));
        let x = if OFF {
            _mm512_fmadd_ps(mn, s, gather4(&v[k]))
        } else {
            let sum = if two_chains::<F, V, R>() { _mm512_add_epi32(sums[0][k], sums[1][k]) } else { sums[0][k] };
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(c0, ad), gather4(&v[k]))
        };
        scatter4(&mut v[k], x);
    }
}

/// Lanes 0..4 of `v[r]` into block `r` (`v.len() >= 4`).
#[inline(always)]
unsafe fn gather4(v: &[__m512]) -> __m512 {
    let x = _mm512_insertf32x4::<1>(v[0], _mm512_castps512_ps128(v[1]));
    let x = _mm512_insertf32x4::<2>(x, _mm512_castps512_ps128(v[2]));
    _mm512_insertf32x4::<3>(x, _mm512_castps512_ps128(v[3]))
}

/// Block `r` of `x` into lanes 0..4 of `v[r]`.
#[inline(always)]
unsafe fn scatter4(v: &mut [__m512], x: __m512) {
    v[0] = _mm512_insertf32x4::<0>(v[0], _mm512_extractf32x4_ps::<0>(x));
    v[1] = _mm512_insertf32x4::<0>(v[1], _mm512_extractf32x4_ps::<1>(x));
    v[2] = _mm512_insertf32x4::<0>(v[2], _mm512_extractf32x4_ps::<2>(x));
    v[3] = _mm512_insertf32x4::<0>(v[3], _mm512_extractf32x4_ps::<3>(x));
}
