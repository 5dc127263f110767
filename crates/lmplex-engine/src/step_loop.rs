//! `EngineCore`: the step loop of one model, on its own OS thread.
//!
//! Each turn: take the commands waiting on the channel (new requests, aborts), run the images
//! of requests waiting for the vision tower (`encoding.rs`, a budget's worth), then one
//! `step`, in nano-vllm's and vLLM's shape, three calls:
//! - `schedule`: `Scheduler::schedule` -> copy the step's swapped blocks between the hot pool
//!   and the swap space (out, then in); requests scheduled for the first time leave the
//!   bounded queue;
//! - `execute`: one forward pass over every scheduled chunk (prefill chunks and decodes alike,
//!   `runner::forward_batch`) -> sample and check stops for the requests whose chunk reached
//!   their last token;
//! - `update`: `Scheduler::update` -> send each sampled request its new chunk.
//!
//! The step's `StepOutcome` says what the loop does next: step again (`Ran`, `Preempted`) or
//! sleep on the channel until a command comes or the batch window closes (`Idle`).
//!
//! Invariants:
//! - The loop is the only owner of the scheduler, the KV pool and the sequences; the front
//!   talks to it through `Command`s and reads `Stats`, never the other way round. The one
//!   counter both touch, the bounded queue's, changes only through `QueueSlots`: the front
//!   takes a slot, the request carries it, and it is given back when the request is first
//!   scheduled or leaves (so an idle engine, or a stopped loop, counts 0 queued).
//! - A request's tokens depend only on its prompt, parameters and seed: every kernel computes
//!   a row from that row alone, and chunking, batching and prefix hits only change which rows
//!   run together, never what a row computes.
//! - A request whose handle is gone (dropped or aborted) is removed from the scheduler at the
//!   next turn, which frees its blocks; when the loop ends (engine dropped) every block is free.
//! - Swap copies finish before the forward pass, so no freed hot block is overwritten before
//!   its K/V reach the swap space. The loop measures what a prefill token and a copied token cost
//!   and hands them to the scheduler's preemption rule (`CostModel`), one way: loop -> scheduler.
//! - An error in a step (`StepFailure`) fails the requests of that step, not the engine; a
//!   panic fails every request and stops the loop, so callers get an error rather than a hang.

mod active;
mod commands;
mod drafting;
mod encoding;
mod execute;
mod pooled;

use crate::draft::DraftModel;
use crate::handle::Command;
use crate::runner::Runner;
use crate::signals::{LiveSignals, Meter, PREFILL_SAMPLE_TOKENS};
use crate::stats::Stats;
use active::Active;
use encoding::Encoding;
use execute::Sampled;
use lmplex_core::{Error, Result};
use lmplex_kv::manager::ReqId;
use lmplex_model::Tokenizer;
use lmplex_route::Work;
use lmplex_sched::{CostModel, RequestStatus, Scheduler, SchedulerOutput};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

const IDLE_POLL: Duration = Duration::from_millis(10);
/// Weight of a new measurement in the cost averages.
const COST_EMA: f64 = 0.2;

/// What a step did, for the loop to decide whether to wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StepOutcome {
    /// A forward pass ran over the scheduled batch.
    Ran,
    /// Nothing ran, but requests were preempted to make room: schedule again at once.
    Preempted,
    /// Nothing schedulable: wait for a command, or until `wake_at` (the batch window closes).
    Idle { wake_at: Option<Instant> },
}

impl StepOutcome {
    /// The outcome of a step whose `SchedulerOutput` scheduled nothing.
    fn nothing_scheduled(out: &SchedulerOutput) -> Self {
        if out.preempted.is_empty() {
            Self::Idle { wake_at: out.wait_until }
        } else {
            Self::Preempted
        }
    }
}

/// A step that failed: `error` ends the requests `ids` (the step's batch, or every active
/// request when the step failed before its batch was known), not the engine.
struct StepFailure {
    ids: Vec<ReqId>,
    error: Error,
}

impl StepFailure {
    fn of_batch(out: &SchedulerOutput, error: Error) -> Self {
        Self { ids: out.scheduled.iter().map(|s| s.id).collect(), error }
    }
}

