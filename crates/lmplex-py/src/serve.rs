//! `lmplex._core.serve`: runs the OpenAI-compatible server (lmplex-server) until SIGTERM or
//! Ctrl-C, with the GIL released. The TOML config is parsed in Rust (one parser for the binary
//! and the CLI); `resolve` (Python's resolver of aliases and Hub ids) maps each `model_id` and
//! `revision` to a path first.

use crate::errors::to_py;
use pyo3::prelude::*;
use std::path::PathBuf;

/// Serves the models of ``config_toml`` (see ``lmplex serve --help``) until SIGTERM or Ctrl-C.
/// With ``address_file``, the server's URL is written there once it listens (whole, by rename).
/// ``api_keys`` are added to the config's; ``scheduling_policy`` and ``allowed_origins`` (CORS)
/// replace its top-level ones.
#[pyfunction]
#[pyo3(signature = (config_toml, resolve=None, host=None, port=None, address_file=None, api_keys=None, scheduling_policy=None, allowed_origins=None))]
#[allow(clippy::too_many_arguments)] // keyword arguments of one Python function
pub fn serve(
    py: Python<'_>,
    config_toml: &str,
    resolve: Option<Bound<'_, PyAny>>,
    host: Option<String>,
    port: Option<u16>,
    address_file: Option<PathBuf>,
    api_keys: Option<Vec<String>>,
    scheduling_policy: Option<String>,
    allowed_origins: Option<Vec<String>>,
) -> PyResult<()> {
    let mut cfg = lmplex_server::ServerConfig::from_toml(config_toml).map_err(to_py)?;
    cfg.api_keys.extend(api_keys.unwrap_or_default());
    if let Some(p) = scheduling_policy {
        cfg.scheduling_policy = Some(lmplex_core::SchedulingPolicy::parse(&p).map_err(to_py)?);
    }
    if let Some(o) = allowed_origins.filter(|o| !o.is_empty()) {
        cfg.allowed_origins = o;
    }
    cfg.validate().map_err(to_py)?;
    if let Some(h) = host {
        cfg.host = h;
    }
    if let Some(p) = port {
        cfg.port = p;
    }
    let paths = cfg
        .models
        .iter()
        .map(|m| match &resolve {
            Some(f) => f.call1((m.model_id.as_str(), m.revision.as_deref()))?.extract::<String>().map(PathBuf::from),
            None => Ok(PathBuf::from(&m.model_id)),
        })
        .collect::<PyResult<Vec<_>>>()?;
    py.detach(|| lmplex_server::run(cfg, paths, address_file)).map_err(to_py)
}
