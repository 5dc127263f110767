//! AVX-512 (F, BW, VL, DQ) kernels over packed rows (`pack`): one 512-bit register holds one
//! 32-bit word of each of a group's 16 units, so a few shifts and masks give vector `t` (the
//! `i16` pair `2t, 2t+1` of every unit) and one `vpmaddwd` and an add per input row accumulate
//! it (one `vpdpwssd` where the CPU has VNNI: `dot_add`): each lane ends a
//! group with its unit's exact integer sum. The
//! float work (convert, scale, FMA) is then once per 16 units instead of once per unit.
//!
//! Results may differ from the AVX2 and portable builds in the last bits (the same exact
//! integer sums, scaled and added in a different order); the choice is made once per process.

#![allow(clippy::missing_safety_doc)] // every fn here needs AVX-512 F/BW/VL/DQ and AVX2/FMA/F16C

mod quad;

use quad::{hsum16, tail4};

use super::acts::{QActs, QRow, QuadTail};
use super::avx2::hsum as hsum256;
use super::formats::{Format, Scales};
use super::pack::lanes;
use super::{prefetch_ahead, STREAM_UNITS};
use std::arch::x86_64::*;

/// `x` shifted so that bit `from` of each 16-bit lane lands on bit `to`.
#[inline(always)]
unsafe fn move_bits(x: __m512i, from: usize, to: usize) -> __m512i {
    if from >= to {
        _mm512_srl_epi16(x, _mm_cvtsi32_si128((from - to) as i32))
    } else {
        _mm512_sll_epi16(x, _mm_cvtsi32_si128((to - from) as i32))
    }
}

/// Calls `f(t, w)` for t in 0..16 with vector `t` of the group whose planes start at `p`
/// (`stride` bytes apart): lane `j` holds values `2t` and `2t + 1` of unit `j` as `i16`.
#[inline(always)]
unsafe fn weights<F: Format>(p: *const u8, stride: usize, mut f: impl FnMut(usize, __m512i)) {
    weights_w::<F, false, 1>([p], stride, |t, w| f(t, w[0]))
}

/// `weights` for the same group of `W` rows at once: `f(t, w)` gets vector `t` of each. With
/// `BCAST`, only the group's first 4 lanes are loaded, repeated in each 128-bit block (a short
/// last group serving four input rows: `tail4`); the operations after the load are the same.
///
/// (Narrower vectors for short last groups, 8 or 4 lanes, did not pay: batched decode is bound
/// by the number of `vpmaddwd`, not their width. Four input rows in one vector divide it.)
#[inline(always)]
unsafe fn weights_w<F: Format, const BCAST: bool, const W: usize>(
    p: [*const u8; W],
    stride: usize,
    mut f: impl FnMut(usize, &[__m512i; W]),
) {
    let ld = |q: usize| {
        let mut x = [_mm512_setzero_si512(); W];
        for (x, p) in x.iter_mut().zip(&p) {
            let p = p.add(q * stride);
            *x = if BCAST { _mm512_broadcast_i32x4(_mm_loadu_si128(p.cast())) } else { _mm512_loadu_si512(p.cast()) };
        }
        x
    };
    if F::BITS == 8 {
        for q in 0..8 {
            let x = ld(q);
            let mut w = x;
            for (w, x) in w.iter_mut().zip(&x) {
                *w = _mm512_srai_epi16::<8>(_mm512_slli_epi16::<8>(*x));
            }
            f(2 * q, &w);
            for (w, x) in w.iter_mut().zip(&x) {
                *w = _mm512_srai_epi16::<8>(*x);
            }
            f(2 * q + 1, &w);
        }
        return;
    }
    let m4 = _mm512_set1_epi16(0xF);
    let high = [ld(4.min(F::BITS - 1)), ld(5.min(F::BITS - 1))];
    for q in 0..4 {
        let x = ld(q);
        for i in 0..4 {
            let t = 4 * q + i;
            let mut w = x;
            for (k, w) in w.iter_mut().enumerate() {
                *w = match i {
                    0 => _mm512_and_si512(x[k], m4),
                    1 => _mm512_and_si512(_mm512_srli_epi16::<4>(x[k]), m4),
                    2 => _mm512_and_si512(_mm512_srli_epi16::<8>(x[k]), m4),
                    _ => _mm512_srli_epi16::<12>(x[k]),
                };
                if F::BITS == 5 {
                    // w | (bit t of each half, moved to bit 4)
                    *w = _mm512_ternarylogic_epi32::<0xF8>(*w, move_bits(high[0][k], t, 4), _mm512_set1_epi16(0x10));
                }
                if F::BITS == 6 {
                    let bits = move_bits(high[t / 8][k], 2 * (t % 8), 4);
                    *w = _mm512_ternarylogic_epi32::<0xF8>(*w, bits, _mm512_set1_epi16(0x30));
                    *w = _mm512_sub_epi16(*w, _mm512_set1_epi16(32));
                }
            }
            f(t, &w);
        }
    }
}