pub(crate) struct EngineCore {
    /// The model and its KV pool (hot, and the swap space swapped-out requests wait in).
    pub runner: Runner,
    pub tokenizer: Arc<Tokenizer>,
    pub sched: Scheduler,
    pub vocab_size: usize,
    pub stats: Arc<Stats>,
    active: HashMap<ReqId, Active>,
    cost: CostModel,
    meter: Meter,
    /// The draft model of speculative decoding's `draft` method, if any.
    draft: Option<DraftModel>,
    /// Whether a failed draft pass was logged (drafting is skipped for that step, once logged).
    draft_failed: bool,
    /// Requests whose images wait for the vision tower, out of the scheduler until encoded.
    encoding: Encoding,
}

impl EngineCore {
    pub fn new(
        runner: Runner,
        tokenizer: Arc<Tokenizer>,
        sched: Scheduler,
        vocab_size: usize,
        stats: Arc<Stats>,
        signals: Arc<LiveSignals>,
        draft: Option<DraftModel>,
    ) -> Self {
        stats.alive.store(true, Ordering::Release);
        let cost = sched.cost_model();
        let meter = Meter::new(signals);
        let active = HashMap::new();
        let draft_failed = false;
        let encoding = Encoding::new(sched.config().max_num_batched_tokens);
        let mut core =
            Self { runner, tokenizer, sched, vocab_size, stats, active, cost, meter, draft, draft_failed, encoding };
        core.publish();
        core
    }

    /// Copies the step's swapped blocks (out, then in) and measures the copy's cost per token.
    fn swap(&mut self, out: &SchedulerOutput) -> Result<()> {
        let n = out.blocks_to_swap_out.len() + out.blocks_to_swap_in.len();
        if n == 0 {
            return Ok(());
        }
        let t = Instant::now();
        self.runner.swap(&out.blocks_to_swap_out, &out.blocks_to_swap_in)?;
        let per_token = t.elapsed().as_secs_f64() / (n * crate::sizing::BLOCK_SIZE) as f64;
        self.cost.swap_s_per_token += COST_EMA * (per_token - self.cost.swap_s_per_token);
        self.sched.set_cost_model(self.cost);
        Ok(())
    }

    /// Folds the time of the forward pass over `out` into the step cost (`Meter::step_cost`, for
    /// the step budget), the cost of a pass of generated rows by its row count (for drafts,
    /// `Scheduler::observe_decode_pass`) and the prefill cost per token (large steps only: a
    /// decode step's cost per token says little about recomputing a long sequence).
    fn measure_forward(&mut self, out: &SchedulerOutput, elapsed: Duration) {
        let tokens = out.num_batched_tokens;
        self.meter.forward(tokens, elapsed);
        if let Some(c) = self.meter.step_cost() {
            self.sched.set_step_cost(c); // kept when the recent passes stop varying
        }
        if out.scheduled.iter().all(|s| s.num_computed_tokens >= s.num_prompt_tokens) {
            self.sched.observe_decode_pass(tokens, elapsed.as_secs_f64());
        }
        if tokens >= PREFILL_SAMPLE_TOKENS {
            let per_token = elapsed.as_secs_f64() / tokens as f64;
            self.cost.recompute_s_per_token += COST_EMA * (per_token - self.cost.recompute_s_per_token);
            self.sched.set_cost_model(self.cost);
        }
    }

