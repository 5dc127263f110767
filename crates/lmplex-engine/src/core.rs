//! `EngineCore`: the step loop of one model, on its own OS thread.
//!
//! Each turn: take the commands waiting on the channel (new requests, aborts), then nano-vllm's
//! step: `Scheduler::schedule` -> copy the step's swapped blocks between the hot pool and the
//! warm tier (out, then in) -> one `Model::forward` over every scheduled chunk (prefill
//! chunks and decodes alike) -> sample and check stops for the requests whose chunk reached
//! their last token -> `Scheduler::update` -> send each request its new chunk. With nothing to
//! do the thread sleeps on the channel (or until the batch window closes).
//!
//! Invariants:
//! - The loop is the only owner of the scheduler, the KV pool and the sequences; the front
//!   talks to it through `Command`s and reads `Stats`, never the other way round.
//! - A request's tokens depend only on its prompt, parameters and seed: every kernel computes
//!   a row from that row alone, and chunking, batching and prefix hits only change which rows
//!   run together, never what a row computes.
//! - A request whose handle is gone (dropped or aborted) is removed from the scheduler at the
//!   next turn, which frees its blocks; when the loop ends (engine dropped) every block is free.
//! - Swap copies finish before the forward pass, so no freed hot block is overwritten before
//!   its K/V reach the warm tier. The loop measures what a prefill token and a copied token cost
//!   and hands them to the scheduler's preemption rule (`CostModel`), one way: loop -> scheduler.
//! - An error in a step fails the requests of that step, not the engine; a panic fails every
//!   request and stops the loop, so callers get an error rather than a hang.

use crate::handle::{Command, NewRequest};
use crate::runner::Runner;
use crate::sequence::Sequence;
use lmplex_core::{Error, Result, StreamChunk, TokenId};
use lmplex_kv::manager::ReqId;
use lmplex_model::{ForwardBatch, LogitsSelect, SeqChunk, Tokenizer};
use lmplex_sched::{CostModel, Request, Scheduler, SchedulerOutput};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

const IDLE_POLL: Duration = Duration::from_millis(10);
/// Steps with at least this many tokens measure the prefill cost per token.
const PREFILL_SAMPLE_TOKENS: usize = 32;
/// Weight of a new measurement in the cost averages.
const COST_EMA: f64 = 0.2;

/// Counters the loop publishes after every turn, for `memory()`, metrics and tests.
#[derive(Default)]
pub struct Stats {
    pub num_blocks: AtomicUsize,
    pub num_free_blocks: AtomicUsize,
    pub num_cached_free_blocks: AtomicUsize,
    pub num_running: AtomicUsize,
    pub num_waiting: AtomicUsize,
    /// Requests accepted by `submit` and not yet scheduled once (the bounded queue).
    pub num_queued: AtomicUsize,
    pub num_steps: AtomicU64,
    pub num_preemptions: AtomicU64,
    pub prefix_queries: AtomicU64,
    pub prefix_hits: AtomicU64,
    pub num_warm_blocks: AtomicUsize,
    pub num_warm_free_blocks: AtomicUsize,
    /// Requests swapped out to the warm tier (each swap-out counts once).
    pub num_swaps: AtomicU64,
    pub alive: AtomicBool,
}

struct Active {
    seq: Sequence,
    tx: UnboundedSender<Result<StreamChunk>>,
    /// Scheduled at least once (left the bounded queue).
    admitted: bool,
}

pub(crate) struct EngineCore {
    /// The model and its KV pool (hot, and the warm tier swapped requests wait in).
    pub runner: Runner,
    pub tokenizer: Arc<Tokenizer>,
    pub sched: Scheduler,
    pub vocab_size: usize,
    pub stats: Arc<Stats>,
    active: HashMap<ReqId, Active>,
    cost: CostModel,
}

