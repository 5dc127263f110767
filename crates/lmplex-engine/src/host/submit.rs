//! `ModelHost::submit`: a `Call` runs on the model it names, or on the model `TierSet::select`
//! (lmplex-route) chooses from the host's own live signals. The server and Python both come
//! here, so "named or routed" is decided once.
//!
//! Data flow of a routed call: the `Call`'s route (already completed from its tenant's default)
//! -> the candidates (the route's tier, or every tiered model; only loaded models the tenant
//! may use; a LoRA adapter as its parent model under that adapter) -> per candidate, the call prepared by that engine (`Engine::prepare`: rendered and
//! tokenized once) with the prefix-cache hits its cache holds and its `route_signals` ->
//! `TierSet::select` -> the chosen candidate's `Prepared` submitted, then each fallback's in turn
//! if it fails for its own reasons (an internal error starts its cooldown; a full queue just
//! moves on). A named call is predicted too, and checked against its budgets if any.
//! Either way the call carries its uncalibrated prediction, which the step loop measures it
//! against (`crate::signals`' calibration), and a latency budget becomes its deadline in the
//! scheduler (`Engine::prepare`).
//!
//! A call of several prompts (or samples) is predicted as one request of their summed prompt
//! tokens and `max_tokens`: exact for the cost bound, an upper bound for the latency.
//!
//! Calls are predicted and queued one at a time (`ModelHost::submitting`, held from reading the
//! signals to the call's place in a queue, after preparing), so calls that arrive together each
//! see the others' queued work instead of all predicting the same empty queue.
//!
//! Invariants: the model that runs the call met both budgets in the snapshot it was chosen
//! from (the chosen one or a fallback, which `select` also checked); a budget is never
//! loosened to find a model: nothing fits is `BudgetUnsatisfiable`; a refusal that is the
//! caller's (invalid request, its tenant's quota) is returned at once, not retried elsewhere;
//! a call is rendered once per candidate and never looks its tenant up.

use crate::call::Call;
use crate::engine::{Engine, Prepared};
use crate::handle::RequestHandle;
use crate::host::{ModelHost, ModelState};
use lmplex_core::{Error, Result, Route, Tier};
use lmplex_route::{busy_s, predict, unsatisfiable, ModelSignals, Prediction, RouteRequest, Signals, TierSet};
use std::sync::{Arc, PoisonError};

/// Where a call runs: a served model by name, or where the router chooses under the call's route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A served model, by name.
    Named(String),
    /// The router's choice under the call's route.
    Routed,
}

/// A submitted call: where it runs, its handles, and for a routed call how it was routed.
pub struct Submitted {
    /// The served model that runs it.
    pub model: String,
    /// Its engine.
    pub engine: Arc<Engine>,
    /// One handle per sequence (request x sample), in order.
    pub handles: Vec<RequestHandle>,
    /// How a routed call was routed; `None` for a named one.
    pub routed: Option<Routed>,
}

/// How a routed call was routed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Routed {
    /// The call's tier, else the chosen model's first.
    pub tier: Tier,
    /// Predicted end-to-end latency on the model that runs it, in ms.
    pub predicted_latency_ms: f64,
    /// Upper bound of the call's cost on that model.
    pub max_cost: f64,
    /// Candidates tried before it (they failed to take the call).
    pub fallbacks: usize,
}

/// One candidate as the selection saw it.
struct Candidate {
    name: String,
    engine: Arc<Engine>,
    prepared: Prepared,
}

impl ModelHost {
    /// Sets the tiers routed calls choose from; every named model must be known to the host
    /// (loaded, loading or idle), or be one of their LoRA adapters.
    pub fn set_tiers(&self, tiers: TierSet) -> Result<()> {
        let mut known: Vec<String> = self.known_names();
        known.extend(self.entries().values().flat_map(|e| e.config.lora_modules.keys().cloned()));
        let known: Vec<&str> = known.iter().map(String::as_str).collect();
        tiers.validate(&known)?;
        *self.tiers.write().unwrap_or_else(PoisonError::into_inner) = tiers;
        Ok(())
    }

