//! `TenantConfig`: one tenant of a shared server, as the operator writes it.
//!
//! The one type for this concept: the server TOML's `[[tenants]]` entries deserialize straight
//! into it, Python's `lmplex.Tenant` wraps it (keyword arguments through the same serde derive)
//! and the engine's `Tenants` registry is built from a list of them.
//!
//! Invariants: a `TenantConfig` that passed `validate()` has a non-empty name, at most one of
//! `api_key` and `api_key_sha256` (the digest as 64 hex digits), a finite weight > 0, limits
//! that are positive where set, a finite cost ceiling >= 0 and a positive window; unknown keys
//! are errors naming the key (`deny_unknown_fields`). An API key is never printed: `Debug`
//! shows `api_key: "<redacted>"`.

use crate::{Error, Result};
use serde::{Deserialize, Serialize};

/// One tenant: who it is (name, key), its share of the engine and its quotas.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TenantConfig {
    /// The tenant's name: metrics' `tenant` label, `/v1/usage`, the default prefix-cache salt.
    pub name: String,
    /// The bearer key that authenticates this tenant (plain text; prefer `api_key_sha256`).
    pub api_key: Option<String>,
    /// The SHA-256 of the bearer key, as 64 hex digits (`printf %s KEY | sha256sum`).
    pub api_key_sha256: Option<String>,
    /// Share of the engine under the `fair` policy: a tenant of weight 2 gets twice the
    /// service of a tenant of weight 1 while both are backlogged.
    pub weight: f64,
    /// The served model names this tenant may use; `None` is every model.
    pub models: Option<Vec<String>>,
    /// Default priority of the tenant's requests (lower runs first), under `priority` and as
    /// the first key of `fair`.
    pub priority: i32,
    /// Most requests admitted in any `quota_window_s` window (a sliding window, not a bucket).
    pub requests_per_minute: Option<u64>,
    /// Most tokens admitted in any window: a request reserves its prompt tokens plus its
    /// `max_tokens` when admitted, and gives back what it did not generate when it ends.
    pub tokens_per_minute: Option<u64>,
    /// Most requests in flight at once.
    pub max_concurrency: Option<u64>,
    /// Most money spent per UTC day, at the models' `price_per_million_*_tokens`; a request
    /// reserves its worst case (every `max_tokens` generated) when admitted.
    pub max_cost_per_day: Option<f64>,
    /// Prefix-cache salt: `None` keeps the tenant's cached prompts to itself (salted by its
    /// name); tenants that set the same value share cached prefixes.
    pub cache_salt: Option<String>,
    /// Length of the rate-limit window in seconds (60: the limits are per minute).
    pub quota_window_s: f64,
    /// Default routing (mode, tier, budgets) of the tenant's requests; a request's own
    /// `lmplex` fields win field by field (docs/routing.md).
    pub route: Option<crate::Route>,
}

impl Default for TenantConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            api_key: None,
            api_key_sha256: None,
            weight: 1.0,
            models: None,
            priority: 0,
            requests_per_minute: None,
            tokens_per_minute: None,
            max_concurrency: None,
            max_cost_per_day: None,
            cache_salt: None,
            quota_window_s: 60.0,
            route: None,
        }
    }
}

impl std::fmt::Debug for TenantConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantConfig")
            .field("name", &self.name)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("api_key_sha256", &self.api_key_sha256)
            .field("weight", &self.weight)
            .field("models", &self.models)
            .field("priority", &self.priority)
            .field("requests_per_minute", &self.requests_per_minute)
            .field("tokens_per_minute", &self.tokens_per_minute)
            .field("max_concurrency", &self.max_concurrency)
            .field("max_cost_per_day", &self.max_cost_per_day)
            .field("cache_salt", &self.cache_salt)
            .field("quota_window_s", &self.quota_window_s)
            .field("route", &self.route)
            .finish()
    }
}

impl TenantConfig {
    /// The defaults for a tenant called `name` (no key, weight 1, no quotas).
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into(), ..Self::default() }
    }

    /// The prefix-cache salt of this tenant's requests.
    pub fn salt(&self) -> &str {
        self.cache_salt.as_deref().unwrap_or(&self.name)
    }

    /// Whether the tenant may use the model served as `model`.
    pub fn may_use(&self, model: &str) -> bool {
        self.models.as_ref().is_none_or(|m| m.iter().any(|n| n == model))
    }

    /// Checks every rule the types do not; the error names the tenant and the field.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::invalid(format!("tenant '{}': {m}", self.name)));
        if self.name.trim().is_empty() {
            return Err(Error::invalid("a tenant needs a non-empty name"));
        }
        if self.api_key.is_some() && self.api_key_sha256.is_some() {
            return bad("give api_key or api_key_sha256, not both".into());
        }
        if self.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
            return bad("api_key must not be empty".into());
        }
        if let Some(h) = &self.api_key_sha256 {
            if h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
                return bad("api_key_sha256 must be 64 hex digits (the SHA-256 of the key)".into());
            }
        }
        if !(self.weight.is_finite() && self.weight > 0.0) {
            return bad(format!("weight must be a number > 0, got {}", self.weight));
        }
        let limits = [
            ("requests_per_minute", self.requests_per_minute),
            ("tokens_per_minute", self.tokens_per_minute),
            ("max_concurrency", self.max_concurrency),
        ];
        if let Some((name, _)) = limits.iter().find(|(_, v)| *v == Some(0)) {
            return bad(format!("{name} must be at least 1 (leave it out for no limit)"));
        }
        if let Some(c) = self.max_cost_per_day.filter(|c| !(c.is_finite() && *c >= 0.0)) {
            return bad(format!("max_cost_per_day must be a number >= 0, got {c}"));
        }
        if !(self.quota_window_s.is_finite() && self.quota_window_s > 0.0) {
            return bad(format!("quota_window_s must be a number of seconds > 0, got {}", self.quota_window_s));
        }
        if let Some(Err(e)) = self.route.map(|r| r.validate()) {
            return bad(format!("route: {e}"));
        }
        if self.models.as_ref().is_some_and(|m| m.iter().any(|n| n.trim().is_empty())) {
            return bad("models must not contain an empty name".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_names_the_tenant_and_field() {
        let t = TenantConfig { max_concurrency: Some(0), ..TenantConfig::new("acme") };
        let e = t.validate().unwrap_err().to_string();
        assert_eq!(e, "tenant 'acme': max_concurrency must be at least 1 (leave it out for no limit)");
        let t = TenantConfig { weight: -1.0, ..TenantConfig::new("acme") };
        assert!(t.validate().unwrap_err().to_string().contains("weight"));
        let t = TenantConfig { api_key_sha256: Some("abc".into()), ..TenantConfig::new("acme") };
        assert!(t.validate().unwrap_err().to_string().contains("64 hex digits"));
        TenantConfig::new("acme").validate().unwrap();
    }

    #[test]
    fn debug_never_shows_the_key() {
        let t = TenantConfig { api_key: Some("sk-secret".into()), ..TenantConfig::new("acme") };
        let s = format!("{t:?}");
        assert!(!s.contains("sk-secret") && s.contains("<redacted>"), "{s}");
    }

    #[test]
    fn salt_and_models() {
        let mut t = TenantConfig::new("acme");
        assert_eq!(t.salt(), "acme");
        assert!(t.may_use("any"));
        t.cache_salt = Some("shared".into());
        t.models = Some(vec!["small".into()]);
        assert_eq!(t.salt(), "shared");
        assert!(t.may_use("small") && !t.may_use("big"));
    }
}
