//! The counting executor: runs no kernel, records every launch the backend issues (its name,
//! grid, block and the traffic its kernel module computes from its arguments) over a sparse
//! arena, so the real launch sequence of a model of any size is measured on a machine without
//! a GPU (`crate::profile`). [`crate::Gpu::counting`] is this executor behind the device
//! interface.
//!
//! Graphs: between `begin_capture` and `end_capture` the launches go to the graph instead of the
//! log; a replay logs one launch, `graph`, that moves and computes what they did (a replay is
//! one launch on a device, so the engine's host time per step is measured as a device's).
//!
//! Invariants: a launch is refused as on every executor (the device's limits, the argument
//! list's kinds); every launch and every cuBLAS call is recorded, in issue order; nothing is
//! computed, so outputs read back are zeros (unbacked) or what the host wrote (backed).

use crate::dtype::Dt;
use crate::exec::Arg;
use crate::hostexec::{bad, HostExec, Traffic, Traffics, TwinCall};
use lmplex_core::{Error, Result};
use std::sync::{Mutex, MutexGuard, PoisonError};

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
    /// The launches of the graph being captured, while one is.
    capture: Mutex<Option<Vec<LaunchRecord>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Counting {
    pub(crate) fn new(traffics: Traffics) -> Self {
        let (log, capture) = (Mutex::default(), Mutex::default());
        Self { mem: HostExec::sparse(UNBACKED_FROM), traffics, log, capture }
    }

    fn push(&self, r: LaunchRecord) {
        match lock(&self.capture).as_mut() {
            Some(graph) => graph.push(r),
            None => lock(&self.log).push(r),
        }
    }

    /// Starts a graph: the launches until `end_capture` are its own.
    pub(crate) fn begin_capture(&self) -> Result<()> {
        let mut capture = lock(&self.capture);
        if capture.is_some() {
            return Err(Error::internal("a graph capture inside another"));
        }
        *capture = Some(Vec::new());
        Ok(())
    }

    /// The graph's launches.
    pub(crate) fn end_capture(&self) -> Result<Vec<LaunchRecord>> {
        lock(&self.capture).take().ok_or_else(|| Error::internal("a graph capture ended before it began"))
    }

    /// Records one replay of a graph of `launches`: one launch moving and computing what they did.
    pub(crate) fn replay(&self, launches: &[LaunchRecord]) {
        let traffic = launches.iter().fold(Traffic::default(), |t, l| Traffic {
            bytes: t.bytes + l.traffic.bytes,
            flops: t.flops + l.traffic.flops,
            tensor_cores: t.tensor_cores || l.traffic.tensor_cores,
        });
        self.push(LaunchRecord { name: "graph".into(), grid: (1, 1, 1), block: 0, traffic });
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
        std::mem::take(&mut *lock(&self.log))
    }
}
