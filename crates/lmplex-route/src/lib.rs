//! TierSet routing: which served model answers a request sent to a tier or to `lmplex:auto`.
//!
//! `TierSet::select(&RouteRequest, &Signals)` is a pure function: the operator's tiers and
//! model facts (quality, prices), the request's mode and budgets (`lmplex_core::Route`), and a
//! snapshot of each engine's live signals in; one model (with the ranked fallbacks) or a typed
//! `lmplex_core::Error` out (`BudgetUnsatisfiable` with the best figures, `Capacity` when there
//! is nothing to choose from). It knows no engine: engines publish `ModelSignals`, the caller
//! reads a snapshot and passes it.
//!
//! Invariants: a `Selection`'s predicted latency is within `max_latency_ms` and its cost
//! bound (every prompt token at the input price, every `max_tokens` at the output price) is
//! within `max_cost`, by construction, and so is every fallback's; a model in cooldown or
//! without signals is never chosen; equal inputs give equal outputs (ties end on the name).

mod select;

use lmplex_core::{Error, Result, Route, Tier};
pub use select::{busy_s, predict, step_at, unsatisfiable, Prediction};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// What the operator says about a served model: its name, quality and prices.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelFacts {
    /// The served model name.
    pub name: String,
    /// Higher is better (e.g. a benchmark score); 0 when not set.
    pub quality: f64,
    /// Money per million prompt tokens.
    pub price_per_million_input_tokens: f64,
    /// Money per million generated tokens.
    pub price_per_million_output_tokens: f64,
}

/// Served model names by tier (`[tiers]` in the server TOML). A tier may be empty; a model may
/// be in several.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierSet {
    /// Low latency, lower quality.
    #[serde(default)]
    pub fast: Vec<String>,
    /// The default trade-off.
    #[serde(default)]
    pub balanced: Vec<String>,
    /// High quality.
    #[serde(default)]
    pub deep: Vec<String>,
    /// The best resources.
    #[serde(default)]
    pub max: Vec<String>,
}

impl TierSet {
    /// The models of `tier`.
    pub fn models(&self, tier: Tier) -> &[String] {
        match tier {
            Tier::Fast => &self.fast,
            Tier::Balanced => &self.balanced,
            Tier::Deep => &self.deep,
            Tier::Max => &self.max,
        }
    }

    /// The tiers `model` is in, in order.
    pub fn tiers_of(&self, model: &str) -> Vec<Tier> {
        Tier::ALL.into_iter().filter(|&t| self.models(t).iter().any(|m| m == model)).collect()
    }

    /// Whether no tier names a model.
    pub fn is_empty(&self) -> bool {
        Tier::ALL.iter().all(|&t| self.models(t).is_empty())
    }

    /// Checks every named model is served (`served`), naming the tier and model otherwise.
    pub fn validate(&self, served: &[&str]) -> Result<()> {
        for t in Tier::ALL {
            let names = self.models(t);
            for (i, m) in names.iter().enumerate() {
                if !served.contains(&m.as_str()) {
                    let e = format!("tiers.{}: '{m}' is not a served model (served: {served:?})", t.as_str());
                    return Err(Error::invalid(e));
                }
                if names[..i].contains(m) {
                    return Err(Error::invalid(format!("tiers.{}: '{m}' is listed twice", t.as_str())));
                }
            }
        }
        Ok(())
    }
}

/// One request's routing question: the route, and the request as each candidate sees it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RouteRequest {
    /// Mode, tier and budgets.
    pub route: Route,
    /// Most tokens the request may generate.
    pub max_tokens: usize,
    /// Per model: the prompt's tokens in that model's tokenizer and how many of them its prefix
    /// cache holds. A model missing here is not a candidate.
    pub prompts: HashMap<String, PromptFacts>,
}

impl RouteRequest {
    /// `Route::validate`.
    pub fn validate(&self) -> Result<()> {
        self.route.validate()
    }
}

/// A prompt as one model sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PromptFacts {
    /// Prompt tokens in the model's tokenizer (after its chat template).
    pub prompt_tokens: usize,
    /// Of those, the leading tokens its prefix cache holds now (not prefilled again).
    pub cached_tokens: usize,
}

