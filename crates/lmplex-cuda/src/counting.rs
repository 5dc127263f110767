//! The counting executor: runs no kernel, records every launch the backend issues (its name,
//! grid, block and the traffic its kernel module computes from its arguments) over a sparse
//! arena, so the real launch sequence of a model of any size is measured on a machine without
//! a GPU (`crate::profile`). [`crate::Gpu::counting`] is this executor behind the device
//! interface.
//!
//! Invariants: a launch is refused as on every executor (the device's limits, the argument
//! list's kinds); every launch and every cuBLAS call is recorded, in issue order; nothing is
//! computed, so outputs read back are zeros (unbacked) or what the host wrote (backed).

use crate::dtype::Dt;
use crate::exec::Arg;
use crate::hostexec::{bad, HostExec, Traffic, Traffics, TwinCall};
use lmplex_core::Result;
use std::sync::Mutex;

/// Allocations of at least this many bytes are unbacked (weights, the KV pool, activations,
/// logits); smaller ones (the batch's metadata, which the traffic is read from) hold memory.
pub const UNBACKED_FROM: usize = 8 << 20;

/// One recorded launch.
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchRecord {
    /// The entry point (`rope_bf16`), or `cublas_gemm_<dtype>` for one cuBLAS call.
    pub name: String,
    pub grid: (u32, u32, u32),
    pub block: u32,
    pub traffic: Traffic,
}

pub struct Counting {
    pub mem: HostExec,
    traffics: Traffics,
    log: Mutex<Vec<LaunchRecord>>,
}

impl Counting {
    pub(crate) fn new(traffics: Traffics) -> Self {
        Self { mem: HostExec::sparse(UNBACKED_FROM), traffics, log: Mutex::default() }
    }

    fn push(&self, r: LaunchRecord) {
        self.log.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(r);
    }

    /// Records kernel `name`'s launch with the traffic its module computes.
    pub(crate) fn launch(&self, name: &str, grid: (u32, u32, u32), block: u32, args: &[Arg]) -> Result<()> {
        let call = TwinCall::of(name, grid, args)?;
        let of = (self.traffics)(call.stem).ok_or_else(|| bad(format!("no traffic for kernel '{name}'")))?;
        let traffic = of(&self.mem, &call)?;
        self.push(LaunchRecord { name: name.into(), grid, block, traffic });
        Ok(())
    }

    /// Records one cuBLAS call `y[rows, n] = x[rows, k] · w[n, k]ᵀ` (`x`, `w` in `dt`, `y` in
    /// `out`): each call reads the whole of `w`.
    pub(crate) fn gemm(&self, rows: usize, n: usize, k: usize, dt: Dt, out: Dt) {
        let bytes = (rows * k + n * k) * dt.size() + rows * n * out.size();
        let traffic = Traffic { bytes: bytes as u64, flops: (2 * rows * n * k) as u64, tensor_cores: dt != Dt::F32 };
        self.push(LaunchRecord { name: format!("cublas_gemm_{}", dt.suffix()), grid: (0, 0, 0), block: 0, traffic });
    }

    /// The launches recorded since the last call, in issue order.
    pub fn take(&self) -> Vec<LaunchRecord> {
        std::mem::take(&mut *self.log.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}
