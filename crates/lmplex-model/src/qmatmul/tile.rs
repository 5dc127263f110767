//! The prompt kernel (AVX-512): weight rows decoded once to f32 (`q * c + mn`, one FMA per
//! value, from the same block decoders as the integer kernel), then a register-blocked f32
//! GEMM over the input rows: `RW` weight rows by `RI` input rows per step, 16 lanes per FMA.
//!
//! Why a second kernel: the integer kernel spends about four vector instructions per 32
//! weights and input row on the per-block float scaling; here a decoded weight serves every
//! input row of the tile for two FMAs per 32 values, so prompt processing (many rows) runs
//! about twice as fast, while decode (one row per request) keeps the integer kernel, which
//! decodes fewer instructions per weight.
//!
//! Invariants:
//! - `out[i, r]` is `hsum(acc)` with `acc = fma(w[r][16c..16c+16], x[i][16c..16c+16], acc)` for
//!   `c = 0, 1, ..` in order: it depends only on weight row `r` and input row `i`, never on the
//!   tile, the blocking or `m` (so prompt rows are batch invariant, like decode rows);
//! - the decoded weights are the dequantized model's values up to one rounding (the FMA), and
//!   activations stay f32: this kernel is closer to the dequantized reference than the integer
//!   kernel, so the two differ in the last bits and the caller must pick one per row by a rule
//!   that does not depend on the batch (`Linear::forward_rows` takes the row kinds).

#![allow(clippy::missing_safety_doc)] // every fn here needs AVX-512 F/BW/VL/DQ and AVX2/FMA/F16C

use super::avx512::Decode;
use crate::team::{parallel_for, Cells};
use std::arch::x86_64::*;

/// Weight rows per micro-kernel step.
const RW: usize = 3;
/// Input rows per micro-kernel step.
const RI: usize = 8;

/// 16 f32 on a cache line: buffers of these keep every 512-bit load inside one line (an
/// unaligned f32 buffer splits every load in two, which halves the kernel's speed).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// A cache-line aligned f32 buffer of `len` values (`len` a multiple of 16).
fn aligned(buf: &mut Vec<Line>, len: usize) -> &mut [f32] {
    debug_assert!(len.is_multiple_of(16));
    buf.resize(len / 16, Line([0.0; 16]));
    // SAFETY: `Line` is 16 f32 with no padding (size 64 = 16 * 4), so the lines are `len` f32s.
    unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<f32>(), len) }
}

thread_local! {
    /// Per-thread decoded weight rows (`RW * k` f32).
    static WBUF: std::cell::RefCell<Vec<Line>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Decodes one weight row of format `F` (`row.len() / F::BYTES` blocks) into `out` as f32.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub(super) unsafe fn decode_row<F: Decode>(row: &[u8], out: &mut [f32]) {
    let blocks = row.len() / F::BYTES;
    debug_assert_eq!(out.len(), blocks * F::UNITS * 32);
    let o = out.as_mut_ptr();
    for bi in 0..blocks {
        F::decode(row.as_ptr().add(bi * F::BYTES), |u, w, c, mn| {
            let p = o.add((bi * F::UNITS + u) * 32);
            let lo = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(w)));
            let hi = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(w, 1)));
            _mm512_storeu_ps(p, _mm512_fmadd_ps(lo, c, mn));
            _mm512_storeu_ps(p.add(16), _mm512_fmadd_ps(hi, c, mn));
        });
    }
}

/// The sum of 16 lanes in a fixed order.
#[inline(always)]
unsafe fn hsum(v: __m512) -> f32 {
    let s = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    let s = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
}

