//! lmplex-engine: requests in, outputs and token streams out, over one loaded model.
//!
//! Data flow: `Request` (prompt + `SamplingParams`) -> validation and tokenization on the
//! caller's thread (`Engine::submit`) -> command channel -> the model's step loop
//! (`core::EngineCore`: `Scheduler::schedule` -> the backend's forward pass (`runner`: CPU
//! `Model` or `lmplex_cuda::CudaModel`) over the shared paged KV pool
//! -> sampler and stop checks -> `Scheduler::update`) -> one channel per request ->
//! `RequestHandle` (blocking or async) -> `StreamChunk`s or a `RequestOutput`. A `ModelHost`
//! holds several engines inside one memory budget.

#![warn(missing_docs)]

mod budgets;
mod core;
mod engine;
mod handle;
pub mod host;
pub mod placement;
mod quota;
pub mod report;
pub mod routing;
mod runner;
mod sequence;
pub mod signals;
pub mod sizing;
mod stats;
pub mod tenants;

pub use budgets::{available_memory, CUDA_CONTEXT_BYTES, DEFAULT_GPU_MEMORY_UTILIZATION};
pub use engine::{Batch, Engine, Prompt, Request, DEFAULT_MAX_NUM_BATCHED_TOKENS};
pub use handle::{Aborter, RequestHandle};
pub use host::{ModelHost, ModelState};
pub use lmplex_model::ChatMessage;
pub use placement::{place, Placement};
pub use report::{DeviceBudget, HostMemory, MemoryReport, ModelInfo, RuntimeInfo};
pub use routing::Routed;
pub use signals::LiveSignals;
pub use sizing::{EnginePlan, KvSizing, BLOCK_SIZE};
pub use stats::{QueueSlots, Stats};
pub use tenants::{Admission, KeyDigest, Tenant, TenantUsage, Tenants};

/// The blocking iterator `Engine::stream` returns (a `RequestHandle`).
pub type Stream = RequestHandle;
