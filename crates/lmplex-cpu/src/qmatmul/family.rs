//! The kernel families (`Isa`: AVX-512, AVX2 or portable, chosen once per process) and the
//! dispatch of one integer-kernel call to the chosen family.
//!
//! Invariant: families compute the same exact integer sums and differ only in float rounding;
//! the choice never depends on the batch, so a row's result does not either.

use super::acts::{QActs, QRow};
use super::formats::Format;
use super::grid::Block;
use super::portable;
#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512};
use super::{GROUP, STREAM_UNITS};

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

/// Whether the AVX-512 family uses AVX-512 VNNI (`vpdpwssd`): where the CPU has it, unless
/// `LMPLEX_CPU_ISA=avx512` (for comparing); the same results either way.
pub(crate) fn vnni() -> bool {
    static VNNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VNNI.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx512vnni")
                && std::env::var("LMPLEX_CPU_ISA").as_deref() != Ok("avx512")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// Whether the CPU has AVX512_BF16 (`vdpbf16ps`) for the bf16 prompt kernels where it lacks
/// AMX: the AVX-512 family, unless `LMPLEX_CPU_ISA=avx512` (for comparing; it caps these kernels
/// as it caps VNNI, and their results differ from the FMA kernels').
pub(crate) fn avx512_bf16() -> bool {
    static BF16: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *BF16.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            Isa::detect() == Isa::Avx512
                && std::arch::is_x86_feature_detected!("avx512bf16")
                && std::env::var("LMPLEX_CPU_ISA").as_deref() != Ok("avx512")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// The integer kernel family, chosen once per process from the CPU's features.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Isa {
    /// x86-64 with AVX-512 F/BW/VL/DQ (and AVX2); uses VNNI too where the CPU has it.
    Avx512,
    /// x86-64 with AVX2 (and FMA, F16C).
    Avx2,
    /// Plain Rust for any CPU; the fallback.
    Portable,
}

impl Isa {
    /// The best family this CPU runs; `LMPLEX_CPU_ISA=avx2|portable` caps it (for comparing;
    /// `avx512` keeps this family without VNNI, `vnni`).
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
/// Block `b`'s cells, `out[i, w] = dot(rows[w], input row i)`, over its `W` packed rows of
/// `units` units and its input rows of `acts`, with the kernel family `isa`. A group of
/// weight blocks is decoded once per `GROUP` input rows (then a pair, then one): the AVX-512
/// build shares each activation load among the `W` rows, runs the last group of four input
/// rows in one vector given their quad tail and writes its results itself; the others take
/// the weight rows one by one, with the same result.
#[inline(always)]
pub(super) fn qdot_rows<F: Format, const W: usize>(
    isa: Isa,
    vnni: bool,
    rows: [&[u8]; W],
    units: usize,
    acts: &QActs,
    b: &mut Block<'_>,
) {
    assert_eq!(b.nr, W, "weight rows of the block");
    let (i0, m) = (b.i0, b.li);
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        let (o, stride) = b.at(0, m);
        // SAFETY: `Isa::detect` found avx512f/bw/vl/dq, avx2, fma and f16c at run time, and
        // `vnni` is set only where `vnni()` found avx512vnni (or by a test that checked it);
        // `Block::at` checked that input rows 0..m of the block's W weight rows are its cells.
        return unsafe {
            if vnni {
                avx512::qdot_rows::<F, W, true>(rows, units, acts, i0, m, o, stride)
            } else {
                avx512::qdot_rows::<F, W, false>(rows, units, acts, i0, m, o, stride)
            }
        };
    }
    let stream = units > STREAM_UNITS;
    let mut i = 0;
    while i + GROUP <= m {
        let xs: [QRow; GROUP] = std::array::from_fn(|g| acts.row(i0 + i + g));
        rows_by_one::<F, W, GROUP>(isa, rows, units, &xs, b, i, stream && i == 0);
        i += GROUP;
    }
    if i + 2 <= m {
        rows_by_one::<F, W, 2>(isa, rows, units, &[acts.row(i0 + i), acts.row(i0 + i + 1)], b, i, stream && i == 0);
        i += 2;
    }
    if i < m {
        rows_by_one::<F, W, 1>(isa, rows, units, &[acts.row(i0 + i)], b, i, stream && i == 0);
    }
}

/// `out[i + r, w] = dot(rows[w], xs[r])` one weight row at a time (AVX2 or portable); `stream`
/// as in `avx2::qdot`.
#[inline(always)]
fn rows_by_one<F: Format, const W: usize, const R: usize>(
    isa: Isa,
    rows: [&[u8]; W],
    units: usize,
    xs: &[QRow; R],
    b: &mut Block<'_>,
    i: usize,
    stream: bool,
) {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = stream; // the portable kernel does not prefetch
    for (k, row) in rows.into_iter().enumerate() {
        let res = match isa {
            // SAFETY: `Isa::detect` found avx2, fma and f16c at run time.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 | Isa::Avx512 => unsafe { avx2::qdot::<F, R>(row, units, xs, stream) },
            _ => portable::qdot::<F, R>(row, units, xs),
        };
        for (r, v) in res.into_iter().enumerate() {
            b.set(i + r, k, v);
        }
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

/// The portable f32 dot (the reference the AVX2 build mirrors; lmplex-model's attention
/// tests use it too).
pub fn portable_dot(a: &[f32], b: &[f32]) -> f32 {
    portable::dot(a, b)
}
