//! `Scheduler`: one step's `SchedulerOutput` from the running and waiting requests.
//!
//! A step (`schedule`): the token budget is `max_num_batched_tokens`, or while a request waits
//! and another runs (or another model on the device has requests), what keeps the step short
//! by the engine's measured `StepCost`; running
//! requests first, in order, each getting `min(num_tokens - num_computed_tokens, token budget
//! left)` tokens (fitted to the request's unsplit spans, `SchedulerRequest::fit_chunk`); when the pool cannot hold a running request's new tokens, the lowest-ranked
//! unscheduled running request is preempted until it fits or it is itself the victim.
//! Preemption swaps the victim's blocks to the warm tier (it keeps `num_computed_tokens`) or
//! frees them (it is recomputed later), by `preemption_mode` and, in `Auto`, by the `CostModel`
//! rule. Then, if nothing was preempted,
//! waiting requests in policy order while fewer than `max_num_seqs` run and budget remains: a
//! swapped one is swapped back in, any other gets a prefix-cache lookup that skips its cached
//! tokens; the first one that does not fit stops admission (no overtaking), except that a
//! request under a LoRA adapter that would make more than `max_loras` adapters run is passed
//! over (vLLM's rule) and waits for one of them to end. `update` then
//! applies the step's results: computed tokens, sampled tokens, and the requests that ended.
//! With speculative decoding, after admission, decodes may carry drafted tokens (`drafts`).
//!
//! Before that, under `Priority` and `Fair`, the first waiting request may take from running
//! ones (`preempt_for_waiting`): with every slot taken, it preempts the last-ranked running
//! request of strictly lower priority or, under `Fair` at equal priority, when its tenant runs
//! nothing, the last-ranked request of a tenant that runs two or more and is further over its
//! share; and running requests ranked after it shrink their prefill chunks to leave its chunk
//! in the budget. Admission then goes ahead in the same step.
//!
//! Policy order (`rank`, smaller first; the largest is preempted first): `Fcfs` by arrival,
//! `Priority` by (priority, arrival), `Fair` by (priority, the tenant's virtual token counter,
//! whether the tenant has a request running, arrival), so under `Fair` the least-served
//! tenant is admitted first and the tenant furthest over its share loses blocks first
//! (`fair`). In each, before arrival, a request with a deadline (a latency budget) ranks
//! before one without, so budgeted calls never queue behind unbudgeted ones of the same rank
//! and are the last to be preempted among them. Counters are charged in `update` under every
//! policy, in device seconds, to the device's `DeviceLedger` (shared with the other models on
//! the device, `with_ledger`); under `Fair` a step runs under the device's turn (`turn`); the
//! order never changes what a request computes, only when.
//!
//! Invariants: a request is in exactly one of `waiting` and `running`; only running requests
//! hold hot blocks, only swapped ones hold warm blocks; `num_batched_tokens <=
//! max_num_batched_tokens`, plus at most one unsplit span (`SchedulerRequest::fit_chunk`: a
//! chunk starting at an image block the budget cannot hold takes it whole); at most `max_num_seqs` run, under at most `max_loras` distinct
//! adapters; a request is sampled only when its
//! chunk reaches the end of its known tokens; a request that could never fit the pool is
//! refused by `add_request`, so preemption always makes progress. Every swap-out of a step is
//! decided before any swap-in (admission comes last, and is skipped after a preemption for
//! blocks), so a swap-out's warm blocks were taken while a swap-in's were still held, and the
//! runner may copy `blocks_to_swap_out` then `blocks_to_swap_in`, both before the forward
//! pass, without one overwriting the other's source.
//!
//! Deadlines: a waiting request is not admitted while a running request that ranks before it
//! and has a deadline would miss it with one more request in the batch (and would not without),
//! by the measured `StepCost` and its output tokens left at most; admission stops there (no
//! overtaking), and the held request joins once that one ends or has room.
//!
//! Batch window (`BatchMode::Batch`): while nothing runs, a step schedules nothing (and says
//! until when) until `max_num_seqs` requests wait or the oldest has waited `timeout`. Once a
//! batch runs, new requests join it at the next step (continuous batching).