    /// The tiers in force (empty until `set_tiers`).
    pub fn tiers(&self) -> TierSet {
        self.tiers.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Runs `call` on `target`: a named model (waiting while it loads, reloading it if idle,
    /// and checking the call's budgets, if any, against its prediction) or the router's choice
    /// (module docs). Errors: `InvalidRequest` (an unknown model, no tiers, an empty tier, a
    /// bad prompt), `BudgetUnsatisfiable` (no model meets the budgets; the best figures in the
    /// message), `Capacity` (every candidate cooling down, unloaded or full), and the engines'
    /// own refusals.
    pub fn submit(&self, call: &Call, target: &Target) -> Result<Submitted> {
        let Target::Named(name) = target else { return self.submit_routed(call) };
        // An adapter runs on its parent model.
        let (engine, mut prepared) = match self.adapter_parent(name) {
            Some(parent) => {
                let engine = self.acquire(&parent)?;
                let prepared = engine.prepare_under(call, Some(name))?;
                (engine, prepared)
            }
            None => {
                let engine = self.acquire(name)?;
                let prepared = engine.prepare(call)?;
                (engine, prepared)
            }
        };
        let _submitting = self.submitting.lock().unwrap_or_else(PoisonError::into_inner);
        let signals = signals_on_device(&engine, &self.device_loads());
        let p = check(&engine, &signals, &prepared, call.route())?;
        trace_prediction(name, &signals, &p, false);
        prepared.set_prediction(p);
        let handles = engine.submit_prepared(prepared)?;
        Ok(Submitted { model: name.clone(), engine, handles, routed: None })
    }

    /// The named `engine`'s predicted latency (ms) and cost bound for `call`;
    /// `BudgetUnsatisfiable` when over the call's budgets.
    pub fn check_budget(&self, engine: &Engine, call: &Call) -> Result<(f64, f64)> {
        let signals = signals_on_device(engine, &self.device_loads());
        let p = check(engine, &signals, &engine.prepare(call)?, call.route())?;
        Ok((p.latency_ms, p.max_cost))
    }

    /// Every loaded engine with the seconds it stays busy with the work it holds
    /// (`lmplex_route::busy_s`), read once per call.
    fn device_loads(&self) -> Vec<(Arc<Engine>, f64)> {
        let engines: Vec<Arc<Engine>> = self.entries().values().filter_map(|e| e.engine.clone()).collect();
        engines
            .into_iter()
            .map(|e| {
                let busy = busy_s(&e.route_signals());
                (e, busy)
            })
            .collect()
    }

    fn submit_routed(&self, call: &Call) -> Result<Submitted> {
        let (route, tiers) = (call.route(), self.tiers());
        let names: Vec<&String> = match route.tier {
            Some(t) => tiers.models(t).iter().collect(),
            None => Tier::ALL.iter().flat_map(|&t| tiers.models(t)).collect(),
        };
        if names.is_empty() {
            return Err(Error::invalid(match route.tier {
                Some(t) => format!("tier '{}' has no models", t.as_str()),
                None => "no tiers are configured: name a model, or configure [tiers]".into(),
            }));
        }
        let mut cands: Vec<Candidate> = Vec::new();
        let mut first_error = None;
        for name in names.into_iter().filter(|n| call.tenant().config().may_use(n)) {
            // An adapter runs on its parent model, with the parent's signals.
            let parent = self.adapter_parent(name);
            let model = parent.as_deref().unwrap_or(name);
            if cands.iter().any(|c| &c.name == name) || self.state(model) != Some(ModelState::Ready) {
                continue;
            }
            let Some(engine) = self.get(model) else { continue };
            match engine.prepare_under(call, parent.is_some().then_some(name.as_str())) {
                Ok(prepared) => cands.push(Candidate { name: name.clone(), engine, prepared }),
                Err(e) => first_error = first_error.or(Some(e.with_context(&format!("model '{name}'")))),
            }
        }
        if cands.is_empty() {
            return Err(
                first_error.unwrap_or_else(|| Error::capacity("no model of the route is loaded and usable now"))
            );
        }
        let max_tokens = cands[0].prepared.max_tokens();
        let mut rr = RouteRequest { route: *route, max_tokens, prompts: Default::default() };
        let _submitting = self.submitting.lock().unwrap_or_else(PoisonError::into_inner);
        let (mut signals, loads) = (Signals::default(), self.device_loads());
        for c in &cands {
            rr.prompts.insert(c.name.clone(), c.engine.prompt_facts(&c.prepared));
            signals.models.insert(c.name.clone(), (c.engine.route_facts(), signals_on_device(&c.engine, &loads)));
        }
        let sel = tiers.select(&rr, &signals).inspect_err(|_| {
            for (name, (facts, sig)) in &signals.models {
                let p = predict(facts, sig, rr.prompts[name], max_tokens, route.max_latency_ms);
                trace_prediction(name, sig, &p, true);
            }
        })?;
        let mut last = None;
        for (i, name) in std::iter::once(&sel.model).chain(&sel.fallbacks).enumerate() {
            // `select` names only candidates it was given, each once.
            let Some(at) = cands.iter().position(|c| &c.name == name) else { continue };
            let Candidate { name, engine, mut prepared } = cands.swap_remove(at);
            let (facts, sig) = &signals.models[&name];
            let p = predict(facts, sig, rr.prompts[&name], max_tokens, route.max_latency_ms);
            trace_prediction(&name, sig, &p, false);
            prepared.set_prediction(p);
            match engine.submit_prepared(prepared) {
                Ok(handles) => {
                    let tier = route.tier.or(if i == 0 { Some(sel.tier) } else { None });
                    let tier = tier.or_else(|| tiers.tiers_of(&name).first().copied()).unwrap_or(Tier::Balanced);
                    let routed =
                        Routed { tier, predicted_latency_ms: p.latency_ms, max_cost: p.max_cost, fallbacks: i };
                    return Ok(Submitted { model: name, engine, handles, routed: Some(routed) });
                }
                Err(e @ (Error::Internal(_) | Error::ModelLoad(_))) => {
                    tracing::warn!(model = %name, "routed call failed, trying the next candidate: {e}");
                    engine.live_signals().start_cooldown();
                    last = Some(e);
                }
                Err(e @ Error::Capacity(_)) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::internal("a selection has a model")))
    }
}

/// `engine`'s signals, with the time the other models on its device stay busy (from `loads`,
/// `ModelHost::device_loads`).
fn signals_on_device(engine: &Engine, loads: &[(Arc<Engine>, f64)]) -> ModelSignals {
    let mut s = engine.route_signals();
    s.device.others_busy_s = (loads.iter())
        .filter(|(e, _)| !std::ptr::eq(e.as_ref(), engine) && e.shares_device_with(engine))
        .map(|(_, busy)| busy)
        .sum();
    s
}

/// `engine`'s prediction for `prepared` under its `signals`, or `BudgetUnsatisfiable` when over
/// `route`'s budgets.
fn check(engine: &Engine, signals: &ModelSignals, prepared: &Prepared, route: &Route) -> Result<Prediction> {
    let facts = engine.route_facts();
    let p = predict(&facts, signals, engine.prompt_facts(prepared), prepared.max_tokens(), route.max_latency_ms);
    let over_latency = route.max_latency_ms.is_some_and(|b| p.latency_ms > b);
    let over_cost = route.max_cost.is_some_and(|b| p.max_cost > b);
    if over_latency || over_cost {
        let e = unsatisfiable(p.latency_ms, p.max_cost);
        return Err(Error::BudgetUnsatisfiable(format!("model '{}': {e}", engine.config().served_name())));
    }
    Ok(p)
}

/// The prediction a call runs under, or that `refused` it, with the signals it came from (debug
/// level, target `lmplex::route`; the step loop logs the same `fixed_s` and `tpot_s` with what
/// they measured).
fn trace_prediction(model: &str, s: &ModelSignals, p: &Prediction, refused: bool) {
    tracing::debug!(
        target: "lmplex::route",
        model,
        refused,
        fixed_s = p.queue_and_prefill_s,
        tpot_s = p.time_per_output_token_s,
        latency_ms = p.latency_ms,
        running = s.num_running,
        waiting = s.num_waiting,
        shared_factor = s.device.shared_factor,
        others_busy_s = s.device.others_busy_s,
        guarded_s = s.device.guarded_s,
        calibration = s.calibration,
        batch_size = s.batch_size,
        step_s_per_seq = s.step_s_per_seq,
        measured_tpot_s = s.time_per_output_token_s,
        "a call is predicted to take {:.0} ms",
        p.latency_ms,
    );
}
