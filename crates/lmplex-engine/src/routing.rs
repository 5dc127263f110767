//! `ModelHost` routing: a call sent to a tier or to `lmplex:auto` runs on the model
//! `TierSet::select` (lmplex-route) chooses from the host's own live signals.
//!
//! Data flow of `submit_routed`: the caller's `Route`, its unset fields taken from the
//! tenant's default route -> the candidates (the route's tier, or every tiered model; only
//! loaded models the tenant may use) -> per candidate, the call's prompts tokenized by that
//! model with the prefix-cache hits its cache holds (`Engine::prompt_facts`) and the engine's
//! `route_signals` -> `TierSet::select` -> `Engine::submit_all` on the chosen model, then on
//! each fallback in turn if it fails for its own reasons (an internal error starts its
//! cooldown; a full queue just moves on).
//!
//! A call of several prompts (or samples) is predicted as one request of their summed prompt
//! tokens and `max_tokens`: exact for the cost bound, an upper bound for the latency.
//!
//! Invariants: the model that runs the call met both budgets in the snapshot it was chosen
//! from (the chosen one or a fallback, which `select` also checked); a budget is never
//! loosened to find a model: nothing fits is `BudgetUnsatisfiable`; a refusal that is the
//! caller's (invalid request, its tenant's quota) is returned at once, not retried elsewhere.

use crate::engine::{Engine, Request};
use crate::handle::RequestHandle;
use crate::host::{ModelHost, ModelState};
use lmplex_core::{Error, Result};
use lmplex_route::{predict, BudgetError, ModelFacts, ModelSignals, PromptFacts, Route, RouteRequest, Signals};
use lmplex_route::{Tier, TierSet};
use std::sync::{Arc, PoisonError};

/// A routed call: where it runs, why, and its handles.
pub struct Routed {
    /// The served model that runs it.
    pub model: String,
    /// Its engine.
    pub engine: Arc<Engine>,
    /// The request's tier, else the model's first tier.
    pub tier: Tier,
    /// The route in force (the caller's, completed from the tenant's default).
    pub route: Route,
    /// Predicted end-to-end latency on this model, in ms.
    pub predicted_latency_ms: f64,
    /// Upper bound of the call's cost on this model.
    pub max_cost: f64,
    /// Candidates tried before this one (they failed to take the call).
    pub fallbacks: usize,
    /// One handle per request, in order.
    pub handles: Vec<RequestHandle>,
}

/// One candidate as the selection saw it.
struct Candidate {
    engine: Arc<Engine>,
    facts: ModelFacts,
    signals: ModelSignals,
    prompt: PromptFacts,
}

impl ModelHost {
    /// Sets the tiers `submit_routed` chooses from; every named model must be known to the
    /// host (loaded, loading or idle).
    pub fn set_tiers(&self, tiers: TierSet) -> Result<()> {
        let known: Vec<String> = self.known_names();
        let known: Vec<&str> = known.iter().map(String::as_str).collect();
        tiers.validate(&known).map_err(Error::invalid)?;
        *self.tiers.write().unwrap_or_else(PoisonError::into_inner) = tiers;
        Ok(())
    }

