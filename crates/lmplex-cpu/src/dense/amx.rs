//! The AMX-BF16 prompt kernel for bf16 and f16 panels (Intel Sapphire Rapids and later, on
//! Linux).
//!
//! Arithmetic, in one of two precisions (`Activations`):
//! - `Split` (the default): the f32 activations are split into two bf16 parts,
//!   `hi = bf16(x)` and `lo = bf16(x - hi)` (round to nearest even), which carry 16 of x's 24
//!   significant bits, and each panel of 32 outputs accumulates `hi * w + lo * w` in f32 tiles
//!   (`tdpbf16ps`), k-steps of 32 in order, `hi` before `lo` in each. The error against exact
//!   products of the f32 activations is about 2^-17 of each product's size.
//! - `Bf16` (`dtype="bfloat16"`): the activations rounded once to bf16, `hi * w` alone: half
//!   the tile work, and the precision of oneDNN's bf16 gemm (torch's, llama.cpp's), 2^-9.
//!
//! f16 weights (AMX-FP16, on later CPUs, is not used) are split exactly into two bf16 panels,
//! `w = w_hi + w_lo` (`f16_parts`), and take three passes per k-step: `x_hi * w_hi`,
//! `x_lo * w_hi`, then `x_hi * w_lo` (the dropped `x_lo * w_lo` is below 2^-16 of a product).
//!
//! In every case a row's tiles hold that row's sums alone, so its result never depends on the
//! other rows of the batch or on the thread; it is not the FMA chain's bits (the tile unit sums
//! its pairs its own way), so the engine gives prompt rows this kernel and generated rows the
//! FMA chain by the row's kind (`RowKinds`), as it does for the quantized prompt kernel.
//!
//! Layout: the bf16 panels' k-step pairs are AMX's B operand as stored (16 pair-rows of 16
//! columns make one tile; a panel's k-steps are padded with zeros to a multiple of 32). The
//! split activations are stored tile by tile, each tile's 1 KiB in one piece (`split`), so a
//! tile load streams whole lines in order.
//!
//! Tiles: 0-3 the sums of up to 32 rows by the panel's 32 columns, 4-5 activation tiles (16
//! rows by 32 k-steps), 6-7 the panel's two column halves of one 32-step.

#![allow(clippy::missing_safety_doc)]

use super::PANEL;
use crate::aligned::Aligned;
pub(super) use crate::amx::available;
use crate::amx::bf16_rne;
use crate::rowops::Activation;

/// The k-steps of one tile operand.
pub(super) const KSTEP: usize = 32;
/// Activation rows per tile.
const TROWS: usize = 16;

/// How the f32 activations enter the tile unit (module docs).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Activations {
    /// Two bf16 parts, `hi` and `lo`: 16 significant bits.
    Split,
    /// Rounded to bf16: 8 significant bits, one pass.
    Bf16,
}

impl Activations {
    /// bf16 parts per activation.
    pub(super) fn parts(self) -> usize {
        match self {
            Self::Split => 2,
            Self::Bf16 => 1,
        }
    }
}

/// The padded k-steps of `k`.
pub(super) fn padded(k: usize) -> usize {
    k.next_multiple_of(KSTEP)
}

/// u16 values of one activation tile: 16 rows by 32 k-steps.
pub(super) const TILE: usize = TROWS * KSTEP;

/// Where activation `(i, j)`'s `hi` part sits in `split`'s output (its `lo` part, if any, is
/// `TILE` further): row group `i / 16`, then k-step `j / 32`, each a `hi` tile and (`Split`)
/// a `lo` tile of 16 rows by 32 values row-major.
pub(super) fn split_at(i: usize, j: usize, kp: usize, act: Activations) -> usize {
    (i / TROWS * (kp / KSTEP) + j / KSTEP) * act.parts() * TILE + i % TROWS * KSTEP + j % KSTEP
}

/// `x` (`m` rows of `k`) as bf16 parts in `out` (laid out as `split_at` says, for `m` rounded
/// up to 16 rows of `padded(k)`), zeros outside `x`. Row groups are split in parallel on the
/// thread team; each writes its own tiles, every value of them once.
pub(super) fn split(x: &[f32], m: usize, k: usize, act: Activations, out: &mut Aligned<u16>) {
    struct Dst(*mut u16);
    // SAFETY: each task writes the disjoint values of its row group (below).
    unsafe impl Sync for Dst {}
    let (groups, kp) = (m.div_ceil(TROWS), padded(k));
    let per = kp / KSTEP * act.parts() * TILE;
    out.clear();
    out.reserve_total(groups * per);
    let dst = Dst(out.storage_ptr());
    #[cfg(target_arch = "x86_64")]
    let wide = super::kernels::Isa::detect() == super::kernels::Isa::Avx512;
    crate::thread_team::parallel_for(groups, &|g| {
        let dst = &dst;
        // SAFETY: row group `g`'s `per` values are inside the reserved capacity and no other
        // task writes them; AVX-512 F was detected for `wide`.
        unsafe {
            #[cfg(target_arch = "x86_64")]
            if wide {
                return split_group_avx512(x, m, k, g, act, dst.0);
            }
            split_group(x, m, k, g, act, dst.0, |src, hi, lo| split_run(src, hi, lo));
        }
    });
    // SAFETY: the tasks wrote every value of every row group (`parallel_for` returns after the
    // last task, and raises a task's panic before this line).
    unsafe { out.set_len(groups * per) };
}

