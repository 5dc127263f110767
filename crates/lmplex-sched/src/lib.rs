//! lmplex-sched: which requests run in the next forward pass, and how many tokens each.
//!
//! Synchronous and tokio-free: the engine's step loop calls `schedule(now)`, runs the model
//! on the returned `SchedulerOutput`, samples, and calls `update(...)` (vLLM v1's interface:
//! there is no prefill phase and no decode phase; every scheduled request brings
//! `num_computed_tokens` towards `num_tokens`, and chunked prefill falls out of the token
//! budget).

#![warn(missing_docs)]

pub mod config;
pub mod fair;
pub mod ledger;
pub mod request;
pub mod scheduler;
pub mod spec;

pub use config::{
    BatchMode, CostModel, Policy, PreemptionMode, SchedulerConfig, StepCost, MIN_PREFILL_CHUNK, SHORT_PROMPT,
    STEP_TARGET_FACTOR,
};
pub use fair::VirtualTokenCounters;
pub use ledger::{DeviceLedger, Seat, Serves, Turn};
pub use request::{RequestStatus, SchedulerRequest, TenantShare};
pub use scheduler::{ScheduledRequest, Scheduler, SchedulerOutput};
pub use spec::{Acceptance, DraftRequest, Drafter, NgramProposer, Proposal};
