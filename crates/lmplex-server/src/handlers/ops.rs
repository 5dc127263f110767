//! What operators and orchestrators read: `/health` (the process answers), `/ready` (every
//! model loaded and warmed up, not draining, the usage store answering unless it fails open)
//! and `/metrics` (Prometheus text, behind `metrics_api_key` when set).

use crate::caller::may_scrape;
use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// `GET /health`: 200 while the process serves.
pub(crate) async fn health() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

/// `GET /ready`: 200 with the models once all are ready; 503 while loading or draining.
pub(crate) async fn ready(State(st): State<Arc<AppState>>) -> Response {
    if st.ready.load(Ordering::Acquire) && !st.is_draining() {
        let tenants = st.host.tenants();
        return match tenants.check_store() {
            (store, Ok(())) => {
                Json(json!({"status": "ready", "models": st.host.names(), "usage_store": store})).into_response()
            }
            // Fail-open: the server still serves (unmetered), so it stays ready.
            (store, Err(e)) if tenants.store_fails_open() => Json(json!({
                "status": "ready",
                "models": st.host.names(),
                "usage_store": store,
                "usage_store_error": e.to_string(),
                "unmetered": true,
            }))
            .into_response(),
            (store, Err(e)) => {
                let body = json!({"status": "usage store unavailable", "usage_store": store, "error": e.to_string()});
                (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
            }
        };
    }
    let status = if st.is_draining() { "draining" } else { "loading" };
    (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": status}))).into_response()
}

/// `GET /metrics`: the Prometheus text format.
pub(crate) async fn metrics(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if !may_scrape(&st, &headers) {
        return ApiError::unauthorized("/metrics needs the metrics API key").into_response();
    }
    let body = st.metrics.render(&st.host);
    ([("content-type", "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
}