use crate::config::{BatchMode, CostModel, Policy, PreemptionMode, SchedulerConfig, StepCost};
use crate::fair::VirtualTokenCounters;
use crate::ledger::{DeviceLedger, Turn};
use crate::request::{RequestStatus, SchedulerRequest};
use crate::spec::RowCosts;
use lmplex_core::{Error, Result, TokenId};
use lmplex_kv::manager::ReqId;
use lmplex_kv::{BlockId, KvCacheManager};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

mod drafts;
mod policy;
mod update;

/// One request's share of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledRequest {
    /// The request this chunk belongs to.
    pub id: ReqId,
    /// The chunk starts at this position (tokens before it are in the cache).
    pub num_computed_tokens: usize,
    /// Token ids of the chunk: `all_token_ids[num_computed_tokens..][..n]`.
    pub token_ids: Vec<TokenId>,
    /// The request's whole block table (covers `num_computed_tokens + token_ids.len()` tokens).
    pub block_table: Vec<BlockId>,
    /// The chunk ends at the last known token: sample the next one.
    pub sample: bool,
    /// Every row's logits are wanted (a prompt chunk of a request with `all_prompt_logits`),
    /// not only the last row's when `sample` is set.
    pub all_logits: bool,
    /// The request's prompt length: later positions hold generated tokens (the model picks
    /// its matmul kernel by this, and prefix-cache hashes record it).
    pub num_prompt_tokens: usize,
    /// The last this many of `token_ids` are drafted (speculative decoding), after the
    /// request's last known token: every row's logits are wanted, and the engine keeps the
    /// drafts up to the first that differs from the token it picks at that row.
    pub num_draft_tokens: usize,
}

impl ScheduledRequest {
    /// The drafted tokens at the end of the chunk (empty without speculation).
    pub fn draft_token_ids(&self) -> &[TokenId] {
        &self.token_ids[self.token_ids.len() - self.num_draft_tokens..]
    }
}

/// One step's work: the chunks to run, the preemptions and the block copies to do first.
#[derive(Debug, Clone, Default)]
pub struct SchedulerOutput {
    /// Chunks to run in this step's forward pass: running requests first, then newly admitted ones.
    pub scheduled: Vec<ScheduledRequest>,
    /// Tokens in `scheduled`, summed (at most `max_num_batched_tokens`, plus at most one
    /// unsplit span: `SchedulerRequest::fit_chunk`).
    pub num_batched_tokens: usize,
    /// Requests preempted this step (by swap or recompute).
    pub preempted: Vec<ReqId>,
    /// Of `preempted`, those swapped out rather than freed.
    pub swapped_out: Vec<ReqId>,
    /// `(hot, warm)` block pairs to copy before the forward pass.
    pub blocks_to_swap_out: Vec<(BlockId, BlockId)>,
    /// `(warm, hot)` block pairs to copy before the forward pass.
    pub blocks_to_swap_in: Vec<(BlockId, BlockId)>,
    /// Nothing scheduled because the batch window is open, or because another model's
    /// deadlines guard the device: call again at this instant.
    pub wait_until: Option<Instant>,
}

impl SchedulerOutput {
    /// Whether no chunk was scheduled (preemptions and swap copies may still need doing).
    pub fn is_empty(&self) -> bool {
        self.scheduled.is_empty()
    }
}

/// Decides each step's batch over one `KvCacheManager`: chunked prefill, preemption, admission.
pub struct Scheduler {
    cfg: SchedulerConfig,
    kv: KvCacheManager,
    requests: HashMap<ReqId, SchedulerRequest>,
    waiting: Vec<ReqId>,
    running: Vec<ReqId>,
    cost: CostModel,
    step_cost: Option<StepCost>,
    row_costs: RowCosts,
    steps_since_explore: usize,
    /// What it knows of a draft model: its proposals, costs and what it holds.
    draft: drafts::DraftModelState,
    vtc: VirtualTokenCounters,
}

impl Scheduler {
    /// An empty scheduler over `kv`; panics if `max_num_seqs` or `max_num_batched_tokens` is 0.
    pub fn new(cfg: SchedulerConfig, kv: KvCacheManager) -> Self {
        assert!(cfg.max_num_seqs > 0 && cfg.max_num_batched_tokens > 0);
        let cost = CostModel::default();
        Self {
            cfg,
            kv,
            requests: HashMap::new(),
            waiting: Vec::new(),
            running: Vec::new(),
            cost,
            step_cost: None,
            row_costs: RowCosts::default(),
            steps_since_explore: 0,
            draft: drafts::DraftModelState::default(),
            vtc: VirtualTokenCounters::default(),
        }
    }

