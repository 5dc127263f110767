//! A generation call submitted: the `model` it names (a served model, or routed:
//! `"lmplex:auto"`, `"tier:NAME"`) and the `lmplex` body object (`{"mode", "tier",
//! "max_latency_ms", "max_cost"}`, the openai client's `extra_body`) -> one engine `Call` for
//! the caller's tenant -> `ModelHost::submit`, which decides named or routed once.
//!
//! A routed call runs where the host chooses; its response names that model and carries
//! `x-lmplex-tier`, `x-lmplex-predicted-latency-ms` and `x-lmplex-max-cost`. A call to a named
//! model with a budget (its own or its tenant's default) is checked against that model's
//! prediction. Either way, a budget no model can meet is a 400 with
//! `"code": "budget_unsatisfiable"` and the best figures in the message.
//!
//! Invariants: every routed call counts once, in `lmplex_route_decisions` (it ran) or in
//! `lmplex_route_refusals` (it did not); a fallback also counts in `lmplex_route_fallbacks`; a
//! named call counts in `lmplex_route_refusals` when its budget refuses it. No image URL is
//! fetched before the call is authorized (`media`); preparing and queueing the call (image
//! decoding and the vision tower included) runs on a blocking thread, never an async worker.

use crate::api::GenerationRequest;
use crate::error::ApiError;
use crate::media::{fetch_images, ImageLimit, WithImages};
use crate::metrics::{DecisionLabel, ModelLabel, RefusalLabel};
use crate::outcomes::Running;
use crate::quota;
use crate::state::AppState;
use axum::http::HeaderValue;
use axum::response::Response;
use lmplex_core::{Error, Mode, Route, Tier};
use lmplex_engine::{Call, Engine, RequestHandle, Routed, Submitted, Target, Tenant};
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

/// The model name that asks the router to choose among every tier.
pub const AUTO_MODEL: &str = "lmplex:auto";
/// The prefix of a model name that asks for one tier (`tier:fast`).
pub const TIER_PREFIX: &str = "tier:";

/// The target of `model` and the route it asks for (the body's, with the name's tier); a 400
/// names a bad tier.
fn target(model: &str, body: Option<Route>) -> Result<(Target, Route), ApiError> {
    let mut route = body.unwrap_or_default();
    if model == AUTO_MODEL {
        return Ok((Target::Routed, route));
    }
    let Some(name) = model.strip_prefix(TIER_PREFIX) else { return Ok((Target::Named(model.to_string()), route)) };
    let tier = Tier::parse(name).map_err(|e| ApiError::invalid_param("model", e.to_string()))?;
    if route.tier.is_some_and(|t| t != tier) {
        return Err(ApiError::invalid_param(
            "lmplex.tier",
            format!("lmplex.tier '{}' conflicts with the model '{model}'", route.tier.map_or("", Tier::as_str)),
        ));
    }
    route.tier = Some(tier);
    Ok((Target::Routed, route))
}

/// The routed model names `tenant` may call: `lmplex:auto` and each tier with a model it may
/// use; none when no tier names a model.
pub(crate) fn routed_names(st: &AppState, tenant: &Tenant) -> Vec<String> {
    let tiers = st.host.tiers();
    if tiers.is_empty() {
        return Vec::new();
    }
    let usable = |t: Tier| tiers.models(t).iter().any(|m| tenant.config().may_use(m));
    let routed = Tier::ALL.into_iter().filter(|&t| usable(t)).map(|t| format!("{TIER_PREFIX}{}", t.as_str()));
    std::iter::once(AUTO_MODEL.to_string()).chain(routed).collect()
}

/// The longest context of any model a routed call may run on (for chat's default `max_tokens`).
fn max_model_len(st: &AppState) -> usize {
    st.host.names().iter().filter_map(|n| st.host.get(n)).map(|e| e.max_model_len()).max().unwrap_or(0)
}

