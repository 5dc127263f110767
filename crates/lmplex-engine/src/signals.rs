//! `LiveSignals`: what the step loop measures about itself for the router (`lmplex_route`),
//! and `Meter`, the loop's side that measures and publishes.
//!
//! Measured, as exponentially weighted averages (a new sample weighs `EWMA`; the first sample
//! is taken as it is):
//! - prefill seconds per token: a forward pass of at least `PREFILL_SAMPLE_TOKENS` tokens,
//!   its time over its tokens;
//! - time per output token: the wall time of a decode step (schedule to update; every chunk
//!   one known token and its drafts, no prompt to compute), which is what each running
//!   request waits for its next token at the present batch, with the batch size of those
//!   steps (the prefill a request's prompt or a newcomer's adds is predicted apart);
//! - what a forward pass costs (`step_cost`, for the scheduler's step budget): a line fitted
//!   to every pass's time on its batched tokens, weights decaying by `SLOPE_DECAY` a pass;
//! - how much a step grows per request added to the batch: the slope of step time on batch
//!   size over recent sampling steps (a least-squares fit with weights decaying by
//!   `SLOPE_DECAY` a step), once their batch sizes vary enough; until then a forward pass's
//!   cost per token (`step_cost`, once measured: prefill passes vary in size from the start),
//!   within the step time over the batch size, an upper bound of that slope (a step never
//!   costs less than nothing).
//!
//! Published as they are after each turn: the work the requests that started hold (the
//! output tokens each running one may still generate, and the preempted ones' work), which
//! with the bounded queue's work (`QueueSlots`) is the router's `Backlog`.
//!
//! Models on one device (the CPU's cores, or one GPU's SMs) slow each other's steps. The
//! figures above are measured on the steps that ran while no other model on the device held
//! requests (the model alone); a step that ran beside another busy model instead measures
//! the device's shared factor, its time over the time alone at its batch (an average, >= 1;
//! until measured, `SHARED_FACTOR_PRIOR`),
//! unless it ran faster than that time alone: then it is a step alone (the figures alone were
//! too high, the warm-up's for a model seldom alone).
//! The router applies it while the other models stay busy (`lmplex_route::Device`).
//!
//! The device guard (`lmplex_sched::ledger`): after each turn the loop guards the device until
//! its running requests with deadlines have ended when one of them would meet its deadline
//! alone (its output tokens left, at most, each a step at the present batch) but not at the
//! shared factor; otherwise it lifts its guard.
//!
//! Calibration (`calibration`): the router scales its predictions by a high quantile of how far
//! routed requests ran over them, measured where the prediction's assumptions held.
//!
//! The warm-up's measuring request seeds the step figures, so a fresh engine predicts from its own
//! figures (pessimistic ones: first touches included) rather than from none.
//!
//! Prefix affinity: the loop publishes the set of block hashes its prefix cache holds, copied
//! when it changed and at most every `PREFIX_PUBLISH_EVERY` while requests run (at once when
//! the loop goes idle), so a reader counts how many leading blocks of a prompt are cached
//! without asking the loop. An error of a step puts the model in a cooldown of
//! `ERROR_COOLDOWN`: the router skips it until then.
//!
//! Invariants: only the loop writes the averages and the prefix set; readers never block the
//! loop for longer than an `Arc` clone; figures are finite and >= 0.

mod calibration;

use calibration::{relaxed, Calibration};
pub(crate) use calibration::{sample as calibration_sample, Ran};
use lmplex_core::TokenId;
use lmplex_kv::hash::{extend_block_hashes, BlockHash};
use lmplex_kv::BlockPool;
use lmplex_route::Work;
use lmplex_sched::StepCost;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

