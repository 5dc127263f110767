//! Routed calls over HTTP: `"model": "lmplex:auto"` or `"tier:NAME"`, and the `lmplex` body
//! object (`{"mode", "tier", "max_latency_ms", "max_cost"}`, the openai client's `extra_body`).
//!
//! A routed call runs where `ModelHost::submit_routed` chooses; its response names that model
//! and carries `x-lmplex-tier`, `x-lmplex-predicted-latency-ms` and `x-lmplex-max-cost`. A
//! call to a named model with a budget (its own or its tenant's default) is checked against
//! that model's prediction. Either way, a budget no model can meet is a 400 with
//! `"code": "budget_unsatisfiable"` and the best figures in the message.
//!
//! Invariants: every routed call counts once, in `lmplex_route_decisions` (it ran) or in
//! `lmplex_route_refusals` (it did not); a fallback also counts in `lmplex_route_fallbacks`.

use crate::error::ApiError;
use crate::metrics::{DecisionLabel, ModelLabel, RefusalLabel};
use crate::routes::AppState;
use axum::http::HeaderValue;
use axum::response::Response;
use lmplex_core::Error;
use lmplex_engine::{Engine, Request, Routed};
use lmplex_route::{Mode, Route, Tier};
use std::sync::Arc;

/// The model name that asks the router to choose among every tier.
pub const AUTO_MODEL: &str = "lmplex:auto";
/// The prefix of a model name that asks for one tier (`tier:fast`).
pub const TIER_PREFIX: &str = "tier:";

/// What a call's `model` asks for.
pub enum Target {
    /// A served model, by name.
    Named(String),
    /// The router's choice under this route (the body's, with the name's tier).
    Routed(Route),
}

/// The target of `model` with the body's `lmplex` object; a 400 names a bad tier.
pub fn target(model: &str, body: Option<Route>) -> Result<Target, ApiError> {
    let mut route = body.unwrap_or_default();
    if model == AUTO_MODEL {
        return Ok(Target::Routed(route));
    }
    let Some(name) = model.strip_prefix(TIER_PREFIX) else { return Ok(Target::Named(model.to_string())) };
    let tier = Tier::parse(name).map_err(|e| ApiError::invalid_param("model", e))?;
    if route.tier.is_some_and(|t| t != tier) {
        return Err(ApiError::invalid_param(
            "lmplex.tier",
            format!("lmplex.tier '{}' conflicts with the model '{model}'", route.tier.map_or("", Tier::as_str)),
        ));
    }
    route.tier = Some(tier);
    Ok(Target::Routed(route))
}

/// What the response and the metrics say about a routed call.
#[derive(Debug, Clone)]
pub struct RouteInfo {
    /// The mode in force.
    pub mode: Mode,
    /// The call's tier, else the chosen model's first.
    pub tier: Tier,
    /// The router's predicted latency, in ms.
    pub predicted_latency_ms: f64,
    /// The call's cost bound on the chosen model.
    pub max_cost: f64,
}

impl RouteInfo {
    /// Adds the `x-lmplex-*` headers.
    pub fn add_headers(&self, r: &mut Response) {
        let h = r.headers_mut();
        h.insert("x-lmplex-tier", HeaderValue::from_static(self.tier.as_str()));
        for (k, v) in [
            ("x-lmplex-predicted-latency-ms", format!("{:.1}", self.predicted_latency_ms)),
            ("x-lmplex-max-cost", format!("{:.9}", self.max_cost)),
        ] {
            if let Ok(v) = HeaderValue::from_str(&v) {
                h.insert(k, v);
            }
        }
    }
}

/// Counts a call the router (or a budget check) refused.
fn refused(st: &AppState, mode: Mode, e: &Error) {
    let reason = match e {
        Error::BudgetUnsatisfiable(_) => "budget_unsatisfiable".to_string(),
        other => ApiError::from(other.clone()).status.as_u16().to_string(),
    };
    st.metrics.route_refusals.get_or_create(&RefusalLabel { mode: mode.as_str().into(), reason }).inc();
}

/// The longest context of any model a routed call may run on (for chat's default `max_tokens`).
pub fn max_model_len(st: &AppState) -> usize {
    st.host.names().iter().filter_map(|n| st.host.get(n)).map(|e| e.max_model_len()).max().unwrap_or(0)
}

/// Submits a routed call and counts the decision (or the refusal).
pub fn submit(st: &AppState, route: &Route, reqs: &[Request]) -> Result<Routed, Error> {
    match st.host.submit_routed(route, reqs) {
        Ok(r) => {
            let label = DecisionLabel {
                mode: r.route.mode().as_str().into(),
                tier: r.tier.as_str().into(),
                model: r.model.clone(),
            };
            st.metrics.route_decisions.get_or_create(&label).inc();
            if r.fallbacks > 0 {
                st.metrics.route_fallbacks.get_or_create(&ModelLabel { model: r.model.clone() }).inc();
            }
            Ok(r)
        }
        Err(e) => {
            // The mode in force, for the label: the tenant's default fills an unset one.
            let mode = st.host.effective_route(route, reqs).map_or(route.mode(), |r| r.mode());
            refused(st, mode, &e);
            Err(e)
        }
    }
}

/// Checks a call to a named model against the budget in force, if any (counted when refused).
pub fn check_named(st: &AppState, engine: &Arc<Engine>, route: &Route, reqs: &[Request]) -> Result<(), Error> {
    let effective = st.host.effective_route(route, reqs)?;
    if !effective.has_budget() {
        return Ok(());
    }
    st.host.check_budget(engine, route, reqs).map(|_| ()).inspect_err(|e| refused(st, effective.mode(), e))
}
