//! The HTTP routes: `/v1/models`, `/v1/completions`, `/v1/chat/completions`, `/v1/responses`
//! (in `responses`), `/v1/usage`, `/health`, `/ready`, `/metrics`, and an OpenAI-shaped 404
//! for anything else.
//!
//! Data flow of a generation: the bearer key -> the tenant (`auth`) -> body bytes -> `api`
//! parse and checks -> the named engine (404 if the tenant may not use it) ->
//! `Engine::submit_all` (one quota admission for the call, every prompt and sample queued
//! before the first await, so they batch) -> `reply`: one JSON reply, or SSE events.
//! Invariants: every request, however it ends, is counted once in `lmplex_requests`; while
//! draining (after SIGTERM) new generations get 503 and in-flight ones finish.

use crate::api::{self, ChatRequest, CompletionRequest};
use crate::auth;
use crate::error::ApiError;
use crate::generation::GenerationRequest;
use crate::metrics::Metrics;
use crate::render::Kind;
use crate::reply;
use crate::routing::{self, RouteInfo, Target};
use crate::tracker::count_error;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lmplex_engine::{Engine, KeyDigest, ModelHost, ModelState, RequestHandle, Tenant};
use lmplex_route::Tier;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// What every handler shares: the models, the readiness flags, the metrics.
pub struct AppState {
    /// The models served, loaded or not, and their memory budget.
    pub host: ModelHost,
    /// Every configured model name, loaded or still loading.
    pub expected: Vec<String>,
    /// Set once every model has loaded and warmed up; then `/ready` answers 200 (unless draining).
    pub ready: AtomicBool,
    /// Set on the shutdown signal (or a load failure): `/ready` and new generations answer 503.
    pub draining: AtomicBool,
    /// The Prometheus metrics `/metrics` renders.
    pub metrics: Metrics,
    /// The key `/metrics` asks for, if any.
    pub metrics_key: Option<KeyDigest>,
    next_id: AtomicU64,
}

impl AppState {
    /// A state for `host` serving `expected`, not yet ready nor draining.
    pub fn new(host: ModelHost, expected: Vec<String>) -> Self {
        Self {
            host,
            expected,
            ready: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            metrics: Metrics::new(),
            metrics_key: None,
            next_id: AtomicU64::new(0),
        }
    }

    /// The engine serving `model`; a model unloaded for idleness is reloaded first (off the
    /// async threads), and concurrent requests wait for that one reload.
    async fn engine(self: &Arc<Self>, model: &str) -> Result<(String, Arc<Engine>), ApiError> {
        if self.draining.load(Ordering::Acquire) {
            return Err(ApiError::unavailable("the server is shutting down"));
        }
        let started = self.ready.load(Ordering::Acquire);
        match self.host.state(model) {
            Some(ModelState::Ready) => {}
            Some(ModelState::Loading) | None if !started && self.expected.iter().any(|n| n == model) => {
                return Err(ApiError::unavailable(format!(
                    "model `{model}` is still loading: retry when /ready says so"
                )));
            }
            None => return Err(ApiError::model_not_found(model)),
            Some(ModelState::Idle | ModelState::Loading) => {
                let (st, name) = (self.clone(), model.to_string());
                let engine = tokio::task::spawn_blocking(move || {
                    let t = Instant::now();
                    let reloading = st.host.state(&name) == Some(ModelState::Idle);
                    let e = st.host.acquire(&name);
                    if reloading && e.is_ok() {
                        tracing::info!(model = %name, seconds = t.elapsed().as_secs_f64(), "reloaded model");
                    }
                    e
                })
                .await
                .map_err(|e| ApiError::from(lmplex_core::Error::internal(e)))??;
                return Ok((model.to_string(), engine));
            }
        }
        Ok((model.to_string(), self.host.acquire(model)?))
    }

    /// A new response id: `prefix` then the time and a counter, in hex.
    pub(crate) fn new_id(&self, prefix: &str) -> String {
        format!("{prefix}{:x}{:06x}", now(), self.next_id.fetch_add(1, Ordering::Relaxed))
    }
}

pub(crate) fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The server's routes over `state`, with the request-id middleware.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model_object))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/responses", post(crate::responses::create))
        .route("/v1/usage", get(auth::usage))
        .fallback(|uri: Uri| async move { ApiError::not_found_route(uri.path()) })
        .layer(axum::middleware::from_fn(crate::trace::with_request_id))
        .with_state(state)
}

