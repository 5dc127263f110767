//! Where a model runs: `ModelConfig::device` resolved to the CPU or one CUDA device.
//!
//! `device="cpu"` and `device="cuda:N"` are taken as asked (a CUDA device that cannot be used
//! is an error at load, never a silent CPU run). `device="auto"` probes CUDA device 0 once per
//! process (`lmplex_cuda::probe`, no context created) and chooses it when it is usable and its
//! architecture is one the device tests have passed on (`lmplex_cuda::VERIFIED_ARCHS`), else the
//! CPU; the choice is logged once, with the reason when it is the CPU.
//!
//! Invariant: the plan (`EnginePlan`, which the `ModelHost` checks against its budgets) and the
//! load (`runner::load`) resolve a config through `place_model`, so a model is planned for the device
//! it then loads on.

use lmplex_core::{DeviceKind, ModelConfig, Task};
use std::sync::OnceLock;

/// A resolved device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Placement {
    /// The CPU backend.
    Cpu,
    /// The CUDA backend on the device of this ordinal.
    Cuda(u32),
}

impl std::fmt::Display for Placement {
    /// `cpu` or `cuda:N`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// Where the model of `config` runs: its `device` (`place`), except that an embedding model
/// (`Task::Embed`, CPU only) on `auto` runs on the CPU.
pub fn place_model(config: &ModelConfig) -> Placement {
    match (config.task, config.device) {
        (Task::Embed, DeviceKind::Auto) => Placement::Cpu,
        (_, device) => place(device),
    }
}

/// Where a model asking for `device` runs.
pub fn place(device: DeviceKind) -> Placement {
    match device {
        DeviceKind::Cpu => Placement::Cpu,
        DeviceKind::Cuda(n) => Placement::Cuda(n),
        DeviceKind::Auto => auto(),
    }
}

/// `device="auto"`'s choice, made once per process.
fn auto() -> Placement {
    static AUTO: OnceLock<Placement> = OnceLock::new();
    *AUTO.get_or_init(|| match lmplex_cuda::auto_choice(lmplex_cuda::probe(0)) {
        Ok(f) => {
            tracing::info!("device=auto: CUDA device {} ({}, sm_{})", f.ordinal, f.name, f.arch);
            Placement::Cuda(f.ordinal)
        }
        Err(why) => {
            tracing::info!("device=auto: the CPU, because {why}");
            Placement::Cpu
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_devices_are_taken_as_asked() {
        assert_eq!(place(DeviceKind::Cpu), Placement::Cpu);
        assert_eq!(place(DeviceKind::Cuda(3)), Placement::Cuda(3));
        assert_eq!(Placement::Cuda(3).to_string(), "cuda:3");
    }
}
