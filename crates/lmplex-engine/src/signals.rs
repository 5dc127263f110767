//! `LiveSignals`: what the step loop measures about itself for the router (`lmplex_route`),
//! and `Meter`, the loop's side that measures and publishes.
//!
//! Measured, as exponentially weighted averages (a new sample weighs `EWMA`; the first sample
//! is taken as it is):
//! - prefill seconds per token: a forward pass of at least `PREFILL_SAMPLE_TOKENS` tokens,
//!   its time over its tokens;
//! - time per output token: the wall time of a step that sampled (schedule to update), which
//!   is what each running request waits for its next token under the present load, with the
//!   batch size of those steps;
//! - what a forward pass costs (`step_cost`, for the scheduler's step budget): a line fitted
//!   to every pass's time on its batched tokens, weights decaying by `SLOPE_DECAY` a pass;
//! - how much a step grows per request added to the batch: the slope of step time on batch
//!   size over recent sampling steps (a least-squares fit with weights decaying by
//!   `SLOPE_DECAY` a step), once their batch sizes vary enough; until then the step time over
//!   the batch size, an upper bound of that slope (a step never costs less than nothing).
//!
//! Published as they are after each turn: the work the requests that started hold (the
//! output tokens each running one may still generate, and the preempted ones' work), which
//! with the bounded queue's work (`QueueSlots`) is the router's `Backlog`.
//!
//! Models on one device (the CPU's cores, or one GPU's SMs) slow each other's steps. The
//! figures above are measured on the steps that ran while no other model on the device held
//! requests (the model alone); a step that ran beside another busy model instead measures
//! the device's shared factor, its time over the time alone at its batch (an average, >= 1).
//! The router applies it while the other models stay busy (`lmplex_route::Device`).
//!
//! The device guard (`lmplex_sched::ledger`): after each turn the loop guards the device until
//! its running requests with deadlines have ended when one of them would meet its deadline
//! alone (its output tokens left, at most, each a step at the present batch) but not at the
//! shared factor; otherwise it lifts its guard.
//!
//! Calibration: a routed request carries the router's uncalibrated prediction; when it ends,
//! its measured latency (submitted to finished) over that prediction for the tokens it really
//! generated is folded into a moving mean and variance of the ratio's logarithm (weight
//! `CALIBRATION_EWMA`), and the router scales its predictions by the ratio's high quantile
//! `exp(mean + CALIBRATION_Z x sd)` (p99 if the log-ratio were normal), never below 1. Once
//! `CALIBRATION_HOLD` has passed without a finished request that carried a prediction, the
//! quantile's logarithm halves every `CALIBRATION_HALF_LIFE`: a model whose calibration
//! refuses every budgeted call would otherwise never get the request that could correct it.
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

/// Weight of a new request in the calibration's log-ratio mean and variance.
const CALIBRATION_EWMA: f64 = 0.05;
/// Standard deviations above the mean log-ratio the calibration takes (p99 of a normal).
const CALIBRATION_Z: f64 = 2.33;
/// The largest calibration factor.
const CALIBRATION_MAX: f64 = 20.0;
/// Time without a finished predicted request before the calibration starts to relax.
const CALIBRATION_HOLD: Duration = Duration::from_secs(30);
/// Once relaxing, the time over which the calibration's log halves.
const CALIBRATION_HALF_LIFE: Duration = Duration::from_secs(10);

