//! Who is calling: the key (`Authorization: Bearer KEY`, or Anthropic's `x-api-key: KEY`) ->
//! the tenant, as an axum extractor (`Caller`), and the headers a tenant's answers carry.
//!
//! With no key configured (no `api_keys`, no tenant with a key) every caller is the default
//! tenant. With keys, every generation, `/v1/models` and `/v1/usage` needs
//! `Authorization: Bearer KEY`: a missing or unknown key is a 401 `invalid_api_key` (counted
//! under `tenant=""`), a model the tenant may not use is a 404 `model_not_found`, as if it did
//! not exist. `/health` and `/ready` stay open; `/metrics` asks for `metrics_api_key` when set.
//!
//! Invariants: the tenant is looked up once per call, here, and carried from then on; keys are
//! compared as SHA-256 digests in constant time (`Tenants`); neither a key nor a header value
//! is logged or echoed in an error.

use crate::error::{rate_limit_headers, ApiError};
use crate::outcomes::fail;
use crate::state::AppState;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::HeaderMap;
use axum::response::Response;
use lmplex_engine::Tenant;
use std::sync::Arc;

/// The calling tenant, resolved from the request's bearer key (a 401 when it names none).
pub(crate) struct Caller(pub Arc<Tenant>);

impl FromRequestParts<Arc<AppState>> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, st: &Arc<AppState>) -> Result<Self, Response> {
        caller(st, &parts.headers).map(Caller).map_err(|e| fail(st, "", "", e))
    }
}

/// The key of an `Authorization: Bearer KEY` header.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(axum::http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, key) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| key.trim()).filter(|k| !k.is_empty())
}

/// The caller's key: `Authorization: Bearer KEY`, else `x-api-key: KEY` (Anthropic's header).
fn api_key(headers: &HeaderMap) -> Option<&str> {
    let x_api_key = || headers.get("x-api-key")?.to_str().ok().map(str::trim).filter(|k| !k.is_empty());
    bearer(headers).or_else(x_api_key)
}

/// The calling tenant, or a 401.
pub(crate) fn caller(st: &AppState, headers: &HeaderMap) -> Result<Arc<Tenant>, ApiError> {
    let tenants = st.host.tenants();
    if !tenants.has_keys() {
        return tenants.get(None).map_err(ApiError::from);
    }
    let Some(key) = api_key(headers) else {
        return Err(ApiError::unauthorized(
            "You didn't provide an API key. Send it in an Authorization header (`Authorization: Bearer KEY`) \
             or as `x-api-key: KEY`.",
        ));
    };
    tenants.authenticate(key).ok_or_else(|| ApiError::unauthorized("Incorrect API key provided."))
}

/// Whether `/metrics` may be read with these headers.
pub(crate) fn may_scrape(st: &AppState, headers: &HeaderMap) -> bool {
    st.metrics_key.as_ref().is_none_or(|k| bearer(headers).is_some_and(|b| k.matches(b)))
}

/// Adds the tenant's `x-ratelimit-*` headers to a successful answer (none when its usage store
/// cannot be read now: the answer stands).
pub(crate) fn add_rate_limit_headers(r: &mut Response, tenant: &Tenant) {
    let Ok(status) = tenant.status() else { return };
    for (k, v) in rate_limit_headers(&status) {
        if let Ok(v) = axum::http::HeaderValue::from_str(&v) {
            r.headers_mut().insert(k, v);
        }
    }
}
