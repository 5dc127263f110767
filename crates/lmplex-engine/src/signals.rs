//! `LiveSignals`: what the step loop measures about itself for the router (`lmplex_route`),
//! and `Meter`, the loop's side that measures and publishes.
//!
//! Measured, as exponentially weighted averages (a new sample weighs `EWMA`; the first sample
//! is taken as it is):
//! - prefill seconds per token: a forward pass of at least `PREFILL_SAMPLE_TOKENS` tokens,
//!   its time over its tokens;
//! - time per output token: the wall time of a step that sampled (schedule to update), which
//!   is what each running request waits for its next token under the present load;
//! - request seconds: first scheduled to finished, per finished request.
//!
//! The warm-up's measuring request seeds all three, so a fresh engine predicts from its own
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
/// Least time between two copies of the prefix set while requests run.
const PREFIX_PUBLISH_EVERY: Duration = Duration::from_millis(20);

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
    request_s: AtomicF64,
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
    /// Seconds a request holds its slot.
    pub fn request_s(&self) -> f64 {
        self.request_s.load()
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

/// The loop's side: samples in, `LiveSignals` out.
pub(crate) struct Meter {
    out: Arc<LiveSignals>,
    prefill: Ewma,
    tpot: Ewma,
    request: Ewma,
    prefix_generation: Option<u64>,
    prefix_at: Instant,
}

impl Meter {
    pub fn new(out: Arc<LiveSignals>) -> Self {
        Self {
            out,
            prefill: Ewma::default(),
            tpot: Ewma::default(),
            request: Ewma::default(),
            prefix_generation: None,
            prefix_at: Instant::now(),
        }
    }

    /// A forward pass of `tokens` tokens took `elapsed`.
    pub fn forward(&mut self, tokens: usize, elapsed: Duration) {
        if tokens >= PREFILL_SAMPLE_TOKENS {
            let v = self.prefill.add(elapsed.as_secs_f64() / tokens as f64);
            self.out.prefill_s_per_token.store(v);
        }
    }

    /// A step that sampled took `elapsed`, schedule to update.
    pub fn sampling_step(&mut self, elapsed: Duration) {
        let v = self.tpot.add(elapsed.as_secs_f64());
        self.out.time_per_output_token_s.store(v);
    }

    /// A request held its slot for `elapsed`.
    pub fn finished(&mut self, elapsed: Duration) {
        let v = self.request.add(elapsed.as_secs_f64());
        self.out.request_s.store(v);
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
        m.sampling_step(Duration::from_millis(10));
        assert!((out.time_per_output_token_s() - 0.010).abs() < 1e-12);
        m.sampling_step(Duration::from_millis(20));
        assert!((out.time_per_output_token_s() - 0.012).abs() < 1e-12);
        m.forward(PREFILL_SAMPLE_TOKENS - 1, Duration::from_secs(1)); // too small to count
        assert_eq!(out.prefill_s_per_token(), 0.0);
        m.forward(64, Duration::from_millis(64));
        assert!((out.prefill_s_per_token() - 0.001).abs() < 1e-12);
        assert!(!out.cooling_down());
        m.failed();
        assert!(out.cooling_down());
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
}
