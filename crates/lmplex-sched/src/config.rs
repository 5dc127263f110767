//! Scheduler settings, with LM Lite's batch knobs.

use std::time::Duration;

pub use lmplex_core::PreemptionMode;

/// Order of the waiting queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// First come, first served.
    Fcfs,
    /// Lower `priority` first, then arrival (vLLM's convention); with every slot taken, a
    /// waiting request preempts a running one of strictly lower priority.
    Priority,
    /// Lower `priority` first, then the tenant with the smallest virtual token counter
    /// (`fair`), then arrival; preemption takes from the tenant furthest over its share, and
    /// with every slot taken a tenant running nothing takes a slot from one running several.
    Fair,
}

/// When a new batch may start (LM Lite's single and batch modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchMode {
    /// Run as soon as anything is waiting.
    Single,
    /// With nothing running, wait until `max_num_seqs` requests are waiting or `timeout` has
    /// passed since the oldest waiting one arrived (`model_batch_execute_timeout_ms`).
    Batch {
        /// Longest the window stays open, from the oldest waiting request's arrival.
        timeout: Duration,
    },
}

/// How the scheduler batches, queues and preempts (default: 8 sequences, 2048 tokens, FCFS).
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Most running sequences (`max_model_concurrency`).
    pub max_num_seqs: usize,
    /// Most tokens in one forward pass (prefill chunks and decodes together).
    pub max_num_batched_tokens: usize,
    /// Most requests waiting; `add_request` beyond it is a `Capacity` error.
    pub max_waiting: usize,
    /// Order of admission and of preemption (the last in order is preempted first).
    pub policy: Policy,
    /// Whether a batch starts at once or waits for a fuller batch.
    pub batch_mode: BatchMode,
    /// Swap, recompute, or choose by the `CostModel` when a running request must give up blocks.
    pub preemption_mode: PreemptionMode,
    /// Most distinct LoRA adapters (`SchedulerRequest::lora`) among the running requests
    /// (vLLM's `max_loras`); a waiting request under another adapter waits for one to end.
    pub max_loras: usize,
    /// Drafts for speculative decoding (`spec`); `None` decodes one token per request and step.
    pub speculative: Option<crate::spec::Drafter>,
}

/// What preemption costs, per token, as the engine measures it (`Scheduler::set_cost_model`).
///
/// The rule (`PreemptionMode::Auto`): swap a victim with `n` computed tokens, `s` of them in
/// blocks other requests also hold, when the warm tier has room and
/// `2 * n * swap_s_per_token < (n - s) * recompute_s_per_token`: copying out and back must be
/// cheaper than re-running the prefill of the tokens that would not stay resident.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Seconds to prefill one token (a large prefill step's time over its tokens).
    pub recompute_s_per_token: f64,
    /// Seconds to copy one token's K/V between the tiers, one way.
    pub swap_s_per_token: f64,
}

impl Default for CostModel {
    /// Priors until the engine measures: 1 ms a prefill token, 10 us a copied token.
    fn default() -> Self {
        Self { recompute_s_per_token: 1e-3, swap_s_per_token: 1e-5 }
    }
}

impl CostModel {
    /// Whether swapping a victim of `n` computed tokens (`shared` of them resident through
    /// other requests) beats recomputing it.
    pub fn prefers_swap(&self, n: usize, shared: usize) -> bool {
        2.0 * n as f64 * self.swap_s_per_token < n.saturating_sub(shared) as f64 * self.recompute_s_per_token
    }
}

/// Multiple of a decode step's time that a step may take while requests wait (`StepCost`).
pub const STEP_TARGET_FACTOR: f64 = 2.0;
/// Least prefill a capped step leaves room for, in tokens, so a prefill always progresses.
pub const MIN_PREFILL_CHUNK: usize = 16;
/// A waiting request first in the policy's order whose prompt left is at most this many tokens
/// gets it all in its first step, beside the decodes, whatever the cap (`Scheduler::schedule`).
pub const SHORT_PROMPT: usize = 64;

/// What a step costs as the engine measures it: a fixed part (reading the weights, launching
/// the kernels) and a part per batched token (`Scheduler::set_step_cost`).
///
/// The rule: while a request waits and another runs, a step's token budget is what keeps it
/// within `STEP_TARGET_FACTOR` decode steps of the running batch, so a request that arrives
/// during a step waits out a short one, and a prefill runs in chunks beside the decodes
/// (Sarathi-Serve's stall-free batching) instead of stalling them for one long step; never
/// below the batch plus `MIN_PREFILL_CHUNK`, nor above `max_num_batched_tokens`. Otherwise (a
/// lone request, or requests that all start together) a step takes the whole
/// `max_num_batched_tokens`: the decodes pay for a step's fixed part, so chunks beside them
/// cost no throughput, but chunks with nothing beside them would.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepCost {
    /// Seconds of a step whatever its tokens.
    pub base_s: f64,
    /// Seconds per batched token.
    pub s_per_token: f64,
}

impl StepCost {
    /// The tokens a step may batch while requests wait, with `batch` requests running.
    pub fn token_budget(&self, batch: usize) -> usize {
        let target = STEP_TARGET_FACTOR * (self.base_s + self.s_per_token * batch as f64);
        let tokens = (target - self.base_s) / self.s_per_token.max(1e-12);
        (tokens.clamp(0.0, 1e9) as usize).max(batch + MIN_PREFILL_CHUNK)
    }
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_num_seqs: 8,
            max_num_batched_tokens: 2048,
            max_waiting: 1024,
            policy: Policy::Fcfs,
            batch_mode: BatchMode::Single,
            preemption_mode: PreemptionMode::Auto,
            max_loras: usize::MAX,
            speculative: None,
        }
    }
}
