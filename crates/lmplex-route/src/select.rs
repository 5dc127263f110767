//! The prediction (`predict`) and the choice (`TierSet::select`).
//!
//! Prediction, per candidate model:
//! - queue wait: the decode steps until a slot is free for this request, from the `Backlog`
//!   at its upper bounds: each slot frees when its running request has generated all it may
//!   (a free slot at once; none counts as free when KV use is at `KV_FULL`), and each
//!   request that runs before this one (with a latency budget: those waiting with a
//!   deadline or preempted; without: every waiting one) takes the first slot to free for its
//!   share of their output tokens; plus their prompt tokens at `prefill_s_per_token`;
//! - prefill: the prompt's tokens not in the prefix cache x `prefill_s_per_token`;
//! - decode: `max_tokens` x the time per output token at the batch it will run in (everyone
//!   running or waiting and this one, up to the slots): `time_per_output_token_s` plus
//!   `step_s_per_seq` for every request above the measured `batch_size`;
//! - held back by deadlines: the scheduler admits no request while a running one with a
//!   deadline (it came first, so it ranks before this one) is on track at the present batch but
//!   would miss its deadline with one more request and its prefill; then this request waits at
//!   least until that one ends (its tokens left at the present batch);
//! - a queue step is timed as a decode step at that batch;
//! - held back by the device guard: a model with nothing running starts nothing while a
//!   deadline on another model of its device needs the device to itself (`Device::guarded_s`),
//!   so the request starts no earlier than that;
//! - shared device: the sum so far is the time alone, `d`; while the other models of the device
//!   stay busy (`Device::others_busy_s`, what they hold now) its steps run `f =
//!   Device::shared_factor` times as long, so it takes `d + min(d (f - 1), busy (1 - 1/f))`
//!   after it starts;
//! - the whole is scaled by `calibration` (how far recent requests ran over their prediction);
//! - cost bound: prompt tokens x input price + `max_tokens` x output price (per million).
//!
//! A candidate fits when its predicted latency is within `max_latency_ms` and its cost bound
//! within `max_cost` (an absent budget always holds). The fitting candidates are ranked by the
//! mode's key, smaller first, ties ending on the name:
//!
//! | mode | key |
//! |---|---|
//! | fixed | load ((running + waiting) / slots), latency, cost |
//! | balanced | cost, not in the `balanced` tier, latency |
//! | deep | -quality, cost, latency |
//! | max | -quality, latency, cost |

use crate::{Backlog, ModelFacts, ModelSignals, PromptFacts, RouteRequest, Selection, Signals, TierSet, Work};
use lmplex_core::{Error, Mode, Result, Tier};
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

/// KV use at or above which a model is treated as having no free slot.
pub const KV_FULL: f64 = 0.95;

/// What one model would do with one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    /// (Queue wait + prefill + decode) x calibration, in milliseconds.
    pub latency_ms: f64,
    /// Uncalibrated queue wait + prefill, in seconds (what calibration is measured against).
    pub queue_and_prefill_s: f64,
    /// Uncalibrated seconds per output token at the batch it will join.
    pub time_per_output_token_s: f64,
    /// Upper bound of the request's cost.
    pub max_cost: f64,
    /// (running + waiting) / slots.
    pub load: f64,
    /// Requests in the batch it will run in: everyone now running or waiting, and it, up to the
    /// slots (later arrivals are not predicted).
    pub batch: usize,
    /// Whether it expects the device's other models to slow its steps (they hold work now).
    pub shared: bool,
}

