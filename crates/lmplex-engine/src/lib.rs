//! lmplex-engine: requests in, outputs and token streams out, over one loaded model.
//!
//! Data flow: `Request` (prompt + `SamplingParams`), carried with its resolved tenant and route
//! as a `Call` -> `ModelHost::submit` (named or routed) -> validation and tokenization on the
//! caller's thread (`Engine::prepare`, then `Engine::submit_prepared`) -> command channel -> the model's step loop
//! (`step_loop::EngineCore`: `Scheduler::schedule` -> the backend's forward pass (`runner`: CPU
//! `Model` or `lmplex_cuda::CudaModel`) over the shared paged KV pool
//! -> sampler and stop checks -> `Scheduler::update`) -> one channel per request ->
//! `RequestHandle` (blocking or async) -> `StreamChunk`s or a `RequestOutput`. A `ModelHost`
//! holds several engines inside one memory budget.

#![warn(missing_docs)]

mod budgets;
pub mod call;
mod draft;
mod engine;
mod handle;
pub mod host;
mod lora;
pub mod placement;
pub mod report;
mod runner;
mod sequence;
pub mod signals;
pub mod sizing;
mod stats;
mod step_loop;
pub mod tenants;
pub mod usage;
mod vision;

pub use budgets::{available_memory, CUDA_CONTEXT_BYTES, DEFAULT_GPU_MEMORY_UTILIZATION};
pub use call::Call;
pub use engine::{Batch, Engine, Prepared, Prompt, Request};
pub use handle::{Aborter, RequestHandle};
pub use host::{ModelHost, ModelState};
pub use host::{Routed, Submitted, Target};
pub use lmplex_model::chat::ContentPart;
pub use lmplex_model::chat::{continue_final_message, ChatTemplateKwargs};
pub use lmplex_model::{ChatMessage, Tokenizer};
pub use lora::LoraRegistry;
pub use placement::{place, Placement};
pub use report::{DeviceBudget, HostMemory, MemoryReport, ModelInfo, RuntimeInfo};
pub use signals::LiveSignals;
pub use sizing::{EnginePlan, KvSizing, BLOCK_SIZE};
pub use stats::{QueueSlots, Stats, StatsSnapshot};
pub use tenants::{Admission, KeyDigest, Tenant, TenantUsage, Tenants};
pub use usage::{Documents, UsageStoreSpec, DEFAULT_LEASE_S};

/// The blocking iterator `Engine::stream` returns (a `RequestHandle`).
pub type Stream = RequestHandle;