/// Weight of a new sample in the averages.
const EWMA: f64 = 0.2;
/// Forward passes with at least this many tokens measure the prefill cost per token.
pub(crate) const PREFILL_SAMPLE_TOKENS: usize = 32;
/// How long a model that failed a step is skipped by the router.
pub const ERROR_COOLDOWN: Duration = Duration::from_secs(10);
/// Weight kept by past steps in the slope fit, per step.
const SLOPE_DECAY: f64 = 0.98;
/// Least variance of the fitted steps' batch sizes for the slope to be trusted.
const SLOPE_MIN_VARIANCE: f64 = 0.25;
/// Least time between two copies of the prefix set while requests run.
const PREFIX_PUBLISH_EVERY: Duration = Duration::from_millis(20);

/// The shared factor until one is measured: two busy models split the device.
const SHARED_FACTOR_PRIOR: f64 = 2.0;

/// An `f64` read and written whole from several threads.
#[derive(Default)]
struct AtomicF64(AtomicU64);

impl AtomicF64 {
    fn load(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
    fn store(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }
}

/// The figures the loop publishes for the router (see the module docs).
#[derive(Default)]
pub struct LiveSignals {
    prefill_s_per_token: AtomicF64,
    time_per_output_token_s: AtomicF64,
    batch_size: AtomicF64,
    step_s_per_seq: AtomicF64,
    /// What the started requests hold (`StartedWork`).
    started: Mutex<StartedWork>,
    /// A step's time beside another busy model over its time alone (average; 0 until measured).
    shared_factor: AtomicF64,
    /// ln of the calibration factor, and when it was measured.
    calibration: Mutex<Option<(f64, Instant)>>,
    cooldown_until: Mutex<Option<Instant>>,
    prefix: RwLock<Arc<HashSet<BlockHash>>>,
}

impl LiveSignals {
    /// Seconds per prefilled token.
    pub fn prefill_s_per_token(&self) -> f64 {
        self.prefill_s_per_token.load()
    }
    /// Seconds per output token of one running request.
    pub fn time_per_output_token_s(&self) -> f64 {
        self.time_per_output_token_s.load()
    }
    /// Requests per sampling step behind `time_per_output_token_s`.
    pub fn batch_size(&self) -> f64 {
        self.batch_size.load()
    }
    /// Seconds a step grows per request added to the batch.
    pub fn step_s_per_seq(&self) -> f64 {
        self.step_s_per_seq.load()
    }
    /// The started requests' part of the router's `Backlog`, as the loop last published it.
    pub(crate) fn started_work(&self) -> StartedWork {
        self.started.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// A step's time while another model on the device is busy over its time alone at the
    /// same batch (>= 1; `SHARED_FACTOR_PRIOR` until measured).
    pub fn shared_factor(&self) -> f64 {
        let f = self.shared_factor.load();
        if f > 0.0 {
            f.max(1.0)
        } else {
            SHARED_FACTOR_PRIOR
        }
    }

    /// Measured over predicted latency of recent routed requests, a high quantile (>= 1),
    /// relaxed towards 1 while none finishes (module docs).
    pub fn calibration(&self) -> f64 {
        self.calibration_at(Instant::now())
    }

    fn calibration_at(&self, now: Instant) -> f64 {
        let Some((ln, at)) = *self.calibration.lock().unwrap_or_else(PoisonError::into_inner) else { return 1.0 };
        (ln * relaxed(now.saturating_duration_since(at))).exp().clamp(1.0, calibration::MAX)
    }

    /// Whether the model is in an error cooldown now.
    pub fn cooling_down(&self) -> bool {
        let until = *self.cooldown_until.lock().unwrap_or_else(PoisonError::into_inner);
        until.is_some_and(|t| Instant::now() < t)
    }

    /// Starts (or restarts) an error cooldown.
    pub fn start_cooldown(&self) {
        *self.cooldown_until.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now() + ERROR_COOLDOWN);
    }

