//! Retries that are not served twice: a `POST` carrying `Idempotency-Key: KEY` runs once per
//! tenant and key. A retry of a call that finished (2xx) gets the same reply again, with
//! `idempotent-replayed: true`, and is not admitted, run or charged again; a retry while the
//! first still runs is a 409 `request_in_progress` with `Retry-After`; the key sent again with
//! another path or body is a 422 `idempotency_key_reused`. `LMLiteBlock` and the Ray app send
//! one key per call on every attempt, so a call retried on another replica after its first
//! replica died runs once.
//!
//! Data flow: the middleware resolves the caller (the handler does so again from the same
//! headers), reads the body, and claims the key in the usage store's documents when the store
//! is shared (every server on it sees the claim), else in this server's memory. The claim lives
//! `CLAIM_TTL_S` and its owner renews it while the call runs, so the claim of a server that
//! died lapses within seconds and a retry then runs. When the call ends, a 2xx JSON reply
//! replaces the claim for `REPLAY_TTL_S`; any other reply, a stream (which cannot be replayed)
//! once it ends, or a call whose client went away, gives the key up, so that it can be retried.
//!
//! Invariants: keys are scoped by tenant (the record's id hashes tenant and key, so one tenant
//! can neither read nor block another's); a key is never logged; the renewal and the final
//! write exclude each other, so a late renewal never overwrites the finished record.

use crate::caller::caller;
use crate::error::ApiError;
use crate::state::AppState;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use lmplex_engine::Documents;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

const HEADER: &str = "idempotency-key";
const REPLAYED: &str = "idempotent-replayed";
/// How long a claim lasts without its owner's renewal.
pub const CLAIM_TTL_S: f64 = 3.0;
/// How often the owner renews its claim.
const RENEW_EVERY: Duration = Duration::from_secs(1);
/// How long a finished reply is kept for replay.
pub const REPLAY_TTL_S: f64 = 3600.0;
/// Records kept at most (in memory, and in the shared store with its other documents).
const MAX_RECORDS: usize = 10_000;
/// The largest reply kept for replay; a larger one gives its key up when it ends.
const MAX_REPLY_BYTES: usize = 8 << 20;
const MAX_KEY_LEN: usize = 255;

/// What a key's record holds: a claim, or the reply it led to.
#[derive(Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
enum Record {
    Running { fingerprint: String },
    Done { fingerprint: String, status: u16, content_type: String, body: String },
}

/// Where the records live: the shared usage store's documents, else this server's memory.
pub enum Records {
    /// Every server on the store sees them.
    Shared(Documents),
    /// This server's own: id to (expiry, record).
    Local(Mutex<HashMap<String, (Instant, String)>>),
}

impl Records {
    /// In `shared` when given, else in memory.
    pub fn new(shared: Option<Documents>) -> Self {
        shared.map_or_else(|| Self::Local(Mutex::default()), Self::Shared)
    }

    /// Keeps `body` as `id` unless a live record holds it; that record's body if one does.
    fn claim(&self, tenant: &str, id: &str, body: &str) -> Result<Option<String>, ApiError> {
        match self {
            Self::Shared(docs) => Ok(docs.claim(tenant, id, body, CLAIM_TTL_S, MAX_RECORDS)?),
            Self::Local(m) => {
                let mut g = m.lock().unwrap_or_else(PoisonError::into_inner);
                let now = Instant::now();
                if let Some((_, held)) = g.get(id).filter(|(until, _)| *until > now) {
                    return Ok(Some(held.clone()));
                }
                Self::insert(&mut g, id, body, CLAIM_TTL_S);
                Ok(None)
            }
        }
    }

    /// Keeps `body` as `id` for `ttl_s`; a shared store that cannot be written is logged.
    fn put(&self, tenant: &str, id: &str, body: &str, ttl_s: f64) {
        match self {
            Self::Shared(docs) => {
                if let Err(e) = docs.put(tenant, id, body, ttl_s, MAX_RECORDS) {
                    tracing::warn!(error = %e, "an idempotency record was not written");
                }
            }
            Self::Local(m) => Self::insert(&mut m.lock().unwrap_or_else(PoisonError::into_inner), id, body, ttl_s),
        }
    }

    /// Gives `id` up.
    fn delete(&self, tenant: &str, id: &str) {
        match self {
            Self::Shared(docs) => {
                if let Err(e) = docs.delete(tenant, id) {
                    tracing::warn!(error = %e, "an idempotency record was not removed; it lapses on its own");
                }
            }
            Self::Local(m) => {
                m.lock().unwrap_or_else(PoisonError::into_inner).remove(id);
            }
        }
    }