    /// The tiers in force (empty until `set_tiers`).
    pub fn tiers(&self) -> TierSet {
        self.tiers.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// `route` with its unset fields from the default route of the tenant of `reqs`.
    pub fn effective_route(&self, route: &Route, reqs: &[Request]) -> Result<Route> {
        let tenant = self.tenants().get(reqs.first().and_then(|r| r.tenant.as_deref()))?;
        let r = route.or(&tenant.config().route.unwrap_or_default());
        r.validate().map_err(Error::invalid)?;
        Ok(r)
    }

    /// The call `reqs` (one call: same tenant) as a routing question for `model`.
    fn candidate(&self, engine: Arc<Engine>, reqs: &[Request]) -> Result<Candidate> {
        let mut prompt = PromptFacts::default();
        for r in reqs {
            let p = engine.prompt_facts(r)?;
            prompt.prompt_tokens += p.prompt_tokens;
            prompt.cached_tokens += p.cached_tokens;
        }
        Ok(Candidate { facts: engine.route_facts(), signals: engine.route_signals(), prompt, engine })
    }

    /// Chooses the model for `reqs` under `route` (completed by `effective_route`) and
    /// submits them there, trying the fallbacks in turn; see the module docs. Errors:
    /// `InvalidRequest` (no tiers, an empty tier, a bad route or prompt), `BudgetUnsatisfiable`
    /// (no model meets the budgets; the best figures in the message), `Capacity` (every
    /// candidate cooling down, unloaded or full), and the engines' own refusals.
    pub fn submit_routed(&self, route: &Route, reqs: &[Request]) -> Result<Routed> {
        let route = &self.effective_route(route, reqs)?;
        let tiers = self.tiers();
        let tenant = self.tenants().get(reqs.first().and_then(|r| r.tenant.as_deref()))?;
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
        let mut cands: Vec<(String, Candidate)> = Vec::new();
        let mut first_error = None;
        for name in names.into_iter().filter(|n| tenant.config().may_use(n)) {
            if cands.iter().any(|(n, _)| n == name) || self.state(name) != Some(ModelState::Ready) {
                continue;
            }
            let Some(engine) = self.get(name) else { continue };
            match self.candidate(engine, reqs) {
                Ok(c) => cands.push((name.clone(), c)),
                Err(e) => first_error = first_error.or(Some(e.with_context(&format!("model '{name}'")))),
            }
        }
        if cands.is_empty() {
            return Err(
                first_error.unwrap_or_else(|| Error::capacity("no model of the route is loaded and usable now"))
            );
        }
        let max_tokens: usize = reqs.iter().map(|r| r.params.max_tokens).sum();
        let rr = RouteRequest {
            route: *route,
            max_tokens,
            prompts: cands.iter().map(|(n, c)| (n.clone(), c.prompt)).collect(),
        };
        let signals =
            Signals { models: cands.iter().map(|(n, c)| (n.clone(), (c.facts.clone(), c.signals))).collect() };
        let sel = tiers.select(&rr, &signals).map_err(|e| match e {
            BudgetError::Unsatisfiable { .. } => Error::BudgetUnsatisfiable(e.to_string()),
            BudgetError::NoCandidate(why) => Error::capacity(why),
        })?;
        let mut last = None;
        for (i, name) in std::iter::once(&sel.model).chain(&sel.fallbacks).enumerate() {
            // `select` names only candidates it was given.
            let Some((_, c)) = cands.iter().find(|(n, _)| n == name) else { continue };
            let p = predict(&c.facts, &c.signals, c.prompt, max_tokens);
            match c.engine.submit_predicted(reqs, Some((p.queue_and_prefill_s, p.time_per_output_token_s))) {
                Ok(handles) => {
                    let tier = route.tier.or(if i == 0 { Some(sel.tier) } else { None });
                    return Ok(Routed {
                        model: name.clone(),
                        engine: c.engine.clone(),
                        tier: tier.or_else(|| tiers.tiers_of(name).first().copied()).unwrap_or(Tier::Balanced),
                        route: *route,
                        predicted_latency_ms: p.latency_ms,
                        max_cost: p.max_cost,
                        fallbacks: i,
                        handles,
                    });
                }
                Err(e @ (Error::Internal(_) | Error::ModelLoad(_))) => {
                    tracing::warn!(model = %name, "routed call failed, trying the next candidate: {e}");
                    c.engine.live_signals().start_cooldown();
                    last = Some(e);
                }
                Err(e @ Error::Capacity(_)) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::internal("a selection has a model")))
    }

    /// Checks a call to the named `engine` against `route`'s budgets (completed by
    /// `effective_route`) and returns its predicted latency (ms) and cost bound;
    /// `BudgetUnsatisfiable` over budget.
    pub fn check_budget(&self, engine: &Arc<Engine>, route: &Route, reqs: &[Request]) -> Result<(f64, f64)> {
        let route = &self.effective_route(route, reqs)?;
        let c = self.candidate(engine.clone(), reqs)?;
        let max_tokens: usize = reqs.iter().map(|r| r.params.max_tokens).sum();
        let p = predict(&c.facts, &c.signals, c.prompt, max_tokens);
        let over_latency = route.max_latency_ms.is_some_and(|b| p.latency_ms > b);
        let over_cost = route.max_cost.is_some_and(|b| p.max_cost > b);
        if over_latency || over_cost {
            let e = BudgetError::Unsatisfiable { best_latency_ms: p.latency_ms, best_cost: p.max_cost };
            return Err(Error::BudgetUnsatisfiable(format!("model '{}': {e}", c.facts.name)));
        }
        Ok((p.latency_ms, p.max_cost))
    }
}
