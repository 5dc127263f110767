//! The memory budgets of a `ModelHost`: the CPU's (host memory) and each CUDA device's.
//!
//! The CPU's is given or the memory available at start (`MemAvailable`). A CUDA device's is set
//! (`set_cuda`) or made when its first model is planned: `gpu_memory_utilization` of the
//! device's memory (from a probe, which creates no context) less `CUDA_CONTEXT_BYTES` for what
//! the device's models share beyond their plans.
//!
//! Invariant: a device's budget, once known, never changes unless set again.

use crate::placement::Placement;
use lmplex_core::{Error, Result};
use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

/// Device memory a CUDA device's models share beyond their plans: the context, the kernel
/// modules and cuBLAS. 0.59-0.61 GiB were measured beyond weights, KV and workspace on an H100.
pub const CUDA_CONTEXT_BYTES: usize = 640 << 20;

/// vLLM's default `gpu_memory_utilization`.
pub const DEFAULT_GPU_MEMORY_UTILIZATION: f64 = 0.9;

/// Memory the machine can still give (`MemAvailable`), or `None` where it cannot be read.
pub fn available_memory() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

pub(crate) fn gib(b: usize) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

/// The budgets; see the module docs.
pub(crate) struct Budgets {
    /// The CPU's budget (host memory).
    pub cpu: usize,
    /// Share of a CUDA device's memory its models may reserve when no budget was set for it.
    gpu_memory_utilization: f64,
    /// Budgets of the CUDA devices, by ordinal: set, or made on the device's first model.
    cuda: Mutex<BTreeMap<u32, usize>>,
}

impl Budgets {
    /// `cpu` bytes for the CPU, or (`None`) the memory available now.
    pub fn new(cpu: Option<usize>) -> Self {
        let cpu = cpu.or_else(available_memory).unwrap_or(usize::MAX);
        Self { cpu, gpu_memory_utilization: DEFAULT_GPU_MEMORY_UTILIZATION, cuda: Mutex::default() }
    }

    /// Sets the share of a device's memory used for devices whose budget is not set.
    pub fn with_gpu_memory_utilization(mut self, share: f64) -> Result<Self> {
        if !(share > 0.0 && share <= 1.0) {
            return Err(Error::invalid(format!("gpu_memory_utilization must be in (0, 1], got {share}")));
        }
        self.gpu_memory_utilization = share;
        Ok(self)
    }

    /// Sets CUDA device `ordinal`'s budget to `bytes`.
    pub fn set_cuda(&self, ordinal: u32, bytes: usize) {
        self.cuda.lock().unwrap_or_else(PoisonError::into_inner).insert(ordinal, bytes);
    }

    /// The budget of `on`; a CUDA device's is made on first use from a probe of the device,
    /// which fails with `InvalidRequest` when the device cannot be used.
    pub fn of(&self, on: Placement) -> Result<usize> {
        let Placement::Cuda(n) = on else { return Ok(self.cpu) };
        let mut budgets = self.cuda.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(b) = budgets.get(&n) {
            return Ok(*b);
        }
        let facts = lmplex_cuda::probe(n)?;
        let share = (facts.total_bytes as f64 * self.gpu_memory_utilization) as usize;
        let b = share.saturating_sub(CUDA_CONTEXT_BYTES);
        tracing::info!(
            "cuda:{n} ({}): {} budget = {} x {} - {} for the context",
            facts.name,
            gib(b),
            self.gpu_memory_utilization,
            gib(facts.total_bytes),
            gib(CUDA_CONTEXT_BYTES)
        );
        budgets.insert(n, b);
        Ok(b)
    }

    /// The CUDA devices' budgets known so far, by ordinal.
    pub fn cuda(&self) -> BTreeMap<u32, usize> {
        self.cuda.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}