    /// Runs until every `Sender` of `rx` is gone, then frees everything.
    pub fn run(mut self, rx: mpsc::Receiver<Command>) {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run_inner(&rx)));
        if let Err(panic) = result {
            let what =
                panic.downcast_ref::<&str>().copied().or_else(|| panic.downcast_ref::<String>().map(String::as_str));
            tracing::error!(requests = self.active.len(), "the step loop panicked: {}", what.unwrap_or("(no message)"));
            self.meter.failed();
            for (_, a) in self.active.drain() {
                let _ = a.tx.send(Err(Error::internal("the engine's step loop panicked; the model must be reloaded")));
            }
        }
        self.stats.alive.store(false, Ordering::Release);
    }

    fn run_inner(&mut self, rx: &mpsc::Receiver<Command>) {
        loop {
            if self.active.is_empty() && self.encoding.is_empty() {
                match rx.recv() {
                    Ok(c) => self.handle(c),
                    Err(_) => return,
                }
            }
            while let Ok(c) = rx.try_recv() {
                self.handle(c);
            }
            self.drop_closed();
            self.encode();
            match self.step() {
                Ok(StepOutcome::Idle { .. }) if !self.encoding.is_empty() => {}
                Ok(StepOutcome::Idle { wake_at }) => {
                    // Batch window open (or, defensively, nothing schedulable): sleep until the
                    // window closes or a command comes.
                    let t = wake_at.map_or(IDLE_POLL, |t| t.saturating_duration_since(Instant::now()));
                    match rx.recv_timeout(t) {
                        Ok(c) => self.handle(c),
                        Err(mpsc::RecvTimeoutError::Disconnected) => return,
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                    }
                }
                Ok(StepOutcome::Ran | StepOutcome::Preempted) => {}
                Err(failure) => self.fail(failure),
            }
            self.publish();
        }
    }

    /// Ends the failed step's requests with its error.
    fn fail(&mut self, StepFailure { ids, error }: StepFailure) {
        self.meter.failed();
        for id in ids {
            let tx = self.active.get(&id).map(|a| a.tx.clone());
            self.remove(id); // settles its admission before the caller hears
            if let Some(tx) = tx {
                let _ = tx.send(Err(error.clone()));
            }
        }
    }

    /// One step, nano-vllm's and vLLM's `step`: schedule, execute the model, update.
    fn step(&mut self) -> std::result::Result<StepOutcome, StepFailure> {
        let t = Instant::now();
        let out = self.schedule()?;
        if out.is_empty() {
            return Ok(StepOutcome::nothing_scheduled(&out));
        }
        let shared = self.sched.others_busy();
        let turn = self.sched.turn(&out); // under `fair`, the device's turn (`lmplex_sched::ledger`)
        let sampled = self.execute(&out, turn.as_ref())?;
        drop(turn);
        // A decode step: every chunk is one known token (and its drafts), no prompt to compute.
        let decoding =
            !sampled.tokens.is_empty() && out.scheduled.iter().all(|s| s.token_ids.len() == 1 + s.num_draft_tokens);
        self.update(&out, sampled)?;
        if decoding {
            let shared = shared || self.sched.others_busy();
            self.meter.decode_step(out.scheduled.len(), t.elapsed(), shared);
        }
        Ok(StepOutcome::Ran)
    }

    /// `Scheduler::schedule`, then the step's swap copies (before the forward pass); the
    /// requests scheduled for the first time leave the bounded queue, and are published as
    /// running before the pass, so a call routed meanwhile sees them.
    fn schedule(&mut self) -> std::result::Result<SchedulerOutput, StepFailure> {
        self.draft();
        let out = self.sched.schedule(Instant::now()).map_err(|e| self.fail_all(e))?;
        self.stats.num_preemptions.fetch_add(out.preempted.len() as u64, Ordering::Relaxed);
        self.stats.num_swaps.fetch_add(out.swapped_out.len() as u64, Ordering::Relaxed);
        self.swap(&out).map_err(|e| self.fail_all(e))?;
        let (mut started, shared) = (false, self.sched.others_busy());
        for s in &out.scheduled {
            if let Some(a) = self.active.get_mut(&s.id) {
                a.max_batch = a.max_batch.max(out.scheduled.len());
                a.shared |= shared;
                // First scheduled: the request leaves the bounded queue.
                if a.queue_slot.take().is_some() {
                    a.seq.started = true;
                    a.seq.cached_tokens = s.num_computed_tokens;
                    a.queue_time = Some(a.arrival.elapsed());
                    started = true;
                }
            }
        }
        if started {
            self.publish_load();
        }
        Ok(out)
    }

    /// `Scheduler::update` with the step's results, then each sampled request gets its new
    /// chunk (the counters are published first, so a caller that sees a chunk sees the step's
    /// accounting too).
    fn update(&mut self, out: &SchedulerOutput, sampled: Sampled) -> std::result::Result<(), StepFailure> {
        let Sampled { tokens, finished, failed, scored, drafted, accepted } = sampled;
        self.sched.update(out, &tokens, &finished).map_err(|e| StepFailure::of_batch(out, e))?;
        if drafted > 0 {
            let drafts = out.scheduled.iter().filter(|s| s.num_draft_tokens > 0).count();
            self.stats.spec_decode_num_drafts.fetch_add(drafts as u64, Ordering::Relaxed);
            self.stats.spec_decode_num_draft_tokens.fetch_add(drafted as u64, Ordering::Relaxed);
            self.stats.spec_decode_num_accepted_tokens.fetch_add(accepted as u64, Ordering::Relaxed);
        }
        for (id, e) in failed {
            if let Some(a) = self.active.remove(&id) {
                let tx = a.tx.clone();
                drop(a); // settles its admission first, as for a finished request
                let _ = tx.send(Err(e));
            }
        }
        self.stats.num_steps.fetch_add(1, Ordering::Relaxed);
        self.publish();
        for id in tokens.keys().chain(&scored) {
            let a = self.active.get_mut(id).expect("sampled request is active");
            let mut chunk = a.seq.take_chunk();
            if !chunk.token_ids.is_empty() {
                chunk.queue_time_s = a.queue_time.take().map(|d| d.as_secs_f64());
                a.first_token.get_or_insert_with(|| a.arrival.elapsed());
            }
            if chunk.finish_reason.is_some() {
                // The scheduler already dropped it (and its blocks) in `update`. The sequence
                // goes before its last chunk, so its tenant's admission is settled by the
                // time the caller sees the end (a sequential caller is never refused for
                // concurrency by its own previous call).
                let tx = a.tx.clone();
                a.ended(&mut self.meter);
                self.active.remove(id);
                let _ = tx.send(Ok(chunk));
            } else if !chunk.text.is_empty() || !chunk.token_ids.is_empty() {
                let _ = a.tx.send(Ok(chunk));
            }
        }
        Ok(())
    }

    /// A failure of the whole step: every active request fails with `e`.
    fn fail_all(&self, e: Error) -> StepFailure {
        StepFailure { ids: self.active.keys().copied().collect(), error: e }
    }

    /// What the router reads of the load: running and waiting counts, the started work and
    /// the device guard.
    fn publish_load(&mut self) {
        self.publish_started_work();
        self.stats.num_running.store(self.sched.num_running(), Ordering::Relaxed);
        self.stats.num_waiting.store(self.sched.num_waiting(), Ordering::Relaxed);
    }

    fn publish(&mut self) {
        self.publish_load();
        self.meter.publish_prefix(self.sched.kv().pool(), self.active.is_empty());
        let s = &self.stats;
        let pool = self.sched.kv().pool();
        let prefix = self.sched.kv().stats();
        s.num_kv_blocks.store(pool.num_blocks(), Ordering::Relaxed);
        s.num_free_kv_blocks.store(pool.num_free(), Ordering::Relaxed);
        s.num_cached_free_kv_blocks.store(pool.num_cached_free(), Ordering::Relaxed);
        s.prefix_cache_queries.store(prefix.queries, Ordering::Relaxed);
        s.prefix_cache_hits.store(prefix.hits, Ordering::Relaxed);
        let warm = self.sched.kv().warm_pool();
        s.num_swap_blocks.store(warm.num_blocks(), Ordering::Relaxed);
        s.num_free_swap_blocks.store(warm.num_free(), Ordering::Relaxed);
    }

    /// The started requests' work for the router (those never scheduled are the bounded
    /// queue's to count): what each running request may still generate and its deadline, and
    /// the preempted.
    fn publish_started_work(&mut self) {
        let mut preempted = Work::default();
        let mut running = Vec::new();
        for (&id, _) in self.active.iter().filter(|(_, a)| a.queue_slot.is_none()) {
            let Some(r) = self.sched.request(id) else { continue };
            let left = r.max_num_tokens.saturating_sub(r.num_tokens());
            if r.status == RequestStatus::Running {
                running.push((left, r.deadline));
            } else {
                preempted = preempted + Work::one(r.num_tokens() - r.num_computed_tokens, left);
            }
        }
        self.sched.guard_device(self.meter.guard(&running, Instant::now()));
        self.meter.started(running.into_iter(), preempted);
    }
}
