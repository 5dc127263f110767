//! `ServerConfig`: what `lmplex serve` loads, from a TOML file or the command line.
//!
//! ```toml
//! host = "127.0.0.1"          # default
//! port = 8000                 # default; 0 picks a free port
//! memory_budget_bytes = 8e9   # optional; default: the memory available at start
//!
//! [[models]]
//! model_id = "/models/SmolLM2-135M-Instruct-Q4_1.gguf"  # a .gguf file or an HF folder
//! name = "smollm2"            # the `model` clients ask for; default: model_id as written
//! max_model_len = 2048        # and every other ModelConfig knob, same names
//! keep_alive_s = 300          # optional: unload after this long idle, reload on next use
//! ```
//!
//! Invariants: unknown keys are errors (a typo never silently falls back to a default); model
//! names are unique; every model has a `model_id`.

use lmplex_core::{DType, DeviceKind, Error, KvCacheDtype, ModelConfig, PreemptionMode, Result, SchedulingPolicy};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    #[serde(default = "default_host")]
    pub host: String,
    #[serde(default = "default_port")]
    pub port: u16,
    pub memory_budget_bytes: Option<f64>,
    pub models: Vec<ServedModel>,
}

fn default_host() -> String {
    "127.0.0.1".into()
}
fn default_port() -> u16 {
    8000
}

/// One `[[models]]` entry: a name and the `ModelConfig` fields.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServedModel {
    pub model_id: String,
    pub name: Option<String>,
    pub max_model_len: Option<usize>,
    pub max_model_concurrency: Option<usize>,
    pub model_batch_execute_timeout_ms: Option<u64>,
    pub dtype: Option<String>,
    pub device: Option<String>,
    pub kv_cache_dtype: Option<String>,
    pub kv_cache_bytes: Option<usize>,
    pub max_num_batched_tokens: Option<usize>,
    pub max_queue_len: Option<usize>,
    pub enable_prefix_caching: Option<bool>,
    pub scheduling_policy: Option<String>,
    pub kv_swap_bytes: Option<usize>,
    pub preemption_mode: Option<String>,
    /// Seconds of idleness after which the model is unloaded (reloaded on its next request).
    pub keep_alive_s: Option<f64>,
}

impl ServedModel {
    /// The idle time after which the model unloads, if any.
    pub fn keep_alive(&self) -> Option<std::time::Duration> {
        self.keep_alive_s.map(std::time::Duration::from_secs_f64)
    }

    /// The name clients use in `"model"`.
    pub fn served_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.model_id)
    }

    /// The engine's `ModelConfig` for this entry (validated).
    pub fn model_config(&self) -> Result<ModelConfig> {
        let mut c = ModelConfig::new(self.model_id.clone());
        c.max_model_len = self.max_model_len;
        if let Some(n) = self.max_model_concurrency {
            c.max_model_concurrency = n;
        }
        if let Some(ms) = self.model_batch_execute_timeout_ms {
            c.model_batch_execute_timeout_ms = ms;
        }
        if let Some(d) = &self.dtype {
            c.dtype = DType::parse(d)?;
        }
        if let Some(d) = &self.device {
            c.device = DeviceKind::parse(d)?;
        }
        if let Some(d) = &self.kv_cache_dtype {
            c.kv_cache_dtype = KvCacheDtype::parse(d)?;
        }
        c.kv_cache_bytes = self.kv_cache_bytes;
        c.max_num_batched_tokens = self.max_num_batched_tokens;
        if let Some(n) = self.max_queue_len {
            c.max_queue_len = n;
        }
        if let Some(b) = self.enable_prefix_caching {
            c.enable_prefix_caching = b;
        }
        if let Some(p) = &self.scheduling_policy {
            c.scheduling_policy = SchedulingPolicy::parse(p)?;
        }
        c.kv_swap_bytes = self.kv_swap_bytes;
        if let Some(p) = &self.preemption_mode {
            c.preemption_mode = PreemptionMode::parse(p)?;
        }
        c.validate()?;
        Ok(c)
    }
}

impl ServerConfig {
    pub fn from_toml(text: &str) -> Result<Self> {
        let c: Self = toml::from_str(text).map_err(|e| Error::invalid(format!("server config: {e}")))?;
        c.validate()?;
        Ok(c)
    }

    pub fn validate(&self) -> Result<()> {
        if self.models.is_empty() {
            return Err(Error::invalid("server config: no [[models]] to serve"));
        }
        let mut names: Vec<&str> = self.models.iter().map(ServedModel::served_name).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::invalid(format!("server config: two models are named '{}'", w[0])));
        }
        for m in &self.models {
            if m.keep_alive_s.is_some_and(|k| !k.is_finite() || k < 0.0) {
                return Err(Error::invalid(format!(
                    "server config, model '{}': keep_alive_s must be a number of seconds >= 0",
                    m.served_name()
                )));
            }
            m.model_config().map_err(|e| Error::invalid(format!("server config, model '{}': {e}", m.served_name())))?;
        }
        if self.memory_budget_bytes.is_some_and(|b| b.is_nan() || b <= 0.0) {
            return Err(Error::invalid("server config: memory_budget_bytes must be positive"));
        }
        Ok(())
    }
}