/// `acc + madd(w, a)`: with `V` (AVX-512 VNNI) one `vpdpwssd`, else `vpmaddwd` and an add;
/// the same exact integers either way. `vpdpwssd` runs at the pair's rate on Zen 5 and
/// leaves the add's vector pipe to the weights' decoding (8 input rows, `kernel_ab.sh`:
/// Q5_0 16% faster in cache and from memory; Q6_K, now two weight rows at a time, 18% in
/// cache, 3% from memory). It is written as `asm!` because LLVM's
/// machine combiner splits the intrinsic back into the two.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
#[inline]
unsafe fn dot_add<F: Format, const V: bool, const R: usize>(acc: __m512i, w: __m512i, a: __m512i) -> __m512i {
    if fused::<F, V, R>() {
        let mut acc = acc;
        // SAFETY: `V` is set only where avx512vnni was detected (`family::vnni`).
        std::arch::asm!("vpdpwssd {acc}, {w}, {a}", acc = inout(zmm_reg) acc, w = in(zmm_reg) w, a = in(zmm_reg) a,
            options(pure, nomem, nostack, preserves_flags));
        acc
    } else {
        _mm512_add_epi32(acc, _mm512_madd_epi16(w, a))
    }
}

/// Whether `dot_add` fuses: with VNNI, but for Q6_K on two input rows. Batch-1 decode is
/// bound by this loop as much as by memory (one row from cache ran at 21-24 GB/s per thread
/// for the 4-bit formats, about this machine's share of bandwidth), and fusing freed it: one
/// input row, one thread, in cache: the 4-bit formats 12-19% faster, Q8_0 7%, Q5_0 1%,
/// Q6_K 6%; two rows 8-24% faster, but Q6_K 20% slower (its early flush on two rows spills),
/// so Q6_K keeps the pair there. The integers are exact either way, so results do not change.
const fn fused<F: Format, const V: bool, const R: usize>() -> bool {
    V && !(matches!(F::SCALES, Scales::K6) && R == 2)
}

/// Whether `group` and `tail4` keep two chains of sums (even and odd `t`), so that each
/// `vpdpwssd` waits on an accumulator two steps back: the 4- and 8-bit formats, whose cheap
/// decoding leaves the chain's latency exposed (Q4_1 and Q8_0 at 8 input rows: 14% faster).
/// The 5- and 6-bit formats have the decoding work to cover it, and the registers of a second
/// chain spilled (Q5_0: 2x slower).
const fn two_chains<F: Format, const V: bool, const R: usize>() -> bool {
    fused::<F, V, R>() && (F::BITS == 4 || F::BITS == 8)
}

/// Two f32 at `p` (unaligned): the first in lanes 0..8, the second in lanes 8..16.
#[inline(always)]
unsafe fn halves(p: *const f32) -> __m512 {
    let lo = _mm512_castps256_ps512(_mm256_set1_ps(p.read_unaligned()));
    _mm512_insertf32x8::<1>(lo, _mm256_set1_ps(p.add(1).read_unaligned()))
}