/// The prediction for a request of `prompt` and `max_tokens` on a model (module docs), with a
/// latency budget of `max_latency_ms` or none: with one, its deadline puts it before waiting
/// requests without one.
pub fn predict(
    facts: &ModelFacts,
    s: &ModelSignals,
    prompt: PromptFacts,
    max_tokens: usize,
    max_latency_ms: Option<f64>,
) -> Prediction {
    let slots = s.max_num_seqs.max(1);
    let b = &s.backlog;
    let ahead = if max_latency_ms.is_some() { b.ahead } else { b.ahead + b.behind_deadlines };
    let uncached = prompt.prompt_tokens - prompt.cached_tokens.min(prompt.prompt_tokens);
    // The batch this request will run in: everyone now running or waiting, and it, up to the slots.
    let batch = (s.num_running + s.num_waiting + 1).min(slots);
    let tpot = step_s(s, batch as f64);
    let (now_s, joined_s) = (step_s(s, s.num_running as f64), step_s(s, (s.num_running + 1) as f64));
    let prefill_s = uncached as f64 * s.prefill_s_per_token;
    let held_s = b
        .deadlines
        .iter()
        .filter(|d| d.left as f64 * now_s <= d.slack_s && d.left as f64 * joined_s + prefill_s > d.slack_s)
        .map(|d| d.left as f64 * now_s)
        .fold(0.0, f64::max);
    let slot_steps = slot_times(b, ahead, slots, s.kv_usage >= KV_FULL).peek().map_or(0, |r| r.0);
    let queue_s = (slot_steps as f64 * tpot).max(held_s) + ahead.prompt_tokens as f64 * s.prefill_s_per_token;
    let alone_s = queue_s + prefill_s + max_tokens as f64 * tpot;
    let guard_s = if s.num_running == 0 { s.device.guarded_s.max(0.0) } else { 0.0 };
    let shared_s = shared(alone_s, (s.device.others_busy_s - guard_s).max(0.0), s.device.shared_factor);
    // The prediction calibration measures against (the queue and prefill, and a per-token
    // time), stretched as the device's sharing stretches the whole.
    let stretch = if alone_s > 0.0 { shared_s / alone_s } else { 1.0 };
    let max_cost = (prompt.prompt_tokens as f64 * facts.price_per_million_input_tokens
        + max_tokens as f64 * facts.price_per_million_output_tokens)
        / 1e6;
    Prediction {
        latency_ms: 1000.0 * s.calibration.max(1.0) * (guard_s + shared_s),
        queue_and_prefill_s: guard_s + stretch * (queue_s + prefill_s),
        time_per_output_token_s: stretch * tpot,
        max_cost,
        load: (s.num_running + s.num_waiting) as f64 / slots as f64,
        batch,
        shared: shared_s > alone_s,
    }
}

/// Seconds the model of `s` stays busy with the work it holds now, alone on its device: the
/// decode steps until its running and queued requests (at their `max_tokens`) have all ended,
/// at its present batch, and the queued prompts' prefill.
pub fn busy_s(s: &ModelSignals) -> f64 {
    let slots = s.max_num_seqs.max(1);
    let b = &s.backlog;
    let queued = b.ahead + b.behind_deadlines;
    let steps = slot_times(b, queued, slots, false).into_iter().map(|r| r.0).max().unwrap_or(0);
    let batch = (s.num_running + s.num_waiting).min(slots) as f64;
    steps as f64 * step_s(s, batch) + queued.prompt_tokens as f64 * s.prefill_s_per_token
}

/// A step's time alone on the device at `batch` requests (`step_at`).
fn step_s(s: &ModelSignals, batch: f64) -> f64 {
    step_at(s.time_per_output_token_s, s.batch_size, s.step_s_per_seq, batch)
}

/// A step's time at `batch` requests from one measured at `measured_batch` (`step`) and the
/// growth per request (`per_seq`): the line through the measured step, and below that batch
/// never under the measured step's share per request (fewer requests amortize less, so a
/// request's share of a step only grows as the batch shrinks).
pub fn step_at(step: f64, measured_batch: f64, per_seq: f64, batch: f64) -> f64 {
    let line = step + (batch - measured_batch) * per_seq;
    if batch >= measured_batch || measured_batch <= 0.0 {
        line
    } else {
        line.max(step * batch / measured_batch)
    }
}

/// Wall time of `alone_s` of work while the device is shared for `busy_s` more seconds,
/// during which it runs `factor` times slower.
fn shared(alone_s: f64, busy_s: f64, factor: f64) -> f64 {
    let f = factor.max(1.0);
    alone_s + (alone_s * (f - 1.0)).min(busy_s * (1.0 - 1.0 / f))
}

/// When each slot frees, in decode steps from now, once `ahead` has taken its share: each
/// slot frees when its running request has generated all it may (a slot nobody holds is free
/// now unless the KV cache is full), and each request ahead holds the first slot to free for
/// its share of their output tokens. Empty when nothing runs and no slot is free.
fn slot_times(b: &Backlog, ahead: Work, slots: usize, kv_full: bool) -> BinaryHeap<Reverse<usize>> {
    let idle = if kv_full { 0 } else { slots.saturating_sub(b.running_left.len()) };
    let mut free_at: BinaryHeap<Reverse<usize>> =
        b.running_left.iter().take(slots).copied().chain(std::iter::repeat_n(0, idle)).map(Reverse).collect();
    let each = ahead.output_tokens.div_ceil(ahead.requests.max(1));
    for _ in 0..ahead.requests {
        let Some(Reverse(t)) = free_at.pop() else { return free_at };
        free_at.push(Reverse(t + each));
    }
    free_at
}

/// The refusal of a call no candidate can serve within its budgets: the best latency and the
/// lowest cost bound any candidate could give.
pub fn unsatisfiable(best_latency_ms: f64, best_cost: f64) -> Error {
    Error::BudgetUnsatisfiable(format!(
        "no model meets the budget: the best predicted latency is {best_latency_ms:.0} ms and the lowest cost \
         bound {best_cost:.6}"
    ))
}

