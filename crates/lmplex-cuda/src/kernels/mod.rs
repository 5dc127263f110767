//! The backend's kernels as Rust sees them: one module per source of `lmplex-kernels/kernels`,
//! named after its `.cu` file (`rope.rs` for `rope.cu`), holding what a kernel needs
//! on this side: its typed launch (one struct per entry point whose fields follow the `.cu`
//! signature in order and name, and whose `launch` sets the grid and block size), its CPU twin
//! (run by `Gpu::host()`), what a launch must move through global memory (recorded by
//! `Gpu::counting()`), and its check cases (run by `crate::kernel_check` on the CPU kernels).
//! `launch.rs` and `check.rs` hold what the launches and the cases share.
//!
//! Adding a kernel: its `.cu` (and its line in `lmplex_kernels::sources`), its module here, and
//! the module's `KERNEL` in `ALL`.
//!
//! Invariants: a kernel module is the one place that knows its kernel's argument list and launch
//! shape; the forward pass (`forward.rs`), the twins and the checks all launch through it, so
//! the checks run the launch parameters the backend runs. Addresses are device addresses
//! (`u64`); sizes are `usize`, refused when they do not fit the kernel's `int`.

pub mod argmax;
pub mod check;
pub mod embedding;
pub mod kv_write;
pub mod launch;
pub mod lora;
pub mod paged_attention;
pub mod qgemv;
pub mod rmsnorm;
pub mod rope;
pub mod rowwise;
pub mod sampling;
pub mod swiglu;
pub mod tgemm;
pub mod tgemm_fused;

pub use argmax::Argmax;
pub use embedding::Embedding;
pub use kv_write::ReshapeAndCache;
pub use lora::{LoraExpand, LoraShrink, LoraSlot};
pub use paged_attention::{PagedAttention, PARTITION, TILE_ROWS};
pub use qgemv::{QEmbedding, Qgemv};
pub use rmsnorm::FusedAddRmsnorm;
pub use rope::{Rope, RopeAndCache};
pub use rowwise::{AddBias, RmsnormHeads};
pub use sampling::{LogitEdits, Sample};
pub use swiglu::SiluAndMul;
pub use tgemm::{Fusion, RowNorm, TileGemm};
pub use tgemm_fused::TileGemmSwiglu;

use crate::gpu::Gpu;
use crate::hostexec::{TrafficOf, Twin};
use check::Instance;

/// What a kernel module gives the executors and the checks.
pub(crate) struct Kernel {
    /// Its twins and traffic by entry-point stem (the name without its dtype suffix); a stem
    /// ending in `_` stands for every stem it begins (`qgemv_` for `qgemv_q4_0`, `qgemv_q6_k`, ...).
    entries: &'static [(&'static str, Twin, TrafficOf)],
    /// Its instances whose name contains the filter, with their cases.
    checks: fn(&str) -> Vec<Instance>,
}

/// Every kernel module, in the order of `lmplex_kernels::all_kernels` (`tgemm.cu`'s fused entry
/// points first: `tgemm_` also begins their names).
const ALL: [Kernel; 13] = [
    embedding::KERNEL,
    rmsnorm::KERNEL,
    rope::KERNEL,
    swiglu::KERNEL,
    rowwise::KERNEL,
    kv_write::KERNEL,
    lora::KERNEL,
    paged_attention::KERNEL,
    qgemv::KERNEL,
    tgemm_fused::KERNEL,
    tgemm::KERNEL,
    argmax::KERNEL,
    sampling::KERNEL,
];

/// The entry of an entry point's stem.
fn entry(stem: &str) -> Option<&'static (&'static str, Twin, TrafficOf)> {
    let matches = |s: &str| s == stem || (s.ends_with('_') && stem.starts_with(s));
    ALL.iter().flat_map(|k| k.entries).find(|(s, _, _)| matches(s))
}

fn twin(stem: &str) -> Option<Twin> {
    entry(stem).map(|e| e.1)
}

fn traffic(stem: &str) -> Option<TrafficOf> {
    entry(stem).map(|e| e.2)
}

/// Every kernel instance whose name contains `filter` (all with `""`), with its cases.
pub fn checks(filter: &str) -> Vec<Instance> {
    ALL.iter().flat_map(|k| (k.checks)(filter)).collect()
}

impl Gpu {
    /// The host executor (no GPU): every kernel's CPU twin over host memory.
    pub fn host() -> Self {
        Self::with_twins(twin)
    }

    /// The counting executor (no GPU, no kernel work): every launch recorded with the traffic
    /// its kernel must move (`crate::counting`, `Gpu::take_launches`).
    pub fn counting() -> Self {
        Self::with_traffics(traffic)
    }
}