/// Group `g`'s scales `(c[0], c[1], mn)` per lane (`s`: the row's scale region), lanes outside
/// `k` zero.
#[inline(always)]
unsafe fn scales<F: Format>(s: *const u8, units: usize, g: usize, k: __mmask16) -> (__m512, __m512, __m512) {
    let f16s = |p: *const u8| _mm512_maskz_mov_ps(k, _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())));
    let u8s = |p: *const u8| _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast())));
    let i8s = |p: *const u8| _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast())));
    let d = s.add(2 * units).cast::<f32>().add(2 * g);
    match F::SCALES {
        Scales::F16 => {
            let c = f16s(s.add(32 * g));
            (c, c, _mm512_mul_ps(c, _mm512_set1_ps(-F::OFFSET)))
        }
        Scales::F16Min => {
            let c = f16s(s.add(32 * g));
            (c, c, f16s(s.add(2 * units + 32 * g)))
        }
        Scales::K => {
            let c = _mm512_maskz_mul_ps(k, u8s(s.add(16 * g)), halves(d));
            let m = _mm512_maskz_mul_ps(k, u8s(s.add(units + 16 * g)), halves(d.add(units.div_ceil(8))));
            (c, c, _mm512_sub_ps(_mm512_setzero_ps(), m))
        }
        Scales::K6 => {
            let dv = halves(d);
            let c0 = _mm512_maskz_mul_ps(k, i8s(s.add(16 * g)), dv);
            (c0, _mm512_maskz_mul_ps(k, i8s(s.add(units + 16 * g)), dv), _mm512_setzero_ps())
        }
    }
}

/// The sum of 16 lanes: the halves added, then the AVX2 reduction of 8 lanes.
#[inline(always)]
pub(super) unsafe fn hsum(v: __m512) -> f32 {
    hsum256(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps::<1>(v)))
}

/// `out[i * stride + w] = dot(rows[w], input row i0 + i)` for the `m` input rows from `i0` of
/// `acts` and `W` packed rows of `units` units of format `F` (`out` valid for those writes): the
/// rows in groups of four (with their quad tail), then a pair, then one. One call per block
/// of weight rows, so the rows' views are built here, in registers, not by the caller.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub(super) unsafe fn qdot_rows<F: Format, const W: usize, const V: bool>(
    rows: [&[u8]; W],
    units: usize,
    acts: &QActs,
    i0: usize,
    m: usize,
    out: *mut f32,
    stride: usize,
) {
    let stream = units > STREAM_UNITS;
    let mut i = 0;
    while i + 4 <= m {
        let r = i0 + i;
        let xs = [acts.row(r), acts.row(r + 1), acts.row(r + 2), acts.row(r + 3)];
        qdot::<F, W, 4, V>(rows, units, &xs, acts.quad(r), out.add(i * stride), stride, stream && i == 0);
        i += 4;
    }
    if i + 2 <= m {
        let xs = [acts.row(i0 + i), acts.row(i0 + i + 1)];
        qdot::<F, W, 2, V>(rows, units, &xs, None, out.add(i * stride), stride, stream && i == 0);
        i += 2;
    }
    if i < m {
        qdot::<F, W, 1, V>(rows, units, &[acts.row(i0 + i)], None, out.add(i * stride), stride, stream && i == 0);
    }
}

