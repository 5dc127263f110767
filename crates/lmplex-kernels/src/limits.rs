//! What a device checks at launch, checked for every executor (device, host twins, CPU kernels)
//! on the launch parameters the backend passes: threads per block, grid size, and each kernel's
//! static shared memory (read from its CUBIN's `.nv.shared.<kernel>` section).
//!
//! Invariant: the limits are those of every arch the backend compiles for (sm_80 and later);
//! a launch the device would refuse is an error here too, on any machine.

use lmplex_core::{Error, Result};

/// Threads per block.
pub const MAX_THREADS_PER_BLOCK: u32 = 1024;
/// Blocks along x, y and z.
pub const MAX_GRID: [u32; 3] = [i32::MAX as u32, 65_535, 65_535];
/// Static shared memory per block (more needs a dynamic opt-in the kernels do not use).
pub const MAX_STATIC_SHARED_BYTES: usize = 48 * 1024;

/// An error when `name` launched over `grid` blocks of `block` threads would be refused.
pub fn check_launch(name: &str, grid: (u32, u32, u32), block: u32) -> Result<()> {
    if block == 0 || block > MAX_THREADS_PER_BLOCK {
        return Err(Error::internal(format!(
            "kernel {name}: {block} threads per block (a launch takes 1 to {MAX_THREADS_PER_BLOCK})"
        )));
    }
    for (axis, (n, max)) in ["x", "y", "z"].iter().zip([grid.0, grid.1, grid.2].into_iter().zip(MAX_GRID)) {
        if n > max {
            return Err(Error::internal(format!("kernel {name}: grid {axis} of {n} blocks (at most {max})")));
        }
    }
    Ok(())
}

fn u16_at(b: &[u8], at: usize) -> Option<usize> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?) as usize)
}
fn u32_at(b: &[u8], at: usize) -> Option<usize> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?) as usize)
}
fn u64_at(b: &[u8], at: usize) -> Option<usize> {
    usize::try_from(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?)).ok()
}

/// Static shared memory of `function` in a CUBIN (ELF64): the size of its `.nv.shared.<function>`
/// section, 0 when it has none; `None` when the bytes are not an ELF64 little-endian file.
pub fn static_shared_bytes(cubin: &[u8], function: &str) -> Option<usize> {
    if !cubin.starts_with(b"\x7fELF\x02\x01") {
        return None;
    }
    let (shoff, shentsize, shnum, shstrndx) =
        (u64_at(cubin, 0x28)?, u16_at(cubin, 0x3a)?, u16_at(cubin, 0x3c)?, u16_at(cubin, 0x3e)?);
    let section = |i: usize| shoff.checked_add(i.checked_mul(shentsize)?);
    let names = u64_at(cubin, section(shstrndx)? + 0x18)?;
    let want = format!(".nv.shared.{function}");
    for i in 0..shnum {
        let s = section(i)?;
        let name_at = names.checked_add(u32_at(cubin, s)?)?;
        let name = cubin.get(name_at..)?.split(|&b| b == 0).next()?;
        if name == want.as_bytes() {
            return u64_at(cubin, s + 0x20);
        }
    }
    Some(0)
}
