//! `ServerConfig`: what `lmplex serve` loads, from a TOML file or the command line.
//!
//! ```toml
//! host = "127.0.0.1"          # default
//! port = 8000                 # default; 0 picks a free port
//! memory_budget_bytes = 8e9   # optional; CPU models' budget; default: the memory available at start
//! gpu_memory_utilization = 0.9  # optional; share of each CUDA device its models may reserve
//!
//! [[models]]                  # each entry is a lmplex_core::ModelConfig, same keys
//! model_id = "/models/SmolLM2-135M-Instruct-Q4_1.gguf"  # a .gguf file or an HF folder
//! served_model_name = "smollm2"  # (or `name`) the `model` clients ask for; default: model_id
//! max_model_len = 2048
//! keep_alive_s = 300          # optional: unload after this long idle, reload on next use
//!
//! api_keys = ["sk-admin"]     # optional: keys of the default tenant (no quotas)
//! metrics_api_key = "sk-prom" # optional: /metrics asks for this key
//! allowed_media_domains = ["images.example.com"]  # optional: hosts whose image URLs are fetched
//! media_fetch_timeout_s = 5   # optional: longest one image's fetch may take
//! max_concurrent_media_fetches = 16  # optional: most image fetches in flight at once, server-wide
//! scheduling_policy = "fair"  # optional: for models that set none (default: fair with tenants)
//!
//! [[tenants]]                 # each entry is a lmplex_core::TenantConfig, same keys
//! name = "acme"
//! api_key_sha256 = "…"        # or api_key = "…"
//! weight = 2
//! requests_per_minute = 600
//! route = { mode = "balanced", max_latency_ms = 2000 }  # optional default route
//!
//! [tiers]                     # optional: served names per tier, for "lmplex:auto" and "tier:NAME"
//! fast = ["smollm2"]
//! deep = ["qwen-coder"]
//! ```
//!
//! Invariants: unknown keys are errors naming the key and its line (a typo never silently
//! falls back to a default); served names are unique; every model and tenant passed
//! `validate()`; tenant names and keys are unique; a config that fails any of this starts
//! nothing.

use axum::http::{HeaderName, HeaderValue, Method};
use lmplex_core::{Error, ModelConfig, Result, SchedulingPolicy, TenantConfig};
use lmplex_route::TierSet;
use serde::Deserialize;
use tower_http::cors::{AllowHeaders, AllowMethods, AllowOrigin, Any, CorsLayer};

