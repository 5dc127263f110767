//! `lmplex._core.serve`: runs the OpenAI-compatible server (lmplex-server) until SIGTERM or
//! Ctrl-C, with the GIL released; `start_server` runs it on threads of its own until
//! `ServerThread.shutdown()` (for hosts such as a Ray Serve replica, with no signal handler). The TOML config is parsed in Rust (one parser for the binary
//! and the CLI); `resolve` (Python's resolver of aliases and Hub ids) maps each `model_id` and
//! `revision` to a path first.

use crate::errors::to_py;
use lmplex_core::Error;
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::{mpsc, Mutex, PoisonError};
use std::thread::JoinHandle;
use tokio::sync::oneshot;

/// Serves the models of ``config_toml`` (see ``lmplex serve --help``) until SIGTERM or Ctrl-C.
/// With ``address_file``, the server's URL is written there once it listens (whole, by rename).
/// ``api_keys`` are added to the config's; ``scheduling_policy``, ``allowed_origins`` (CORS) and
/// ``usage_store`` replace its top-level ones; ``usage_store_fail_open`` sets it when true.
/// ``config_path``, the file ``config_toml`` was read from, places relative paths and the
/// default usage store (``ServerConfig::default_usage_store``).
#[pyfunction]
#[pyo3(signature = (config_toml, resolve=None, host=None, port=None, address_file=None, api_keys=None, scheduling_policy=None, allowed_origins=None, usage_store=None, config_path=None, usage_store_fail_open=false))]
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
    usage_store: Option<String>,
    config_path: Option<PathBuf>,
    usage_store_fail_open: bool,
) -> PyResult<()> {
    let overrides = Overrides {
        host,
        port,
        api_keys,
        scheduling_policy,
        allowed_origins,
        usage_store,
        config_path,
        fail_open: usage_store_fail_open,
    };
    let cfg = configure(config_toml, resolve, overrides)?;
    py.detach(|| lmplex_server::run(cfg, address_file)).map_err(to_py)
}

/// Starts the server of ``config_toml`` on threads of its own and returns once it listens; the
/// models load in the background (``/ready`` says when they have). Arguments as for ``serve``.
/// No signal handler is installed: the server runs until ``ServerThread.shutdown()``.
#[pyfunction]
#[pyo3(signature = (config_toml, resolve=None, host=None, port=None, api_keys=None, scheduling_policy=None, allowed_origins=None))]
#[allow(clippy::too_many_arguments)] // keyword arguments of one Python function
pub fn start_server(
    py: Python<'_>,
    config_toml: &str,
    resolve: Option<Bound<'_, PyAny>>,
    host: Option<String>,
    port: Option<u16>,
    api_keys: Option<Vec<String>>,
    scheduling_policy: Option<String>,
    allowed_origins: Option<Vec<String>>,
) -> PyResult<ServerThread> {
    let (usage_store, config_path, fail_open) = (None, None, false);
    let overrides =
        Overrides { host, port, api_keys, scheduling_policy, allowed_origins, usage_store, config_path, fail_open };
    let cfg = configure(config_toml, resolve, overrides)?;
    py.detach(move || ServerThread::start(cfg)).map_err(to_py)
}

/// A server started by ``start_server``. It stops on ``shutdown()`` or when dropped.
#[pyclass(module = "lmplex._core")]
pub struct ServerThread {
    url: String,
    stop: Mutex<Option<oneshot::Sender<()>>>,
    thread: Mutex<Option<JoinHandle<lmplex_core::Result<()>>>>,
}

impl ServerThread {
    fn start(cfg: lmplex_server::ServerConfig) -> lmplex_core::Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("lmplex-serve")
            .build()
            .map_err(|e| Error::internal(format!("cannot start the server runtime: {e}")))?;
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let (addr_tx, addr_rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("lmplex-server".into())
            .spawn(move || {
                let stop = async {
                    let _ = stop_rx.await;
                };
                rt.block_on(lmplex_server::serve(cfg, stop, |addr| {
                    let _ = addr_tx.send(addr);
                }))
            })
            .map_err(|e| Error::internal(format!("cannot start the server thread: {e}")))?;
        match addr_rx.recv() {
            Ok(addr) => Ok(Self {
                url: format!("http://{addr}"),
                stop: Mutex::new(Some(stop_tx)),
                thread: Mutex::new(Some(thread)),
            }),
            // The thread ended before it listened: its result says why.
            Err(_) => match thread.join() {
                Ok(Err(e)) => Err(e),
                Ok(Ok(())) => Err(Error::internal("the server stopped before it listened")),
                Err(_) => Err(Error::internal("the server thread panicked")),
            },
        }
    }
}

#[pymethods]
impl ServerThread {
    /// The server's URL, ``http://HOST:PORT``.
    #[getter]
    fn url(&self) -> &str {
        &self.url
    }

