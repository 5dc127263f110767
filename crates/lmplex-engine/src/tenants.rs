//! `Tenants`: who may call (API keys), whose request it is (fairness share, cache salt) and
//! what each tenant may still spend (quotas), shared by every engine of a host, with each
//! device's service ledger (`ledger`: the fair policy's counters, one per device).
//!
//! Data flow: a caller names a tenant (the server by its bearer key, Python by `tenant=`) ->
//! `Tenants::get` -> `Tenant::admit` checks and charges every quota at once for one call (a
//! call is one API request, however many prompts or samples it has) in the tenant's ledger
//! (`usage`: memory, or a SQLite file, `Tenants::with_store`) -> the `Admission` rides on each
//! of the call's sequences -> when the last of them ends, it settles: the unused tokens return
//! to the window, the concurrency slot frees, the real cost replaces the reserved one.
//!
//! Invariants: keys are kept as SHA-256 digests only and compared in constant time against
//! every tenant's digest (the time does not depend on which tenant, if any, matches); a key or
//! its digest never reaches a log or an error. With no tenant configured, any name is accepted
//! as a tenant of weight 1 without quotas (a fairness group); with tenants configured, an
//! unknown name is an `InvalidRequest`. Requests without a tenant belong to the default
//! tenant `""` (weight 1, no quotas, no salt).

use crate::placement::Placement;
use crate::usage::{Ask, Ledger, Store, UsageStoreSpec};
use lmplex_core::{Error, ModelConfig, QuotaStatus, Result, TenantConfig, Usage};
use lmplex_sched::{DeviceLedger, TenantShare};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use subtle::ConstantTimeEq;

pub use crate::usage::TenantUsage;

/// One configured tenant and its live quota state.
pub struct Tenant {
    config: TenantConfig,
    share: TenantShare,
    digest: Option<[u8; 32]>,
    ledger: Ledger,
    next_admission: AtomicU64,
    /// Fail-open stores only: the host's count of calls let through unmetered while the store
    /// was unavailable (`None`: the store fails closed).
    unmetered: Option<Arc<AtomicU64>>,
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant").field("name", &self.config.name).finish_non_exhaustive()
    }
}

fn digest_of(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// A secret key kept as its SHA-256 only; `matches` compares in constant time.
#[derive(Clone)]
pub struct KeyDigest([u8; 32]);

impl KeyDigest {
    /// The digest of `key`.
    pub fn new(key: &str) -> Self {
        Self(digest_of(key))
    }
    /// Whether `key` is the key, in time independent of where they differ.
    pub fn matches(&self, key: &str) -> bool {
        bool::from(self.0.ct_eq(&digest_of(key)))
    }
}

impl std::fmt::Debug for KeyDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyDigest(<redacted>)")
    }
}

fn hex_digest(h: &str) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&h[2 * i..2 * i + 2], 16).unwrap_or(0); // validated: 64 hex digits
    }
    out
}

impl Tenant {
    fn new(config: TenantConfig, ledger: Ledger) -> Self {
        let digest = match (&config.api_key, &config.api_key_sha256) {
            (Some(k), _) => Some(digest_of(k)),
            (None, Some(h)) => Some(hex_digest(h)),
            (None, None) => None,
        };
        let share = TenantShare { name: Arc::from(config.name.as_str()), weight: config.weight };
        Self { config, share, digest, ledger, next_admission: AtomicU64::new(1), unmetered: None }
    }

    /// The tenant's name (`""` for the default tenant).
    pub fn name(&self) -> &str {
        &self.config.name
    }
    /// Its configuration.
    pub fn config(&self) -> &TenantConfig {
        &self.config
    }
    /// Its fairness share (name and weight) for the scheduler.
    pub fn share(&self) -> &TenantShare {
        &self.share
    }
    /// The prefix-cache salt of its requests (`None` for the default tenant).
    pub fn salt(&self) -> Option<&str> {
        (!self.config.name.is_empty()).then(|| self.config.salt())
    }

    /// The request and token windows now (for the `x-ratelimit-*` headers); an error when the
    /// usage store cannot be read.
    pub fn status(&self) -> Result<QuotaStatus> {
        self.ledger.status(&self.config)
    }

    /// Totals (since start in memory, since the store was made otherwise), and what is in
    /// flight now.
    pub fn usage(&self) -> Result<TenantUsage> {
        self.ledger.usage(&self.config)
    }

