//! The prompt kernel: packed weight rows decoded once to f32 (`c * v + mn`, one FMA per value,
//! from the same plane decoders as the integer kernel, in packed order), then a
//! register-blocked f32 GEMM over the input rows, permuted into the same order
//! (`pack::permute_x`): `RW` weight rows by `RI` input rows per step (AVX-512: 3 x 8 with 16
//! lanes per FMA; AVX2: 2 x 6 with 8 lanes).
//!
//! Why a second kernel: here a decoded weight serves every input row of the tile for two FMAs
//! per 32 values, with f32 activations (closer to the dequantized model). On 64 rows it runs
//! 1.0-1.25x as fast as the integer kernel (one thread, L2; before the packed layout it was
//! 1.5-2x), while decode (one row per request) keeps the integer kernel, which on one row is
//! about three times as fast.
//!
//! Invariants:
//! - `out[i, r]` is `hsum(acc)` with `acc = fma(w[r][L*c..L*c+L], x[i][L*c..L*c+L], acc)` for
//!   `c = 0, 1, ..` in order (L lanes, both rows in packed order): it depends only on weight
//!   row `r` and input row `i`, never on the tile, the blocking or `m` (so prompt rows are
//!   batch invariant, like decode rows); the two builds differ in the last bits and one is
//!   chosen per process;
//! - the decoded weights are the dequantized model's values up to one rounding (the FMA), and
//!   activations stay f32: this kernel is closer to the dequantized reference than the integer
//!   kernel, so the two differ in the last bits and the caller must pick one per row by a rule
//!   that does not depend on the batch (`Linear::forward_rows` takes the row kinds).

#![allow(clippy::missing_safety_doc)] // every fn here needs the CPU features its `Tile` names

use super::formats::Format;
use super::pack::{lanes, permute_x};
use crate::thread_team::{parallel_for, Cells};
use std::arch::x86_64::*;
use std::marker::PhantomData;

/// One build of the kernel for one block format.
pub(super) trait Tile {
    /// Weight rows per micro-kernel step.
    const RW: usize;
    /// Input rows per micro-kernel step.
    const RI: usize;
    /// Decodes group `g` of a packed row of `units` units into `out[32t + 2j + h]` (512 f32).
    unsafe fn decode_group(row: &[u8], units: usize, g: usize, out: *mut f32);
    /// `out[i * ld + a] = dot(w[a], x[i])` for `w_rows <= RW` weight rows (`w`, stride `k`) and
    /// `i_rows <= RI` input rows (`x`, stride `k`).
    unsafe fn micro(w_rows: usize, i_rows: usize, w: *const f32, x: *const f32, k: usize, out: *mut f32, ld: usize);
}

/// The AVX-512 build for format `F`.
pub(super) struct Avx512<F>(PhantomData<F>);
/// The AVX2/FMA build for format `F`.
pub(super) struct Avx2<F>(PhantomData<F>);

/// 16 f32 on a cache line: buffers of these keep every 512-bit load inside one line (with an
/// unaligned f32 buffer every load splits in two: Q5_0 on 64 rows ran at 300 MiB/s, 487 aligned).
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
    /// The caller's aligned copy of the input rows, kept between calls (no fresh pages each time).
    static XBUF: std::cell::Cell<Vec<Line>> = const { std::cell::Cell::new(Vec::new()) };
}

