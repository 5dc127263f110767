//! What an `Engine` tells the router (`lmplex_route`, `crate::host::submit`): its facts from the
//! config, its live signals as the step loop measured them (`crate::signals`), and a prepared
//! call's prompts as this model sees them (tokens, and those its prefix cache holds).
//!
//! Invariant: nothing here waits on the step loop; every figure is read from what it published.

use super::{Engine, Prepared};
use crate::signals::LiveSignals;
use crate::sizing::BLOCK_SIZE;
use lmplex_route::{Backlog, Deadline, Device, ModelFacts, ModelSignals, PromptFacts};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

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

    /// The model's live state as the router reads it (measured by the step loop itself; the
    /// backlog is the started requests' work as the loop published it, and the queued ones'
    /// as the bounded queue counts it).
    pub fn route_signals(&self) -> ModelSignals {
        let (s, l) = (&self.stats, &self.signals);
        let num_blocks = self.sizing.num_blocks.max(1);
        let free = s.num_free_kv_blocks.load(Ordering::Relaxed).min(num_blocks);
        let started = l.started_work();
        let now = Instant::now();
        let backlog = Backlog {
            running_left: started.running_left,
            ahead: started.preempted + s.num_queued.work(true),
            behind_deadlines: s.num_queued.work(false),
            deadlines: (started.deadlines.iter())
                .map(|&(left, d)| Deadline { left, slack_s: d.saturating_duration_since(now).as_secs_f64() })
                .collect(),
        };
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
            device: Device {
                shared_factor: l.shared_factor(),
                others_busy_s: 0.0, // the host's to fill: it knows the other models (`ModelHost`)
                guarded_s: self.ledger.guarded_for(self.seat, now).map_or(0.0, |t| (t - now).as_secs_f64()),
            },
            calibration: l.calibration(),
            backlog,
        }
    }

    /// Whether `other` runs on the same device as this engine (they share its ledger).
    pub fn shares_device_with(&self, other: &Engine) -> bool {
        Arc::ptr_eq(&self.ledger, &other.ledger)
    }

    /// The figures the step loop measures for the router, and its error cooldown.
    pub fn live_signals(&self) -> &LiveSignals {
        &self.signals
    }

    /// The prompts of `p` as this model sees them, summed over its sequences: tokens after the
    /// chat template and tokenizer, and how many leading ones the prefix cache holds now for
    /// each sequence's tenant and salt.
    pub fn prompt_facts(&self, p: &Prepared) -> PromptFacts {
        let mut facts = PromptFacts::default();
        for s in &p.seqs {
            facts.prompt_tokens += s.prompt_ids.len();
            facts.cached_tokens += self.signals.cached_tokens(&s.prompt_ids, s.cache_salt.as_deref(), BLOCK_SIZE);
        }
        facts
    }
}