    /// Whether the server still serves: false once it was shut down or stopped by a load failure.
    fn running(&self) -> bool {
        lock(&self.thread).as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Drains (open requests finish, new ones get 503) and stops; returns once it has. Raises the
    /// error that stopped the server, if one did (a model that failed to load). Idempotent.
    fn shutdown(&self, py: Python<'_>) -> PyResult<()> {
        if let Some(stop) = lock(&self.stop).take() {
            let _ = stop.send(());
        }
        let Some(thread) = lock(&self.thread).take() else { return Ok(()) };
        match py.detach(|| thread.join()) {
            Ok(result) => result.map_err(to_py),
            Err(_) => Err(to_py(Error::internal("the server thread panicked"))),
        }
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        if let Some(stop) = lock(&self.stop).take() {
            let _ = stop.send(());
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the Python caller sets over the config file's values.
struct Overrides {
    host: Option<String>,
    port: Option<u16>,
    api_keys: Option<Vec<String>>,
    scheduling_policy: Option<String>,
    allowed_origins: Option<Vec<String>>,
    usage_store: Option<String>,
    config_path: Option<PathBuf>,
    /// Sets `usage_store_fail_open` when true.
    fail_open: bool,
}

/// The parsed, validated config with `overrides` applied, each model at its resolved
/// checkpoint (`ModelConfig::at`).
fn configure(
    config_toml: &str,
    resolve: Option<Bound<'_, PyAny>>,
    o: Overrides,
) -> PyResult<lmplex_server::ServerConfig> {
    let mut cfg = lmplex_server::ServerConfig::from_toml(config_toml).map_err(to_py)?;
    cfg.api_keys.extend(o.api_keys.unwrap_or_default());
    if let Some(p) = o.scheduling_policy {
        cfg.scheduling_policy = Some(lmplex_core::SchedulingPolicy::parse(&p).map_err(to_py)?);
    }
    if let Some(origins) = o.allowed_origins.filter(|v| !v.is_empty()) {
        cfg.allowed_origins = origins;
    }
    if let Some(store) = o.usage_store {
        cfg.usage_store = Some(store);
    }
    cfg.usage_store_fail_open |= o.fail_open;
    if let Some(file) = &o.config_path {
        cfg.default_usage_store(file);
    }
    cfg.validate().map_err(to_py)?;
    if let Some(h) = o.host {
        cfg.host = h;
    }
    if let Some(p) = o.port {
        cfg.port = p;
    }
    if let Some(f) = &resolve {
        let adapter = pyo3::types::PyDict::new(f.py());
        adapter.set_item("adapter", true)?;
        for m in &mut cfg.models {
            let path: String = f.call1((m.model_id.as_str(), m.revision.as_deref()))?.extract()?;
            *m = m.clone().at(path);
            for p in m.lora_modules.values_mut() {
                *p = f.call((p.as_str(), None::<&str>), Some(&adapter))?.extract()?;
            }
            if let Some(draft) = m.speculative.as_mut().and_then(|s| s.model.as_mut()) {
                *draft = f.call1((draft.as_str(), None::<&str>))?.extract()?;
            }
        }
    }
    Ok(cfg)
}

/// Every tenant's usage in a server's usage store (SQLite or Redis), as dicts (``lmplex usage``): the store
/// ``usage_store`` names, else the one the config read from ``config_path`` uses (its
/// ``usage_store``, or the default beside it).
#[pyfunction]
#[pyo3(signature = (usage_store=None, config_path=None))]
pub fn usage_report<'py>(
    py: Python<'py>,
    usage_store: Option<String>,
    config_path: Option<PathBuf>,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let spec = match (usage_store, config_path) {
        (Some(s), _) => lmplex_engine::UsageStoreSpec::parse(&s, None, lmplex_engine::DEFAULT_LEASE_S),
        (None, Some(file)) => std::fs::read_to_string(&file)
            .map_err(|e| Error::invalid(format!("cannot read the config {}: {e}", file.display())))
            .and_then(|text| lmplex_server::ServerConfig::from_toml(&text))
            .and_then(|mut cfg| {
                cfg.default_usage_store(&file);
                cfg.usage_store_spec()
            }),
        (None, None) => Err(Error::invalid("give --store sqlite:PATH|redis://HOST:PORT/DB or --config FILE")),
    }
    .map_err(to_py)?;
    let rows = py.detach(|| lmplex_engine::usage::report(&spec)).map_err(to_py)?;
    rows.into_iter()
        .map(|(tenant, u)| {
            let d = pythonize::pythonize(py, &u).map_err(|e| crate::errors::invalid(e.to_string()))?;
            d.set_item("tenant", tenant)?;
            Ok(d)
        })
        .collect()
}