/// A packed row of `units` units as f32 in packed order (`permute_x`'s): whole groups straight
/// into `out`, the last partial group through a scratch group, its `L` lanes per vector kept.
unsafe fn decode_row<T: Tile>(row: &[u8], units: usize, out: &mut [f32]) {
    debug_assert_eq!(out.len(), 32 * units);
    let mut tmp = [Line([0.0; 16]); 32];
    for g in 0..units.div_ceil(16) {
        let l = lanes(units, g);
        if l == 16 {
            T::decode_group(row, units, g, out.as_mut_ptr().add(512 * g));
        } else {
            T::decode_group(row, units, g, tmp.as_mut_ptr().cast());
            let tmp = tmp.as_ptr().cast::<f32>();
            for t in 0..16 {
                std::ptr::copy_nonoverlapping(tmp.add(32 * t), out.as_mut_ptr().add(512 * g + 2 * l * t), 2 * l);
            }
        }
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

/// `$name::<W, I>`: `Tile::micro` for fixed `W` and `I` over `$lanes`-lane vectors `$v`.
macro_rules! micro_kernel {
    ($name:ident, $v:ty, $lanes:literal, $zero:path, $load:path, $fma:path, $hsum:path) => {
        #[inline(always)]
        #[allow(clippy::needless_range_loop)] // i and a index a register block, not one slice
        unsafe fn $name<const W: usize, const I: usize>(
            w: *const f32,
            x: *const f32,
            k: usize,
            out: *mut f32,
            ld: usize,
        ) {
            let mut acc = [[$zero(); I]; W];
            let mut c = 0;
            while c < k {
                let wv: [$v; W] = std::array::from_fn(|a| $load(w.add(a * k + c)));
                for i in 0..I {
                    let xv = $load(x.add(i * k + c));
                    for a in 0..W {
                        acc[a][i] = $fma(wv[a], xv, acc[a][i]);
                    }
                }
                c += $lanes;
            }
            for (a, row) in acc.iter().enumerate() {
                for (i, v) in row.iter().enumerate() {
                    *out.add(i * ld + a) = $hsum(*v);
                }
            }
        }
    };
}

micro_kernel!(micro512, __m512, 16, _mm512_setzero_ps, _mm512_loadu_ps, _mm512_fmadd_ps, hsum);
micro_kernel!(micro256, __m256, 8, _mm256_setzero_ps, _mm256_loadu_ps, _mm256_fmadd_ps, super::avx2::hsum);

/// Dispatches `i_rows` (1..=8) to `$micro::<$W, I>`.
macro_rules! by_i {
    ($micro:ident, $W:literal, $i:expr, $($arg:expr),*) => {
        match $i {
            8 => $micro::<$W, 8>($($arg),*),
            7 => $micro::<$W, 7>($($arg),*),
            6 => $micro::<$W, 6>($($arg),*),
            5 => $micro::<$W, 5>($($arg),*),
            4 => $micro::<$W, 4>($($arg),*),
            3 => $micro::<$W, 3>($($arg),*),
            2 => $micro::<$W, 2>($($arg),*),
            _ => $micro::<$W, 1>($($arg),*),
        }
    };
}

impl<F: Format> Tile for Avx512<F> {
    const RW: usize = 3;
    const RI: usize = 8;
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    unsafe fn decode_group(row: &[u8], units: usize, g: usize, out: *mut f32) {
        super::avx512::decode_group::<F>(row, units, g, out)
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    unsafe fn micro(w_rows: usize, i_rows: usize, w: *const f32, x: *const f32, k: usize, out: *mut f32, ld: usize) {
        match w_rows {
            3 => by_i!(micro512, 3, i_rows, w, x, k, out, ld),
            2 => by_i!(micro512, 2, i_rows, w, x, k, out, ld),
            _ => by_i!(micro512, 1, i_rows, w, x, k, out, ld),
        }
    }
}

impl<F: Format> Tile for Avx2<F> {
    const RW: usize = 2;
    const RI: usize = 6;
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode_group(row: &[u8], units: usize, g: usize, out: *mut f32) {
        super::avx2::decode_group::<F>(row, units, g, out)
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn micro(w_rows: usize, i_rows: usize, w: *const f32, x: *const f32, k: usize, out: *mut f32, ld: usize) {
        match w_rows {
            2 => by_i!(micro256, 2, i_rows, w, x, k, out, ld),
            _ => by_i!(micro256, 1, i_rows, w, x, k, out, ld),
        }
    }
}

/// `x: [m, k]` times the `[n, k]` weight whose packed row `r` is `row(r)` -> `[m, n]`, with
/// build `T`.
///
/// # Safety
/// The CPU has the features `T` needs (`Isa::detect` found them).
pub(super) unsafe fn matmul<'a, T: Tile>(
    n: usize,
    k: usize,
    row: impl Fn(usize) -> &'a [u8] + Sync,
    x: &[f32],
    m: usize,
) -> Vec<f32> {
    debug_assert!(k.is_multiple_of(32) && x.len() == m * k);
    let mut out = vec![0f32; m * n];
    let mut xbuf = XBUF.take();
    let xa = aligned(&mut xbuf, m * k);
    for (xr, xo) in x.chunks_exact(k).zip(xa.chunks_exact_mut(k)) {
        permute_x(xr, xo);
    }
    let x = &*xa;
    // Input rows per tile: their f32 activations (`ib * k * 4` bytes) stay in L2 while the
    // tile's weight rows are decoded and swept.
    let (rw, ri) = (T::RW, T::RI);
    let ib = ((512 << 10) / (4 * k)).clamp(ri, 64) / ri * ri;
    let ib = ib.min(m.next_multiple_of(ri)).max(1);
    let threads = rayon::current_num_threads();
    let tiles_i = m.div_ceil(ib);
    // Weight rows per tile: multiples of RW, about eight tiles per thread.
    let per = n.div_ceil((8 * threads).div_ceil(tiles_i).max(1)).next_multiple_of(rw).clamp(rw, 96);
    let tiles_r = n.div_ceil(per);
    let dst = Cells::new(&mut out);
    parallel_for(tiles_i * tiles_r, &|t| {
        let (i0, r0) = (t % tiles_i * ib, t / tiles_i * per);
        let (li, lr) = (ib.min(m - i0), per.min(n - r0));
        WBUF.with_borrow_mut(|wbuf| {
            let wbuf = aligned(wbuf, rw * k);
            let mut r = r0;
            while r < r0 + lr {
                let wr = rw.min(r0 + lr - r);
                for a in 0..wr {
                    // SAFETY: the caller checked the CPU features of `T`.
                    unsafe { decode_row::<T>(row(r + a), k / 32, &mut wbuf[a * k..(a + 1) * k]) };
                }
                let mut i = i0;
                while i < i0 + li {
                    let ir = ri.min(i0 + li - i);
                    // SAFETY: cells (i..i + ir) x (r..r + wr) are inside [m, n] and belong to
                    // this tile alone; `x` holds rows i..i + ir; the caller checked the features.
                    unsafe {
                        T::micro(wr, ir, wbuf.as_ptr(), x.as_ptr().add(i * k), k, dst.ptr(i * n + r), n);
                    }
                    i += ir;
                }
                r += wr;
            }
        });
    });
    XBUF.set(xbuf);
    out
}