/// Picks the engine for `req`, fetches its image URLs, and queues its requests there; on
/// failure, the model to count the error under and the error.
///
/// Order: the model resolved and authorized (the tenant may use it; served, not draining) ->
/// for a request with image URLs, the tenant's quota read (`quota::precheck`) and the URLs
/// fetched, at most the model's `limit_mm_per_prompt.image` (`media`) -> the call prepared and
/// submitted (`ModelHost::submit`: images decoded and encoded by the vision tower, then admitted)
/// on a blocking thread, off the async workers.
pub(crate) async fn submit<R: GenerationRequest + WithImages>(
    st: &Arc<AppState>,
    req: &mut R,
    tenant: Arc<Tenant>,
    start: Instant,
) -> Result<(Running, Vec<RequestHandle>), (String, ApiError)> {
    let at = |model: &str| {
        let model = model.to_string();
        move |e: ApiError| (model, e)
    };
    let model = model_or_only(st, req.model()).map_err(at(""))?.to_string();
    let (target, route) = target(&model, req.common().lmplex).map_err(at(""))?;
    let (name, engine) = match &target {
        Target::Named(name) => {
            if !tenant.config().may_use(name) {
                return Err(("".into(), ApiError::model_not_found(name)));
            }
            (name.clone(), Some(st.engine(name).await.map_err(at(name))?))
        }
        Target::Routed if st.is_draining() => return Err(("".into(), ApiError::draining())),
        Target::Routed => (String::new(), None),
    };
    if !req.image_urls().is_empty() {
        let limit = match &engine {
            Some(e) => ImageLimit { most: e.config().limit_mm_per_prompt.image, of: format!("the model '{name}'") },
            None => routed_image_limit(st, &tenant, &model, &route),
        };
        quota::precheck(st, &tenant, engine.as_ref().map(|e| e.config())).await.map_err(at(&name))?;
        fetch_images(&st.media, req, &limit).await.map_err(at(&name))?;
    }
    let max_len = engine.as_ref().map_or_else(|| max_model_len(st), |e| e.max_model_len());
    let samples = req.prepare(max_len).map_err(at(&name))?;
    let call = samples.call(tenant.clone(), &route);
    let call = match &target {
        Target::Named(_) => call.map_err(|e| (name.clone(), e.into()))?,
        Target::Routed => call.inspect_err(|e| refused(st, route.mode(), e)).map_err(|e| (name.clone(), e.into()))?,
    };
    let (call, submitted) = submit_blocking(st, call, target.clone()).await.map_err(at(&name))?;
    let submitted = submitted.map_err(|e| {
        if target == Target::Routed || matches!(e, Error::BudgetUnsatisfiable(_)) {
            refused(st, call.route().mode(), &e);
        }
        (name.clone(), e.into())
    })?;
    if let Some(r) = &submitted.routed {
        decided(st, call.route().mode(), r, &submitted.model);
    }
    let max_latency = call.route().max_latency_ms.map(|ms| Duration::from_secs_f64(ms.max(0.0) / 1e3));
    let (model, engine, routed) = (submitted.model, submitted.engine, submitted.routed);
    let running = Running { model, engine, tenant, routed, max_latency, start };
    Ok((running, submitted.handles))
}

/// `ModelHost::submit` of `call` on a blocking thread: preparing it decodes its images and runs
/// the vision tower (CPU work of many milliseconds), which must not hold an async worker.
async fn submit_blocking(
    st: &Arc<AppState>,
    call: Call,
    target: Target,
) -> Result<(Call, lmplex_core::Result<Submitted>), ApiError> {
    let st = st.clone();
    tokio::task::spawn_blocking(move || {
        let submitted = st.host.submit(&call, &target);
        (call, submitted)
    })
    .await
    .map_err(|e| ApiError::from(Error::internal(e)))
}

