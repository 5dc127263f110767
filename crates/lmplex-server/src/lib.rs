//! lmplex-server: an OpenAI-compatible HTTP server over a `ModelHost` (axum).
//!
//! `serve` binds first, so `/health` answers at once and `/ready` says 503 while the models
//! load (all at once, each checked against the host's memory budget as it starts); when every
//! model has loaded and run a warm-up step, `/ready` turns 200. A load failure stops the server
//! with that error. Models with `keep_alive_s` are unloaded by a reaper task once idle that
//! long and reloaded by their next request. On the shutdown signal (SIGTERM or Ctrl-C in the binary and `lmplex serve`)
//! the server drains: `/ready` turns 503, new generations get 503, open connections finish
//! their requests, then `serve` returns.

#![warn(missing_docs)]

pub mod api;
mod caller;
pub mod config;
pub mod error;
mod handlers;
pub mod idempotency;
pub mod limits;
pub mod logging;
pub mod media;
pub mod metrics;
pub mod openapi;
mod outcomes;
mod quota;
pub mod render;
pub mod replays;
pub mod replies;
mod reply;
pub mod request_id;
pub mod routes;
pub mod state;
pub mod stored;
mod submit;

pub use config::ServerConfig;
pub use routes::router;
pub use state::AppState;

use lmplex_core::{Error, Result};
use lmplex_engine::ModelHost;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

/// Serves `config` until `shutdown` completes; each model's `model_id` is its checkpoint
/// (aliases and Hub ids already resolved: `ModelConfig::at`). `on_listen` gets the bound
/// address.
pub async fn serve(
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_listen: impl FnOnce(std::net::SocketAddr),
) -> Result<()> {
    config.validate()?;
    let tenants =
        Arc::new(config.build_tenants()?.with_store(&config.usage_store_spec()?, config.usage_store_fail_open)?);
    if !tenants.is_empty() || tenants.has_keys() {
        tracing::info!(tenants = tenants.list().len(), api_keys = tenants.has_keys(), "tenants configured");
    }
    let mut host = ModelHost::with_tenants(config.memory_budget_bytes.map(|b| b as usize), tenants);
    if let Some(share) = config.gpu_memory_utilization {
        host = host.with_gpu_memory_utilization(share)?;
    }
    let names: Vec<String> = config.models.iter().map(|m| m.served_name().to_string()).collect();
    let mut state = AppState::new(host, names);
    state.metrics_key = config.metrics_api_key.as_deref().map(lmplex_engine::KeyDigest::new);
    state.responses = config.response_store(state.host.tenants().documents());
    state.idempotency = replays::Records::new(state.host.tenants().documents());
    state.media = media::MediaFetcher::new(config.media_policy()?)?;
    state.image_limits = config.image_limits();
    if !state.media.policy().is_off() {
        tracing::info!(hosts = ?config.allowed_media_domains, "image URLs of these hosts are fetched");
    }
    let state = Arc::new(state);
    let listener = tokio::net::TcpListener::bind((config.host.as_str(), config.port))
        .await
        .map_err(|e| Error::invalid(format!("cannot listen on {}:{}: {e}", config.host, config.port)))?;
    let addr = listener.local_addr().map_err(Error::internal)?;
    on_listen(addr);

    let load_error: Arc<Mutex<Option<Error>>> = Arc::default();
    let loader = {
        let (state, load_error) = (state.clone(), load_error.clone());
        let models = config.resolved_models();
        let tiers = config.tiers.clone();
        tokio::task::spawn_blocking(move || {
            match state.host.load_all(&models).and_then(|()| state.host.set_tiers(tiers)) {
                Ok(()) => {
                    for m in &models {
                        tracing::info!(model = m.served_name(), path = %m.checkpoint().display(), "loaded model");
                    }
                    state.ready.store(true, Ordering::Release);
                    tracing::info!(models = models.len(), "ready");
                }
                Err(e) => {
                    *load_error.lock().unwrap_or_else(PoisonError::into_inner) = Some(Error::model_load(e.to_string()));
                }
            }
        })
    };
    if config.models.iter().any(|m| m.keep_alive_s.is_some()) {
        let state = state.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_millis(250));
            loop {
                tick.tick().await;
                for name in state.host.unload_idle() {
                    tracing::info!(model = %name, "unloaded idle model");
                }
            }
        });
    }
    let stop = {
        let (state, load_error) = (state.clone(), load_error.clone());
        async move {
            let failed = async {
                if loader.await.is_err() || load_error.lock().unwrap_or_else(PoisonError::into_inner).is_some() {
                    return;
                }
                std::future::pending::<()>().await
            };
            tokio::select! {
                _ = shutdown => tracing::info!("draining"),
                _ = failed => {}
            }
            state.draining.store(true, Ordering::Release);
        }
    };
    let limits = config.limits()?;
    let app = router(state.clone())
        .layer(axum::extract::DefaultBodyLimit::max(limits.max_request_body_bytes))
        .layer(axum::middleware::from_fn(move |req, next| limits::guard_body(limits, req, next)));
    let app = match config.cors()? {
        Some(cors) => app.layer(cors),
        None => app,
    };
    let listener = limits::CappedListener::new(listener, limits.max_connections);
    limits::serve(listener, app, limits, stop).await;
    let failed = load_error.lock().unwrap_or_else(PoisonError::into_inner).take();
    failed.map_or(Ok(()), Err)
}

/// Serves `config` until SIGTERM or Ctrl-C on a runtime of its own, blocking the calling
/// thread; `config` as for [`serve`]. With `address_file`, the URL (`http://HOST:PORT`) is
/// written there once the server listens (whole: written beside it, then renamed).
pub fn run(config: ServerConfig, address_file: Option<PathBuf>) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("lmplex-serve")
        .build()
        .map_err(|e| Error::internal(format!("cannot start the server runtime: {e}")))?;
    rt.block_on(serve(config, shutdown_signal(), |addr| {
        let url = format!("http://{addr}");
        tracing::info!("listening on {url}");
        if let Some(path) = &address_file {
            let tmp = path.with_extension("tmp");
            if let Err(e) = std::fs::write(&tmp, &url).and_then(|()| std::fs::rename(&tmp, path)) {
                tracing::error!(path = %path.display(), "cannot write the address file: {e}");
            }
        }
    }))
}

/// Completes on SIGTERM or Ctrl-C (SIGINT).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
