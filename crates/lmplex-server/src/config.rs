//! `ServerConfig`: what `lmplex serve` loads, from a TOML file or the command line.
//!
//! ```toml
//! host = "127.0.0.1"          # default
//! port = 8000                 # default; 0 picks a free port
//! memory_budget_bytes = 8e9   # optional; default: the memory available at start
//!
//! [[models]]                  # each entry is a lmplex_core::ModelConfig, same keys
//! model_id = "/models/SmolLM2-135M-Instruct-Q4_1.gguf"  # a .gguf file or an HF folder
//! served_model_name = "smollm2"  # (or `name`) the `model` clients ask for; default: model_id
//! max_model_len = 2048
//! keep_alive_s = 300          # optional: unload after this long idle, reload on next use
//! ```
//!
//! Invariants: unknown keys are errors naming the key and its line (a typo never silently
//! falls back to a default); served names are unique; every model passed `validate()`.

use lmplex_core::{Error, ModelConfig, Result};
use serde::Deserialize;

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
    /// Memory all models share; `None` is the memory available at start.
    pub memory_budget_bytes: Option<f64>,
    /// The `[[models]]` entries, in order.
    pub models: Vec<ModelConfig>,
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
        Self { host: default_host(), port: default_port(), memory_budget_bytes: None, models }
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
        Ok(())
    }
}
