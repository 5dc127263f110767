//! Who is calling: the bearer key -> the tenant, and the routes only a tenant sees
//! (`/v1/usage`).
//!
//! With no key configured (no `api_keys`, no tenant with a key) every caller is the default
//! tenant. With keys, every generation, `/v1/models` and `/v1/usage` needs
//! `Authorization: Bearer KEY`: a missing or unknown key is a 401 `invalid_api_key` (counted
//! under `tenant=""`), a model the tenant may not use is a 404 `model_not_found`, as if it did
//! not exist. `/health` and `/ready` stay open; `/metrics` asks for `metrics_api_key` when set.
//!
//! Invariants: keys are compared as SHA-256 digests in constant time (`Tenants`); neither a key
//! nor a header value is logged or echoed in an error.

use crate::error::{rate_limit_headers, ApiError};
use crate::routes::AppState;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use lmplex_engine::Tenant;
use serde_json::json;
use std::sync::Arc;

/// The key of an `Authorization: Bearer KEY` header.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(axum::http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, key) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| key.trim()).filter(|k| !k.is_empty())
}

/// The calling tenant, or a 401.
pub fn caller(st: &AppState, headers: &HeaderMap) -> Result<Arc<Tenant>, ApiError> {
    let tenants = st.host.tenants();
    if !tenants.has_keys() {
        return tenants.get(None).map_err(ApiError::from);
    }
    let Some(key) = bearer(headers) else {
        return Err(ApiError::unauthorized(
            "You didn't provide an API key. Send it in an Authorization header: `Authorization: Bearer KEY`.",
        ));
    };
    tenants.authenticate(key).ok_or_else(|| ApiError::unauthorized("Incorrect API key provided."))
}

/// Whether `/metrics` may be read with these headers.
pub fn may_scrape(st: &AppState, headers: &HeaderMap) -> bool {
    st.metrics_key.as_ref().is_none_or(|k| bearer(headers).is_some_and(|b| k.matches(b)))
}

/// `GET /v1/usage`: the calling tenant's totals since start and what its quotas have left.
pub async fn usage(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let tenant = match caller(&st, &headers) {
        Ok(t) => t,
        Err(e) => {
            crate::tracker::count_error(&st, "", "", &e);
            return e.into_response();
        }
    };
    let c = tenant.config();
    let (u, q) = (tenant.usage(), tenant.status());
    let window = |l: Option<lmplex_core::LimitStatus>| {
        l.map(|l| json!({"limit": l.limit, "remaining": l.remaining, "reset_seconds": l.reset_s}))
    };
    let body = json!({
        "object": "usage",
        "tenant": tenant.name(),
        "requests": u.requests,
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "cost": u.cost,
        "cost_today": u.cost_today,
        "in_flight": u.in_flight,
        "limits": {
            "requests": window(q.requests),
            "tokens": window(q.tokens),
            "max_concurrency": c.max_concurrency,
            "max_cost_per_day": c.max_cost_per_day,
            "window_seconds": c.quota_window_s,
        },
    });
    let mut r = Json(body).into_response();
    add_headers(&mut r, &tenant);
    r
}

/// Adds the tenant's `x-ratelimit-*` headers to a successful answer.
pub fn add_headers(r: &mut Response, tenant: &Tenant) {
    for (k, v) in rate_limit_headers(&tenant.status()) {
        if let Ok(v) = axum::http::HeaderValue::from_str(&v) {
            r.headers_mut().insert(k, v);
        }
    }
}
