//! How each request ends, in the metrics: `Running` (a call as it runs), `Tracker` (one
//! request's outcome, latencies, tokens, cost, whether it overran its latency budget and, for
//! a routed call, the ratio of its latency to the router's prediction, as its chunks go by), and `count_error`/`fail` for calls that
//! fail before they run.
//!
//! Invariant: every request is counted once in `lmplex_requests`, however it ends (a tracker
//! dropped before the last chunk counts as `abort`).

use crate::error::ApiError;
use crate::metrics::{ModelLabel, OutcomeLabel, RequestLabel};
use crate::state::AppState;
use axum::response::{IntoResponse, Response};
use lmplex_core::StreamChunk;
use lmplex_engine::{Engine, Routed, Tenant};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One API call as it runs: the engine it runs on, under its served name, for a tenant.
pub(crate) struct Running {
    pub model: String,
    pub engine: Arc<Engine>,
    pub tenant: Arc<Tenant>,
    /// For a routed call: how it was routed.
    pub routed: Option<Routed>,
    /// The call's latency budget, if it has one.
    pub max_latency: Option<Duration>,
    /// When the call arrived.
    pub start: Instant,
}

impl Running {
    /// How far past its latency budget the call is now, if it is.
    pub(crate) fn overrun(&self) -> Option<Duration> {
        self.max_latency.and_then(|b| self.start.elapsed().checked_sub(b)).filter(|d| !d.is_zero())
    }
}

/// Counts one request's outcome, latencies and tokens as its chunks go by.
pub(crate) struct Tracker {
    st: Arc<AppState>,
    label: RequestLabel,
    /// Prices per token, input and output.
    prices: (f64, f64),
    /// The router's predicted latency of a routed call, in seconds.
    predicted_s: Option<f64>,
    /// The call's latency budget.
    max_latency: Option<Duration>,
    start: Instant,
    last: Option<Instant>,
    /// Counted already (set by a caller that counts the failure itself).
    finished: bool,
}

impl Tracker {
    pub(crate) fn new(st: &Arc<AppState>, call: &Running) -> Self {
        let c = call.engine.config();
        Self {
            st: st.clone(),
            label: RequestLabel { model: call.model.clone(), tenant: call.tenant.name().to_string() },
            prices: (c.price_per_million_input_tokens / 1e6, c.price_per_million_output_tokens / 1e6),
            predicted_s: call.routed.as_ref().map(|r| r.predicted_latency_ms / 1e3),
            max_latency: call.max_latency,
            start: call.start,
            last: None,
            finished: false,
        }
    }
    fn label(&self) -> RequestLabel {
        self.label.clone()
    }
    pub(crate) fn chunk(&mut self, c: &StreamChunk) {
        let m = &self.st.metrics;
        let t = Instant::now();
        if let Some(q) = c.queue_time_s {
            m.queue_time.get_or_create(&self.label()).observe(q);
        }
        if !c.token_ids.is_empty() {
            match self.last {
                None => m.ttft.get_or_create(&self.label()).observe((t - self.start).as_secs_f64()),
                Some(prev) => {
                    let per = (t - prev).as_secs_f64() / c.token_ids.len() as f64;
                    for _ in 0..c.token_ids.len() {
                        m.inter_token.get_or_create(&self.label()).observe(per);
                    }
                }
            }
            self.last = Some(t);
            m.generation_tokens.get_or_create(&self.label()).inc_by(c.token_ids.len() as u64);
        }
        if let (Some(f), Some(u)) = (c.finish_reason, c.usage) {
            m.prompt_tokens.get_or_create(&self.label()).inc_by(u.prompt_tokens as u64);
            let cost = u.prompt_tokens as f64 * self.prices.0 + u.completion_tokens as f64 * self.prices.1;
            m.cost.get_or_create(&self.label()).inc_by(cost);
            let e2e = self.start.elapsed().as_secs_f64();
            m.e2e.get_or_create(&self.label()).observe(e2e);
            if self.max_latency.is_some_and(|b| e2e > b.as_secs_f64()) {
                m.route_budget_overruns.get_or_create(&self.label()).inc();
            }
            if let Some(p) = self.predicted_s.filter(|&p| p > 0.0) {
                let l = ModelLabel { model: self.label.model.clone() };
                m.route_latency_ratio.get_or_create(&l).observe(e2e / p);
            }
            self.finish(f.as_str());
        }
    }
    /// Marks the request counted already (its caller counts the failure itself).
    pub(crate) fn counted(&mut self) {
        self.finished = true;
    }
    fn finish(&mut self, outcome: &str) {
        if !self.finished {
            self.finished = true;
            let l = OutcomeLabel {
                model: self.label.model.clone(),
                tenant: self.label.tenant.clone(),
                outcome: outcome.to_string(),
            };
            self.st.metrics.requests.get_or_create(&l).inc();
        }
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.finish("abort"); // the client went away or the stream failed
    }
}

/// Counts a failed request under its model (`""` if not served) and tenant.
pub(crate) fn count_error(st: &AppState, model: &str, tenant: &str, e: &ApiError) {
    let model = if st.host.state(model).is_some() { model } else { "" };
    let l =
        OutcomeLabel { model: model.to_string(), tenant: tenant.to_string(), outcome: e.status.as_u16().to_string() };
    st.metrics.requests.get_or_create(&l).inc();
}

/// Counts a failed request (`count_error`) and answers it.
pub(crate) fn fail(st: &AppState, model: &str, tenant: &str, e: ApiError) -> Response {
    count_error(st, model, tenant, &e);
    e.into_response()
}