/// One engine's live state, measured by the engine itself.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSignals {
    /// False while the model is in an error cooldown (or not loaded).
    pub available: bool,
    /// Requests running now.
    pub num_running: usize,
    /// Requests waiting now.
    pub num_waiting: usize,
    /// Most requests run together (`max_model_concurrency`).
    pub max_num_seqs: usize,
    /// Fraction of KV blocks in use, 0..=1.
    pub kv_usage: f64,
    /// Seconds per prefilled token (EWMA over recent steps).
    pub prefill_s_per_token: f64,
    /// Seconds per output token of one request under the present load (EWMA).
    pub time_per_output_token_s: f64,
    /// Requests per step behind `time_per_output_token_s` (EWMA of the steps' batch sizes).
    pub batch_size: f64,
    /// Seconds a step grows per request added to the batch (measured slope, or an upper bound).
    pub step_s_per_seq: f64,
    /// The work a new request may queue behind.
    pub backlog: Backlog,
    /// The other models on its device, as they load it now.
    pub device: Device,
    /// Measured latency over predicted, a high quantile over recent routed requests (>= 1; 1
    /// until measured): scales the whole prediction.
    pub calibration: f64,
}

/// What the other models on one model's device do to its steps. Their forward passes share
/// the device (the CPU's cores, a GPU's SMs), so while one of them is busy this model's steps
/// take `shared_factor` times as long as alone.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Device {
    /// A step's time while another model on the device is busy over its time alone at the
    /// same batch (measured; >= 1, 1 until measured).
    pub shared_factor: f64,
    /// Seconds the other models stay busy with the work they hold now (their own estimates,
    /// `busy_s`; 0 when they are idle).
    pub others_busy_s: f64,
    /// Seconds until a running request with a deadline on another model no longer needs the
    /// device to itself: a model with nothing running starts nothing before (the scheduler's
    /// device guard, `lmplex_sched::ledger`); 0 when none is guarded.
    pub guarded_s: f64,
}

impl Default for Device {
    /// A device no other model shares.
    fn default() -> Self {
        Self { shared_factor: 1.0, others_busy_s: 0.0, guarded_s: 0.0 }
    }
}

/// Requests counted by their work: how many, the prompt tokens they have still to prefill,
/// and the most output tokens they may generate (their `max_tokens`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Work {
    /// Requests.
    pub requests: usize,
    /// Prompt tokens still to prefill, summed.
    pub prompt_tokens: usize,
    /// Output tokens they may still generate, summed.
    pub output_tokens: usize,
}

impl Work {
    /// One request's work.
    pub fn one(prompt_tokens: usize, output_tokens: usize) -> Self {
        Self { requests: 1, prompt_tokens, output_tokens }
    }
}

impl std::ops::Add for Work {
    type Output = Work;
    fn add(self, o: Work) -> Work {
        Work {
            requests: self.requests + o.requests,
            prompt_tokens: self.prompt_tokens + o.prompt_tokens,
            output_tokens: self.output_tokens + o.output_tokens,
        }
    }
}

/// The work ahead of a new request on one model, as upper bounds (each request counted at
/// its `max_tokens`), in the order the scheduler runs it: requests with a deadline (a
/// latency budget) before those without, each in arrival order (`lmplex_sched`'s rank).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Backlog {
    /// Per running request, the output tokens it may still generate, smallest first.
    pub running_left: Vec<usize>,
    /// Waiting requests any new one queues behind: those with a deadline, and those
    /// preempted (they resume first).
    pub ahead: Work,
    /// The other waiting requests: a new request without a deadline queues behind them too,
    /// one with a deadline goes before them.
    pub behind_deadlines: Work,
    /// The running requests with a deadline: the scheduler admits no later request while
    /// joining their batch would make one of them miss its deadline.
    pub deadlines: Vec<Deadline>,
}

/// A running request with a deadline, as a new request sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Deadline {
    /// Output tokens it may still generate.
    pub left: usize,
    /// Seconds until its deadline.
    pub slack_s: f64,
}

/// A snapshot of every model's facts and signals.
#[derive(Debug, Clone, Default)]
pub struct Signals {
    /// By served model name.
    pub models: HashMap<String, (ModelFacts, ModelSignals)>,
}

/// The chosen model and why it fits.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    /// The served model name.
    pub model: String,
    /// The request's tier, else the model's first tier.
    pub tier: Tier,
    /// Predicted end-to-end latency.
    pub predicted_latency_ms: f64,
    /// Upper bound of the request's cost on this model.
    pub max_cost: f64,
    /// The other candidates that meet the budgets, best first (used in turn when one fails).
    pub fallbacks: Vec<String>,
}
