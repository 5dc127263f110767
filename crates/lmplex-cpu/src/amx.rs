//! What the AMX-BF16 kernels (`dense`'s prompt kernel, `attention`'s prompt kernel) share:
//! whether this process may use the tile unit, the one tile configuration they all load, and
//! bf16 rounding.
//!
//! Invariants: every AMX kernel calls `configure` on entry, so it runs with `CONFIG` whatever
//! ran on its thread before, and keeps no tile data between calls (it zeroes or loads every
//! tile it reads). Kernels leave the configuration loaded rather than releasing the tiles:
//! `ldtilecfg` costs about 120 ns on the machines measured and a prompt matmul calls a kernel
//! per 32-row panel, while checking the loaded configuration (`sttilecfg`) costs about 15.

use std::sync::OnceLock;

/// Whether this process may use AMX: the CPU has AMX-TILE and AMX-BF16 (CPUID leaf 7), the
/// kernel family is AVX-512 and not capped (`LMPLEX_CPU_ISA=avx512|avx2|portable` turns AMX
/// off), and Linux granted the tile data permission (`arch_prctl(ARCH_REQ_XCOMP_PERM)`, asked
/// once per process).
pub(crate) fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        let capped = std::env::var("LMPLEX_CPU_ISA").is_ok_and(|v| !v.is_empty() && v != "amx");
        !capped && crate::qmatmul::Isa::detect() == crate::qmatmul::Isa::Avx512 && os::enable()
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
pub(crate) fn bf16_rne(v: f32) -> u16 {
    let b = v.to_bits();
    (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// `bf16_rne` of each lane: the bf16 bits in the low half of each u32 lane.
///
/// # Safety
/// The CPU has AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn bf16_rne_lanes(v: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    let b = _mm512_castps_si512(v);
    let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
    _mm512_srli_epi32::<16>(_mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))))
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

/// The configuration every AMX kernel loads: tiles 0-7 all 16 rows by 64 bytes (16 f32 sums,
/// or 32 bf16 values, or 16 pairs of them, per row).
const CONFIG: TileConfig = TileConfig {
    palette: 1,
    start_row: 0,
    reserved: [0; 14],
    colsb: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
    rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
};

/// Makes sure this thread's tile unit holds `CONFIG`: reads the loaded configuration back and
/// loads `CONFIG` only where it differs (a fresh thread, released tiles, or other code's
/// configuration).
///
/// # Safety
/// `available()` is true.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) unsafe fn configure() {
    let mut now = TileConfig { palette: 0, start_row: 0, reserved: [0; 14], colsb: [0; 16], rows: [0; 16] };
    std::arch::asm!("sttilecfg [{}]", in(reg) &mut now as *mut TileConfig, options(nostack));
    if now.palette != CONFIG.palette || now.colsb != CONFIG.colsb || now.rows != CONFIG.rows {
        std::arch::asm!("ldtilecfg [{}]", in(reg) &CONFIG as *const TileConfig, options(nostack, readonly));
    }
}
