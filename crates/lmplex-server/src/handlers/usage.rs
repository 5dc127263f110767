//! `GET /v1/usage`: the calling tenant's totals (from its usage store) and what its quotas have
//! left.

use crate::caller::{add_rate_limit_headers, Caller};
use crate::replies::{UsageLimits, UsageReport, Window};
use crate::state::AppState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::sync::Arc;

/// The handler.
#[utoipa::path(get, path = "/v1/usage", tag = "tenants", responses((status = 200, body = UsageReport)))]
pub(crate) async fn usage(State(_): State<Arc<AppState>>, Caller(tenant): Caller) -> Response {
    let c = tenant.config();
    let (u, q) = match (tenant.usage(), tenant.status()) {
        (Ok(u), Ok(q)) => (u, q),
        (Err(e), _) | (_, Err(e)) => return crate::error::ApiError::from(e).into_response(),
    };
    let window = |l: Option<lmplex_core::LimitStatus>| {
        l.map(|l| Window { limit: l.limit, remaining: l.remaining, reset_seconds: l.reset_s })
    };
    let body = UsageReport {
        object: "usage",
        tenant: tenant.name().to_string(),
        requests: u.requests,
        prompt_tokens: u.prompt_tokens,
        completion_tokens: u.completion_tokens,
        total_tokens: u.prompt_tokens + u.completion_tokens,
        cost: u.cost,
        cost_today: u.cost_today,
        in_flight: u.in_flight,
        limits: UsageLimits {
            requests: window(q.requests),
            tokens: window(q.tokens),
            max_concurrency: c.max_concurrency,
            max_cost_per_day: c.max_cost_per_day,
            window_seconds: c.quota_window_s,
        },
    };
    let mut r = Json(body).into_response();
    add_rate_limit_headers(&mut r, &tenant);
    r
}