    /// The scheduler charges its tenants' service to `ledger`, the one every model on its device
    /// shares (by default, a ledger of its own); call before adding requests.
    pub fn with_ledger(mut self, ledger: &Arc<DeviceLedger>) -> Self {
        assert!(self.requests.is_empty(), "a scheduler moves to a device's ledger before it has requests");
        self.vtc = VirtualTokenCounters::on(ledger.seat());
        self
    }

    /// The per-token costs the `Auto` preemption rule weighs (measured by the engine).
    pub fn set_cost_model(&mut self, cost: CostModel) {
        self.cost = cost;
    }
    /// What a step costs, measured by the engine: while requests wait, it caps a step's tokens
    /// (`StepCost`'s rule); until set, every step may take `max_num_batched_tokens`.
    pub fn set_step_cost(&mut self, cost: StepCost) {
        self.step_cost = Some(cost);
    }
    /// A forward pass of `rows` generated rows only (decodes and drafts) took `secs`, measured
    /// by the engine: what drafts cost (`RowCosts`).
    pub fn observe_decode_pass(&mut self, rows: usize, secs: f64) {
        self.row_costs.observe(rows, secs);
    }
    /// The per-token costs the `Auto` preemption rule uses now.
    pub fn cost_model(&self) -> CostModel {
        self.cost
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }
    /// Every tenant's virtual token counter (kept under every policy; `fair` orders by it).
    pub fn fairness(&self) -> &VirtualTokenCounters {
        &self.vtc
    }
    /// Device seconds a token is charged at: the measured `StepCost`'s, else the prefill
    /// cost's (measured, or its prior).
    pub fn seconds_per_token(&self) -> f64 {
        self.step_cost.map_or(self.cost.recompute_s_per_token, |c| c.s_per_token)
    }
    /// Under `Fair`, waits for the device's turn to run `out` (see `ledger`) and holds it until
    /// the `Turn` is dropped; under other policies, or for an empty step, takes none.
    pub fn turn(&self, out: &SchedulerOutput) -> Option<Turn> {
        if self.cfg.policy != Policy::Fair || out.is_empty() {
            return None;
        }
        let serves = out
            .scheduled
            .iter()
            .filter_map(|s| self.requests.get(&s.id))
            .map(|r| (r.priority, r.tenant.name.clone()))
            .collect();
        Some(self.vtc.seat().turn(serves))
    }
    /// Whether another model on the device holds requests now.
    pub fn others_busy(&self) -> bool {
        self.vtc.seat().others_busy()
    }
    /// Guards the device for this model's deadlines until `until`, or lifts the guard
    /// (`ledger`'s device guard).
    pub fn guard_device(&self, until: Option<Instant>) {
        self.vtc.seat().guard(until);
    }
    /// The KV cache manager (block pools, prefix-cache counters).
    pub fn kv(&self) -> &KvCacheManager {
        &self.kv
    }
    /// Request `id`, if waiting or running.
    pub fn request(&self, id: ReqId) -> Option<&SchedulerRequest> {
        self.requests.get(&id)
    }
    /// Requests waiting to be admitted (new, preempted or swapped out).
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }
    /// Requests in the running batch.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }
    /// Whether any request is still waiting or running.
    pub fn has_unfinished(&self) -> bool {
        !self.requests.is_empty()
    }

    /// Queues a request; `Capacity` when the waiting queue is full, `InvalidRequest` when it
    /// could never fit the KV pool or its id is taken.
    pub fn add_request(&mut self, mut req: SchedulerRequest) -> Result<()> {
        if self.requests.contains_key(&req.id) {
            return Err(Error::invalid(format!("request id {} is already in use", req.id)));
        }
        if req.all_token_ids.is_empty() || req.max_num_tokens < req.num_tokens() {
            return Err(Error::invalid("a request needs a prompt and room for its tokens"));
        }
        let need = self.kv.blocks_for(req.max_num_tokens);
        if need > self.kv.pool().num_blocks() {
            return Err(Error::invalid(format!(
                "the request may reach {} tokens ({need} KV blocks) but the pool has {} blocks of {}",
                req.max_num_tokens,
                self.kv.pool().num_blocks(),
                self.kv.block_size()
            )));
        }
        if self.waiting.len() >= self.cfg.max_waiting {
            return Err(Error::capacity(format!(
                "{} requests are already waiting (the queue holds {}): retry later",
                self.waiting.len(),
                self.cfg.max_waiting
            )));
        }
        req.status = RequestStatus::Waiting;
        self.vtc.arrive(&req);
        self.waiting.push(req.id);
        self.requests.insert(req.id, req);
        Ok(())
    }

    /// Removes a request wherever it is and frees its blocks at once; false if unknown.
    pub fn abort(&mut self, id: ReqId) -> Result<bool> {
        let Some(r) = self.requests.remove(&id) else {
            return Ok(false);
        };
        self.vtc.leave(&r);
        self.waiting.retain(|&w| w != id);
        self.running.retain(|&r| r != id);
        self.kv.free(id)?;
        Ok(true)
    }

    fn window_open(&self, now: Instant) -> Option<Instant> {
        let BatchMode::Batch { timeout } = self.cfg.batch_mode else { return None };
        if !self.running.is_empty() || self.waiting.is_empty() || self.waiting.len() >= self.cfg.max_num_seqs {
            return None;
        }
        let oldest = self.waiting.iter().map(|id| self.requests[id].arrival).min()?;
        let deadline = oldest + timeout;
        (now < deadline).then_some(deadline)
    }

    fn scheduled(&self, id: ReqId, n: usize) -> ScheduledRequest {
        let r = &self.requests[&id];
        let end = r.num_computed_tokens + n;
        ScheduledRequest {
            id,
            num_computed_tokens: r.num_computed_tokens,
            token_ids: r.all_token_ids[r.num_computed_tokens..end].to_vec(),
            block_table: self.kv.block_table(id).to_vec(),
            sample: end == r.num_tokens(),
            all_logits: r.all_prompt_logits && r.num_computed_tokens < r.num_prompt_tokens,
            num_prompt_tokens: r.num_prompt_tokens,
            num_draft_tokens: 0,
        }
    }

    /// Swap (keep the computed tokens in the warm tier) rather than recompute `id`?
    fn should_swap(&self, id: ReqId) -> bool {
        let n = self.requests[&id].num_computed_tokens;
        if !self.kv.can_swap_out(id, n) {
            return false;
        }
        match self.cfg.preemption_mode {
            PreemptionMode::Swap => true,
            PreemptionMode::Recompute => false,
            PreemptionMode::Auto => self.cost.prefers_swap(n, self.kv.num_shared_prefix_tokens(id)),
        }
    }

    fn preempt(&mut self, id: ReqId, out: &mut SchedulerOutput) -> Result<()> {
        let swap = self.should_swap(id);
        if swap {
            let n = self.requests[&id].num_computed_tokens;
            out.blocks_to_swap_out.extend(self.kv.swap_out(id, n)?);
            out.swapped_out.push(id);
        } else {
            self.kv.free(id)?;
        }
        self.running.retain(|&r| r != id);
        let r = self.requests.get_mut(&id).expect("running request is known");
        if swap {
            r.status = RequestStatus::Swapped;
        } else {
            r.num_computed_tokens = 0;
            r.status = RequestStatus::Preempted;
        }
        r.num_preemptions += 1;
        self.waiting.push(id);
        out.preempted.push(id);
        Ok(())
    }

    /// The next step's work, or nothing (with `wait_until` while a batch window is open or the
    /// device is guarded).
    pub fn schedule(&mut self, now: Instant) -> Result<SchedulerOutput> {
        let mut out = SchedulerOutput { wait_until: self.window_open(now), ..Default::default() };
        if out.wait_until.is_some() {
            return Ok(out);
        }
        let reserve = self.preempt_for_waiting(&mut out)?;
        let preempted_for_waiting = out.preempted.len();
        let step_budget = self.step_budget(reserve.as_ref());
        let mut budget = step_budget;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let r = &self.requests[&id];
            let mut n = (r.num_tokens() - r.num_computed_tokens).min(budget);
            n = match reserve.as_ref().filter(|res| n > 1 && res.after.contains(&id)) {
                // A prefill chunk of a later rank leaves the reservation whole.
                Some(res) => r.fit_chunk_within(r.num_computed_tokens, n.min(budget.saturating_sub(res.tokens))),
                None => r.fit_chunk(r.num_computed_tokens, n),
            };
            if n == 0 {
                i += 1;
                continue;
            }
            if self.kv.allocate_slots(id, r.num_computed_tokens, n, &[])?.is_some() {
                out.scheduled.push(self.scheduled(id, n));
                budget = budget.saturating_sub(n);
                i += 1;
                continue;
            }
            // Short of blocks: preempt the lowest-ranked request not yet scheduled this step.
            let tenants = self.running_tenants();
            let victim = *self.running[i..].iter().max_by_key(|&&v| self.rank(v, &tenants)).expect("id itself");
            self.preempt(victim, &mut out)?;
        }
        if out.preempted.len() == preempted_for_waiting {
            match self.held_by_device(now) {
                Some(until) => out.wait_until = Some(until),
                None => self.admit_waiting(&mut budget, &mut out, now)?,
            }
        }
        self.add_drafts(&mut out, &mut budget)?;
        out.num_batched_tokens = out.scheduled.iter().map(|s| s.token_ids.len()).sum();
        Ok(out)
    }

    fn admit_waiting(&mut self, budget: &mut usize, out: &mut SchedulerOutput, now: Instant) -> Result<()> {
        let mut order = std::mem::take(&mut self.waiting);
        let running = self.running_tenants();
        order.sort_by_cached_key(|&id| self.rank(id, &running)); // each rank computed once
        drop(running);
        let mut loras = self.running_loras();
        let mut kept = Vec::with_capacity(order.len());
        let mut stopped = false;
        for id in order {
            if stopped || self.waits_for_adapter(id, &loras) {
                kept.push(id); // under `max_loras`, the one case where later requests go ahead
                continue;
            }
            stopped = self.running.len() >= self.cfg.max_num_seqs
                || *budget == 0
                || self.joining_breaks_a_deadline(id, now, &self.running_tenants());
            let n = if stopped { None } else { self.take_blocks(id, *budget, out)? };
            let Some(n) = n else {
                stopped = true;
                kept.push(id);
                continue;
            };
            let r = self.requests.get_mut(&id).expect("waiting request is known");
            r.status = RequestStatus::Running;
            loras.extend(r.lora);
            self.running.push(id);
            out.scheduled.push(self.scheduled(id, n));
            *budget = budget.saturating_sub(n);
        }
        self.waiting = kept;
        Ok(())
    }

    /// Gives waiting `id` the blocks for its next chunk (at most `budget` tokens): a swapped
    /// request is swapped back in and goes on from its computed tokens; any other starts from
    /// its longest cached prefix. Returns the chunk's length, or `None` (nothing changed) when
    /// the pool is short.
    fn take_blocks(&mut self, id: ReqId, budget: usize, out: &mut SchedulerOutput) -> Result<Option<usize>> {
        let r = &self.requests[&id];
        if r.status == RequestStatus::Swapped {
            let computed = r.num_computed_tokens;
            let n = r.fit_chunk(computed, (r.num_tokens() - computed).min(budget));
            if !self.kv.can_allocate(self.kv.blocks_for(computed + n), &[]) {
                return Ok(None);
            }
            let pairs = self.kv.swap_in(id)?.ok_or_else(|| Error::internal("swap-in short of checked blocks"))?;
            out.blocks_to_swap_in.extend(pairs);
            self.kv.allocate_slots(id, computed, n, &[])?.ok_or_else(|| Error::internal("checked blocks"))?;
            return Ok(Some(n));
        }
        let (hit, cached) = if r.all_prompt_logits {
            self.kv.skip_computed_blocks(id, &r.all_token_ids, r.num_prompt_tokens, r.cache_salt.as_deref());
            (Vec::new(), 0)
        } else {
            self.kv.get_computed_blocks(id, &r.all_token_ids, r.num_prompt_tokens, r.cache_salt.as_deref())
        };
        let n = r.fit_chunk(cached, (r.num_tokens() - cached).min(budget));
        if self.kv.allocate_slots(id, cached, n, &hit)?.is_none() {
            self.kv.free(id)?; // drops the lookup; it holds no blocks
            return Ok(None);
        }
        let r = self.requests.get_mut(&id).expect("waiting request is known");
        r.num_computed_tokens = cached;
        r.num_cached_tokens = cached;
        Ok(Some(n))
    }
}
