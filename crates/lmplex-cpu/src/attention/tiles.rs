//! The tile operations of the bf16 prompt attention kernel (`amx`), on one of two units: AMX's
//! tiles (`Amx`), or the same products on AVX-512 vectors with `vdpbf16ps` (`Vectors`, for CPUs
//! with AVX512_BF16 but no AMX, such as AMD Zen 4).
//!
//! Contract (both units): four f32 sum tiles (0-3) of 16 rows by 16 columns; `load_a` takes an
//! A tile of 16 rows by 32 bf16 k-steps (64 bytes a row, in one piece); `dot::<N>` adds to sum
//! tile `N` the products of the A tile with a B tile of 16 pair-rows by 16 columns (pair-row
//! `p` holds k-steps `2p, 2p + 1` of each column), summed in f32 in k-step pair order. Row `r`
//! of a sum tile depends only on row `r` of the A tiles, so rows stay independent. The units'
//! bits differ from each other (each sums its pairs its own way).

use std::arch::asm;
use std::arch::x86_64::*;

/// The units, as `amx::unit` chooses them.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Unit {
    Amx,
    Vectors,
}

/// The operations the kernel runs (module docs). All are unsafe: the unit must be usable on
/// this CPU (`Amx`: `crate::amx::available()`; `Vectors`: AVX512_BF16), and the pointers
/// readable or writable as stated.
pub(super) trait Tiles {
    /// Ready for use (AMX loads its tile configuration).
    unsafe fn begin(&mut self);
    /// Sum tiles 0-3 to zero.
    unsafe fn zero4(&mut self);
    /// The A tile at `a` (16 rows of 32 bf16 values, 64 bytes apart).
    unsafe fn load_a(&mut self, a: *const u16);
    /// Sum tile `N` += A times the B tile at `b` (16 pair-rows of 64 bytes).
    unsafe fn dot<const N: usize>(&mut self, b: *const u16);
    /// Stores the first `n` sum tiles side by side at `c` (`ldc` bytes a row; tile `i` at
    /// column `16 i`).
    unsafe fn store4(&mut self, c: *mut f32, ldc: usize, n: usize);
}

/// AMX-BF16: sums in tiles 0-3, A in tile 4, B through tile 5.
pub(super) struct Amx;

impl Tiles for Amx {
    #[inline(always)]
    unsafe fn begin(&mut self) {
        crate::amx::configure();
    }

    #[inline(always)]
    unsafe fn zero4(&mut self) {
        asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
    }

    #[inline(always)]
    unsafe fn load_a(&mut self, a: *const u16) {
        asm!("tileloadd tmm4, [{a} + {ld}*1]", a = in(reg) a, ld = in(reg) 64usize, options(nostack, readonly));
    }

    #[inline(always)]
    unsafe fn dot<const N: usize>(&mut self, b: *const u16) {
        asm!(
            "tileloadd tmm5, [{b} + {ld}*1]",
            "tdpbf16ps tmm{n}, tmm4, tmm5",
            b = in(reg) b, ld = in(reg) 64usize, n = const N,
            options(nostack, readonly),
        );
    }

    #[inline(always)]
    unsafe fn store4(&mut self, c: *mut f32, ldc: usize, n: usize) {
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

/// The tiles on vectors: each sum tile is 16 vectors in memory, and `dot` keeps one tile's 16
/// rows in registers over the 16 pair-rows of B, each pair-row one vector of 16 columns and
/// each row's pair of A one broadcast (`vdpbf16ps`).
pub(super) struct Vectors {
    sums: [[__m512; 16]; 4],
    a: *const u16,
}

impl Default for Vectors {
    fn default() -> Self {
        // SAFETY: all-zero bits are a valid __m512 (0.0 in every lane).
        Self { sums: unsafe { std::mem::zeroed() }, a: std::ptr::null() }
    }
}

impl Tiles for Vectors {
    #[inline(always)]
    unsafe fn begin(&mut self) {}

    #[inline(always)]
    unsafe fn zero4(&mut self) {
        self.sums = [[_mm512_setzero_ps(); 16]; 4];
    }

    #[inline(always)]
    unsafe fn load_a(&mut self, a: *const u16) {
        self.a = a;
    }

    #[inline(always)]
    unsafe fn dot<const N: usize>(&mut self, b: *const u16) {
        let mut acc = self.sums[N];
        for p in 0..16 {
            let bv: __m512bh = std::mem::transmute(_mm512_loadu_si512(b.add(p * 32).cast()));
            for (r, s) in acc.iter_mut().enumerate() {
                let pair = self.a.add(r * 32 + 2 * p).cast::<i32>().read_unaligned();
                *s = _mm512_dpbf16_ps(*s, bv, std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(pair)));
            }
        }
        self.sums[N] = acc;
    }

    #[inline(always)]
    unsafe fn store4(&mut self, c: *mut f32, ldc: usize, n: usize) {
        for (t, tile) in self.sums.iter().enumerate().take(n) {
            for (r, v) in tile.iter().enumerate() {
                _mm512_storeu_ps(c.cast::<u8>().add(r * ldc).cast::<f32>().add(16 * t), *v);
            }
        }
    }
}