/// The whole server: where it listens, its memory budget and its models.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to bind.
    #[serde(default = "default_host")]
    pub host: String,
    /// Port to bind; 0 picks a free one.
    #[serde(default = "default_port")]
    pub port: u16,
    /// Memory the CPU's models share; `None` is the memory available at start.
    pub memory_budget_bytes: Option<f64>,
    /// Share (0, 1] of each CUDA device's memory its models may reserve; `None` is 0.9.
    pub gpu_memory_utilization: Option<f64>,
    /// The `[[models]]` entries, in order.
    pub models: Vec<ModelConfig>,
    /// The `[[tenants]]` entries: who may call, their shares and quotas.
    #[serde(default)]
    pub tenants: Vec<TenantConfig>,
    /// Keys of the default tenant (`--api-key`, `LMPLEX_API_KEY`); with any key configured,
    /// every generation and model listing asks for one.
    #[serde(default)]
    pub api_keys: Vec<String>,
    /// The key `/metrics` asks for; `None` leaves it open.
    pub metrics_api_key: Option<String>,
    /// The policy of models whose config sets none.
    pub scheduling_policy: Option<SchedulingPolicy>,
    /// Served model names per tier, for routed calls (`lmplex:auto`, `tier:NAME`).
    #[serde(default)]
    pub tiers: TierSet,
    /// Where tenants' usage is kept: `"memory"` (lost on restart), or `"sqlite:PATH"` (kept
    /// across restarts, shared by every server on the file; a relative `PATH` is taken from the
    /// config file's folder). Unset: `memory`, except that `lmplex serve --config FILE` with
    /// tenants keeps it in `FILE`'s name with `.usage.sqlite` (`default_usage_store`).
    pub usage_store: Option<String>,
    /// Seconds a server's in-flight reservations stay held without its heartbeat (a crashed
    /// server's calls are then charged their reservations); default 30.
    pub usage_lease_s: Option<f64>,
    /// While the usage store cannot be reached (Redis down, the SQLite file unwritable): `false`
    /// (the default) answers calls 503 with `Retry-After` (fail closed); `true` lets them through
    /// unmetered, logged and counted in `lmplex_usage_unmetered_requests_total` (fail open).
    #[serde(default)]
    pub usage_store_fail_open: bool,
    /// Most responses the Responses API keeps (`store`, for `GET /v1/responses/{id}` and
    /// `previous_response_id`), in memory; 0 keeps none. Default 10,000.
    pub max_stored_responses: Option<usize>,
    /// Seconds a stored response is kept; default 86,400 (a day).
    pub stored_responses_ttl_s: Option<f64>,
    /// The folder relative paths of the config are taken from (set by the edge that read the
    /// file; not a TOML key).
    #[serde(skip)]
    pub config_dir: Option<std::path::PathBuf>,
    /// Origins whose pages may call the server (CORS); empty (the default) sends no CORS
    /// headers; `"*"` allows any origin.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// Methods allowed cross-origin; empty: `GET`, `POST`, `OPTIONS`; `"*"`: any.
    #[serde(default)]
    pub allowed_methods: Vec<String>,
    /// Request headers allowed cross-origin; empty or `"*"`: any.
    #[serde(default)]
    pub allowed_headers: Vec<String>,
    /// Largest request body in bytes (413 past it); default 32 MiB.
    pub max_request_body_bytes: Option<usize>,
    /// Seconds a request's headers may take (the connection is closed past it), and longest
    /// pause while its body arrives (408 past it); default 30.
    pub request_read_timeout_s: Option<f64>,
    /// Most connections open at once (past it, 503 with `Retry-After`); default 1024.
    pub max_connections: Option<usize>,
    /// Hosts whose `http(s)` image URLs the server fetches (vLLM's `--allowed-media-domains`;
    /// exact host names, any case); empty (the default) fetches none (`crate::media`).
    #[serde(default)]
    pub allowed_media_domains: Vec<String>,
    /// Seconds one image URL's fetch may take, waiting for a turn and connection to last byte;
    /// default 5.
    pub media_fetch_timeout_s: Option<f64>,
    /// Most image URL fetches in flight at once, across every request; default 16.
    pub max_concurrent_media_fetches: Option<usize>,
}

fn default_host() -> String {
    "127.0.0.1".into()
}
fn default_port() -> u16 {
    8000
}

impl ServerConfig {
    /// A server on the default address for `models`.
    pub fn new(models: Vec<ModelConfig>) -> Self {
        Self {
            host: default_host(),
            port: default_port(),
            memory_budget_bytes: None,
            gpu_memory_utilization: None,
            models,
            tenants: Vec::new(),
            api_keys: Vec::new(),
            metrics_api_key: None,
            scheduling_policy: None,
            tiers: TierSet::default(),
            allowed_origins: Vec::new(),
            allowed_methods: Vec::new(),
            allowed_headers: Vec::new(),
            usage_store: None,
            usage_lease_s: None,
            usage_store_fail_open: false,
            max_stored_responses: None,
            stored_responses_ttl_s: None,
            config_dir: None,
            max_request_body_bytes: None,
            request_read_timeout_s: None,
            max_connections: None,
            allowed_media_domains: Vec::new(),
            media_fetch_timeout_s: None,
            max_concurrent_media_fetches: None,
        }
    }

    /// Parses and validates a TOML config.
    pub fn from_toml(text: &str) -> Result<Self> {
        let c: Self = toml::from_str(text).map_err(|e| Error::invalid(format!("server config: {e}")))?;
        c.validate()?;
        Ok(c)
    }