/// Row group `g` of `split`, each row's run of each k-step written by `run`.
///
/// Safety: `dst` must be valid for writes of the group's values (`split_at`'s layout).
#[inline(always)]
unsafe fn split_group(
    x: &[f32],
    m: usize,
    k: usize,
    g: usize,
    act: Activations,
    dst: *mut u16,
    run: impl Fn(&[f32], *mut u16, Option<*mut u16>),
) {
    let kp = padded(k);
    for s in 0..kp / KSTEP {
        for r in 0..TROWS {
            let (i, j0) = (g * TROWS + r, s * KSTEP);
            let src = if i < m && j0 < k { &x[i * k + j0..][..KSTEP.min(k - j0)] } else { &[][..] };
            let at = split_at(i, j0, kp, act);
            // `at..at + KSTEP` (and for `Split` the same `TILE` further) are the group's.
            run(src, dst.add(at), (act == Activations::Split).then(|| dst.add(at + TILE)));
        }
    }
}

/// `split_group` with `split_run_avx512`'s body inlined (one call per group, not per run).
///
/// Safety: as `split_group`; the CPU has AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn split_group_avx512(x: &[f32], m: usize, k: usize, g: usize, act: Activations, dst: *mut u16) {
    split_group(x, m, k, g, act, dst, |src, hi, lo| split_run_wide(src, hi, lo))
}

/// One row's run of up to 32 activations `src` as `KSTEP` bf16 values at `hi` (and, with
/// `lo`, the parts `hi` left there), zeros past `src`.
///
/// Safety: `hi` (and `lo`) must be valid for writes of `KSTEP` values.
pub(super) unsafe fn split_run(src: &[f32], hi: *mut u16, lo: Option<*mut u16>) {
    let mut v = [0f32; KSTEP];
    v[..src.len()].copy_from_slice(src);
    for (j, &v) in v.iter().enumerate() {
        let h = bf16_rne(v);
        *hi.add(j) = h;
        if let Some(lo) = lo {
            *lo.add(j) = bf16_rne(v - f32::from_bits((h as u32) << 16));
        }
    }
}

/// `split_run` 16 values at a time (the same bits).
///
/// Safety: as `split_run`; the CPU has AVX-512 F.
#[cfg(all(test, target_arch = "x86_64"))]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn split_run_avx512(src: &[f32], hi: *mut u16, lo: Option<*mut u16>) {
    split_run_wide(src, hi, lo)
}

/// `split_run_avx512`'s body, inlined into AVX-512 callers.
///
/// Safety: as `split_run_avx512`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn split_run_wide(src: &[f32], hi: *mut u16, lo: Option<*mut u16>) {
    use crate::amx::bf16_rne_lanes as rne;
    use std::arch::x86_64::*;
    for h in 0..KSTEP / 16 {
        let n = src.len().saturating_sub(16 * h).min(16);
        let v = _mm512_maskz_loadu_ps(((1u32 << n) - 1) as u16, src.as_ptr().wrapping_add(16 * h));
        let vh = rne(v);
        _mm256_storeu_si256(hi.add(16 * h).cast(), _mm512_cvtepi32_epi16(vh));
        if let Some(lo) = lo {
            let back = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(vh));
            _mm256_storeu_si256(lo.add(16 * h).cast(), _mm512_cvtepi32_epi16(rne(_mm512_sub_ps(v, back))));
        }
    }
}

/// An f16 panel (`PANEL` columns, k-major, `k` steps) as two bf16 panels in AMX's k-step
/// pairs, `hi = bf16(w)` and `lo = bf16(w - hi)` (round to nearest even), padded with zeros to
/// `padded(k)` steps (every value of `hi` and `lo` is written). Exact: an f16 value has 11 significant bits and bf16 holds 8, so `lo`
/// is what `hi` left, which bf16 holds exactly (f16's exponents are well inside bf16's range).
pub(super) fn f16_parts(src: &[u16], k: usize, hi: &mut Aligned<u16>, lo: &mut Aligned<u16>) {
    assert!(src.len() >= PANEL * k, "f16 panel of {k} steps");
    let kp = padded(k);
    hi.resize_zeroed(PANEL * kp);
    lo.resize_zeroed(PANEL * kp);
    #[cfg(target_arch = "x86_64")]
    if super::kernels::Isa::detect() == super::kernels::Isa::Avx512 {
        // SAFETY: AVX-512 F and F16C detected; the slices hold what the loops index.
        unsafe { f16_parts_avx512(src, k, hi, lo) };
        return;
    }
    f16_parts_portable(src, k, hi, lo);
}

