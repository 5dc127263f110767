//! What an `Engine` tells the router (`lmplex_route`, `crate::routing`): its facts from the
//! config, its live signals as the step loop measured them (`crate::signals`), and a prompt as
//! this model would see it (tokens, and those its prefix cache holds).
//!
//! Invariant: nothing here waits on the step loop; every figure is read from what it published.

use super::admission::cache_salt;
use super::{Engine, Request};
use crate::signals::LiveSignals;
use crate::sizing::BLOCK_SIZE;
use lmplex_core::Result;
use lmplex_route::{ModelFacts, ModelSignals, PromptFacts};
use std::sync::atomic::Ordering;

impl Engine {
    /// What the router knows about this model from its config: name, quality, prices.
    pub fn route_facts(&self) -> ModelFacts {
        let c = &self.config;
        ModelFacts {
            name: c.served_name().to_string(),
            quality: c.quality,
            price_per_million_input_tokens: c.price_per_million_input_tokens,
            price_per_million_output_tokens: c.price_per_million_output_tokens,
        }
    }

    /// The model's live state as the router reads it (measured by the step loop itself).
    pub fn route_signals(&self) -> ModelSignals {
        let (s, l) = (&self.stats, &self.signals);
        let num_blocks = self.sizing.num_blocks.max(1);
        let free = s.num_free_blocks.load(Ordering::Relaxed).min(num_blocks);
        ModelSignals {
            available: s.alive.load(Ordering::Acquire) && !l.cooling_down(),
            num_running: s.num_running.load(Ordering::Relaxed),
            num_waiting: s.num_waiting.load(Ordering::Relaxed).max(s.num_queued.load(Ordering::Relaxed)),
            max_num_seqs: self.config.max_model_concurrency,
            kv_usage: 1.0 - free as f64 / num_blocks as f64,
            prefill_s_per_token: l.prefill_s_per_token(),
            time_per_output_token_s: l.time_per_output_token_s(),
            batch_size: l.batch_size(),
            step_s_per_seq: l.step_s_per_seq(),
            slowdown: l.slowdown(),
            calibration: l.calibration(),
            request_s: l.request_s(),
        }
    }

    /// The figures the step loop measures for the router, and its error cooldown.
    pub fn live_signals(&self) -> &LiveSignals {
        &self.signals
    }

    /// `req`'s prompt as this model sees it: its tokens after the tokenizer (and chat
    /// template), and how many leading ones the prefix cache holds for its tenant and salt.
    /// Errors as `submit` would give for a bad prompt or an unknown tenant.
    pub fn prompt_facts(&self, req: &Request) -> Result<PromptFacts> {
        let tenant = self.tenants.get(req.tenant.as_deref())?;
        let (_, ids, _) = self.tokenize_prompt(req)?;
        let salt = cache_salt(&tenant, req);
        let cached_tokens = self.signals.cached_tokens(&ids, salt.as_deref(), BLOCK_SIZE);
        Ok(PromptFacts { prompt_tokens: ids.len(), cached_tokens })
    }
}