/// `out[r * stride + w] = dot(rows[w], xs[r])` for `W` packed rows of `units` units of format
/// `F` (`out` valid for those writes):
/// each activation vector loaded serves the `W` rows. The arithmetic of one (row, input) pair
/// is the same for any `W` and `R`, so grouping never changes a result. Given `quad` (four
/// input rows' last groups side by side), a last group of 1 to 4 units runs in one vector for
/// all four rows (`tail4`), with each lane's values unchanged. With `stream` (`STREAM_UNITS`),
/// each group also prefetches its rows' bytes `STREAM_AHEAD` ahead.
///
/// Two passes over the groups: the scaled integer sums into `acc`, then (formats with a
/// minimum or offset) `mn * s` into `off`, so the two sets of `W * R` accumulators are never
/// live at once: together with the sums they spilled to the stack around every group
/// (Q4_1 and Q5_0 on 8 rows ran 5.5-7.5% slower). Each accumulator sees the same operations in
/// the same order as in one pass.
///
/// (Splitting the `i16` activations into bytes for `vpdpbusd` does not pay: two of those per
/// 64 weights cost as much as the two `vpmaddwd`, and measured 1.3x slower on 8 rows.)
#[inline(always)]
unsafe fn qdot<F: Format, const W: usize, const R: usize, const V: bool>(
    rows: [&[u8]; W],
    units: usize,
    xs: &[QRow; R],
    quad: Option<&QuadTail>,
    out: *mut f32,
    stride: usize,
    stream: bool,
) {
    let groups = units.div_ceil(16);
    let tail = |g: usize| if R == 4 && g == units / 16 { quad } else { None };
    let mut acc = [[_mm512_setzero_ps(); R]; W];
    for g in 0..groups {
        if stream {
            rows.iter().for_each(|row| prefetch_ahead(row.as_ptr().add(g * 64 * F::BITS), 64 * F::BITS));
        }
        match tail(g) {
            Some(quad) => tail4::<F, W, R, false, V>(&rows, units, g, quad, &mut acc),
            None => group::<F, W, R, V>(&rows, units, g, xs, &mut acc),
        }
    }
    let mut off = [[_mm512_setzero_ps(); R]; W];
    if F::MIN {
        for g in 0..groups {
            match tail(g) {
                Some(quad) => tail4::<F, W, R, true, V>(&rows, units, g, quad, &mut off),
                None => group_off::<F, W, R>(&rows, units, g, xs, &mut off),
            }
        }
    }
    // Loops, not `array::from_fn`: its closure would not inherit the target features, and
    // every intrinsic in it would become a call.
    if R == 4 && W == 2 {
        let v = [
            acc[0][0], acc[0][1], acc[0][2], acc[0][3], acc[1][0], acc[1][1], acc[1][2], acc[1][3], off[0][0],
            off[0][1], off[0][2], off[0][3], off[1][0], off[1][1], off[1][2], off[1][3],
        ];
        let f = hsum16(&v);
        // block r: row r's two results (weight rows 0 and 1) in lanes 0 and 1: one 8-byte store
        _mm_storel_pd(out.cast(), _mm_castps_pd(_mm512_castps512_ps128(f)));
        _mm_storel_pd(out.add(stride).cast(), _mm_castps_pd(_mm512_extractf32x4_ps::<1>(f)));
        _mm_storel_pd(out.add(2 * stride).cast(), _mm_castps_pd(_mm512_extractf32x4_ps::<2>(f)));
        _mm_storel_pd(out.add(3 * stride).cast(), _mm_castps_pd(_mm512_extractf32x4_ps::<3>(f)));
        return;
    }
    for k in 0..W {
        for r in 0..R {
            *out.add(r * stride + k) = hsum(acc[k][r]) + hsum(off[k][r]);
        }
    }
}

/// Group `g` of `qdot`'s first pass: the exact integer sums, then `acc += sum * c * d`
/// (lanes past the row's last unit have zero scales).
#[inline(always)]
unsafe fn group<F: Format, const W: usize, const R: usize, const V: bool>(
    rows: &[&[u8]; W],
    units: usize,
    g: usize,
    xs: &[QRow; R],
    acc: &mut [[__m512; R]; W],
) {
    // Q6_K's two halves (values 0..16 and 16..32 of a unit, each with its scale): on one
    // weight row, in the two sets of sums; on two, in one set, the first flushed at t = 8 (two
    // sets and the accumulators spilled registers). Flushing early on one row ran 1.14x slower
    // (one input row, weights from memory). Otherwise, with VNNI, the sets may be two chains.
    let halves = F::SCALES == Scales::K6 && W == 1;
    let early = F::SCALES == Scales::K6 && W > 1;
    let mut sums = [[[_mm512_setzero_si512(); R]; W]; 2];
    let planes = group_planes::<F, W>(rows, g);
    // inline(always): the 8-bit path calls it 16 times, and as a call it ran 50x slower
    weights_w::<F, false, W>(
        planes,
        4 * lanes(units, g),
        #[inline(always)]
        |t, w| {
            if early && t == 8 {
                flush::<F, W, R, V>(rows, units, g, xs, &mut sums, acc, 0);
            }
            let c = usize::from(if halves { t >= 8 } else { two_chains::<F, V, R>() && t % 2 == 1 });
            for r in 0..R {
                let a = _mm512_loadu_si512(xs[r].q.as_ptr().add(512 * g + 32 * t).cast());
                for k in 0..W {
                    sums[c][k][r] = dot_add::<F, V, R>(sums[c][k][r], w[k], a);
                }
            }
        },
    );
    flush::<F, W, R, V>(rows, units, g, xs, &mut sums, acc, usize::from(early));
}