/// `f16_parts` one value at a time (`hi` and `lo` `PANEL * padded(k)` long).
pub(super) fn f16_parts_portable(src: &[u16], k: usize, hi: &mut [u16], lo: &mut [u16]) {
    for j in 0..padded(k) {
        for c in 0..PANEL {
            let v = if j < k { half::f16::from_bits(src[j * PANEL + c]).to_f32() } else { 0.0 };
            let h = bf16_rne(v);
            let at = j / 2 * 2 * PANEL + 2 * c + j % 2;
            (hi[at], lo[at]) = (h, bf16_rne(v - f32::from_bits((h as u32) << 16)));
        }
    }
}

/// `f16_parts` 16 columns at a time: a pair of k-steps' bf16 values for one column is one u32
/// (the first step in the low half), so the pair layout is a store of 16 u32 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,f16c,avx2")]
unsafe fn f16_parts_avx512(src: &[u16], k: usize, hi: &mut [u16], lo: &mut [u16]) {
    use crate::amx::bf16_rne_lanes as rne;
    use std::arch::x86_64::*;
    let (sp, hp, lp) = (src.as_ptr(), hi.as_mut_ptr(), lo.as_mut_ptr());
    for jp in 0..padded(k) / 2 {
        for h in 0..PANEL / 16 {
            let mut parts = [[_mm512_setzero_si512(); 2]; 2];
            for (t, part) in parts.iter_mut().enumerate() {
                let j = 2 * jp + t;
                if j < k {
                    let v = _mm512_cvtph_ps(_mm256_loadu_si256(sp.add(j * PANEL + 16 * h).cast()));
                    let vh = rne(v);
                    let back = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(vh));
                    *part = [vh, rne(_mm512_sub_ps(v, back))];
                }
            }
            for (i, out) in [hp, lp].into_iter().enumerate() {
                let pair = _mm512_or_si512(parts[0][i], _mm512_slli_epi32::<16>(parts[1][i]));
                _mm512_storeu_si512(out.add(jp * 2 * PANEL + 32 * h).cast(), pair);
            }
        }
    }
}

/// Loads one 32-step of a panel (`b`, in k-step pairs) into tiles 6 and 7, its two column
/// halves.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn load_panel(b: *const u16) {
    // One pair-row of the panel: 32 columns of two bf16.
    let ldb = 2 * PANEL * 2;
    std::arch::asm!(
        "tileloadd tmm6, [{b0} + {ldb}*1]",
        "tileloadd tmm7, [{b1} + {ldb}*1]",
        b0 = in(reg) b, b1 = in(reg) b.add(TROWS * 2), ldb = in(reg) ldb,
        options(nostack, readonly),
    );
}

/// Loads the activation tile at `a` (16 rows by 32 k-steps, in one piece) and adds its
/// products with tiles 6 and 7 to the sums of the first 16 rows (tiles 0 and 1) or, for
/// `SECOND`, of the next 16 (tiles 2 and 3).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn rows_times_panel<const SECOND: bool>(a: *const u16) {
    use std::arch::asm;
    let lda = KSTEP * 2;
    if SECOND {
        asm!(
            "tileloadd tmm5, [{a} + {lda}*1]",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            a = in(reg) a, lda = in(reg) lda,
            options(nostack, readonly),
        );
    } else {
        asm!(
            "tileloadd tmm4, [{a} + {lda}*1]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            a = in(reg) a, lda = in(reg) lda,
            options(nostack, readonly),
        );
    }
}

/// The checks every tile kernel's `panel` makes of its panel arguments (this module's and
/// `dpbf16`'s share the contract): `nr` columns of a panel of `kp` k-steps (a multiple of 32)
/// that `w` (and the `lo` part `wl`) hold whole, and a gated panel whole.
pub(super) fn check_panel(w: &[u16], wl: Option<&[u16]>, kp: usize, nr: usize, gate: Option<Activation>) {
    assert!(gate.is_none() || nr == PANEL, "a gated panel has all its columns");
    assert!(nr <= PANEL && kp.is_multiple_of(KSTEP) && w.len() >= PANEL * kp, "panel of {kp} by {nr}");
    assert!(wl.is_none_or(|l| l.len() >= PANEL * kp), "lo panel of {kp}");
}