    /// Leading prompt tokens whose blocks the prefix cache holds, for a prompt of `ids` under
    /// `salt` (whole blocks, leaving at least one token to compute, as the scheduler counts).
    pub fn cached_tokens(&self, ids: &[TokenId], salt: Option<&str>, block_size: usize) -> usize {
        let set = self.prefix.read().unwrap_or_else(PoisonError::into_inner).clone();
        if set.is_empty() {
            return 0;
        }
        let max_blocks = ids.len().saturating_sub(1) / block_size;
        let mut hashes = Vec::with_capacity(max_blocks);
        extend_block_hashes(&mut hashes, &ids[..max_blocks * block_size], ids.len(), block_size, salt);
        hashes.iter().take_while(|h| set.contains(h)).count() * block_size
    }
}

/// What the started requests hold, as the loop publishes it after each turn.
#[derive(Debug, Clone, Default)]
pub(crate) struct StartedWork {
    /// Output tokens each running request may still generate, smallest first.
    pub running_left: Vec<usize>,
    /// The running requests with a deadline: output tokens left, and the deadline.
    pub deadlines: Vec<(usize, Instant)>,
    /// The preempted requests' work.
    pub preempted: Work,
}

/// An average that takes its first sample as it is.
#[derive(Default, Clone, Copy)]
struct Ewma(Option<f64>);

impl Ewma {
    fn add(&mut self, x: f64) -> f64 {
        let v = self.0.map_or(x, |v| v + EWMA * (x - v));
        self.0 = Some(v);
        v
    }
}

/// A least-squares fit of step time on batch size, past steps' weights decaying.
#[derive(Default)]
struct Slope {
    w: f64,
    b: f64,
    t: f64,
    bb: f64,
    bt: f64,
}

impl Slope {
    fn add(&mut self, b: f64, t: f64) {
        for v in [&mut self.w, &mut self.b, &mut self.t, &mut self.bb, &mut self.bt] {
            *v *= SLOPE_DECAY;
        }
        self.w += 1.0;
        self.b += b;
        self.t += t;
        self.bb += b * b;
        self.bt += b * t;
    }

    /// Seconds per added unit (request, token), once the sizes vary enough.
    fn slope(&self) -> Option<f64> {
        self.line().map(|(_, slope)| slope)
    }

    /// The fitted line, (seconds at size 0, seconds per unit), once the sizes vary enough; the
    /// slope at least 0.
    fn line(&self) -> Option<(f64, f64)> {
        let (mb, mt) = (self.b / self.w, self.t / self.w);
        let var = self.bb / self.w - mb * mb;
        let slope = ((self.bt / self.w - mb * mt) / var).max(0.0);
        (var >= SLOPE_MIN_VARIANCE).then_some((mt - slope * mb, slope))
    }
}

/// The loop's side: samples in, `LiveSignals` out.
pub(crate) struct Meter {
    out: Arc<LiveSignals>,
    prefill: Ewma,
    tpot: Ewma,
    batch: Ewma,
    shared: Ewma,
    /// The recent calibration samples.
    calibration: Calibration,
    slope: Slope,
    /// Forward-pass time on batched tokens, every pass.
    step: Slope,
    prefix_generation: Option<u64>,
    prefix_at: Instant,
}

impl Meter {
    pub fn new(out: Arc<LiveSignals>) -> Self {
        Self {
            out,
            prefill: Ewma::default(),
            tpot: Ewma::default(),
            batch: Ewma::default(),
            shared: Ewma::default(),
            calibration: Calibration::default(),
            slope: Slope::default(),
            step: Slope::default(),
            prefix_generation: None,
            prefix_at: Instant::now(),
        }
    }

    /// A forward pass of `tokens` tokens took `elapsed`.
    pub fn forward(&mut self, tokens: usize, elapsed: Duration) {
        self.step.add(tokens as f64, elapsed.as_secs_f64());
        if tokens >= PREFILL_SAMPLE_TOKENS {
            let v = self.prefill.add(elapsed.as_secs_f64() / tokens as f64);
            self.out.prefill_s_per_token.store(v);
        }
    }

    /// What a forward pass costs, from the line fitted to the recent passes' times on their
    /// batched tokens (`None` until their sizes vary, or if time does not grow with tokens).
    pub fn step_cost(&self) -> Option<StepCost> {
        let (base_s, s_per_token) = self.step.line()?;
        (s_per_token > 0.0).then_some(StepCost { base_s: base_s.max(0.0), s_per_token })
    }