    fn insert(g: &mut HashMap<String, (Instant, String)>, id: &str, body: &str, ttl_s: f64) {
        let now = Instant::now();
        if g.len() >= MAX_RECORDS && !g.contains_key(id) {
            g.retain(|_, (until, _)| *until > now);
            if g.len() >= MAX_RECORDS {
                let first = g.iter().min_by_key(|(_, (until, _))| *until).map(|(k, _)| k.clone());
                first.map(|k| g.remove(&k));
            }
        }
        g.insert(id.to_string(), (now + Duration::from_secs_f64(ttl_s.max(0.0)), body.to_string()));
    }
}

/// The claim a running call holds: renewed until finished or dropped, given up when dropped
/// unfinished (the client went away, or a stream ended).
struct Claim {
    st: Arc<AppState>,
    tenant: String,
    id: String,
    /// Held by every write of this claim's record; true once the final record is written.
    finished: Arc<Mutex<bool>>,
    renewal: tokio::task::JoinHandle<()>,
}

impl Claim {
    fn start(st: Arc<AppState>, tenant: String, id: String, running: String) -> Self {
        let finished = Arc::new(Mutex::new(false));
        let renewal = {
            let (st, tenant, id, finished) = (st.clone(), tenant.clone(), id.clone(), finished.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(RENEW_EVERY);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    let (st, tenant, id, running, finished) =
                        (st.clone(), tenant.clone(), id.clone(), running.clone(), finished.clone());
                    let _ = tokio::task::spawn_blocking(move || {
                        let done = finished.lock().unwrap_or_else(PoisonError::into_inner);
                        if !*done {
                            st.idempotency.put(&tenant, &id, &running, CLAIM_TTL_S);
                        }
                    })
                    .await;
                }
            })
        };
        Self { st, tenant, id, finished, renewal }
    }

    /// Ends the claim with `record` (`None`: gives the key up).
    async fn finish(self, record: Option<String>) {
        self.renewal.abort();
        let (st, tenant, id, finished) = (self.st.clone(), self.tenant.clone(), self.id.clone(), self.finished.clone());
        let _ = tokio::task::spawn_blocking(move || {
            let mut done = finished.lock().unwrap_or_else(PoisonError::into_inner);
            *done = true;
            match record {
                Some(body) => st.idempotency.put(&tenant, &id, &body, REPLAY_TTL_S),
                None => st.idempotency.delete(&tenant, &id),
            }
        })
        .await;
    }
}