    /// Admits one call on `model` of `prompt_tokens` that may generate `max_new_tokens` more,
    /// charging every quota, or refuses it: `RateLimited` (retry later), or `InvalidRequest`
    /// when no window could ever hold it.
    pub fn admit(self: &Arc<Self>, model: &ModelConfig, prompt_tokens: u64, max_new_tokens: u64) -> Result<Admission> {
        if !self.config.may_use(model.served_name()) {
            return Err(Error::invalid(format!(
                "tenant '{}' may not use the model `{}`",
                self.config.name,
                model.served_name()
            )));
        }
        let ask = Ask {
            tokens: prompt_tokens + max_new_tokens,
            cost: model.cost(prompt_tokens as usize, max_new_tokens as usize),
        };
        let id = self.next_admission.fetch_add(1, Ordering::Relaxed);
        let admitted = match (self.ledger.admit(&self.config, id, ask), &self.unmetered) {
            (Err(Error::Unavailable(why)), Some(count)) => {
                count.fetch_add(1, Ordering::Relaxed);
                warn_unmetered(&why);
                None
            }
            (r, _) => Some(r?.map_err(|r| {
                if r.retry_after_s.is_infinite() {
                    Error::invalid(r.message)
                } else {
                    Error::RateLimited(Box::new(r))
                }
            })?),
        };
        Ok(Admission {
            tenant: self.clone(),
            id: admitted.map(|a| a.0),
            ask,
            prices: (model.price_per_million_input_tokens, model.price_per_million_output_tokens),
            used: Mutex::default(),
            status: admitted.map(|a| a.1).unwrap_or_default(),
        })
    }
}

/// Logs that calls pass unmetered, at most once every 10 s (an outage would flood the log).
fn warn_unmetered(why: &str) {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::UNIX_EPOCH.elapsed().map_or(0, |d| d.as_secs());
    let last = LAST.load(Ordering::Relaxed);
    if now >= last + 10 && LAST.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
        tracing::warn!(error = %why, "usage store unavailable: calls pass unmetered (usage_store_fail_open)");
    }
}

/// One admitted call: its reservation, held until every sequence of the call has ended
/// (dropped), then settled against what the sequences really used.
pub struct Admission {
    tenant: Arc<Tenant>,
    /// The reservation; `None` for a call let through unmetered (a fail-open store was down).
    id: Option<u64>,
    ask: Ask,
    prices: (f64, f64),
    used: Mutex<Usage>,
    status: QuotaStatus,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission").field("tenant", &self.tenant.name()).field("id", &self.id).finish()
    }
}

impl Admission {
    /// The tenant it was admitted for.
    pub fn tenant(&self) -> &Arc<Tenant> {
        &self.tenant
    }
    /// The tenant's windows right after this admission.
    pub fn status(&self) -> QuotaStatus {
        self.status
    }
    /// Adds one sequence's tokens to what the call used.
    pub fn record(&self, u: Usage) {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        used.prompt_tokens += u.prompt_tokens;
        used.completion_tokens += u.completion_tokens;
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        let Some(id) = self.id else { return };
        let u = *self.used.get_mut().unwrap_or_else(PoisonError::into_inner);
        let cost = (u.prompt_tokens as f64 * self.prices.0 + u.completion_tokens as f64 * self.prices.1) / 1e6;
        let t = &self.tenant;
        t.ledger.settle(&t.config, id, self.ask, u, cost);
    }
}

/// Every tenant of a host, by name and by key; see the module docs.
#[derive(Debug)]
pub struct Tenants {
    list: Vec<Arc<Tenant>>,
    by_name: HashMap<String, Arc<Tenant>>,
    /// Tenants named by callers when none is configured (fairness groups).
    ad_hoc: Mutex<HashMap<String, Arc<Tenant>>>,
    default: Arc<Tenant>,
    /// Keys that authenticate as the default tenant.
    default_keys: Vec<KeyDigest>,
    /// Lookups by name or key (`num_lookups`).
    lookups: AtomicU64,
    /// Each device's service ledger, shared by the schedulers of the engines on it.
    ledgers: Mutex<HashMap<Placement, Arc<DeviceLedger>>>,
    /// Where the configured tenants' usage is kept (`with_store`).
    store: Store,
    /// Calls let through unmetered by a fail-open store (`with_store`).
    unmetered: Option<Arc<AtomicU64>>,
}

impl Default for Tenants {
    fn default() -> Self {
        Self {
            list: Vec::new(),
            by_name: HashMap::new(),
            ad_hoc: Mutex::default(),
            default: Arc::new(Tenant::new(TenantConfig::default(), Ledger::default())),
            default_keys: Vec::new(),
            lookups: AtomicU64::new(0),
            ledgers: Mutex::default(),
            store: Store::default(),
            unmetered: None,
        }
    }
}