    /// A decode step of `batch` requests took `elapsed`, schedule to update; `shared` when
    /// another model on the device held requests while it ran.
    pub fn decode_step(&mut self, batch: usize, elapsed: Duration, shared: bool) {
        let (b, t) = (batch.max(1) as f64, elapsed.as_secs_f64());
        // A shared step faster than the time alone at its batch shows that time too high (the
        // warm-up's, say, for a model that is rarely alone): it counts as a step alone.
        if let Some(alone) = self.alone_step_s(b).filter(|&alone| shared && t >= alone) {
            let factor = self.shared.add(t / alone);
            self.out.shared_factor.store(factor);
            return;
        }
        let tpot = self.tpot.add(t);
        let batch = self.batch.add(b);
        self.slope.add(b, t);
        self.out.time_per_output_token_s.store(tpot);
        self.out.batch_size.store(batch);
        // Until the batch sizes vary: a forward pass's cost per token, within the upper bound.
        let bound = tpot / batch;
        let fallback = self.step_cost().map_or(bound, |c| c.s_per_token.min(bound));
        self.out.step_s_per_seq.store(self.slope.slope().unwrap_or(fallback));
    }

    /// A sampling step's time alone at `batch` requests, once measured.
    fn alone_step_s(&self, batch: f64) -> Option<f64> {
        let (tpot, b) = (self.tpot.0?, self.batch.0?);
        Some(lmplex_route::step_at(tpot, b, self.out.step_s_per_seq.load(), batch)).filter(|&t| t > 0.0)
    }

    /// Until when the device needs guarding for `running` (each running request's output
    /// tokens left and its deadline, if any) at `now`: the latest end of a request that meets
    /// its deadline alone but not at the shared factor (module docs); `None` when none.
    pub fn guard(&self, running: &[(usize, Option<Instant>)], now: Instant) -> Option<Instant> {
        let step = self.alone_step_s(running.len() as f64)?;
        let factor = self.out.shared_factor();
        let at_risk = running.iter().filter_map(|&(left, deadline)| {
            let (alone, slack) = (left as f64 * step, deadline?.saturating_duration_since(now).as_secs_f64());
            (alone <= slack && alone * factor > slack).then(|| now + Duration::from_secs_f64(alone))
        });
        at_risk.max()
    }

    /// What the started requests hold now; `running` gives each running request's output
    /// tokens left and its deadline, if any.
    pub fn started(&mut self, running: impl Iterator<Item = (usize, Option<Instant>)>, preempted: Work) {
        let mut s = self.out.started.lock().unwrap_or_else(PoisonError::into_inner);
        s.running_left.clear();
        s.deadlines.clear();
        for (left, deadline) in running {
            s.running_left.push(left);
            s.deadlines.extend(deadline.map(|d| (left, d)));
        }
        s.running_left.sort_unstable();
        s.preempted = preempted;
    }

    /// A routed request took `ratio` times its uncalibrated prediction.
    pub fn calibrate(&mut self, ratio: f64) {
        self.calibrate_at(ratio, Instant::now());
    }

    fn calibrate_at(&mut self, ratio: f64, now: Instant) {
        if let Some(ln) = self.calibration.add(ratio, now) {
            *self.out.calibration.lock().unwrap_or_else(PoisonError::into_inner) = Some((ln, now));
        }
    }

    /// A step failed: the router skips the model for a while.
    pub fn failed(&self) {
        self.out.start_cooldown();
    }

    /// Copies the pool's cached hashes if they changed (throttled unless `now_idle`).
    pub fn publish_prefix(&mut self, pool: &BlockPool, now_idle: bool) {
        let generation = pool.cache_generation();
        if self.prefix_generation == Some(generation) || (!now_idle && self.prefix_at.elapsed() < PREFIX_PUBLISH_EVERY)
        {
            return;
        }
        let set: HashSet<BlockHash> = pool.cached_hashes().collect();
        *self.out.prefix.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(set);
        self.prefix_generation = Some(generation);
        self.prefix_at = Instant::now();
    }
}

#[cfg(test)]
mod tests;