/// `acc += sum * c * d` for group `g`, then the sums back to zero: `sum` the two chains'
/// sums added, or (Q6_K on one weight row) each set with its half's scale in turn; else the
/// first set with the scale of half `h` (Q6_K: values `16h..16h + 16` of a unit; the other
/// formats have one scale). Every accumulator sees the same operations in the same order
/// whatever the grouping, so the result does not depend on it. (Q6_K on two rows computes
/// the group's scales here twice, at t = 8 and at the end, rather than hold them in
/// registers through the loop; the A/B figures in `dot_add` include that cost.)
#[inline(always)]
unsafe fn flush<F: Format, const W: usize, const R: usize, const V: bool>(
    rows: &[&[u8]; W],
    units: usize,
    g: usize,
    xs: &[QRow; R],
    sums: &mut [[[__m512i; R]; W]; 2],
    acc: &mut [[__m512; R]; W],
    h: usize,
) {
    let l = lanes(units, g);
    let halves = F::SCALES == Scales::K6 && W == 1;
    for k in 0..W {
        let s = rows[k].as_ptr().add(units * 4 * F::BITS);
        let (c0, c1, _) = scales::<F>(s, units, g, ((1u32 << l) - 1) as u16);
        for r in 0..R {
            let ad = _mm512_loadu_ps(xs[r].d.as_ptr().add(16 * g));
            // (a macro, not a closure: a closure's intrinsics could become calls)
            macro_rules! fma {
                ($sum:expr, $c:expr) => {
                    acc[k][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps($sum), _mm512_mul_ps($c, ad), acc[k][r])
                };
            }
            if halves {
                fma!(sums[0][k][r], c0);
                fma!(sums[1][k][r], c1);
            } else if two_chains::<F, V, R>() {
                fma!(_mm512_add_epi32(sums[0][k][r], sums[1][k][r]), c0);
            } else {
                fma!(sums[0][k][r], if h == 0 { c0 } else { c1 });
            }
            sums[0][k][r] = _mm512_setzero_si512();
            sums[1][k][r] = _mm512_setzero_si512();
        }
    }
}

/// Group `g` of `qdot`'s second pass: `off += mn * s` (the minimum or offset times the
/// activation block's sum).
#[inline(always)]
unsafe fn group_off<F: Format, const W: usize, const R: usize>(
    rows: &[&[u8]; W],
    units: usize,
    g: usize,
    xs: &[QRow; R],
    off: &mut [[__m512; R]; W],
) {
    let l = lanes(units, g);
    for k in 0..W {
        let s = rows[k].as_ptr().add(units * 4 * F::BITS);
        let (_, _, mn) = scales::<F>(s, units, g, ((1u32 << l) - 1) as u16);
        for r in 0..R {
            off[k][r] = _mm512_fmadd_ps(mn, _mm512_loadu_ps(xs[r].s.as_ptr().add(16 * g)), off[k][r]);
        }
    }
}

/// Where group `g`'s planes start in each of the `W` rows.
#[inline(always)]
unsafe fn group_planes<F: Format, const W: usize>(rows: &[&[u8]; W], g: usize) -> [*const u8; W] {
    let mut planes = [std::ptr::null::<u8>(); W];
    for (p, row) in planes.iter_mut().zip(rows) {
        *p = row.as_ptr().add(g * 64 * F::BITS);
    }
    planes
}

/// Group `g` of a packed row as f32 (`c * v + mn`, one FMA per value) into `out[32t + 2j + h]`
/// (512 values; lanes past the group's end hold garbage).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub(super) unsafe fn decode_group<F: Format>(row: &[u8], units: usize, g: usize, out: *mut f32) {
    let l = lanes(units, g);
    let s = row.as_ptr().add(units * 4 * F::BITS);
    let (c0, c1, mn) = scales::<F>(s, units, g, ((1u32 << l) - 1) as u16);
    // Lane j's scale for values 2j and 2j+1 (lo: lanes 0..8, hi: lanes 8..16).
    let lo = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    let hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
    let spread = |v: __m512| (_mm512_permutexvar_ps(lo, v), _mm512_permutexvar_ps(hi, v));
    let (c0, c1, mn) = (spread(c0), spread(c1), spread(mn));
    weights::<F>(row.as_ptr().add(g * 64 * F::BITS), 4 * l, |t, w| {
        let c = if F::SCALES == Scales::K6 && t >= 8 { c1 } else { c0 };
        let a = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(w)));
        let b = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64::<1>(w)));
        _mm512_storeu_ps(out.add(32 * t), _mm512_fmadd_ps(a, c.0, mn.0));
        _mm512_storeu_ps(out.add(32 * t + 16), _mm512_fmadd_ps(b, c.1, mn.1));
    });
}
