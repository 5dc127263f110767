//! Scheduler settings, with LM Lite's batch knobs.

use std::time::Duration;

/// Order of the waiting queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// First come, first served.
    Fcfs,
    /// Lower `priority` first, then arrival (vLLM's convention).
    Priority,
}

/// When a new batch may start (LM Lite's single and batch modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchMode {
    /// Run as soon as anything is waiting.
    Single,
    /// With nothing running, wait until `max_num_seqs` requests are waiting or `timeout` has
    /// passed since the oldest waiting one arrived (`model_batch_execute_timeout_ms`).
    Batch { timeout: Duration },
}

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Most running sequences (`max_model_concurrency`).
    pub max_num_seqs: usize,
    /// Most tokens in one forward pass (prefill chunks and decodes together).
    pub max_num_batched_tokens: usize,
    /// Most requests waiting; `add_request` beyond it is a `Capacity` error.
    pub max_waiting: usize,
    pub policy: Policy,
    pub batch_mode: BatchMode,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_num_seqs: 8,
            max_num_batched_tokens: 2048,
            max_waiting: 1024,
            policy: Policy::Fcfs,
            batch_mode: BatchMode::Single,
        }
    }
}
