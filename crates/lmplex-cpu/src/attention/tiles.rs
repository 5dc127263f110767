//! The tile operations of the bf16 prompt attention kernel (`amx`), on one of two units: AMX's
//! tiles (`Amx`), or the same products on AVX-512 vectors with `vdpbf16ps` (`Vectors`, for CPUs
//! with AVX512_BF16 but no AMX, such as AMD Zen 4).
//!
//! Contract (both units): `product` computes up to four f32 sum tiles of 16 rows by 16 columns,
//! each the sum over `steps` of an A tile (16 rows by 32 bf16 k-steps, 64 bytes a row, in one
//! piece) times a B tile (16 pair-rows by 16 columns; pair-row `p` holds k-steps `2p, 2p + 1` of
//! each column), summed in f32 in step order and, within a step, in k-step pair order; and
//! stores them side by side. Row `r` of a sum tile depends only on row `r` of the A tiles, so
//! rows stay independent. The units' bits differ from each other (each sums its pairs its own
//! way).

use std::arch::asm;
use std::arch::x86_64::*;

/// The units, as `amx::unit` chooses them.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Unit {
    Amx,
    Vectors,
}

/// The operation the kernel runs (module docs). Unsafe: the unit must be usable on this CPU
/// (`Amx`: `crate::amx::available()`; `Vectors`: AVX512_BF16), and the pointers readable or
/// writable as stated.
pub(super) trait Tiles {
    /// Ready for use (AMX loads its tile configuration).
    unsafe fn begin(&mut self);
    /// Sum tiles `0..n` (`n <= 4`): tile `t` is the sum over steps `s < steps` of the A tile at
    /// `a(s)` times the B tile at `b(s, t)`; stored at `c` (`ldc` bytes a row; tile `t` at
    /// column `16 t`).
    unsafe fn product(
        &mut self,
        steps: usize,
        a: impl Fn(usize) -> *const u16,
        b: impl Fn(usize, usize) -> *const u16,
        n: usize,
        c: *mut f32,
        ldc: usize,
    );
}

/// AMX-BF16: sums in tiles 0-3, A in tile 4, B through tile 5.
pub(super) struct Amx;

impl Amx {
    #[inline(always)]
    unsafe fn dot<const N: usize>(b: *const u16) {
        asm!(
            "tileloadd tmm5, [{b} + {ld}*1]",
            "tdpbf16ps tmm{n}, tmm4, tmm5",
            b = in(reg) b, ld = in(reg) 64usize, n = const N,
            options(nostack, readonly),
        );
    }
}

impl Tiles for Amx {
    #[inline(always)]
    unsafe fn begin(&mut self) {
        crate::amx::configure();
    }

    #[inline(always)]
    unsafe fn product(
        &mut self,
        steps: usize,
        a: impl Fn(usize) -> *const u16,
        b: impl Fn(usize, usize) -> *const u16,
        n: usize,
        c: *mut f32,
        ldc: usize,
    ) {
        asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
        for s in 0..steps {
            asm!("tileloadd tmm4, [{a} + {ld}*1]", a = in(reg) a(s), ld = in(reg) 64usize, options(nostack, readonly));
            Self::dot::<0>(b(s, 0));
            if n > 1 {
                Self::dot::<1>(b(s, 1));
            }
            if n > 2 {
                Self::dot::<2>(b(s, 2));
            }
            if n > 3 {
                Self::dot::<3>(b(s, 3));
            }
        }
        asm!("tilestored [{c} + {ld}*1], tmm0", c = in(reg) c, ld = in(reg) ldc, options(nostack));
        if n > 1 {
            asm!("tilestored [{c} + {ld}*1], tmm1", c = in(reg) c.add(16), ld = in(reg) ldc, options(nostack));
        }
        if n > 2 {
            asm!("tilestored [{c} + {ld}*1], tmm2", c = in(reg) c.add(32), ld = in(reg) ldc, options(nostack));
        }
        if n > 3 {
            asm!("tilestored [{c} + {ld}*1], tmm3", c = in(reg) c.add(48), ld = in(reg) ldc, options(nostack));
        }
    }
}

/// The tiles on vectors, one sum tile at a time: its 16 rows stay in registers over every step
/// and the 16 pair-rows of B (each pair-row one vector of 16 columns, each row's pair of A one
/// broadcast, `vdpbf16ps`), then go straight to `c`.
pub(super) struct Vectors;

impl Tiles for Vectors {
    #[inline(always)]
    unsafe fn begin(&mut self) {}

    #[inline(always)]
    unsafe fn product(
        &mut self,
        steps: usize,
        a: impl Fn(usize) -> *const u16,
        b: impl Fn(usize, usize) -> *const u16,
        n: usize,
        c: *mut f32,
        ldc: usize,
    ) {
        for t in 0..n {
            let mut acc = [_mm512_setzero_ps(); 16];
            for s in 0..steps {
                let (a, b) = (a(s), b(s, t));
                for p in 0..16 {
                    let bv: __m512bh = std::mem::transmute(_mm512_loadu_si512(b.add(p * 32).cast()));
                    for (r, sum) in acc.iter_mut().enumerate() {
                        let pair = a.add(r * 32 + 2 * p).cast::<i32>().read_unaligned();
                        let av = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(pair));
                        *sum = _mm512_dpbf16_ps(*sum, bv, av);
                    }
                }
            }
            for (r, v) in acc.iter().enumerate() {
                _mm512_storeu_ps(c.cast::<u8>().add(r * ldc).cast::<f32>().add(16 * t), *v);
            }
        }
    }
}
