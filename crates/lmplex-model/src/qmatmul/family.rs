//! The kernel families (`Isa`: AVX-512, AVX2 or portable, chosen once per process) and the
//! dispatch of one integer-kernel call to the chosen family.
//!
//! Invariant: families compute the same exact integer sums and differ only in float rounding;
//! the choice never depends on the batch, so a row's result does not either.

use super::acts::{QRow, QuadTail};
use super::formats::Format;
use super::portable;
#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512};

pub(crate) fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The integer kernel family, chosen once per process from the CPU's features.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Isa {
    Avx512,
    Avx2,
    Portable,
}

impl Isa {
    /// The best family this CPU runs; `LMPLEX_CPU_ISA=avx2|portable` caps it (for comparing).
    pub fn detect() -> Self {
        static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *ISA.get_or_init(|| {
            let cap = std::env::var("LMPLEX_CPU_ISA").unwrap_or_default();
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::is_x86_feature_detected as has;
                let avx512 = has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512dq");
                if has_avx2() && avx512 && cap != "avx2" && cap != "portable" {
                    return Isa::Avx512;
                }
                if has_avx2() && cap != "portable" {
                    return Isa::Avx2;
                }
            }
            let _ = cap;
            Isa::Portable
        })
    }
}
/// `o[w * m + i + r] = dot(rows[w], xs[r])` over `W` packed rows of `units` units with the
/// kernel family `isa` (the AVX-512 build shares each activation load among the `W` rows, runs
/// the last group of four rows in one vector given their `quad` tail and stores each weight
/// row's results at once; the others take the rows one by one, with the same result).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn qdot<F: Format, const W: usize, const R: usize>(
    isa: Isa,
    rows: [&[u8]; W],
    units: usize,
    xs: &[QRow; R],
    quad: Option<&QuadTail>,
    o: &mut [f32],
    m: usize,
    i: usize,
) {
    assert!(i + R <= m && (W - 1) * m + i + R <= o.len());
    let mut out = [[0f32; R]; W];
    match isa {
        // SAFETY: `Isa::detect` found avx512f/bw/vl/dq, avx2, fma and f16c at run time; the
        // W x R outputs at o[i..] (rows m apart) are inside `o` (asserted above).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => return unsafe { avx512::qdot::<F, W, R>(rows, units, xs, quad, o.as_mut_ptr().add(i), m) },
        // SAFETY: `Isa::detect` found avx2, fma and f16c at run time.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            for (o, row) in out.iter_mut().zip(rows) {
                *o = unsafe { avx2::qdot::<F, R>(row, units, xs) };
            }
        }
        _ => {
            for (o, row) in out.iter_mut().zip(rows) {
                *o = portable::qdot::<F, R>(row, units, xs);
            }
        }
    }
    for (w, res) in out.iter().enumerate() {
        o[w * m + i..w * m + i + R].copy_from_slice(res);
    }
}

/// `dot(a, b)` with the process-wide kernel choice; the reduction order depends only on the
/// length, so it is the building block of every batch-invariant f32 product.
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: guarded by runtime detection of avx2, fma and f16c.
        return unsafe { avx2::dot(a, b) };
    }
    portable::dot(a, b)
}

/// The portable f32 dot (the reference the AVX2 build mirrors).
#[cfg(test)]
pub(crate) fn portable_dot(a: &[f32], b: &[f32]) -> f32 {
    portable::dot(a, b)
}