struct Candidate<'a> {
    name: &'a str,
    quality: f64,
    in_mode_tier: bool,
    p: Prediction,
}

impl TierSet {
    /// Chooses the model for `req` from `signals` (rules: module docs of `select`).
    /// `BudgetUnsatisfiable` when candidates exist but none meets both budgets (the best
    /// figures in the message, `unsatisfiable`); `Capacity` when there is none to choose from
    /// (an empty tier, every model cooling down or unloaded).
    pub fn select(&self, req: &RouteRequest, signals: &Signals) -> Result<Selection> {
        let (mode, route) = (req.route.mode(), &req.route);
        let names = self.candidate_names(route.tier)?;
        let mode_tier = match mode {
            Mode::Fixed => route.tier,
            Mode::Balanced => Some(Tier::Balanced),
            Mode::Deep => Some(Tier::Deep),
            Mode::Max => Some(Tier::Max),
        };
        let mut all: Vec<Candidate<'_>> = Vec::with_capacity(names.len());
        for name in names {
            let (Some((facts, sig)), Some(&prompt)) = (signals.models.get(name), req.prompts.get(name)) else {
                continue;
            };
            if sig.available {
                let in_mode_tier = mode_tier.is_some_and(|t| self.models(t).iter().any(|m| m == name));
                let p = predict(facts, sig, prompt, req.max_tokens, route.max_latency_ms);
                all.push(Candidate { name, quality: facts.quality, in_mode_tier, p });
            }
        }
        if all.is_empty() {
            return Err(Error::capacity("every candidate model is cooling down or not loaded"));
        }
        let fits = |c: &Candidate<'_>| {
            route.max_latency_ms.is_none_or(|b| c.p.latency_ms <= b) && route.max_cost.is_none_or(|b| c.p.max_cost <= b)
        };
        let (mut ok, rest): (Vec<_>, Vec<_>) = all.into_iter().partition(fits);
        if ok.is_empty() {
            let best = |f: fn(&Prediction) -> f64| rest.iter().map(|c| f(&c.p)).min_by(f64::total_cmp).unwrap_or(0.0);
            return Err(unsatisfiable(best(|p| p.latency_ms), best(|p| p.max_cost)));
        }
        ok.sort_by(|a, b| rank(mode, a, b));
        let chosen = &ok[0];
        let tier = route
            .tier
            .or(if chosen.in_mode_tier { mode_tier } else { None })
            .or_else(|| self.tiers_of(chosen.name).first().copied())
            .unwrap_or(Tier::Balanced);
        Ok(Selection {
            model: chosen.name.to_string(),
            tier,
            predicted_latency_ms: chosen.p.latency_ms,
            max_cost: chosen.p.max_cost,
            fallbacks: ok[1..].iter().map(|c| c.name.to_string()).collect(),
        })
    }

    /// The models of `tier`, or of every tier (each once, in tier order).
    fn candidate_names(&self, tier: Option<Tier>) -> Result<Vec<&str>> {
        let mut names: Vec<&str> = Vec::new();
        for t in tier.map_or(Tier::ALL.to_vec(), |t| vec![t]) {
            for m in self.models(t) {
                if !names.contains(&m.as_str()) {
                    names.push(m);
                }
            }
        }
        if names.is_empty() {
            let why = match tier {
                Some(t) => format!("tier '{}' has no models", t.as_str()),
                None => "no tiers are configured".to_string(),
            };
            return Err(Error::capacity(why));
        }
        Ok(names)
    }
}

/// The mode's order (module docs): smaller first.
fn rank(mode: Mode, a: &Candidate<'_>, b: &Candidate<'_>) -> Ordering {
    let (pa, pb) = (&a.p, &b.p);
    let by = match mode {
        Mode::Fixed => pa.load.total_cmp(&pb.load).then(pa.latency_ms.total_cmp(&pb.latency_ms)),
        Mode::Balanced => pa
            .max_cost
            .total_cmp(&pb.max_cost)
            .then(b.in_mode_tier.cmp(&a.in_mode_tier))
            .then(pa.latency_ms.total_cmp(&pb.latency_ms)),
        Mode::Deep => b.quality.total_cmp(&a.quality).then(pa.max_cost.total_cmp(&pb.max_cost)),
        Mode::Max => b.quality.total_cmp(&a.quality).then(pa.latency_ms.total_cmp(&pb.latency_ms)),
    };
    by.then(pa.max_cost.total_cmp(&pb.max_cost)).then(pa.latency_ms.total_cmp(&pb.latency_ms)).then(a.name.cmp(b.name))
}
