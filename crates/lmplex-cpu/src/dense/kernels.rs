//! The dense kernels: one panel (`PANEL` weight rows, k-major) times up to a tile of input
//! rows, in register blocks of up to `MR` rows, for each element type (`Elem`) and kernel
//! family (AVX-512, AVX2, portable).
//!
//! Invariant (the module's, `dense`): each output is the f32 FMA chain over `j` in order from
//! zero, one lane per output, in every family and block size; families differ in vector
//! width only, so their results are bit-identical.

#![allow(clippy::missing_safety_doc)]

use super::PANEL;
pub(super) use crate::qmatmul::Isa;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Input rows per register block (AVX-512: `MR x 2` vectors of sums).
const MR: usize = 8;
/// Input rows per register block on AVX2 (`MR2 x 4` vectors of sums of 16 registers).
const MR2: usize = 2;
/// Blocks of at most this many input rows (decode) prefetch the panel into L2 `AHEAD` bytes
/// ahead: one core's few L1 miss buffers alone stream a panel from memory at about 7 GB/s,
/// with L2 prefetches about 20 (`dense_timing`). One row by two panels
/// (`avx512_row_by_two`) prefetches both into L1 instead: 10-20% faster there, measured on a
/// Qwen2.5-0.5B decode step.
const STREAM_ROWS: usize = 2;
const AHEAD: usize = 6144;

/// Prefetches (`HINT`: `_MM_HINT_T1` into L2, `_MM_HINT_T0` into L1) the panel bytes `AHEAD`
/// past k-step `j` (one k-step is `PANEL` values).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn stream<const HINT: i32, T>(p: *const T, j: usize) {
    let step = PANEL * std::mem::size_of::<T>();
    let at = p.cast::<i8>().wrapping_add(j * step + AHEAD);
    for line in (0..step).step_by(64) {
        // A prefetch never faults, so addresses past the panels are harmless.
        _mm_prefetch::<HINT>(at.wrapping_add(line));
    }
}

/// A stored element type and its panel layout: widening to f32, scalar and by vector.
pub(super) trait Elem: Copy {
    /// The stored value (`f32`, or the bits of a bf16/f16).
    type Raw: Copy;
    /// Where weight `(c, j)` (column `c < PANEL`, k-step `j`) sits in its panel.
    fn at(c: usize, j: usize) -> usize;
    /// The least panel length the vector loads of `k` k-steps read within.
    fn len(k: usize) -> usize {
        PANEL * k
    }
    /// The value as f32 (exact).
    fn widen(r: Self::Raw) -> f32;
    /// Columns `16 h .. 16 h + 16` of k-step `j` of the panel at `p`, as f32.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self::Raw, j: usize, h: usize) -> __m512;
    /// Columns `8 q .. 8 q + 8` of k-step `j` of the panel at `p`, as f32.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self::Raw, j: usize, q: usize) -> __m256;
}

/// f32 weights, k-major (`PANEL` values per k-step).
#[derive(Clone, Copy)]
pub(super) struct F32;
/// bf16 weights in k-step pairs (the AMX/VNNI layout: pair `j / 2` holds `PANEL` columns of
/// two values, `[w(c, 2p), w(c, 2p + 1)]`); widened by a shift (even steps) or a mask (odd).
#[derive(Clone, Copy)]
pub(super) struct Bf16;
/// f16 weights, k-major; converted by F16C / AVX-512F.
#[derive(Clone, Copy)]
pub(super) struct F16;

impl Elem for F32 {
    type Raw = f32;
    #[inline(always)]
    fn at(c: usize, j: usize) -> usize {
        j * PANEL + c
    }
    #[inline(always)]
    fn widen(r: f32) -> f32 {
        r
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const f32, j: usize, h: usize) -> __m512 {
        _mm512_loadu_ps(p.add(j * PANEL + 16 * h))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f32, j: usize, q: usize) -> __m256 {
        _mm256_loadu_ps(p.add(j * PANEL + 8 * q))
    }
}

