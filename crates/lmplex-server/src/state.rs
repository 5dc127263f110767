//! `AppState`: what every handler shares (the models, the readiness flags, the metrics, the
//! stored responses), and the server's clock.
//!
//! Invariant: once `draining` is set (after SIGTERM, or a load failure) no new generation
//! starts: `AppState::engine` answers 503.

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::stored::ResponseStore;
use lmplex_engine::{Engine, KeyDigest, ModelHost, ModelState};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// What every handler shares: the models, the readiness flags, the metrics.
pub struct AppState {
    /// The models served, loaded or not, and their memory budget.
    pub host: ModelHost,
    /// Every configured model name, loaded or still loading.
    pub expected: Vec<String>,
    /// Set once every model has loaded and warmed up; then `/ready` answers 200 (unless draining).
    pub ready: AtomicBool,
    /// Set on the shutdown signal (or a load failure): `/ready` and new generations answer 503.
    pub draining: AtomicBool,
    /// The Prometheus metrics `/metrics` renders.
    pub metrics: Metrics,
    /// The key `/metrics` asks for, if any.
    pub metrics_key: Option<KeyDigest>,
    /// The Responses API's stored responses.
    pub responses: ResponseStore,
    /// The `Idempotency-Key` records (`crate::idempotency`).
    pub idempotency: crate::replays::Records,
    /// Fetches the image URLs of hosts in `allowed_media_domains` (none by default).
    pub media: crate::media::MediaFetcher,
    /// Each served name's `limit_mm_per_prompt.image` (`ServerConfig::image_limits`); a name
    /// missing here is read from its loaded engine's config.
    pub image_limits: std::collections::HashMap<String, usize>,
    next_id: AtomicU64,
}

impl AppState {
    /// A state for `host` serving `expected`, not yet ready nor draining.
    pub fn new(host: ModelHost, expected: Vec<String>) -> Self {
        Self {
            host,
            expected,
            ready: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            metrics: Metrics::new(),
            metrics_key: None,
            responses: ResponseStore::new(
                crate::stored::DEFAULT_MAX_STORED_RESPONSES,
                std::time::Duration::from_secs_f64(crate::stored::DEFAULT_STORED_RESPONSES_TTL_S),
                None,
            ),
            idempotency: crate::replays::Records::new(None),
            media: crate::media::MediaFetcher::default(),
            image_limits: Default::default(),
            next_id: AtomicU64::new(0),
        }
    }

    /// Whether the server is draining (new generations get 503).
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// The engine serving `model`, ready; a model unloaded for idleness is reloaded first (off
    /// the async threads), and concurrent requests wait for that one reload.
    pub(crate) async fn engine(self: &Arc<Self>, model: &str) -> Result<Arc<Engine>, ApiError> {
        if self.is_draining() {
            return Err(ApiError::draining());
        }
        // A LoRA adapter runs on its parent model's engine.
        let parent = self.host.adapter_parent(model);
        let model = parent.as_deref().unwrap_or(model);
        let started = self.ready.load(Ordering::Acquire);
        match self.host.state(model) {
            Some(ModelState::Ready) => {}
            Some(ModelState::Loading) | None if !started && self.expected.iter().any(|n| n == model) => {
                return Err(ApiError::unavailable(format!(
                    "model `{model}` is still loading: retry when /ready says so"
                )));
            }
            None => return Err(ApiError::model_not_found(model)),
            Some(ModelState::Idle | ModelState::Loading) => {
                let (st, name) = (self.clone(), model.to_string());
                let engine = tokio::task::spawn_blocking(move || {
                    let t = Instant::now();
                    let reloading = st.host.state(&name) == Some(ModelState::Idle);
                    let e = st.host.acquire(&name);
                    if reloading && e.is_ok() {
                        tracing::info!(model = %name, seconds = t.elapsed().as_secs_f64(), "reloaded model");
                    }
                    e
                })
                .await
                .map_err(|e| ApiError::from(lmplex_core::Error::internal(e)))??;
                return Ok(engine);
            }
        }
        Ok(self.host.acquire(model)?)
    }

    /// A new response id: `prefix` then the time and a counter, in hex.
    pub(crate) fn new_id(&self, prefix: &str) -> String {
        format!("{prefix}{:x}{:06x}", now(), self.next_id.fetch_add(1, Ordering::Relaxed))
    }
}

/// Seconds since the Unix epoch (OpenAI's `created`).
pub(crate) fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
