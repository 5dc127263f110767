//! Warming a model up before its first request: every code path run once, then the router's
//! signals (`crate::signals`) seeded from measured steps: a prefill, decode steps alone, decode
//! steps at a batch, and, where several models share a device, steps side by side
//! (`ModelHost::load_all` runs `measure_batch` on all of them at once).
//!
//! Invariant: warm-up requests only measure; one that cannot run (a pool or context too small)
//! leaves a figure unseeded, never fails the load past the first request.

use super::Engine;
use crate::signals::PREFILL_SAMPLE_TOKENS;
use crate::{Prompt, Request};
use lmplex_core::{Result, SamplingParams, TokenId};

/// Requests of the measuring batch (the router's bursts are of this order).
const WARM_BATCH: usize = 8;

impl Engine {
    /// Runs two greedy tokens from a one-token prompt (an embedding model embeds it), so the
    /// first real request finds every code path, prefill and decode (and, on a GPU, every
    /// kernel), ready; then a short measuring request (a prefill of `PREFILL_SAMPLE_TOKENS`
    /// tokens and a few decode steps) whose figures seed the router's signals (`crate::signals`).
    pub fn warm_up(&self) -> Result<()> {
        let first = self.tokenizer.bos_token_id.unwrap_or(0);
        let params = SamplingParams { max_tokens: 2, temperature: 0.0, ignore_eos: true, ..Default::default() };
        // An embedding model warms up on embedding requests (prefill only).
        let pooling = self.pooling.map(|_| lmplex_core::PoolingParams::default());
        let warm = Request { pooling: pooling.clone(), ..Request::new(Prompt::TokenIds(vec![first]), params.clone()) };
        self.submit(&warm)?.collect_blocking()?;
        let len = PREFILL_SAMPLE_TOKENS.min(self.max_model_len.saturating_sub(5)).max(1);
        let ids = (0..len).map(|i| (i % self.vocab_size) as TokenId).collect();
        let measure = Request {
            cache_salt: Some("lmplex-warm-up".into()),
            pooling,
            ..Request::new(Prompt::TokenIds(ids), SamplingParams { max_tokens: 4, ..params })
        };
        // Only figures: a pool or context too small for it leaves the signals unseeded.
        if let Err(e) = self.submit(&measure).and_then(|h| h.collect_blocking()) {
            tracing::debug!("the measuring warm-up request did not run: {e}");
        }
        self.measure_batch();
        Ok(())
    }

    /// Runs up to `WARM_BATCH` short requests together (within `max_model_concurrency`): their
    /// decode steps at that batch, beside the measuring request's alone, give the signals a
    /// step's growth per request before traffic does. Run by several models of one device at
    /// once (`ModelHost::load_all`), their steps side by side seed each one's shared factor.
    /// Only figures: a request that cannot run is logged at debug level.
    pub fn measure_batch(&self) {
        if self.pooling.is_some() {
            return;
        }
        let n = WARM_BATCH.min(self.config.max_model_concurrency);
        let params = SamplingParams { max_tokens: 4, temperature: 0.0, ignore_eos: true, ..Default::default() };
        let reqs: Vec<Request> = (0..n)
            .map(|i| Request {
                cache_salt: Some(format!("lmplex-warm-up-{i}")),
                ..Request::new(Prompt::TokenIds(vec![(i % self.vocab_size) as TokenId; 4]), params.clone())
            })
            .collect();
        let run = self.submit_all(&reqs).and_then(|hs| hs.into_iter().try_for_each(|h| h.collect_blocking().map(drop)));
        if let Err(e) = run {
            tracing::debug!("the measuring warm-up batch did not run: {e}");
        }
    }
}