impl Elem for Bf16 {
    type Raw = u16;
    #[inline(always)]
    fn at(c: usize, j: usize) -> usize {
        j / 2 * 2 * PANEL + 2 * c + j % 2
    }
    fn len(k: usize) -> usize {
        PANEL * k.next_multiple_of(2)
    }
    #[inline(always)]
    fn widen(r: u16) -> f32 {
        f32::from_bits((r as u32) << 16)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const u16, j: usize, h: usize) -> __m512 {
        let v = _mm512_loadu_si512(p.add(j / 2 * 2 * PANEL + 32 * h).cast());
        _mm512_castsi512_ps(if j.is_multiple_of(2) {
            _mm512_slli_epi32::<16>(v)
        } else {
            _mm512_and_si512(v, _mm512_set1_epi32(0xffff_0000u32 as i32))
        })
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const u16, j: usize, q: usize) -> __m256 {
        let v = _mm256_loadu_si256(p.add(j / 2 * 2 * PANEL + 16 * q).cast());
        _mm256_castsi256_ps(if j.is_multiple_of(2) {
            _mm256_slli_epi32::<16>(v)
        } else {
            _mm256_and_si256(v, _mm256_set1_epi32(0xffff_0000u32 as i32))
        })
    }
}

impl Elem for F16 {
    type Raw = u16;
    #[inline(always)]
    fn at(c: usize, j: usize) -> usize {
        j * PANEL + c
    }
    #[inline(always)]
    fn widen(r: u16) -> f32 {
        half::f16::from_bits(r).to_f32()
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const u16, j: usize, h: usize) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p.add(j * PANEL + 16 * h).cast()))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const u16, j: usize, q: usize) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p.add(j * PANEL + 8 * q).cast()))
    }
}

/// `out[i * stride + c] = sum_j w(c, j) * rows[i * k + j]` for the `m` rows of `rows` (`k`
/// values each; the panel may hold more k-steps, zero padding) and columns `c < nr`, with the
/// family `isa`.
///
/// Safety: `out` must be valid for writes at `i * stride + c` for `i < m`, `c < nr`, and no
/// other thread may access those cells during the call.
pub(super) unsafe fn panel<E: Elem>(
    isa: Isa,
    panel: &[E::Raw],
    k: usize,
    rows: &[f32],
    out: *mut f32,
    stride: usize,
    nr: usize,
) {
    let ok = nr <= PANEL && k > 0 && panel.len() >= E::len(k) && rows.len().is_multiple_of(k);
    assert!(ok, "panel of {k} by {nr} columns");
    let m = rows.len() / k;
    let mut i = 0;
    while i < m {
        let mr = match isa {
            Isa::Avx512 => MR,
            Isa::Avx2 => MR2,
            Isa::Portable => 1,
        }
        .min(m - i);
        let (x, o) = (&rows[i * k..(i + mr) * k], out.add(i * stride));
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => avx512_rows::<E>(panel, k, x, mr, o, stride, nr),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => avx2_rows::<E>(panel, k, x, mr, o, stride, nr),
            _ => portable_rows::<E>(panel, x, o, nr),
        }
        i += mr;
    }
}

/// One row by the panel, one scalar chain per column (the reference the vector builds match).
unsafe fn portable_rows<E: Elem>(panel: &[E::Raw], x: &[f32], out: *mut f32, nr: usize) {
    let mut acc = [0f32; PANEL];
    for (j, &xv) in x.iter().enumerate() {
        for (c, a) in acc.iter_mut().enumerate() {
            *a = E::widen(panel[E::at(c, j)]).mul_add(xv, *a);
        }
    }
    std::ptr::copy_nonoverlapping(acc.as_ptr(), out, nr);
}

