//! The AVX-512 BF16 prompt kernel (`vdpbf16ps`) for bf16 and f16 panels on CPUs that have
//! AVX512_BF16 but no AMX (AMD Zen 4 and later, Intel Cooper Lake).
//!
//! Arithmetic: the AMX kernel's (`amx` module docs), with the same operands: the activations
//! split by `amx::split` (`Split`: `hi` and `lo`, or `Bf16`: `hi` alone), bf16 panels as
//! stored (k-step pairs, padded to 32 steps) and f16 panels as their exact `hi`/`lo` bf16
//! parts (`amx::f16_parts`). Each output is one f32 lane that takes, per k-step pair in order,
//! `vdpbf16ps`'s two exact products of that pair, and per pair the passes in the AMX kernel's
//! order (`x_hi * w`, `x_lo * w`, `x_hi * w_lo`). A row's sums are its own registers, so its
//! result never depends on the other rows, the block it ran in, or the thread; the bits differ
//! from the FMA chain's and from the tile unit's, so, as there, the engine gives this kernel to
//! prompt rows only (`RowKinds`).
//!
//! Blocking: `RB` input rows (inside one 16-row group of the split layout) by the panel's 32
//! columns, `2 * RB` vectors of sums; per k-step pair, two panel vectors and one broadcast pair
//! of each row feed `2 * RB` dot products.

#![allow(clippy::missing_safety_doc)]

use super::amx::{split_at, Activations, KSTEP, TILE};
use super::PANEL;
use crate::rowops::{gated_rows, Activation, GATE_RUN};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Input rows per register block; divides the split layout's 16-row groups.
const RB: usize = 8;
const _: () = assert!(16 % RB == 0 && 2 * GATE_RUN == PANEL);

/// Whether this CPU runs the kernel (AVX-512 with BF16, not capped).
pub(super) fn available() -> bool {
    crate::qmatmul::avx512_bf16()
}

/// `amx::panel`'s contract, computed with `vdpbf16ps`: `out[i * stride + c] = sum_j w(c, j) *
/// x(i, j)` for rows `i < rows` of the split activations `a` (from a row group's start,
/// readable for `rows` rounded up to 16) and columns `c < nr` of the panel `w` (`PANEL * kp`
/// values in k-step pairs); `wl`, an f16 panel's `lo` part; `gate`, the fused activation of an
/// interleaved panel (`nr == PANEL`; `out` gets 16 columns).
///
/// Safety: `available()` must be true; `w`, `wl` and `a` must be readable as above; `out` must
/// be valid for writes at `i * stride + c` for `i < rows` and the columns above, and no other
/// thread may access those cells during the call.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bf16")]
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
    super::amx::check_panel(w, wl, kp, nr, gate);
    let lo = act == Activations::Split;
    let mut g = 0;
    while g < rows {
        let mut acc = [[_mm512_setzero_ps(); 2]; RB];
        for s in 0..kp / KSTEP {
            let h = a.add(split_at(g, s * KSTEP, kp, act));
            let ws = w.as_ptr().add(s * KSTEP * PANEL);
            for q in 0..KSTEP / 2 {
                let p = ws.add(q * 2 * PANEL);
                let (w0, w1) = (load(p), load(p.add(2 * 16)));
                dot(&mut acc, w0, w1, h.add(2 * q));
                if lo {
                    dot(&mut acc, w0, w1, h.add(TILE + 2 * q));
                }
                if let Some(wl) = wl {
                    let p = wl.as_ptr().add(s * KSTEP * PANEL + q * 2 * PANEL);
                    dot(&mut acc, load(p), load(p.add(2 * 16)), h.add(2 * q));
                }
            }
        }
        let live = (rows - g).min(RB);
        if let Some(f) = gate {
            // The block's gates and ups as two runs, so one `gated_rows` call covers the
            // block's rows (the same elementwise code as per row, so the same bits).
            let (mut gs, mut us) = ([[0f32; GATE_RUN]; RB], [[0f32; GATE_RUN]; RB]);
            for ((gr, ur), a) in gs.iter_mut().zip(&mut us).zip(&acc) {
                _mm512_storeu_ps(gr.as_mut_ptr(), a[0]);
                _mm512_storeu_ps(ur.as_mut_ptr(), a[1]);
            }
            gated_rows(f, &mut gs.as_flattened_mut()[..live * GATE_RUN], None, &us.as_flattened()[..live * GATE_RUN]);
            for (i, row) in gs.iter().enumerate().take(live) {
                std::ptr::copy_nonoverlapping(row.as_ptr(), out.add((g + i) * stride), GATE_RUN);
            }
        } else {
            // The panel's first `nr` columns, straight from the registers.
            let lo = ((1u32 << nr.min(16)) - 1) as __mmask16;
            let hi = ((1u64 << nr.saturating_sub(16)) - 1) as __mmask16;
            for (i, a) in acc.iter().enumerate().take(live) {
                let o = out.add((g + i) * stride);
                _mm512_mask_storeu_ps(o, lo, a[0]);
                _mm512_mask_storeu_ps(o.add(16), hi, a[1]);
            }
        }
        g += RB;
    }
}

/// 16 columns of one k-step pair of a panel (32 bf16 values).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn load(p: *const u16) -> __m512bh {
    std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(p.cast()))
}

/// Adds to each row's sums the products of the panel pair `w0`, `w1` with the row's pair at
/// `x` (row `r` at `x + r * KSTEP`, the split layout's row pitch inside a tile).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn dot(acc: &mut [[__m512; 2]; RB], w0: __m512bh, w1: __m512bh, x: *const u16) {
    for (r, a) in acc.iter_mut().enumerate() {
        let pair = x.add(r * KSTEP).cast::<i32>().read_unaligned();
        let xb = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(pair));
        a[0] = _mm512_dpbf16_ps(a[0], w0, xb);
        a[1] = _mm512_dpbf16_ps(a[1], w1, xb);
    }
}