impl Tenants {
    /// The service ledger of device `on`, which every engine on it charges its tenants'
    /// service to (`lmplex_sched::ledger`).
    pub fn ledger(&self, on: Placement) -> Arc<DeviceLedger> {
        self.ledgers.lock().unwrap_or_else(PoisonError::into_inner).entry(on).or_default().clone()
    }

    /// The registry of `configs`: each validated; names and keys unique.
    pub fn new(configs: Vec<TenantConfig>) -> Result<Self> {
        let mut t = Self::default();
        for (i, c) in configs.into_iter().enumerate() {
            c.validate().map_err(|e| e.with_context(&format!("tenant {}", i + 1)))?;
            if t.by_name.contains_key(&c.name) {
                return Err(Error::invalid(format!("two tenants are named '{}'", c.name)));
            }
            let tenant = Arc::new(Tenant::new(c, Ledger::default()));
            if let Some(d) = tenant.digest {
                if let Some(other) = t.list.iter().find(|o| o.digest == Some(d)) {
                    return Err(Error::invalid(format!(
                        "tenants '{}' and '{}' have the same API key",
                        other.name(),
                        tenant.name()
                    )));
                }
            }
            t.by_name.insert(tenant.name().to_string(), tenant.clone());
            t.list.push(tenant);
        }
        Ok(t)
    }

    /// With the configured tenants' usage kept in `store` (in memory until this is called):
    /// opened here, so a bad file is an error now rather than at the first call. While the store
    /// cannot be reached, calls fail with `Unavailable` (fail closed), or with `fail_open` pass
    /// unmetered: admitted without a quota check and never charged (`num_unmetered`).
    pub fn with_store(mut self, store: &UsageStoreSpec, fail_open: bool) -> Result<Self> {
        let longest = self.list.iter().map(|t| t.config.quota_window_s).fold(0.0, f64::max);
        let store = Store::open(store, longest)?;
        self.unmetered = fail_open.then(Arc::default);
        for t in &mut self.list {
            let mut tenant = Tenant::new(t.config.clone(), store.ledger());
            tenant.digest = t.digest;
            tenant.unmetered.clone_from(&self.unmetered);
            *t = Arc::new(tenant);
            self.by_name.insert(t.name().to_string(), t.clone());
        }
        self.store = store;
        Ok(self)
    }

    /// The usage store's kind (`memory`, `sqlite`, `redis`) and, unless it answers now, why not
    /// (for `/ready`).
    pub fn check_store(&self) -> (&'static str, Result<()>) {
        (self.store.kind(), self.store.check())
    }

    /// The usage store's documents (the server's stored responses) when it is shared (SQLite,
    /// Redis); `None` with the memory store.
    pub fn documents(&self) -> Option<crate::usage::Documents> {
        crate::usage::Documents::of(&self.store)
    }

    /// Whether calls pass unmetered while the store cannot be reached (`with_store`).
    pub fn store_fails_open(&self) -> bool {
        self.unmetered.is_some()
    }

    /// Calls let through unmetered so far (a fail-open store was unavailable).
    pub fn num_unmetered(&self) -> u64 {
        self.unmetered.as_ref().map_or(0, |n| n.load(Ordering::Relaxed))
    }

    /// With `keys` that authenticate as the default tenant (no quotas); a key that is also a
    /// tenant's is refused.
    pub fn with_default_keys(mut self, keys: &[String]) -> Result<Self> {
        for k in keys {
            if k.trim().is_empty() {
                return Err(Error::invalid("an API key must not be empty"));
            }
            if let Some(t) = self.authenticate(k) {
                return Err(Error::invalid(format!("tenant '{}' has the same key as a plain API key", t.name())));
            }
            self.default_keys.push(KeyDigest::new(k));
        }
        Ok(self)
    }

    /// Whether no tenant is configured.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
    /// The configured tenants, in order.
    pub fn list(&self) -> &[Arc<Tenant>] {
        &self.list
    }
    /// Whether any tenant has an API key (then the server asks every caller for one).
    pub fn has_keys(&self) -> bool {
        !self.default_keys.is_empty() || self.list.iter().any(|t| t.digest.is_some())
    }

    /// The tenant whose key is `key` (the default tenant for a plain key), comparing against
    /// every key's digest in constant time.
    pub fn authenticate(&self, key: &str) -> Option<Arc<Tenant>> {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        let d = digest_of(key);
        let mut found = None;
        for t in &self.list {
            let hit = t.digest.map_or(subtle::Choice::from(0), |td| td.ct_eq(&d));
            if bool::from(hit) {
                found = Some(t.clone());
            }
        }
        for k in &self.default_keys {
            if bool::from(k.0.ct_eq(&d)) {
                found = Some(self.default.clone());
            }
        }
        found
    }

