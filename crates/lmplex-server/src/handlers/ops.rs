//! What operators and orchestrators read: `/health` (the process answers), `/ready` (every
//! model loaded and warmed up, not draining, the usage store answering unless it fails open)
//! and `/metrics` (Prometheus text, behind `metrics_api_key` when set).

use crate::caller::may_scrape;
use crate::error::ApiError;
use crate::replies::{Health, Readiness};
use crate::state::AppState;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// `GET /health`: 200 while the process serves.
#[utoipa::path(get, path = "/health", tag = "operations", responses((status = 200, body = Health)))]
pub(crate) async fn health() -> Response {
    Json(Health { status: "ok" }).into_response()
}

/// `GET /ready`: 200 with the models once all are ready; 503 while loading or draining.
#[utoipa::path(get, path = "/ready", tag = "operations", responses(
    (status = 200, description = "Every model is loaded and warm", body = Readiness),
    (status = 503, description = "Loading, draining, or the usage store does not answer", body = Readiness),
))]
pub(crate) async fn ready(State(st): State<Arc<AppState>>) -> Response {
    if st.ready.load(Ordering::Acquire) && !st.is_draining() {
        let tenants = st.host.tenants();
        let (store, checked) = tenants.check_store();
        let ready = Readiness {
            status: "ready",
            models: Some(st.host.names()),
            usage_store: Some(store.to_string()),
            ..Readiness::default()
        };
        return match checked {
            Ok(()) => Json(ready).into_response(),
            // Fail-open: the server still serves (unmetered), so it stays ready.
            Err(e) if tenants.store_fails_open() => {
                Json(Readiness { usage_store_error: Some(e.to_string()), unmetered: Some(true), ..ready })
                    .into_response()
            }
            Err(e) => {
                let body =
                    Readiness { status: "usage store unavailable", models: None, error: Some(e.to_string()), ..ready };
                (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
            }
        };
    }
    let status = if st.is_draining() { "draining" } else { "loading" };
    (StatusCode::SERVICE_UNAVAILABLE, Json(Readiness { status, ..Readiness::default() })).into_response()
}

/// `GET /metrics`: the Prometheus text format.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses(
    (status = 200, description = "Prometheus text format", content_type = "text/plain", body = String),
))]
pub(crate) async fn metrics(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if !may_scrape(&st, &headers) {
        return ApiError::unauthorized("/metrics needs the metrics API key").into_response();
    }
    let body = st.metrics.render(&st.host);
    ([("content-type", "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
}

/// `GET /openapi.json`: this document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations", responses(
    (status = 200, description = "The OpenAPI 3.1 document of every route", body = Object),
))]
pub(crate) async fn openapi(Extension(doc): Extension<Arc<str>>) -> Response {
    ([("content-type", "application/json")], doc.to_string()).into_response()
}