/// The image limit of a routed call: the largest `limit_mm_per_prompt.image` of the models its
/// route (with the tenant's default) may run on that the tenant may use; 0 when there is none.
fn routed_image_limit(st: &AppState, tenant: &Tenant, model: &str, route: &Route) -> ImageLimit {
    let tiers = st.host.tiers();
    let tier = route.or(&tenant.config().route.unwrap_or_default()).tier;
    let asked = tier.map_or_else(|| Tier::ALL.to_vec(), |t| vec![t]);
    let names: Vec<String> =
        asked.into_iter().flat_map(|t| tiers.models(t).to_vec()).filter(|m| tenant.config().may_use(m)).collect();
    let most = names.iter().filter_map(|m| image_limit_of(st, m)).max().unwrap_or(0);
    let which = if names.is_empty() { "none: no tier lists a model this caller may use" } else { "the largest" };
    ImageLimit { most, of: format!("the models '{model}' may run on ({which})") }
}

/// `limit_mm_per_prompt.image` of the served model (or adapter) `name`: the config's, else its
/// loaded engine's.
fn image_limit_of(st: &AppState, name: &str) -> Option<usize> {
    st.image_limits.get(name).copied().or_else(|| {
        let parent = st.host.adapter_parent(name);
        st.host.get(parent.as_deref().unwrap_or(name)).map(|e| e.config().limit_mm_per_prompt.image)
    })
}

/// The model a call names, or the server's only one when it names none.
fn model_or_only<'a>(st: &'a AppState, model: &'a str) -> Result<&'a str, ApiError> {
    match (model, st.expected.as_slice()) {
        ("", [only]) => Ok(only.as_str()),
        ("", served) => {
            let e = format!("`model` is required: this server serves {}", served.join(", "));
            Err(ApiError::invalid_param("model", e))
        }
        (m, _) => Ok(m),
    }
}

/// The served model `model` names for `tenant` and its engine, ready, for a route (`what`) that
/// needs one model's tokenizer: a routed name is a 400, a model the tenant may not use a 404.
pub(crate) async fn named_engine(
    st: &Arc<AppState>,
    tenant: &Tenant,
    model: &str,
    what: &str,
) -> Result<(String, Arc<Engine>), (String, ApiError)> {
    let model = model_or_only(st, model).map_err(|e| (String::new(), e))?;
    match target(model, None).map_err(|e| (String::new(), e))?.0 {
        Target::Named(name) if tenant.config().may_use(&name) => {
            let engine = st.engine(&name).await.map_err(|e| (name.clone(), e))?;
            Ok((name, engine))
        }
        Target::Named(name) => Err((String::new(), ApiError::model_not_found(&name))),
        Target::Routed => {
            let e = format!("{what} needs a served model's name, not a routed one ('{model}')");
            Err((String::new(), ApiError::invalid_param("model", e)))
        }
    }
}

/// Counts a routed call that ran, and whether it ran on a fallback.
fn decided(st: &AppState, mode: Mode, r: &Routed, model: &str) {
    let label = DecisionLabel { mode: mode.as_str().into(), tier: r.tier.as_str().into(), model: model.into() };
    st.metrics.route_decisions.get_or_create(&label).inc();
    if r.fallbacks > 0 {
        st.metrics.route_fallbacks.get_or_create(&ModelLabel { model: model.into() }).inc();
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

/// Adds `x-lmplex-budget-overrun-ms` when the call is past its latency budget as its headers
/// go out (a whole reply that overran; a stream's headers go out before it could).
pub(crate) fn add_overrun_header(r: &mut Response, call: &Running) {
    if let Some(v) = call.overrun().and_then(|d| HeaderValue::from_str(&format!("{:.1}", d.as_secs_f64() * 1e3)).ok()) {
        r.headers_mut().insert("x-lmplex-budget-overrun-ms", v);
    }
}

/// Adds a routed call's `x-lmplex-*` headers.
pub(crate) fn add_route_headers(r: &mut Response, routed: &Routed) {
    let h = r.headers_mut();
    h.insert("x-lmplex-tier", HeaderValue::from_static(routed.tier.as_str()));
    for (k, v) in [
        ("x-lmplex-predicted-latency-ms", format!("{:.1}", routed.predicted_latency_ms)),
        ("x-lmplex-max-cost", format!("{:.9}", routed.max_cost)),
    ] {
        if let Ok(v) = HeaderValue::from_str(&v) {
            h.insert(k, v);
        }
    }
}