/// `out[i * ld + r] = dot(w[r], x[i])` for `W` weight rows (`w`, stride `k`) and `I` input
/// rows (`x`, stride `k`).
#[inline(always)]
unsafe fn micro<const W: usize, const I: usize>(w: *const f32, x: *const f32, k: usize, out: *mut f32, ld: usize) {
    let mut acc = [[_mm512_setzero_ps(); I]; W];
    let mut c = 0;
    while c < k {
        let wv: [__m512; W] = std::array::from_fn(|a| _mm512_loadu_ps(w.add(a * k + c)));
        for i in 0..I {
            let xv = _mm512_loadu_ps(x.add(i * k + c));
            for a in 0..W {
                acc[a][i] = _mm512_fmadd_ps(wv[a], xv, acc[a][i]);
            }
        }
        c += 16;
    }
    for (a, row) in acc.iter().enumerate() {
        for (i, v) in row.iter().enumerate() {
            *out.add(i * ld + a) = hsum(*v);
        }
    }
}

/// `micro` for `w_rows <= RW` and `i_rows <= RI` chosen at run time (tails).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn micro_any(w_rows: usize, i_rows: usize, w: *const f32, x: *const f32, k: usize, out: *mut f32, ld: usize) {
    macro_rules! by_i {
        ($W:literal) => {
            match i_rows {
                8 => micro::<$W, 8>(w, x, k, out, ld),
                7 => micro::<$W, 7>(w, x, k, out, ld),
                6 => micro::<$W, 6>(w, x, k, out, ld),
                5 => micro::<$W, 5>(w, x, k, out, ld),
                4 => micro::<$W, 4>(w, x, k, out, ld),
                3 => micro::<$W, 3>(w, x, k, out, ld),
                2 => micro::<$W, 2>(w, x, k, out, ld),
                _ => micro::<$W, 1>(w, x, k, out, ld),
            }
        };
    }
    match w_rows {
        3 => by_i!(3),
        2 => by_i!(2),
        _ => by_i!(1),
    }
}

/// `x: [m, k]` times the `[n, k]` weight whose row `r` is `row(r)` (format `F`) -> `[m, n]`.
pub(super) fn matmul<'a, F: Decode>(
    n: usize,
    k: usize,
    row: impl Fn(usize) -> &'a [u8] + Sync,
    x: &[f32],
    m: usize,
) -> Vec<f32> {
    debug_assert!(k.is_multiple_of(32) && x.len() == m * k);
    let mut out = vec![0f32; m * n];
    let mut xa = Vec::new();
    let xa = aligned(&mut xa, m * k);
    xa.copy_from_slice(x);
    let x = &*xa;
    // Input rows per tile: their f32 activations (`ib * k * 4` bytes) stay in L2 while the
    // tile's weight rows are decoded and swept.
    let ib = ((512 << 10) / (4 * k)).clamp(RI, 64) / RI * RI;
    let ib = ib.min(m.next_multiple_of(RI)).max(1);
    let threads = rayon::current_num_threads();
    let tiles_i = m.div_ceil(ib);
    // Weight rows per tile: multiples of RW, about eight tiles per thread.
    let per = n.div_ceil((8 * threads).div_ceil(tiles_i).max(1)).next_multiple_of(RW).clamp(RW, 96);
    let tiles_r = n.div_ceil(per);
    let dst = Cells::new(&mut out);
    parallel_for(tiles_i * tiles_r, &|t| {
        let (i0, r0) = (t % tiles_i * ib, t / tiles_i * per);
        let (li, lr) = (ib.min(m - i0), per.min(n - r0));
        WBUF.with_borrow_mut(|wbuf| {
            let wbuf = aligned(wbuf, RW * k);
            let mut r = r0;
            while r < r0 + lr {
                let wr = RW.min(r0 + lr - r);
                for a in 0..wr {
                    // SAFETY: `Isa::detect` found AVX-512 before choosing this kernel.
                    unsafe { decode_row::<F>(row(r + a), &mut wbuf[a * k..(a + 1) * k]) };
                }
                let mut i = i0;
                while i < i0 + li {
                    let ir = RI.min(i0 + li - i);
                    // SAFETY: cells (i..i + ir) x (r..r + wr) are inside [m, n] and belong to
                    // this tile alone; `x` holds rows i..i + ir; AVX-512 was detected.
                    unsafe {
                        micro_any(wr, ir, wbuf.as_ptr(), x.as_ptr().add(i * k), k, dst.ptr(i * n + r), n);
                    }
                    i += ir;
                }
                r += wr;
            }
        });
    });
    out
}
