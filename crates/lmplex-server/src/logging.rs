//! Logging for the Rust binaries: `tracing` events to stderr through `tracing-subscriber`.
//!
//! The filter comes from `LMPLEX_LOG`, else `RUST_LOG` (`EnvFilter` syntax: `info`,
//! `lmplex_server=debug,warn`, ...), else `info`. Text by default; JSON lines (one object per
//! event, with its span fields) for log collectors. The Python package installs no subscriber:
//! there the same events reach Python's `logging` (lmplex-py bridges them), configured by the
//! application or by `lmplex serve`.
//!
//! Invariant: nothing logged here carries a secret (no request bodies, no credentials).

use lmplex_core::{Error, Result};
use tracing_subscriber::EnvFilter;

/// How events are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    /// `text` or `json`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(Error::invalid(format!("unknown log format '{other}': expected text or json"))),
        }
    }
}

/// The filter the environment asks for (`LMPLEX_LOG`, `RUST_LOG`, else `info`).
pub fn env_filter() -> Result<EnvFilter> {
    let spec = ["LMPLEX_LOG", "RUST_LOG"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.trim().is_empty()))
        .unwrap_or_else(|| "info".into());
    EnvFilter::try_new(&spec).map_err(|e| Error::invalid(format!("bad log filter '{spec}': {e}")))
}

/// Installs the process-wide subscriber; an error if one is installed already.
pub fn init(format: LogFormat) -> Result<()> {
    let builder = tracing_subscriber::fmt().with_env_filter(env_filter()?).with_writer(std::io::stderr);
    let done = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().with_current_span(true).try_init(),
    };
    done.map_err(|e| Error::internal(format!("cannot install the logger: {e}")))
}