async fn ready(State(st): State<Arc<AppState>>) -> Response {
    if st.ready.load(Ordering::Acquire) && !st.draining.load(Ordering::Acquire) {
        return Json(json!({"status": "ready", "models": st.host.names()})).into_response();
    }
    let status = if st.draining.load(Ordering::Acquire) { "draining" } else { "loading" };
    (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": status}))).into_response()
}

async fn metrics(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if !auth::may_scrape(&st, &headers) {
        return ApiError::unauthorized("/metrics needs the metrics API key").into_response();
    }
    let body = st.metrics.render(&st.host);
    ([("content-type", "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
}

async fn models(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let tenant = match auth::caller(&st, &headers) {
        Ok(t) => t,
        Err(e) => return fail(&st, "", "", e),
    };
    let data: Vec<Value> = st
        .host
        .names()
        .into_iter()
        .filter(|id| tenant.config().may_use(id))
        .map(|id| {
            let max_model_len = st.host.get(&id).map(|e| e.max_model_len());
            json!({"id": id, "object": "model", "created": now(), "owned_by": "lmplex", "max_model_len": max_model_len})
        })
        .collect();
    let mut data = data;
    let tiers = st.host.tiers();
    if !tiers.is_empty() {
        // The routed names: every tier with a model this tenant may use, and `lmplex:auto`.
        let usable = |t: Tier| tiers.models(t).iter().any(|m| tenant.config().may_use(m));
        let routed =
            Tier::ALL.into_iter().filter(|&t| usable(t)).map(|t| format!("{}{}", routing::TIER_PREFIX, t.as_str()));
        for id in std::iter::once(routing::AUTO_MODEL.to_string()).chain(routed) {
            data.push(json!({"id": id, "object": "model", "created": now(), "owned_by": "lmplex"}));
        }
    }
    Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /v1/models/{id}`: one model (or routed name) the caller may use, else 404.
async fn model_object(
    State(st): State<Arc<AppState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
    headers: HeaderMap,
) -> Response {
    let tenant = match auth::caller(&st, &headers) {
        Ok(t) => t,
        Err(e) => return fail(&st, "", "", e),
    };
    let tiers = st.host.tiers();
    let routed = !tiers.is_empty()
        && (id == routing::AUTO_MODEL
            || id
                .strip_prefix(routing::TIER_PREFIX)
                .and_then(|t| Tier::parse(t).ok())
                .is_some_and(|t| tiers.models(t).iter().any(|m| tenant.config().may_use(m))));
    let served = st.host.names().contains(&id) && tenant.config().may_use(&id);
    if !(routed || served) {
        return ApiError::model_not_found(&id).into_response();
    }
    let mut object = json!({"id": id, "object": "model", "created": now(), "owned_by": "lmplex"});
    if let Some(e) = st.host.get(&id) {
        object["max_model_len"] = json!(e.max_model_len());
    }
    Json(object).into_response()
}

/// One API call as it runs: the engine it runs on, under its served name, for a tenant.
pub(crate) struct Call {
    pub model: String,
    pub engine: Arc<Engine>,
    pub tenant: Arc<Tenant>,
    /// For a routed call: how it was routed.
    pub route: Option<RouteInfo>,
    /// When the call arrived.
    pub start: Instant,
}

async fn completions(st: State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    endpoint::<CompletionRequest>(st, headers, body, Kind::Completion).await
}

async fn chat(st: State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    endpoint::<ChatRequest>(st, headers, body, Kind::Chat).await
}

/// `/v1/completions` and `/v1/chat/completions`: authenticate, parse, pick the engine (by
/// name, or routed: `routing`), check, submit, generate.
async fn endpoint<R: GenerationRequest + serde::de::DeserializeOwned>(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
    kind: Kind,
) -> Response {
    let start = Instant::now();
    let tenant = match auth::caller(&st, &headers) {
        Ok(t) => t,
        Err(e) => return fail(&st, "", "", e),
    };
    let req: R = match api::parse(&body) {
        Ok(r) => r,
        Err(e) => return fail(&st, "", tenant.name(), e),
    };
    let shape = match req.common().n().and_then(|n| Ok(reply::Shape { n, extras: req.extras()? })) {
        Ok(s) => s,
        Err(e) => return fail(&st, "", tenant.name(), e),
    };
    let (stream, usage) = (req.common().stream(), req.common().stream_usage());
    match submit(&st, &req, tenant.clone(), start).await {
        Ok((call, handles)) => reply::generate(&st, kind, call, handles, shape, stream, usage).await,
        Err((model, e)) => fail(&st, &model, tenant.name(), e),
    }
}

/// Picks the engine for `req` and queues its requests there; on failure, the model to count
/// the error under and the error.
pub(crate) async fn submit<R: GenerationRequest>(
    st: &Arc<AppState>,
    req: &R,
    tenant: Arc<Tenant>,
    start: Instant,
) -> Result<(Call, Vec<RequestHandle>), (String, ApiError)> {
    let at = |model: &str| {
        let model = model.to_string();
        move |e: ApiError| (model, e)
    };
    let body_route = req.common().lmplex.unwrap_or_default();
    let model = match (req.model(), st.expected.as_slice()) {
        ("", [only]) => only.as_str(),
        ("", served) => {
            let e = format!("`model` is required: this server serves {}", served.join(", "));
            return Err(("".into(), ApiError::invalid_param("model", e)));
        }
        (m, _) => m,
    };
    match routing::target(model, req.common().lmplex).map_err(at(""))? {
        Target::Named(name) => {
            if !tenant.config().may_use(&name) {
                return Err(("".into(), ApiError::model_not_found(&name)));
            }
            let (model, engine) = st.engine(&name).await.map_err(at(&name))?;
            let reqs = req.prepare(engine.max_model_len()).map_err(at(&model))?.requests(&tenant);
            routing::check_named(st, &engine, &body_route, &reqs).map_err(|e| (model.clone(), e.into()))?;
            let handles = engine.submit_all(&reqs).map_err(|e| (model.clone(), e.into()))?;
            Ok((Call { model, engine, tenant, route: None, start }, handles))
        }
        Target::Routed(route) => {
            if st.draining.load(Ordering::Acquire) {
                return Err(("".into(), ApiError::unavailable("the server is shutting down")));
            }
            let reqs = req.prepare(routing::max_model_len(st)).map_err(at(""))?.requests(&tenant);
            let r = routing::submit(st, &route, &reqs).map_err(|e| (String::new(), e.into()))?;
            let info = RouteInfo {
                mode: r.route.mode(),
                tier: r.tier,
                predicted_latency_ms: r.predicted_latency_ms,
                max_cost: r.max_cost,
            };
            let call = Call { model: r.model, engine: r.engine, tenant, route: Some(info), start };
            Ok((call, r.handles))
        }
    }
}

pub(crate) fn fail(st: &AppState, model: &str, tenant: &str, e: ApiError) -> Response {
    count_error(st, model, tenant, &e);
    e.into_response()
}