/// `out[i * stride + c] = sum_j w(c, j) * x(i, j)` for rows `i < rows` of the split
/// activations `a` (`split`'s layout for `act` from a row group's start, readable for `rows`
/// rounded up to 16) and columns `c < nr` of the panel `w` (`PANEL * kp` values in k-step
/// pairs). With `wl` (an f16 panel's `lo` part, `f16_parts`) each k-step also adds `x_hi * wl`
/// after the passes over `w`. With `gate` (a panel of an interleaved gated matrix: columns
/// 0-15 gate, 16-31 up; `nr == PANEL`), `out` gets 16 columns, `gate(sum_c) * sum_{c + 16}`
/// (`rowops::gated_rows`), and the sums themselves are never written out.
///
/// Safety: `available()` must be true; `w` and `a` must be readable as above; `out` must
/// be valid for writes at `i * stride + c` for `i < rows`, `c < nr`, and no other thread may
/// access those cells during the call.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn panel(
    w: &[u16],
    wl: Option<&[u16]>,
    kp: usize,
    act: Activations,
    a: *const u16,
    rows: usize,
    out: *mut f32,
    stride: usize,
    nr: usize,
    gate: Option<Activation>,
) {
    use std::arch::asm;
    check_panel(w, wl, kp, nr, gate);
    let wp = w.as_ptr();
    let mut sums = [[0f32; PANEL]; 2 * TROWS];
    crate::amx::configure();
    let split = act == Activations::Split;
    let mut g = 0;
    while g < rows {
        let two = rows - g > TROWS;
        asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
        for s in 0..kp / KSTEP {
            let h0 = a.add(split_at(g, s * KSTEP, kp, act));
            let h1 = two.then(|| a.add(split_at(g + TROWS, s * KSTEP, kp, act)));
            // One pass: the activation tiles `off` values past `h0` (and `h1`) times the loaded
            // panel tiles, into the rows' sums.
            let pass = |off: usize| {
                rows_times_panel::<false>(h0.add(off));
                if let Some(h1) = h1 {
                    rows_times_panel::<true>(h1.add(off));
                }
            };
            load_panel(wp.add(s * KSTEP * PANEL));
            pass(0);
            if split {
                pass(TILE);
            }
            if let Some(wl) = wl {
                load_panel(wl.as_ptr().add(s * KSTEP * PANEL));
                pass(0);
            }
        }
        if let Some(f) = gate {
            // Gate sums (tiles 0 and 2) and up sums (1 and 3) as 32 rows of 16 each.
            let (mut gs, mut us) = ([0f32; 2 * TROWS * TROWS], [0f32; 2 * TROWS * TROWS]);
            let (gp, up) = (gs.as_mut_ptr(), us.as_mut_ptr());
            asm!(
                "tilestored [{g0} + {ld}*1], tmm0",
                "tilestored [{u0} + {ld}*1], tmm1",
                "tilestored [{g1} + {ld}*1], tmm2",
                "tilestored [{u1} + {ld}*1], tmm3",
                g0 = in(reg) gp, u0 = in(reg) up, g1 = in(reg) gp.add(TROWS * TROWS),
                u1 = in(reg) up.add(TROWS * TROWS), ld = in(reg) TROWS * 4,
                options(nostack),
            );
            let live = (rows - g).min(2 * TROWS);
            crate::rowops::gated_rows(f, &mut gs[..live * TROWS], None, &us[..live * TROWS]);
            for (i, row) in gs.chunks_exact(TROWS).take(live).enumerate() {
                std::ptr::copy_nonoverlapping(row.as_ptr(), out.add((g + i) * stride), TROWS);
            }
            g += 2 * TROWS;
            continue;
        }
        // Whole 32-by-32 blocks go straight to `out`; the others through `sums`.
        let direct = nr == PANEL && rows - g >= 2 * TROWS;
        let (c, ldc) =
            if direct { (out.add(g * stride), stride * 4) } else { (sums.as_mut_ptr().cast::<f32>(), PANEL * 4) };
        asm!(
            "tilestored [{c0} + {ldc}*1], tmm0",
            "tilestored [{c1} + {ldc}*1], tmm1",
            "tilestored [{c2} + {ldc}*1], tmm2",
            "tilestored [{c3} + {ldc}*1], tmm3",
            c0 = in(reg) c, c1 = in(reg) c.add(TROWS), c2 = in(reg) c.add(TROWS * ldc / 4),
            c3 = in(reg) c.add(TROWS * ldc / 4 + TROWS), ldc = in(reg) ldc,
            options(nostack),
        );
        if !direct {
            for (i, row) in sums.iter().enumerate().take((rows - g).min(2 * TROWS)) {
                std::ptr::copy_nonoverlapping(row.as_ptr(), out.add((g + i) * stride), nr);
            }
        }
        g += 2 * TROWS;
    }
}