impl Drop for Claim {
    /// A claim dropped unfinished (its client went away) gives the key up: at once in memory, off
    /// the async threads in a shared store.
    fn drop(&mut self) {
        self.renewal.abort();
        let mut done = self.finished.lock().unwrap_or_else(PoisonError::into_inner);
        if !*done {
            *done = true;
            drop(done);
            let (st, tenant, id) = (self.st.clone(), std::mem::take(&mut self.tenant), std::mem::take(&mut self.id));
            match (&st.idempotency, tokio::runtime::Handle::try_current()) {
                (Records::Shared(_), Ok(rt)) => {
                    rt.spawn_blocking(move || st.idempotency.delete(&tenant, &id));
                }
                _ => st.idempotency.delete(&tenant, &id),
            }
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The middleware (inside the body limits, so the body read here is bounded and timed).
pub async fn with_idempotency(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let Some(raw) = req.headers().get(HEADER).filter(|_| req.method() == Method::POST) else {
        return next.run(req).await;
    };
    let anthropic = req.uri().path().starts_with("/v1/messages");
    let answer = |e: ApiError| if anthropic { e.into_anthropic() } else { e.into_response() };
    let key = match raw.to_str() {
        Ok(k) if !k.is_empty() && k.len() <= MAX_KEY_LEN && k.bytes().all(|b| b.is_ascii_graphic()) => k.to_string(),
        _ => {
            return answer(ApiError::invalid(format!("{HEADER} must be 1 to {MAX_KEY_LEN} printable ASCII characters")))
        }
    };
    // An unknown key: the handler answers its 401.
    let Ok(tenant) = caller(&st, req.headers()) else { return next.run(req).await };
    let tenant = tenant.name().to_string();
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let bytes = match Bytes::from_request(Request::from_parts(parts.clone(), body), &st).await {
        Ok(b) => b,
        Err(rejection) => return rejection.into_response(),
    };
    let fingerprint =
        hex(&Sha256::new().chain_update(path.as_bytes()).chain_update([0]).chain_update(&bytes).finalize());
    let id = format!(
        "idem_{}",
        hex(&Sha256::new().chain_update(tenant.as_bytes()).chain_update([0]).chain_update(key.as_bytes()).finalize())
    );
    let running = serde_json::to_string(&Record::Running { fingerprint: fingerprint.clone() }).unwrap_or_default();
    let held = {
        let (st, tenant, id, running) = (st.clone(), tenant.clone(), id.clone(), running.clone());
        tokio::task::spawn_blocking(move || st.idempotency.claim(&tenant, &id, &running)).await
    };
    let held = match held.map_err(|e| ApiError::from(lmplex_core::Error::internal(e))).and_then(|h| h) {
        Ok(h) => h,
        Err(e) => return answer(e),
    };
    if let Some(held) = held {
        return answer_held(&held, &fingerprint).unwrap_or_else(answer);
    }
    let claim = Claim::start(st, tenant, id, running);
    let res = next.run(Request::from_parts(parts, Body::from(bytes))).await;
    let streams = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|t| t.to_str().is_ok_and(|t| t.starts_with("text/event-stream")));
    if streams {
        // Held until the stream ends (or its client goes), then given up.
        let (parts, body) = res.into_parts();
        let end = futures_util::stream::once(async move { claim.finish(None).await })
            .filter_map(|()| async { None::<Result<Bytes, axum::Error>> });
        return Response::from_parts(parts, Body::from_stream(body.into_data_stream().chain(end)));
    }
    let (parts, body) = res.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_REPLY_BYTES).await else {
        claim.finish(None).await;
        let e =
            ApiError::from(lmplex_core::Error::internal("a reply could not be read whole for its idempotency record"));
        return answer(e);
    };
    let record = match (parts.status.is_success(), std::str::from_utf8(&bytes)) {
        (true, Ok(text)) => {
            let content_type =
                parts.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("application/json");
            let done = Record::Done {
                fingerprint,
                status: parts.status.as_u16(),
                content_type: content_type.into(),
                body: text.into(),
            };
            serde_json::to_string(&done).ok()
        }
        _ => None,
    };
    claim.finish(record).await;
    Response::from_parts(parts, Body::from(bytes))
}

/// The answer to a call whose key another call holds: its reply again, a 409 while it runs,
/// a 422 when it was another request.
fn answer_held(held: &str, fingerprint: &str) -> Result<Response, ApiError> {
    let record: Record = serde_json::from_str(held)
        .map_err(|e| ApiError::from(lmplex_core::Error::internal(format!("an idempotency record: {e}"))))?;
    let (Record::Running { fingerprint: theirs } | Record::Done { fingerprint: theirs, .. }) = &record;
    if theirs != fingerprint {
        return Err(ApiError {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            code: Some("idempotency_key_reused"),
            ..ApiError::invalid(format!("this {HEADER} was used with another request (path or body); use a new key"))
        });
    }
    match record {
        Record::Running { .. } => Err(ApiError {
            status: StatusCode::CONFLICT,
            code: Some("request_in_progress"),
            headers: vec![("retry-after", "1".into())],
            ..ApiError::invalid(format!("a request with this {HEADER} is still running; retry shortly"))
        }),
        Record::Done { status, content_type, body, .. } => {
            let mut r = (StatusCode::from_u16(status).unwrap_or(StatusCode::OK), body).into_response();
            let headers = r.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_str(&content_type).unwrap_or(HeaderValue::from_static("application/json")),
            );
            headers.insert(REPLAYED, HeaderValue::from_static("true"));
            Ok(r)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(r: &Record) -> String {
        serde_json::to_string(r).unwrap()
    }

    #[test]
    fn a_local_claim_holds_until_given_up_or_lapsed() {
        let records = Records::new(None);
        let running = record(&Record::Running { fingerprint: "f".into() });
        assert!(records.claim("a", "k", &running).unwrap().is_none());
        assert_eq!(records.claim("a", "k", "other").unwrap().as_deref(), Some(running.as_str()));
        records.delete("a", "k");
        assert!(records.claim("a", "k", &running).unwrap().is_none(), "given up");
        records.put("a", "k", &running, -1.0);
        assert!(records.claim("a", "k", &running).unwrap().is_none(), "lapsed");
    }

    #[test]
    fn a_held_key_is_replayed_busy_or_reused() {
        let done = record(&Record::Done {
            fingerprint: "f".into(),
            status: 200,
            content_type: "application/json".into(),
            body: "{\"id\":1}".into(),
        });
        let replay = answer_held(&done, "f").unwrap();
        assert_eq!(replay.status(), StatusCode::OK);
        assert_eq!(replay.headers()[REPLAYED], "true");
        assert_eq!(replay.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(answer_held(&done, "g").unwrap_err().status, StatusCode::UNPROCESSABLE_ENTITY);
        let busy = answer_held(&record(&Record::Running { fingerprint: "f".into() }), "f").unwrap_err();
        assert_eq!((busy.status, busy.code), (StatusCode::CONFLICT, Some("request_in_progress")));
        assert_eq!(busy.headers, vec![("retry-after", "1".to_string())]);
    }
}
