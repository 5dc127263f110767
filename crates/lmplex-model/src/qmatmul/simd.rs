//! The AVX-512 integer kernel's weight decoding at two load widths: `W16` loads 16 lanes of
//! 32 bits (a group's plane words), `W4x4` loads 4 lanes into each 128-bit block (a short last
//! group, repeated so that one vector serves four input rows: `avx512::tail4`). The operations
//! after the load are the same, so a lane's value does not depend on the width that loaded it.
//! Shifts take their count as a value; the kernels pass constants, which LLVM turns into
//! immediate shifts.
//!
//! (Narrower vectors for short last groups, 8 or 4 lanes, did not pay: batched decode is bound
//! by the number of `vpmaddwd`, not their width, so a 2-unit tail at 4 lanes cost as much as
//! at 16. Putting four input rows in one vector divides that number by four.)

#![allow(clippy::missing_safety_doc)] // every fn here needs AVX-512 F/BW/VL/DQ

use std::arch::x86_64::*;

/// A load width and the integer operations the kernel applies to 16-bit lanes after it.
pub(super) trait Width {
    /// The plane words at `p` (`W16`: 64 bytes; `W4x4`: 16 bytes, in every 128-bit block).
    unsafe fn load(p: *const u8) -> __m512i;
}

/// 16 lanes.
pub(super) struct W16;

impl Width for W16 {
    #[inline(always)]
    unsafe fn load(p: *const u8) -> __m512i {
        _mm512_loadu_si512(p.cast())
    }
}

/// 4 lanes, repeated in each 128-bit block.
pub(super) struct W4x4;

impl Width for W4x4 {
    #[inline(always)]
    unsafe fn load(p: *const u8) -> __m512i {
        _mm512_broadcast_i32x4(_mm_loadu_si128(p.cast()))
    }
}
