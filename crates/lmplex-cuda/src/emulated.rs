//! The CPU-kernel executor: the real kernels (`lmplex_kernels::cpu`, the `.cu` sources compiled
//! as C++ over the emulation layer) run on the host executor's arena, GEMMs through its
//! reference GEMM. [`crate::Gpu::emulated`] is this executor behind the device interface, so the
//! whole forward pass runs the real kernel code on any machine with a C++ compiler.
//!
//! Invariants: every pointer argument is translated from a device address into the arena, and
//! one outside it is an error before the kernel runs (0, a kernel's absent optional argument,
//! stays a null pointer); the arena stays locked (unmoved) for the
//! whole launch; launches run in the calling thread, in issue order, as on one stream.

use crate::device::kernel_cache_dir;
use crate::exec::Arg;
use crate::hostexec::HostExec;
use lmplex_core::Result;
use lmplex_kernels::{CpuKernels, Order};
use std::ffi::c_void;

pub struct Emulated {
    pub mem: HostExec,
    kernels: &'static CpuKernels,
    order: Order,
}

impl Emulated {
    /// Builds (or reuses) the CPU kernels; the threads of every phase run in `order`.
    pub fn new(order: Order) -> Result<Self> {
        let kernels = CpuKernels::shared(&kernel_cache_dir().join("cpu"))?;
        Ok(Self { mem: HostExec::default(), kernels, order })
    }

    pub fn launch(&self, name: &str, grid: (u32, u32, u32), block: u32, args: &[Arg]) -> Result<()> {
        self.mem.with_host_pointers(|host| {
            // One 8-byte slot per argument; the kernel reads its parameter's type from the slot
            // (little-endian, so an int or a float sits in the low bytes).
            let mut slots = Vec::with_capacity(args.len());
            for a in args {
                slots.push(match *a {
                    Arg::P(0) => 0,
                    Arg::P(p) => host(p)? as u64,
                    Arg::I(i) => i as u32 as u64,
                    Arg::F(f) => f.to_bits() as u64,
                });
            }
            let mut ptrs: Vec<*mut c_void> = slots.iter_mut().map(|s| (s as *mut u64).cast()).collect();
            // SAFETY: the argument lists are written next to each kernel's signature
            // (`crate::kernels`), and every pointer addresses the locked arena.
            unsafe { self.kernels.launch(name, grid, (block, 1, 1), &mut ptrs, self.order) }
        })
    }
}
