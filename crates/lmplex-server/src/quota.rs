//! A caller's quota, read before its request's image URLs are fetched: a tenant whose quota
//! refuses any call now (its `requests_per_minute` or `tokens_per_minute` window used up, its
//! `max_concurrency` in flight, its `max_cost_per_day` spent on a priced model) gets the 429 the
//! engine's admission would give, and nothing is fetched for it.
//!
//! The admission itself stays the engine's (`Tenant::admit`, once the prompt's tokens are known,
//! which needs the images): this check refuses only what that admission would refuse for any
//! call, so it never refuses a call that would have been admitted at the same moment.
//!
//! Invariants: read only for a request with image URLs, of a tenant with a quota; the usage
//! store is read off the async threads; a store that cannot be read refuses (503) unless the
//! store fails open (`usage_store_fail_open`), as the admission does.

use crate::error::ApiError;
use crate::state::AppState;
use lmplex_core::{Error, LimitKind, ModelConfig, QuotaStatus, RateLimit};
use lmplex_engine::{Tenant, TenantUsage};
use std::sync::Arc;

/// `Ok` unless `tenant`'s quota refuses any call now; `priced` is the model the call runs on
/// when it is named and charges for tokens (the daily cost is checked only then).
pub(crate) async fn precheck(
    st: &Arc<AppState>,
    tenant: &Arc<Tenant>,
    priced: Option<&ModelConfig>,
) -> Result<(), ApiError> {
    let c = tenant.config();
    let charges =
        priced.is_some_and(|m| m.price_per_million_input_tokens > 0.0 || m.price_per_million_output_tokens > 0.0);
    let cost = c.max_cost_per_day.filter(|_| charges);
    if c.requests_per_minute.is_none() && c.tokens_per_minute.is_none() && c.max_concurrency.is_none() && cost.is_none()
    {
        return Ok(());
    }
    let t = tenant.clone();
    let read = tokio::task::spawn_blocking(move || Ok::<_, Error>((t.status()?, t.usage()?)))
        .await
        .map_err(|e| ApiError::from(Error::internal(e)))?;
    let (status, usage) = match read {
        Ok(read) => read,
        Err(_) if st.host.tenants().store_fails_open() => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    refusal(tenant, &status, &usage, cost).map_or(Ok(()), |r| Err(Error::RateLimited(Box::new(r)).into()))
}

/// What refuses any call of `tenant` now, given its windows and usage (`max_cost` when checked).
fn refusal(tenant: &Tenant, status: &QuotaStatus, usage: &TenantUsage, max_cost: Option<f64>) -> Option<RateLimit> {
    let (c, name) = (tenant.config(), tenant.name());
    let window = c.quota_window_s;
    let limit = |kind, message: String, retry_after_s: f64| RateLimit { message, kind, retry_after_s, status: *status };
    if let Some(max) = c.max_concurrency.filter(|&m| usage.in_flight >= m) {
        let what = format!("tenant '{name}' has {max} requests in flight, its max_concurrency");
        return Some(limit(LimitKind::Concurrency, what, 1.0));
    }
    if let Some(r) = status.requests.filter(|r| r.remaining == 0) {
        let what = format!("tenant '{name}' reached its limit of {} requests per {window} s", r.limit);
        return Some(limit(LimitKind::Requests, what, r.reset_s));
    }
    if let Some(t) = status.tokens.filter(|t| t.remaining == 0) {
        let what = format!("tenant '{name}' has none of its {} tokens per {window} s left", t.limit);
        return Some(limit(LimitKind::Tokens, what, t.reset_s));
    }
    if let Some(max) = max_cost.filter(|&m| usage.cost_today >= m) {
        let what = format!("tenant '{name}' has spent or reserved {:.6} of its {max} a day", usage.cost_today);
        let now = std::time::UNIX_EPOCH.elapsed().map_or(0.0, |d| d.as_secs_f64());
        return Some(limit(LimitKind::Cost, what, 86_400.0 - now % 86_400.0));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmplex_core::{LimitStatus, TenantConfig};

    fn tenant(c: TenantConfig) -> Arc<Tenant> {
        lmplex_engine::Tenants::new(vec![c]).unwrap().get(Some("t")).unwrap()
    }

    /// Each used-up limit refuses with its kind; a window with room, or none, refuses nothing.
    #[test]
    fn a_used_up_limit_refuses_and_room_does_not() {
        let c = TenantConfig {
            requests_per_minute: Some(2),
            tokens_per_minute: Some(100),
            max_concurrency: Some(3),
            max_cost_per_day: Some(1.0),
            ..TenantConfig::new("t")
        };
        let t = tenant(c);
        let window = |remaining| Some(LimitStatus { limit: 2, remaining, reset_s: 7.0 });
        let room =
            QuotaStatus { requests: window(1), tokens: Some(LimitStatus { limit: 100, remaining: 5, reset_s: 7.0 }) };
        let idle = TenantUsage::default();
        assert!(refusal(&t, &room, &idle, Some(1.0)).is_none());
        let busy = TenantUsage { in_flight: 3, ..TenantUsage::default() };
        assert_eq!(refusal(&t, &room, &busy, None).unwrap().kind, LimitKind::Concurrency);
        let spent = QuotaStatus { requests: window(0), ..room };
        let r = refusal(&t, &spent, &idle, None).unwrap();
        assert_eq!((r.kind, r.retry_after_s), (LimitKind::Requests, 7.0));
        assert!(r.message.contains("limit of 2 requests per 60 s"), "{}", r.message);
        let no_tokens = QuotaStatus { tokens: Some(LimitStatus { limit: 100, remaining: 0, reset_s: 3.0 }), ..room };
        assert_eq!(refusal(&t, &no_tokens, &idle, None).unwrap().kind, LimitKind::Tokens);
        let broke = TenantUsage { cost_today: 1.0, ..TenantUsage::default() };
        assert_eq!(refusal(&t, &room, &broke, Some(1.0)).unwrap().kind, LimitKind::Cost);
        assert!(refusal(&t, &room, &broke, None).is_none(), "a free model is not refused for the day's cost");
    }
}