impl EngineCore {
    pub fn new(
        runner: Runner,
        tokenizer: Arc<Tokenizer>,
        sched: Scheduler,
        vocab_size: usize,
        stats: Arc<Stats>,
    ) -> Self {
        stats.alive.store(true, Ordering::Release);
        let cost = sched.cost_model();
        let core = Self { runner, tokenizer, sched, vocab_size, stats, active: HashMap::new(), cost };
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

    /// Folds a forward pass's time into the prefill cost per token (large steps only: a decode
    /// step's cost per token says little about recomputing a long sequence).
    fn measure_forward(&mut self, tokens: usize, elapsed: Duration) {
        if tokens >= PREFILL_SAMPLE_TOKENS {
            let per_token = elapsed.as_secs_f64() / tokens as f64;
            self.cost.recompute_s_per_token += COST_EMA * (per_token - self.cost.recompute_s_per_token);
            self.sched.set_cost_model(self.cost);
        }
    }

    /// Runs until every `Sender` of `rx` is gone, then frees everything.
    pub fn run(mut self, rx: mpsc::Receiver<Command>) {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run_inner(&rx)));
        if result.is_err() {
            for (_, a) in self.active.drain() {
                let _ = a.tx.send(Err(Error::internal("the engine's step loop panicked; the model must be reloaded")));
            }
        }
        self.stats.alive.store(false, Ordering::Release);
    }

    fn run_inner(&mut self, rx: &mpsc::Receiver<Command>) {
        loop {
            if self.active.is_empty() {
                match rx.recv() {
                    Ok(c) => self.handle(c),
                    Err(_) => return,
                }
            }
            while let Ok(c) = rx.try_recv() {
                self.handle(c);
            }
            self.drop_closed();
            match self.step() {
                Ok(Some(wait_until)) => {
                    // Batch window open (or, defensively, nothing schedulable): sleep until the
                    // window closes or a command comes.
                    let t = wait_until.map_or(IDLE_POLL, |t| t.saturating_duration_since(Instant::now()));
                    match rx.recv_timeout(t) {
                        Ok(c) => self.handle(c),
                        Err(mpsc::RecvTimeoutError::Disconnected) => return,
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                    }
                }
                Ok(None) => {}
                Err((ids, e)) => self.fail(&ids, &e),
            }
            self.publish();
        }
    }

    fn handle(&mut self, c: Command) {
        match c {
            Command::Add(r) => {
                let NewRequest { id, seq, arrival, tx } = *r;
                let mut req = Request::new(id, seq.prompt_ids.clone(), seq.max_len, arrival);
                req.priority = seq.priority;
                req.cache_salt = seq.cache_salt.clone();
                match self.sched.add_request(req) {
                    Ok(()) => {
                        self.active.insert(id, Active { seq, tx, admitted: false });
                    }
                    Err(e) => {
                        self.stats.num_queued.fetch_sub(1, Ordering::AcqRel);
                        let _ = tx.send(Err(e));
                    }
                }
            }
            Command::Abort(id) => {
                // The caller may still read the stream (an abort by id): end it properly.
                if let Some(a) = self.active.get_mut(&id) {
                    a.seq.finish = Some((lmplex_core::FinishReason::Abort, None));
                    let _ = a.tx.send(Ok(a.seq.take_chunk()));
                }
                self.remove(id);
            }
        }
    }

    fn remove(&mut self, id: ReqId) {
        if let Some(a) = self.active.remove(&id) {
            if !a.admitted {
                self.stats.num_queued.fetch_sub(1, Ordering::AcqRel);
            }
            // The request is known to the scheduler whenever it is active.
            let _ = self.sched.abort(id);
        }
    }

    fn drop_closed(&mut self) {
        let closed: Vec<ReqId> = self.active.iter().filter(|(_, a)| a.tx.is_closed()).map(|(&id, _)| id).collect();
        for id in closed {
            self.remove(id);
        }
    }

    fn fail(&mut self, ids: &[ReqId], e: &Error) {
        for &id in ids {
            if let Some(a) = self.active.get(&id) {
                let _ = a.tx.send(Err(e.clone()));
            }
            self.remove(id);
        }
    }

    /// One step. `Ok(Some(deadline))`: nothing ran, sleep until `deadline` (or a command);
    /// `Err((ids, e))`: the step failed for these requests.
    fn step(&mut self) -> std::result::Result<Option<Option<Instant>>, (Vec<ReqId>, Error)> {
        let all = || self.active.keys().copied().collect::<Vec<_>>();
        let out = self.sched.schedule(Instant::now()).map_err(|e| (all(), e))?;
        self.stats.num_preemptions.fetch_add(out.preempted.len() as u64, Ordering::Relaxed);
        self.stats.num_swaps.fetch_add(out.swapped_out.len() as u64, Ordering::Relaxed);
        if let Err(e) = self.swap(&out) {
            return Err((self.active.keys().copied().collect(), e));
        }
        if out.is_empty() {
            // After a preemption there is work again at once; otherwise wait.
            return Ok(out.preempted.is_empty().then_some(out.wait_until));
        }
        let ids: Vec<ReqId> = out.scheduled.iter().map(|s| s.id).collect();
        for id in &ids {
            if let Some(a) = self.active.get_mut(id).filter(|a| !a.admitted) {
                a.admitted = true;
                self.stats.num_queued.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let batch = ForwardBatch {
            seqs: out
                .scheduled
                .iter()
                .map(|s| SeqChunk {
                    token_ids: &s.token_ids,
                    start_pos: s.num_computed_tokens,
                    block_table: &s.block_table,
                    logits: if s.sample { LogitsSelect::Last } else { LogitsSelect::None },
                    num_prompt_tokens: s.num_prompt_tokens,
                })
                .collect(),
        };
        let t = Instant::now();
        let logits = self.runner.forward(&batch).map_err(|e| (ids.clone(), e))?;
        self.measure_forward(out.num_batched_tokens, t.elapsed());
        let mut sampled: HashMap<ReqId, TokenId> = HashMap::new();
        let mut finished = Vec::new();
        let mut failed = Vec::new();
        let mut rows = logits.chunks_exact(self.vocab_size);
        for s in out.scheduled.iter().filter(|s| s.sample) {
            let row = rows.next().ok_or_else(|| (ids.clone(), Error::internal("missing logits row")))?;
            let a = self.active.get_mut(&s.id).ok_or_else(|| (ids.clone(), Error::internal("unknown request")))?;
            match a.seq.append_from_logits(&self.tokenizer, row) {
                Ok(()) => {
                    sampled.insert(s.id, *a.seq.output_ids.last().expect("just sampled"));
                    if a.seq.is_finished() {
                        finished.push(s.id);
                    }
                }
                // This request's own failure (its structured-output guide): it alone ends.
                Err(e) => {
                    finished.push(s.id);
                    failed.push((s.id, e));
                }
            }
        }
        self.sched.update(&out, &sampled, &finished).map_err(|e| (ids.clone(), e))?;
        for (id, e) in failed {
            if let Some(a) = self.active.remove(&id) {
                let _ = a.tx.send(Err(e));
            }
        }
        self.stats.num_steps.fetch_add(1, Ordering::Relaxed);
        // Counters first, so a caller that sees a chunk sees the step's accounting too.
        self.publish();
        for id in sampled.keys() {
            let a = self.active.get_mut(id).expect("sampled request is active");
            let chunk = a.seq.take_chunk();
            let done = chunk.finish_reason.is_some();
            if done || !chunk.text.is_empty() || !chunk.token_ids.is_empty() {
                let _ = a.tx.send(Ok(chunk));
            }
            if done {
                // The scheduler already dropped it (and its blocks) in `update`.
                self.active.remove(id);
            }
        }
        Ok(None)
    }

    fn publish(&self) {
        let s = &self.stats;
        let pool = self.sched.kv().pool();
        let prefix = self.sched.kv().stats();
        s.num_blocks.store(pool.num_blocks(), Ordering::Relaxed);
        s.num_free_blocks.store(pool.num_free(), Ordering::Relaxed);
        s.num_cached_free_blocks.store(pool.num_cached_free(), Ordering::Relaxed);
        s.num_running.store(self.sched.num_running(), Ordering::Relaxed);
        s.num_waiting.store(self.sched.num_waiting(), Ordering::Relaxed);
        s.prefix_queries.store(prefix.queries, Ordering::Relaxed);
        s.prefix_hits.store(prefix.hits, Ordering::Relaxed);
        let warm = self.sched.kv().warm_pool();
        s.num_warm_blocks.store(warm.num_blocks(), Ordering::Relaxed);
        s.num_warm_free_blocks.store(warm.num_free(), Ordering::Relaxed);
    }
}