/// The factor the calibration's log keeps after `age` without a finished predicted request.
fn relaxed(age: Duration) -> f64 {
    0.5f64.powf(age.saturating_sub(CALIBRATION_HOLD).as_secs_f64() / CALIBRATION_HALF_LIFE.as_secs_f64())
}

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
    /// same batch (>= 1; 1 until measured).
    pub fn shared_factor(&self) -> f64 {
        self.shared_factor.load().max(1.0)
    }

    /// Measured over predicted latency of recent routed requests, a high quantile (>= 1),
    /// relaxed towards 1 while none finishes (module docs).
    pub fn calibration(&self) -> f64 {
        self.calibration_at(Instant::now())
    }

    fn calibration_at(&self, now: Instant) -> f64 {
        let Some((ln, at)) = *self.calibration.lock().unwrap_or_else(PoisonError::into_inner) else { return 1.0 };
        (ln * relaxed(now.saturating_duration_since(at))).exp().clamp(1.0, CALIBRATION_MAX)
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
    /// Moving mean and variance of ln(measured / predicted), and when last moved.
    log_ratio: Option<(f64, f64, Instant)>,
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
            log_ratio: None,
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

    /// A step of `batch` requests that sampled took `elapsed`, schedule to update; `shared`
    /// when another model on the device held requests while it ran.
    pub fn sampling_step(&mut self, batch: usize, elapsed: Duration, shared: bool) {
        let (b, t) = (batch.max(1) as f64, elapsed.as_secs_f64());
        if shared {
            if let Some(alone) = self.alone_step_s(b) {
                let factor = self.shared.add((t / alone).max(1.0));
                self.out.shared_factor.store(factor);
                return;
            }
        }
        let tpot = self.tpot.add(t);
        let batch = self.batch.add(b);
        self.slope.add(b, t);
        self.out.time_per_output_token_s.store(tpot);
        self.out.batch_size.store(batch);
        self.out.step_s_per_seq.store(self.slope.slope().unwrap_or(tpot / batch));
    }

    /// A sampling step's time alone at `batch` requests, once measured.
    fn alone_step_s(&self, batch: f64) -> Option<f64> {
        let (tpot, b) = (self.tpot.0?, self.batch.0?);
        Some(tpot + (batch - b).max(0.0) * self.out.step_s_per_seq.load()).filter(|&t| t > 0.0)
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
        if !(ratio.is_finite() && ratio > 0.0) {
            return;
        }
        let x = ratio.ln();
        let (mean, var) = match self.log_ratio {
            None => (x, 0.0),
            Some((m, v, at)) => {
                // The time since the last one relaxed the quantile's log: relax its terms alike.
                let k =
                    0.5f64.powf(now.saturating_duration_since(at).as_secs_f64() / CALIBRATION_HALF_LIFE.as_secs_f64());
                let (m, v) = (m * k, v * k * k);
                let d = x - m;
                (m + CALIBRATION_EWMA * d, (1.0 - CALIBRATION_EWMA) * (v + CALIBRATION_EWMA * d * d))
            }
        };
        self.log_ratio = Some((mean, var, now));
        let ln = (mean + CALIBRATION_Z * var.sqrt()).min(CALIBRATION_MAX.ln());
        *self.out.calibration.lock().unwrap_or_else(PoisonError::into_inner) = Some((ln, now));
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
mod tests {
    use super::*;

    #[test]
    fn averages_start_at_the_first_sample_and_move_by_the_weight() {
        let out = Arc::new(LiveSignals::default());
        let mut m = Meter::new(out.clone());
        m.sampling_step(1, Duration::from_millis(10), false);
        assert!((out.time_per_output_token_s() - 0.010).abs() < 1e-12);
        assert!((out.step_s_per_seq() - 0.010).abs() < 1e-12, "one batch size: the upper bound");
        m.sampling_step(1, Duration::from_millis(20), false);
        assert!((out.time_per_output_token_s() - 0.012).abs() < 1e-12);
        assert_eq!(out.batch_size(), 1.0);
        m.forward(PREFILL_SAMPLE_TOKENS - 1, Duration::from_secs(1)); // too small to count
        assert_eq!(out.prefill_s_per_token(), 0.0);
        m.forward(64, Duration::from_millis(64));
        assert!((out.prefill_s_per_token() - 0.001).abs() < 1e-12);
        assert!(!out.cooling_down());
        m.failed();
        assert!(out.cooling_down());
    }

    #[test]
    fn calibration_takes_a_high_quantile_of_the_ratios_and_never_goes_below_one() {
        let t = Instant::now();
        let out = Arc::new(LiveSignals::default());
        let mut m = Meter::new(out.clone());
        assert_eq!(out.calibration_at(t), 1.0, "none measured");
        m.calibrate_at(0.5, t);
        assert_eq!(out.calibration_at(t), 1.0, "over-predicted: not below 1");
        let mut m = Meter::new(out.clone());
        m.calibrate_at(1.2, t);
        assert!((out.calibration_at(t) - 1.2).abs() < 1e-12, "the first ratio as it is");
        for i in 0..200 {
            m.calibrate_at(if i % 2 == 0 { 1.0 } else { 1.5 }, t);
        }
        // ln-ratios 0 and 0.405: mean ~0.203, sd ~0.203: exp(0.203 + 2.33 x 0.203) ~ 1.96.
        let c = out.calibration_at(t);
        assert!(c > 1.5 && c < 2.2, "{c}");
        m.calibrate_at(f64::NAN, t);
        assert_eq!(out.calibration_at(t), c, "a bad ratio is ignored");
    }

    #[test]
    fn calibration_relaxes_while_no_routed_request_finishes() {
        let t = Instant::now();
        let out = Arc::new(LiveSignals::default());
        let mut m = Meter::new(out.clone());
        for _ in 0..20 {
            m.calibrate_at(1.0, t);
        }
        m.calibrate_at(24.0, t); // one request queued behind work its prediction missed
        let high = out.calibration_at(t);
        assert!(high > 3.0, "one outlier raises the quantile: {high}");
        let later = |s: u64| out.calibration_at(t + Duration::from_secs(s));
        assert_eq!(later(30), high, "held while requests may still finish");
        assert!((later(40).ln() - high.ln() / 2.0).abs() < 1e-9, "then its log halves in a half-life");
        assert!(later(90) < 1.1, "{}", later(90));
        // A request that finishes after the gap starts from the relaxed state.
        m.calibrate_at(1.0, t + Duration::from_secs(90));
        assert!(out.calibration_at(t + Duration::from_secs(90)) < 1.2);
    }

    #[test]
    fn the_slope_is_fitted_once_batch_sizes_vary() {
        let out = Arc::new(LiveSignals::default());
        let mut m = Meter::new(out.clone());
        // Steps of 5 ms plus 2 ms a request, at batches 1..=8.
        for i in 0..40 {
            let b = 1 + i % 8;
            m.sampling_step(b, Duration::from_micros(5000 + 2000 * b as u64), false);
        }
        assert!((out.step_s_per_seq() - 0.002).abs() < 1e-9, "{}", out.step_s_per_seq());
        assert!(out.batch_size() > 1.0 && out.batch_size() < 8.0);
    }

    #[test]
    fn the_step_cost_is_the_line_through_the_passes() {
        let mut m = Meter::new(Arc::new(LiveSignals::default()));
        m.forward(8, Duration::from_millis(18));
        assert_eq!(m.step_cost(), None, "one size: no line");
        // 10 ms a pass and 1 ms a token.
        for tokens in [8, 40, 8, 200, 9, 64, 8] {
            m.forward(tokens, Duration::from_micros(10_000 + 1000 * tokens as u64));
        }
        let c = m.step_cost().unwrap();
        assert!((c.base_s - 0.010).abs() < 1e-9 && (c.s_per_token - 0.001).abs() < 1e-12, "{c:?}");
    }

    #[test]
    fn cached_tokens_count_the_leading_blocks_the_cache_holds() {
        let bs = 4;
        let ids: Vec<TokenId> = (0..11).collect();
        let mut hashes = Vec::new();
        extend_block_hashes(&mut hashes, &ids, ids.len(), bs, Some("t"));
        let mut pool = BlockPool::new(8, true);
        let blocks = pool.allocate(2).unwrap();
        pool.cache_block(blocks[0], hashes[0]);
        let out = Arc::new(LiveSignals::default());
        let mut m = Meter::new(out.clone());
        m.publish_prefix(&pool, true);
        assert_eq!(out.cached_tokens(&ids, Some("t"), bs), 4);
        assert_eq!(out.cached_tokens(&ids, None, bs), 0, "another salt sees nothing");
        pool.cache_block(blocks[1], hashes[1]);
        m.publish_prefix(&pool, true);
        assert_eq!(out.cached_tokens(&ids, Some("t"), bs), 8);
        assert_eq!(out.cached_tokens(&ids[..8], Some("t"), bs), 4, "one token is always computed");
    }

    #[test]
    fn steps_beside_a_busy_model_measure_the_shared_factor_not_the_figures_alone() {
        let out = Arc::new(LiveSignals::default());
        let mut m = Meter::new(out.clone());
        assert_eq!(out.shared_factor(), 1.0, "1 until measured");
        m.sampling_step(1, Duration::from_millis(10), true); // nothing alone yet: taken as alone
        assert!((out.time_per_output_token_s() - 0.010).abs() < 1e-12);
        m.sampling_step(1, Duration::from_millis(30), true);
        assert!((out.time_per_output_token_s() - 0.010).abs() < 1e-12, "the figures alone stay");
        assert!((out.shared_factor() - 3.0).abs() < 1e-12);
        // A shared step faster than alone counts as 1x, and moves the average by its weight.
        m.sampling_step(1, Duration::from_millis(5), true);
        assert!((out.shared_factor() - (3.0 + EWMA * (1.0 - 3.0))).abs() < 1e-12);
        m.sampling_step(1, Duration::from_millis(20), false);
        assert!((out.time_per_output_token_s() - (0.010 + EWMA * 0.010)).abs() < 1e-12);
    }

    #[test]
    fn the_device_is_guarded_while_a_deadline_is_met_alone_but_not_shared() {
        let out = Arc::new(LiveSignals::default());
        let mut m = Meter::new(out.clone());
        let now = Instant::now();
        let ms = |n: u64| Duration::from_millis(n);
        assert_eq!(m.guard(&[(10, Some(now + ms(150)))], now), None, "nothing measured yet");
        m.sampling_step(1, ms(10), false);
        m.sampling_step(1, ms(30), true); // shared, the steps take 3x as long
                                          // 10 tokens of 10 ms: met alone (100 <= 150 ms), not shared (300 ms): guarded 100 ms.
        assert_eq!(m.guard(&[(10, Some(now + ms(150)))], now), Some(now + ms(100)));
        assert_eq!(m.guard(&[(10, Some(now + ms(50)))], now), None, "late either way");
        assert_eq!(m.guard(&[(10, Some(now + ms(400)))], now), None, "met either way");
        assert_eq!(m.guard(&[(10, None)], now), None, "no deadline");
        // The latest end of those at risk, each at the batch of all the running ones.
        let (a, b) = (Some(now + ms(250)), Some(now + ms(500)));
        m.sampling_step(2, ms(20), false); // a step of 2 alone; the guard times them at batch 2
        let step = out.time_per_output_token_s() + (2.0 - out.batch_size()) * out.step_s_per_seq();
        let want = now + Duration::from_secs_f64(20.0 * step);
        assert_eq!(m.guard(&[(10, a), (20, b)], now), Some(want));
    }
}