    /// Checks what the types do not: at least one model, unique names, valid models and budget.
    pub fn validate(&self) -> Result<()> {
        if self.models.is_empty() {
            return Err(Error::invalid("server config: no [[models]] to serve"));
        }
        let mut names: Vec<&str> = self.models.iter().map(ModelConfig::served_name).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::invalid(format!("server config: two models are named '{}'", w[0])));
        }
        for m in &self.models {
            m.validate().map_err(|e| e.with_context(&format!("server config, model '{}'", m.served_name())))?;
        }
        if self.memory_budget_bytes.is_some_and(|b| b.is_nan() || b <= 0.0) {
            return Err(Error::invalid("server config: memory_budget_bytes must be positive"));
        }
        if let Some(u) = self.gpu_memory_utilization.filter(|u| !(*u > 0.0 && *u <= 1.0)) {
            return Err(Error::invalid(format!("server config: gpu_memory_utilization must be in (0, 1], got {u}")));
        }
        if self.metrics_api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
            return Err(Error::invalid("server config: metrics_api_key must not be empty"));
        }
        // Tiers and a tenant's `models` may name LoRA adapters, each served as a model of its own.
        let served = self.models.iter().map(ModelConfig::served_name);
        let adapters = self.models.iter().flat_map(|m| m.lora_modules.keys().map(String::as_str));
        let mut usable: Vec<&str> = served.chain(adapters).collect();
        usable.sort_unstable();
        if let Some(w) = usable.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::invalid(format!("server config: two models or LoRA adapters are named '{}'", w[0])));
        }
        self.tiers.validate(&usable).map_err(|e| Error::invalid(format!("server config: {e}")))?;
        for t in &self.tenants {
            if let Some(m) = t.models.iter().flatten().find(|m| usable.binary_search(&m.as_str()).is_err()) {
                return Err(Error::invalid(format!(
                    "server config: tenant '{}' names the model '{m}', which is not served",
                    t.name
                )));
            }
        }
        self.cors()?;
        if let Some(t) = self.stored_responses_ttl_s.filter(|t| !(t.is_finite() && *t > 0.0)) {
            return Err(Error::invalid(format!("server config: stored_responses_ttl_s must be positive, got {t}")));
        }
        self.usage_store_spec()?;
        self.limits()?;
        self.media_policy()?;
        self.build_tenants().map(|_| ())
    }

    /// The client limits, each checked (positive) or defaulted (`crate::limits`).
    pub fn limits(&self) -> Result<crate::limits::Limits> {
        use crate::limits::*;
        let positive =
            [("max_request_body_bytes", self.max_request_body_bytes), ("max_connections", self.max_connections)];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == Some(0)) {
            return Err(Error::invalid(format!("server config: {name} must be at least 1, got 0")));
        }
        let timeout = self.request_read_timeout_s.unwrap_or(DEFAULT_REQUEST_READ_TIMEOUT_S);
        if !(timeout.is_finite() && timeout > 0.0) {
            return Err(Error::invalid(format!(
                "server config: request_read_timeout_s must be positive, got {timeout}"
            )));
        }
        Ok(Limits {
            max_request_body_bytes: self.max_request_body_bytes.unwrap_or(DEFAULT_MAX_REQUEST_BODY_BYTES),
            request_read_timeout: std::time::Duration::from_secs_f64(timeout),
            max_connections: self.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS),
        })
    }

    /// What image URLs are fetched (`allowed_media_domains`, `media_fetch_timeout_s`,
    /// `max_concurrent_media_fetches`), checked.
    pub fn media_policy(&self) -> Result<crate::media::MediaPolicy> {
        use crate::media::{MediaPolicy, DEFAULT_MAX_CONCURRENT_MEDIA_FETCHES, DEFAULT_MEDIA_FETCH_TIMEOUT_S};
        let timeout = self.media_fetch_timeout_s.unwrap_or(DEFAULT_MEDIA_FETCH_TIMEOUT_S);
        let most = self.max_concurrent_media_fetches.unwrap_or(DEFAULT_MAX_CONCURRENT_MEDIA_FETCHES);
        MediaPolicy::new(&self.allowed_media_domains, timeout)
            .and_then(|p| p.with_max_concurrent(most))
            .map_err(|e| Error::invalid(format!("server config: {e}")))
    }

    /// Each served name's `limit_mm_per_prompt.image` (a LoRA adapter's is its parent's), for the
    /// image URLs a request to it may give before anything is fetched.
    pub fn image_limits(&self) -> std::collections::HashMap<String, usize> {
        let mut limits = std::collections::HashMap::new();
        for m in &self.models {
            let most = m.limit_mm_per_prompt.image;
            limits.insert(m.served_name().to_string(), most);
            limits.extend(m.lora_modules.keys().map(|a| (a.clone(), most)));
        }
        limits
    }

    /// The Responses API's store of `max_stored_responses` kept `stored_responses_ttl_s`, in
    /// `shared` (the usage store's documents) when given.
    pub fn response_store(&self, shared: Option<lmplex_engine::Documents>) -> crate::stored::ResponseStore {
        use crate::stored::{DEFAULT_MAX_STORED_RESPONSES, DEFAULT_STORED_RESPONSES_TTL_S};
        let ttl = self.stored_responses_ttl_s.unwrap_or(DEFAULT_STORED_RESPONSES_TTL_S);
        crate::stored::ResponseStore::new(
            self.max_stored_responses.unwrap_or(DEFAULT_MAX_STORED_RESPONSES),
            std::time::Duration::from_secs_f64(ttl),
            shared,
        )
    }

    /// Where tenants' usage is kept, checked (not opened).
    pub fn usage_store_spec(&self) -> Result<lmplex_engine::UsageStoreSpec> {
        let lease = self.usage_lease_s.unwrap_or(lmplex_engine::DEFAULT_LEASE_S);
        let spec = self.usage_store.as_deref().unwrap_or("memory");
        lmplex_engine::UsageStoreSpec::parse(spec, self.config_dir.as_deref(), lease)
            .map_err(|e| e.with_context("server config"))
    }

    /// For a config read from `file`: relative paths are taken from its folder, and with tenants
    /// and no `usage_store`, usage is kept beside it (`tenants.toml` -> `tenants.usage.sqlite`).
    pub fn default_usage_store(&mut self, file: &std::path::Path) {
        self.config_dir = file.parent().map(|d| if d.as_os_str().is_empty() { ".".into() } else { d.to_path_buf() });
        if self.usage_store.is_none() && !self.tenants.is_empty() {
            let stem = file.file_stem().map_or_else(|| "lmplex".into(), |s| s.to_string_lossy().into_owned());
            self.usage_store = Some(format!("sqlite:{stem}.usage.sqlite"));
        }
    }

    /// The CORS layer of `allowed_origins`, `allowed_methods` and `allowed_headers`, or `None`
    /// when no origin is allowed; a value that is not a valid origin, method or header name is
    /// an error naming it.
    pub fn cors(&self) -> Result<Option<CorsLayer>> {
        if self.allowed_origins.is_empty() {
            return Ok(None);
        }
        let bad = |what: &str, v: &str| Error::invalid(format!("server config: {what} '{v}' is not valid"));
        let star = |v: &[String]| v.iter().any(|s| s == "*");
        let origins = if star(&self.allowed_origins) {
            AllowOrigin::any()
        } else {
            let list =
                self.allowed_origins.iter().map(|o| HeaderValue::from_str(o).map_err(|_| bad("allowed_origins", o)));
            AllowOrigin::list(list.collect::<Result<Vec<_>>>()?)
        };
        let methods = match self.allowed_methods.as_slice() {
            [] => AllowMethods::list([Method::GET, Method::POST, Method::OPTIONS]),
            m if star(m) => AllowMethods::any(),
            m => AllowMethods::list(
                m.iter()
                    .map(|s| s.parse::<Method>().map_err(|_| bad("allowed_methods", s)))
                    .collect::<Result<Vec<_>>>()?,
            ),
        };
        let headers = match self.allowed_headers.as_slice() {
            h if h.is_empty() || star(h) => AllowHeaders::any(),
            h => AllowHeaders::list(
                h.iter()
                    .map(|s| s.parse::<HeaderName>().map_err(|_| bad("allowed_headers", s)))
                    .collect::<Result<Vec<_>>>()?,
            ),
        };
        Ok(Some(
            CorsLayer::new().allow_origin(origins).allow_methods(methods).allow_headers(headers).expose_headers(Any),
        ))
    }

    /// The tenants registry: `[[tenants]]` and `api_keys`, checked (names and keys unique).
    pub fn build_tenants(&self) -> Result<lmplex_engine::Tenants> {
        lmplex_engine::Tenants::new(self.tenants.clone())
            .and_then(|t| t.with_default_keys(&self.api_keys))
            .map_err(|e| e.with_context("server config"))
    }

    /// The models as the host loads them: the top-level `scheduling_policy` given to those
    /// that set none.
    pub fn resolved_models(&self) -> Vec<ModelConfig> {
        let mut models = self.models.clone();
        for m in &mut models {
            m.scheduling_policy = m.scheduling_policy.or(self.scheduling_policy);
        }
        models
    }
}
