//! lmplex-core: the types every other crate shares.
//!
//! Invariants: this crate depends on nothing heavier than `serde`, `serde_json` and `thiserror`; every value
//! that crosses a crate boundary from the user (sampling parameters, model configuration) is
//! validated here, once, by a `validate()` that returns a typed [`Error`], never a panic.

#![warn(missing_docs)]

mod config;
mod error;
mod output;
mod pooling;
mod route;
mod sampling;
mod speculative;
mod tenant;
mod tools;

pub use config::{
    DType, DeviceKind, KvCacheDtype, MmLimits, ModelConfig, Pooling, PreemptionMode, ReasoningParser, SchedulingPolicy,
    Task, ToolCallParser, DEFAULT_MAX_NUM_BATCHED_TOKENS,
};
pub use error::{Error, LimitKind, LimitStatus, QuotaStatus, RateLimit, Result};
pub use output::{FinishReason, Logprob, RequestOutput, StopReason, StreamChunk, TokenLogprobs, Usage};
pub use pooling::PoolingParams;
pub use route::{Mode, Route, Tier};
pub use sampling::{SamplingParams, StructuredOutput, MAX_LOGPROBS};
pub use speculative::{SpeculativeConfig, SpeculativeMethod, MAX_SPECULATIVE_TOKENS};
pub use tenant::TenantConfig;
pub use tools::{FunctionCall, FunctionDef, Tool, ToolCall, ToolChoice, Tools};

/// Token id in a model's vocabulary.
pub type TokenId = u32;