/// `mr` (1..=MR) rows by the panel with AVX-512.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn avx512_rows<E: Elem>(
    panel: &[E::Raw],
    k: usize,
    x: &[f32],
    mr: usize,
    out: *mut f32,
    stride: usize,
    nr: usize,
) {
    match mr {
        8 => avx512_block::<E, 8>(panel, k, x, out, stride, nr),
        7 => avx512_block::<E, 7>(panel, k, x, out, stride, nr),
        6 => avx512_block::<E, 6>(panel, k, x, out, stride, nr),
        5 => avx512_block::<E, 5>(panel, k, x, out, stride, nr),
        4 => avx512_block::<E, 4>(panel, k, x, out, stride, nr),
        3 => avx512_block::<E, 3>(panel, k, x, out, stride, nr),
        2 => avx512_block::<E, 2>(panel, k, x, out, stride, nr),
        _ => avx512_block::<E, 1>(panel, k, x, out, stride, nr),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn avx512_block<E: Elem, const R: usize>(
    panel: &[E::Raw],
    k: usize,
    x: &[f32],
    out: *mut f32,
    stride: usize,
    nr: usize,
) {
    debug_assert_eq!(x.len(), R * k);
    let (p, xp) = (panel.as_ptr(), x.as_ptr());
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    for j in 0..k {
        if R <= STREAM_ROWS {
            stream::<_MM_HINT_T1, _>(p, j);
        }
        let (w0, w1) = (E::load16(p, j, 0), E::load16(p, j, 1));
        for (r, a) in acc.iter_mut().enumerate() {
            let xv = _mm512_set1_ps(*xp.add(r * k + j));
            a[0] = _mm512_fmadd_ps(w0, xv, a[0]);
            a[1] = _mm512_fmadd_ps(w1, xv, a[1]);
        }
    }
    let lo = (1u32 << nr.min(16)) - 1;
    let hi = if nr > 16 { ((1u64 << (nr - 16)) - 1) as u32 } else { 0 };
    for (r, a) in acc.iter().enumerate() {
        let o = out.add(r * stride);
        _mm512_mask_storeu_ps(o, lo as u16, a[0]);
        _mm512_mask_storeu_ps(o.add(16), hi as u16, a[1]);
    }
}

/// One input row (`x`, `k` values) by two panels at once (`p0` then `p1`, whose first `nr1`
/// columns go to `out[32..]`): four independent chains instead of one panel's two, so the
/// FMA latency no longer bounds the stream (a one-row product is bound by memory). Each
/// output is still its own chain over `j` in order: the bits of `avx512_block::<E, 1>`.
///
/// Safety: `p0` and `p1` must hold `E::len(k)` values; `out` must be valid for writes at
/// `0..PANEL + nr1`, which no other thread accesses during the call.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn avx512_row_by_two<E: Elem>(
    p0: &[E::Raw],
    p1: &[E::Raw],
    k: usize,
    x: &[f32],
    out: *mut f32,
    nr1: usize,
) {
    assert!(nr1 <= PANEL && p0.len() >= E::len(k) && p1.len() >= E::len(k) && x.len() == k, "two panels");
    let (a, b) = (p0.as_ptr(), p1.as_ptr());
    let mut acc = [_mm512_setzero_ps(); 4];
    for (j, &xj) in x.iter().enumerate() {
        stream::<_MM_HINT_T0, _>(a, j);
        stream::<_MM_HINT_T0, _>(b, j);
        let xv = _mm512_set1_ps(xj);
        acc[0] = _mm512_fmadd_ps(E::load16(a, j, 0), xv, acc[0]);
        acc[1] = _mm512_fmadd_ps(E::load16(a, j, 1), xv, acc[1]);
        acc[2] = _mm512_fmadd_ps(E::load16(b, j, 0), xv, acc[2]);
        acc[3] = _mm512_fmadd_ps(E::load16(b, j, 1), xv, acc[3]);
    }
    let lo = (1u32 << nr1.min(16)) - 1;
    let hi = if nr1 > 16 { ((1u64 << (nr1 - 16)) - 1) as u32 } else { 0 };
    _mm512_storeu_ps(out, acc[0]);
    _mm512_storeu_ps(out.add(16), acc[1]);
    _mm512_mask_storeu_ps(out.add(PANEL), lo as u16, acc[2]);
    _mm512_mask_storeu_ps(out.add(PANEL + 16), hi as u16, acc[3]);
}

/// `mr` (1..=MR2) rows by the panel with AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2_rows<E: Elem>(
    panel: &[E::Raw],
    k: usize,
    x: &[f32],
    mr: usize,
    out: *mut f32,
    stride: usize,
    nr: usize,
) {
    if mr == 2 {
        avx2_block::<E, 2>(panel, k, x, out, stride, nr)
    } else {
        avx2_block::<E, 1>(panel, k, x, out, stride, nr)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2_block<E: Elem, const R: usize>(
    panel: &[E::Raw],
    k: usize,
    x: &[f32],
    out: *mut f32,
    stride: usize,
    nr: usize,
) {
    let (p, xp) = (panel.as_ptr(), x.as_ptr());
    let mut acc = [[_mm256_setzero_ps(); 4]; R];
    for j in 0..k {
        if R <= STREAM_ROWS {
            stream::<_MM_HINT_T1, _>(p, j);
        }
        let w = [E::load8(p, j, 0), E::load8(p, j, 1), E::load8(p, j, 2), E::load8(p, j, 3)];
        for (r, a) in acc.iter_mut().enumerate() {
            let xv = _mm256_set1_ps(*xp.add(r * k + j));
            for (v, wv) in a.iter_mut().zip(w) {
                *v = _mm256_fmadd_ps(wv, xv, *v);
            }
        }
    }
    for (r, a) in acc.iter().enumerate() {
        let mut row = [0f32; PANEL];
        for (q, v) in a.iter().enumerate() {
            _mm256_storeu_ps(row.as_mut_ptr().add(q * 8), *v);
        }
        std::ptr::copy_nonoverlapping(row.as_ptr(), out.add(r * stride), nr);
    }
}
