//! A request as the scheduler sees it: token ids and progress, nothing about text or sampling.
//!
//! Invariants: `num_computed_tokens <= num_tokens()`; `all_token_ids` starts with the prompt and
//! only grows (by `append_output_token`); a request preempted by recompute keeps its tokens and
//! restarts from `num_computed_tokens == 0` (prefix-cache hits may skip part of the recompute);
//! one preempted by swap keeps `num_computed_tokens` too (its K/V wait in the warm tier).

use lmplex_core::TokenId;
use lmplex_kv::manager::ReqId;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

/// The tenant a request belongs to, as the `fair` policy needs it: a name and a weight.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantShare {
    /// The tenant's name; `""` is the default tenant of requests that name none.
    pub name: Arc<str>,
    /// Its share: service is divided by it (> 0; 1 by default).
    pub weight: f64,
}

impl Default for TenantShare {
    fn default() -> Self {
        Self { name: Arc::from(""), weight: 1.0 }
    }
}

/// Where a request is in the scheduler's queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestStatus {
    /// Queued and not yet admitted.
    Waiting,
    /// In the running batch, holding hot blocks.
    Running,
    /// Lost its blocks to a higher-priority request; waits to be recomputed.
    Preempted,
    /// Its blocks were moved to the warm tier; waits to be swapped back in.
    Swapped,
}

/// The scheduler's view of one request: its tokens and how far they are computed (vLLM's
/// scheduler `Request`). Not what a user submits: that is `lmplex_engine::Request`.
#[derive(Debug, Clone)]
pub struct SchedulerRequest {
    /// The engine's id of the request, unique among the scheduler's requests.
    pub id: ReqId,
    /// The prompt followed by every token generated so far.
    pub all_token_ids: Vec<TokenId>,
    /// Length of the prompt at the start of `all_token_ids`.
    pub num_prompt_tokens: usize,
    /// Tokens whose K/V are in the cache.
    pub num_computed_tokens: usize,
    /// Tokens found in the prefix cache on the last admission.
    pub num_cached_tokens: usize,
    /// Most tokens this request may reach (prompt + max output, capped by the context).
    pub max_num_tokens: usize,
    /// Ordering under `Policy::Priority`: lower runs first (vLLM's convention); 0 by default.
    pub priority: i32,
    /// When the request arrived: orders admission (after priority) and times the batch window.
    pub arrival: Instant,
    /// When a request with a latency budget must end: in every policy, after priority (and
    /// the tenant's share under `Fair`), requests with a deadline go first, ahead of those
    /// without one; each group keeps its arrival order.
    pub deadline: Option<Instant>,
    /// Prefix-cache salt (e.g. the tenant): only requests with the same salt share blocks.
    pub cache_salt: Option<String>,
    /// Whose request it is, for the `fair` policy.
    pub tenant: TenantShare,
    /// Where the request is now.
    pub status: RequestStatus,
    /// How many times it was preempted (by swap or recompute).
    pub num_preemptions: usize,
    /// It wants every prompt position's logits (prompt logprobs): it reads nothing from the
    /// prefix cache, and its prompt chunks ask for the logits of all their rows.
    pub all_prompt_logits: bool,
    /// The LoRA adapter it runs under (its process-unique id), counted against `max_loras`.
    pub lora: Option<u64>,
    /// How its speculative drafts have fared (sets its next draft's length).
    pub acceptance: crate::spec::Acceptance,
    /// Prompt spans one chunk must compute whole, in order and disjoint (a Gemma 3 image's
    /// tokens, which attend to each other): chunks end at their edges (`fit_chunk`).
    pub unsplit_spans: Vec<Range<usize>>,
}

impl SchedulerRequest {
    /// A waiting request: `prompt`, room for `max_num_tokens` tokens, priority 0, no deadline, no
    /// salt, the default tenant.
    pub fn new(id: ReqId, prompt: Vec<TokenId>, max_num_tokens: usize, arrival: Instant) -> Self {
        Self {
            id,
            num_prompt_tokens: prompt.len(),
            all_token_ids: prompt,
            num_computed_tokens: 0,
            num_cached_tokens: 0,
            max_num_tokens,
            priority: 0,
            arrival,
            deadline: None,
            cache_salt: None,
            tenant: TenantShare::default(),
            status: RequestStatus::Waiting,
            num_preemptions: 0,
            all_prompt_logits: false,
            lora: None,
            acceptance: crate::spec::Acceptance::default(),
            unsplit_spans: Vec::new(),
        }
    }

    /// The length of a chunk of at most `n` tokens from `start` that splits no unsplit span: one
    /// that would end inside a span ends where the span starts, or, when it starts inside that
    /// span (or at its start), where the span ends, past `n` (a step's budget is then exceeded
    /// by at most one span; the request never stalls). `n` when no span is cut; 0 for 0.
    pub fn fit_chunk(&self, start: usize, n: usize) -> usize {
        self.fit(start, n, true)
    }

    /// `fit_chunk` that never goes past `n`: a chunk that starts inside a span it cannot hold
    /// whole takes 0 tokens (a reservation for a waiting request leaves it no room).
    pub fn fit_chunk_within(&self, start: usize, n: usize) -> usize {
        self.fit(start, n, false)
    }

    fn fit(&self, start: usize, n: usize, extend: bool) -> usize {
        let end = start + n;
        let i = self.unsplit_spans.partition_point(|s| s.end <= end);
        match self.unsplit_spans.get(i) {
            Some(s) if n > 0 && s.start < end && s.start > start => s.start - start,
            Some(s) if n > 0 && s.start < end && extend => s.end - start,
            Some(s) if n > 0 && s.start < end => 0,
            _ => n,
        }
    }

    /// Tokens so far, prompt and output.
    pub fn num_tokens(&self) -> usize {
        self.all_token_ids.len()
    }
    /// Tokens generated so far.
    pub fn num_output_tokens(&self) -> usize {
        self.all_token_ids.len() - self.num_prompt_tokens
    }
    /// Appends a generated token (the scheduler's `update` does this once per sampled step).
    pub fn append_output_token(&mut self, t: TokenId) {
        self.all_token_ids.push(t);
    }
}