    /// Tenants looked up so far (`get` and `authenticate`): one per call at its edge, for
    /// tests and diagnostics.
    pub fn num_lookups(&self) -> u64 {
        self.lookups.load(Ordering::Relaxed)
    }

    /// Tenant `name`; `None` is the default tenant. Unknown names: see the module docs.
    pub fn get(&self, name: Option<&str>) -> Result<Arc<Tenant>> {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        let Some(name) = name.filter(|n| !n.is_empty()) else { return Ok(self.default.clone()) };
        if let Some(t) = self.by_name.get(name) {
            return Ok(t.clone());
        }
        if !self.is_empty() {
            return Err(Error::invalid(format!("unknown tenant '{name}'")));
        }
        let mut ad_hoc = self.ad_hoc.lock().unwrap_or_else(PoisonError::into_inner);
        let group = || Arc::new(Tenant::new(TenantConfig::new(name), Ledger::default()));
        Ok(ad_hoc.entry(name.to_string()).or_insert_with(group).clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyed(name: &str, key: &str) -> TenantConfig {
        TenantConfig { api_key: Some(key.into()), ..TenantConfig::new(name) }
    }

    #[test]
    fn keys_authenticate_by_digest_and_duplicates_are_refused() {
        let sha = "a7a2d37c3f4d3dbd5ab0b4b4bcd0b5e3c6f3e8d0b9f2e0c1d4b5a69788796a5b".to_string();
        let with_hash = TenantConfig { api_key_sha256: Some(sha), ..TenantConfig::new("h") };
        let t = Tenants::new(vec![keyed("a", "sk-a"), keyed("b", "sk-b"), with_hash]).unwrap();
        assert_eq!(t.authenticate("sk-b").unwrap().name(), "b");
        assert!(t.authenticate("sk-c").is_none() && t.authenticate("").is_none());
        let e = Tenants::new(vec![keyed("a", "k"), keyed("b", "k")]).unwrap_err().to_string();
        assert_eq!(e, "tenants 'a' and 'b' have the same API key");
        let e = Tenants::new(vec![keyed("a", "k1"), keyed("a", "k2")]).unwrap_err().to_string();
        assert_eq!(e, "two tenants are named 'a'");
        let hashed = TenantConfig { api_key_sha256: Some(hex(&digest_of("sk-h"))), ..TenantConfig::new("h") };
        assert_eq!(Tenants::new(vec![hashed]).unwrap().authenticate("sk-h").unwrap().name(), "h");
    }

    fn hex(d: &[u8; 32]) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn unknown_names_are_groups_only_without_configured_tenants() {
        let open = Tenants::default();
        assert_eq!(open.get(Some("team-1")).unwrap().share().weight, 1.0);
        assert_eq!(open.get(None).unwrap().name(), "");
        let closed = Tenants::new(vec![TenantConfig::new("a")]).unwrap();
        assert_eq!(closed.get(Some("b")).unwrap_err().to_string(), "unknown tenant 'b'");
    }

    #[test]
    fn an_admission_settles_when_dropped() {
        let cfg = TenantConfig { tokens_per_minute: Some(100), max_concurrency: Some(1), ..TenantConfig::new("a") };
        let t = Tenants::new(vec![cfg]).unwrap().get(Some("a")).unwrap();
        let model = ModelConfig { price_per_million_output_tokens: 2e6, ..ModelConfig::new("m") };
        let a = t.admit(&model, 10, 50).unwrap();
        assert!(matches!(t.admit(&model, 1, 1), Err(Error::RateLimited(_))), "max_concurrency 1");
        a.record(Usage {
            prompt_tokens: 10,
            completion_tokens: 5,
            cached_tokens: 0,
            reasoning_tokens: 0,
            cache_created_tokens: 0,
        });
        drop(a);
        let u = t.usage().unwrap();
        assert_eq!((u.requests, u.prompt_tokens, u.completion_tokens, u.in_flight), (1, 10, 5, 0));
        assert!((u.cost - 10.0).abs() < 1e-9, "5 output tokens at 2 each: {}", u.cost);
        assert_eq!(t.status().unwrap().tokens.unwrap().remaining, 85);
        let e = t.admit(&model, 90, 20).unwrap_err();
        assert!(matches!(e, Error::InvalidRequest(_)), "110 tokens never fit 100: {e}");
    }
}
