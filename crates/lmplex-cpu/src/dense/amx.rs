//! The AMX-BF16 prompt kernel for bf16 panels (Intel Sapphire Rapids and later, on Linux).
//!
//! Arithmetic: the f32 activations are split into two bf16 parts, `hi = bf16(x)` and
//! `lo = bf16(x - hi)` (round to nearest even), which carry 16 of x's 24 significant bits, and
//! each panel of 32 outputs accumulates `hi * w + lo * w` in f32 tiles (`tdpbf16ps`), k-steps
//! of 32 in order, `hi` before `lo` in each. A row's tiles hold that row's sums alone, so its
//! result never depends on the other rows of the batch or on the thread; it is not the FMA
//! chain's bits (the tile unit sums its pairs its own way), so the engine gives prompt rows
//! this kernel and generated rows the FMA chain by the row's kind (`RowKinds`), as it does for
//! the quantized prompt kernel. The error against exact products of the f32 activations is
//! about 2^-17 of each product's size, where bf16 activations alone (as oneDNN's bf16 gemm
//! takes) give 2^-9.
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
use std::sync::OnceLock;

/// The k-steps of one tile operand.
pub(super) const KSTEP: usize = 32;
/// Activation rows per tile.
const TROWS: usize = 16;

/// Whether this process multiplies prompt rows of bf16 panels with AMX: the CPU has AMX-TILE
/// and AMX-BF16 (CPUID leaf 7), the kernel family is AVX-512 and not capped
/// (`LMPLEX_CPU_ISA=avx512|avx2|portable` turns AMX off), and Linux granted the tile data
/// permission (`arch_prctl(ARCH_REQ_XCOMP_PERM)`, asked once per process).
pub(super) fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        let capped = std::env::var("LMPLEX_CPU_ISA").is_ok_and(|v| !v.is_empty() && v != "amx");
        !capped && super::kernels::Isa::detect() == super::kernels::Isa::Avx512 && os::enable()
    })
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod os {
    use std::ffi::c_long;
    extern "C" {
        fn syscall(number: c_long, ...) -> c_long;
    }
    const SYS_ARCH_PRCTL: c_long = 158;
    const ARCH_REQ_XCOMP_PERM: c_long = 0x1023;
    const XFEATURE_XTILEDATA: c_long = 18;

    /// CPUID.(7,0):EDX bit 22 is AMX-BF16, bit 24 AMX-TILE; then the permission.
    pub(super) fn enable() -> bool {
        // CPUID leaf 7 exists on every x86-64 CPU with AVX-512 (checked by the caller).
        let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
        // SAFETY: arch_prctl with these arguments only changes this process's permissions.
        edx & (1 << 22) != 0
            && edx & (1 << 24) != 0
            && unsafe { syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) } == 0
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod os {
    pub(super) fn enable() -> bool {
        false
    }
}

/// bf16 of `v`, rounded to nearest even (NaN stays a NaN or becomes an infinity: activations
/// are finite).
#[inline(always)]
fn bf16_rne(v: f32) -> u16 {
    let b = v.to_bits();
    (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// The padded k-steps of `k`.
pub(super) fn padded(k: usize) -> usize {
    k.next_multiple_of(KSTEP)
}

/// u16 values of one activation tile: 16 rows by 32 k-steps.
pub(super) const TILE: usize = TROWS * KSTEP;

/// Where activation `(i, j)`'s `hi` part sits in `split`'s output (its `lo` part is `TILE`
/// further): row group `i / 16`, then k-step `j / 32`, each a `hi` tile and a `lo` tile of 16
/// rows by 32 values row-major.
pub(super) fn split_at(i: usize, j: usize, kp: usize) -> usize {
    (i / TROWS * (kp / KSTEP) + j / KSTEP) * 2 * TILE + i % TROWS * KSTEP + j % KSTEP
}

/// `x` (`m` rows of `k`) split into `hi` and `lo` parts in `out` (laid out as `split_at`
/// says, for `m` rounded up to 16 rows of `padded(k)`), zeros outside `x`. Row groups are
/// split in parallel on the thread team; each writes its own tiles, every value of them once.
pub(super) fn split(x: &[f32], m: usize, k: usize, out: &mut Vec<u16>) {
    struct Dst(*mut u16);
    // SAFETY: each task writes the disjoint values of its row group (below).
    unsafe impl Sync for Dst {}
    let (groups, kp) = (m.div_ceil(TROWS), padded(k));
    let per = kp / KSTEP * 2 * TILE;
    out.clear();
    out.reserve_exact(groups * per);
    let dst = Dst(out.as_mut_ptr());
    crate::team::parallel_for(groups, &|g| {
        let dst = &dst;
        for s in 0..kp / KSTEP {
            for r in 0..TROWS {
                let (i, j0) = (g * TROWS + r, s * KSTEP);
                let mut v = [0f32; KSTEP];
                if i < m && j0 < k {
                    let n = KSTEP.min(k - j0);
                    v[..n].copy_from_slice(&x[i * k + j0..][..n]);
                }
                let (mut hi, mut lo) = ([0u16; KSTEP], [0u16; KSTEP]);
                for ((&v, h), l) in v.iter().zip(&mut hi).zip(&mut lo) {
                    *h = bf16_rne(v);
                    *l = bf16_rne(v - f32::from_bits((*h as u32) << 16));
                }
                let at = split_at(i, j0, kp);
                // SAFETY: `at..at + KSTEP` and the same `TILE` further are in row group `g`'s
                // `per` values, inside the reserved capacity; no other task writes them.
                unsafe {
                    std::ptr::copy_nonoverlapping(hi.as_ptr(), dst.0.add(at), KSTEP);
                    std::ptr::copy_nonoverlapping(lo.as_ptr(), dst.0.add(at + TILE), KSTEP);
                }
            }
        }
    });
    // SAFETY: the tasks wrote every value of every row group (`parallel_for` returns after the
    // last task, and raises a task's panic before this line).
    unsafe { out.set_len(groups * per) };
}

/// The tile configuration: palette 1, eight tiles of 16 rows by 64 bytes.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

const CONFIG: TileConfig = TileConfig {
    palette: 1,
    start_row: 0,
    reserved: [0; 14],
    colsb: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
    rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
};

/// `out[i * stride + c] = sum_j w(c, j) * x(i, j)` for rows `i < rows` of the split
/// activations `a` (`split`'s layout from a row group's start, readable for `rows` rounded up
/// to 16) and columns `c < nr` of the panel `w` (`PANEL * kp` values in k-step pairs).
///
/// Safety: `available()` must be true; `w` and `a` must be readable as above; `out` must
/// be valid for writes at `i * stride + c` for `i < rows`, `c < nr`, and no other thread may
/// access those cells during the call.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn panel(w: &[u16], kp: usize, a: *const u16, rows: usize, out: *mut f32, stride: usize, nr: usize) {
    use std::arch::asm;
    assert!(nr <= PANEL && kp.is_multiple_of(KSTEP) && w.len() >= PANEL * kp, "AMX panel of {kp} by {nr}");
    // A tile is 16 rows of 64 bytes in one piece.
    let (wp, lda) = (w.as_ptr(), KSTEP * 2);
    // One pair-row of the panel: 32 columns of two bf16.
    let ldb = 2 * PANEL * 2;
    let mut sums = [[0f32; PANEL]; 2 * TROWS];
    asm!("ldtilecfg [{}]", in(reg) &CONFIG as *const TileConfig, options(nostack, readonly));
    let mut g = 0;
    while g < rows {
        let two = rows - g > TROWS;
        asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
        for s in 0..kp / KSTEP {
            let b0 = wp.add(s * KSTEP * PANEL);
            let (b1, h0) = (b0.add(TROWS * 2), a.add(split_at(g, s * KSTEP, kp)));
            let l0 = h0.add(TILE);
            asm!(
                "tileloadd tmm6, [{b0} + {ldb}*1]",
                "tileloadd tmm7, [{b1} + {ldb}*1]",
                "tileloadd tmm4, [{h0} + {lda}*1]",
                "tileloadd tmm5, [{l0} + {lda}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm0, tmm5, tmm6",
                "tdpbf16ps tmm1, tmm5, tmm7",
                b0 = in(reg) b0, b1 = in(reg) b1, h0 = in(reg) h0, l0 = in(reg) l0,
                ldb = in(reg) ldb, lda = in(reg) lda,
                options(nostack, readonly),
            );
            if two {
                let h1 = a.add(split_at(g + TROWS, s * KSTEP, kp));
                let l1 = h1.add(TILE);
                asm!(
                    "tileloadd tmm4, [{h1} + {lda}*1]",
                    "tileloadd tmm5, [{l1} + {lda}*1]",
                    "tdpbf16ps tmm2, tmm4, tmm6",
                    "tdpbf16ps tmm3, tmm4, tmm7",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    h1 = in(reg) h1, l1 = in(reg) l1, lda = in(reg) lda,
                    options(nostack, readonly),
                );
            }
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
    asm!("tilerelease", options(nostack, nomem));
}
