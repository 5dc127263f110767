//! Retries that are not served twice: a `POST` carrying `Idempotency-Key: KEY` runs once per
//! tenant and key. A retry of a call that finished (2xx) gets the same reply again, with
//! `idempotent-replayed: true`, and is not admitted, run or charged again; a retry while the
//! first still runs is a 409 `request_in_progress` with `Retry-After`; the key sent again with
//! another path or body is a 422 `idempotency_key_reused`. `LMLiteBlock` and the Ray app send
//! one key per call on every attempt, so a call retried on another replica after its first
//! replica died runs once where the replicas share a usage store.
//!
//! Data flow: the middleware resolves the caller (the handler does so again from the same
//! headers), reads the body, and claims the key in the usage store's `idempotency` documents
//! when the store is shared (every server on it sees the claim), else in this server's memory.
//! A claim names its owner (a random nonce) and holds until `CLAIM_TTL_S` from its last
//! renewal; its owner renews it every second while the call runs, so the claim of a server
//! that died lapses within seconds and a retry then takes it over. When the call ends, a 2xx
//! reply of at most `MAX_REPLY_BYTES` replaces the claim for `REPLAY_TTL_S`; any other reply, a
//! stream (which cannot be replayed) once it ends, or a call whose client went away, gives the
//! key up, so that it can be sent again.
//!
//! Invariants: keys are scoped by tenant (the record's id hashes tenant and key, so one tenant
//! can neither read nor block another's); a key is never logged; every write after the claim
//! is conditional on the record still being this claim's (the store's compare-and-set), so a
//! claim taken over by another server is never overwritten or removed by its old owner; the
//! store is only called off the async threads.

use crate::caller::caller;
use crate::error::ApiError;
use crate::replays::{now_s, Records, REPLAY_TTL_S};
use crate::state::AppState;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;

const HEADER: &str = "idempotency-key";
const REPLAYED: &str = "idempotent-replayed";
/// How long a claim holds without its owner's renewal.
pub const CLAIM_TTL_S: f64 = 3.0;
/// How often the owner renews its claim.
const RENEW_EVERY: Duration = Duration::from_secs(1);
/// The largest reply kept for replay; a larger one is answered and gives its key up.
pub const MAX_REPLY_BYTES: usize = 8 << 20;
const MAX_KEY_LEN: usize = 255;

/// What a key's record holds: a claim (its owner, and until when it holds without renewal), or
/// the reply it led to.
#[derive(Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
enum Record {
    Running { fingerprint: String, owner: String, until: f64 },
    Done { fingerprint: String, status: u16, content_type: String, body: String },
}

fn running(fingerprint: &str, owner: &str) -> String {
    let r = Record::Running { fingerprint: fingerprint.into(), owner: owner.into(), until: now_s() + CLAIM_TTL_S };
    serde_json::to_string(&r).unwrap_or_default()
}

/// Runs `f` on the store off the async threads.
async fn blocking<T: Send + 'static>(
    st: &Arc<AppState>,
    f: impl FnOnce(&Records) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let st = st.clone();
    tokio::task::spawn_blocking(move || f(&st.idempotency))
        .await
        .map_err(|e| ApiError::from(lmplex_core::Error::internal(e)))?
}

/// The claim a running call holds: renewed every second until finished, given up when dropped
/// unfinished (the client went away). `held` is the record as this claim last wrote it, `None`
/// once finished or taken over; renewals and the final write take its lock in turn.
struct Claim {
    st: Arc<AppState>,
    tenant: String,
    id: String,
    held: Arc<tokio::sync::Mutex<Option<String>>>,
}

impl Claim {
    fn start(st: Arc<AppState>, tenant: String, id: String, body: String, fingerprint: String, owner: String) -> Self {
        let held = Arc::new(tokio::sync::Mutex::new(Some(body)));
        {
            let (st, tenant, id, held) = (st.clone(), tenant.clone(), id.clone(), held.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(RENEW_EVERY);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    let mut g = held.lock().await;
                    let Some(expected) = g.clone() else { return };
                    let next = running(&fingerprint, &owner);
                    let (t, i, n) = (tenant.clone(), id.clone(), next.clone());
                    match blocking(&st, move |r| r.replace(&t, &i, &expected, &n, REPLAY_TTL_S)).await {
                        Ok(true) => *g = Some(next),
                        Ok(false) => {
                            *g = None; // taken over: this call's record is no longer its own
                            return;
                        }
                        Err(e) => tracing::warn!(error = %e.message, "an idempotency claim was not renewed"),
                    }
                }
            });
        }
        Self { st, tenant, id, held }
    }

    /// Ends the claim with `record` (`None`: gives the key up), if it is still this claim's.
    async fn finish(self, record: Option<String>) {
        let Some(expected) = self.held.lock().await.take() else { return };
        let (tenant, id) = (self.tenant.clone(), self.id.clone());
        let out = blocking(&self.st, move |r| match record {
            Some(body) => r.replace(&tenant, &id, &expected, &body, REPLAY_TTL_S),
            None => r.delete_if(&tenant, &id, &expected),
        })
        .await;
        if let Err(e) = out {
            tracing::warn!(error = %e.message, "an idempotency record was not written; its claim lapses on its own");
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if self.held.try_lock().is_ok_and(|g| g.is_none()) {
            return; // finished
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let (held, st) = (self.held.clone(), self.st.clone());
        let (tenant, id) = (std::mem::take(&mut self.tenant), std::mem::take(&mut self.id));
        rt.spawn(async move {
            let Some(expected) = held.lock().await.take() else { return };
            let _ = blocking(&st, move |r| r.delete_if(&tenant, &id, &expected)).await;
        });
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
    let bytes = match Bytes::from_request(Request::from_parts(parts.clone(), body), &st).await {
        Ok(b) => b,
        Err(rejection) => return rejection.into_response(),
    };
    let path = parts.uri.path().as_bytes();
    let fingerprint = hex(&Sha256::new().chain_update(path).chain_update([0]).chain_update(&bytes).finalize());
    let id = format!(
        "idem_{}",
        hex(&Sha256::new().chain_update(tenant.as_bytes()).chain_update([0]).chain_update(key.as_bytes()).finalize())
    );
    let owner = crate::stored::new_id("claim");
    let ours = running(&fingerprint, &owner);
    let taken = take(&st, &tenant, &id, &ours, &fingerprint).await;
    let req = Request::from_parts(parts, Body::from(bytes));
    let claim = match taken {
        Ok(Ok(())) => Claim::start(st, tenant, id, ours, fingerprint.clone(), owner),
        Ok(Err(held)) => return held.unwrap_or_else(answer),
        Err(e) if matches!(st.idempotency, Records::Shared(_)) && st.host.tenants().store_fails_open() => {
            tracing::warn!(error = %e.message, "usage store unavailable: a call runs without its idempotency key");
            return next.run(req).await;
        }
        Err(e) => return answer(e),
    };
    let res = next.run(req).await;
    let streams = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|t| t.to_str().is_ok_and(|t| t.starts_with("text/event-stream")));
    let (parts, body) = res.into_parts();
    if streams {
        // Held until the stream ends (or its client goes), then given up.
        let end = futures_util::stream::once(async move { claim.finish(None).await })
            .filter_map(|()| async { None::<Result<Bytes, axum::Error>> });
        return Response::from_parts(parts, Body::from_stream(body.into_data_stream().chain(end)));
    }
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => {
            claim.finish(None).await;
            return answer(ApiError::from(lmplex_core::Error::internal(format!("a reply could not be read: {e}"))));
        }
    };
    let record = match (parts.status.is_success() && bytes.len() <= MAX_REPLY_BYTES, std::str::from_utf8(&bytes)) {
        (true, Ok(text)) => {
            let content_type =
                parts.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("application/json");
            let status = parts.status.as_u16();
            let done = Record::Done { fingerprint, status, content_type: content_type.into(), body: text.into() };
            serde_json::to_string(&done).ok()
        }
        _ => None,
    };
    claim.finish(record).await;
    Response::from_parts(parts, Body::from(bytes))
}

/// Claims `id` with `ours`, taking over a claim that lapsed: `Ok(Ok(()))` when this call holds
/// it, `Ok(Err(answer))` when another call does (its reply, a 409 or a 422).
async fn take(
    st: &Arc<AppState>,
    tenant: &str,
    id: &str,
    ours: &str,
    fingerprint: &str,
) -> Result<Result<(), Result<Response, ApiError>>, ApiError> {
    let (t, i, o) = (tenant.to_string(), id.to_string(), ours.to_string());
    let Some(held) = blocking(st, move |r| r.claim(&t, &i, &o)).await? else { return Ok(Ok(())) };
    let lapsed = matches!(serde_json::from_str(&held), Ok(Record::Running { until, .. }) if until < now_s());
    if lapsed && same_request(&held, fingerprint) {
        let (t, i, o, h) = (tenant.to_string(), id.to_string(), ours.to_string(), held.clone());
        if blocking(st, move |r| r.replace(&t, &i, &h, &o, REPLAY_TTL_S)).await? {
            return Ok(Ok(())); // its owner died: this call runs it
        }
    }
    Ok(Err(answer_held(&held, fingerprint)))
}

fn same_request(held: &str, fingerprint: &str) -> bool {
    match serde_json::from_str(held) {
        Ok(Record::Running { fingerprint: f, .. } | Record::Done { fingerprint: f, .. }) => f == fingerprint,
        Err(_) => false,
    }
}

/// The answer to a call whose key another call holds: its reply again, a 409 while it runs,
/// a 422 when it was another request.
fn answer_held(held: &str, fingerprint: &str) -> Result<Response, ApiError> {
    let record: Record = serde_json::from_str(held)
        .map_err(|e| ApiError::from(lmplex_core::Error::internal(format!("an idempotency record: {e}"))))?;
    if !same_request(held, fingerprint) {
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
            headers: vec![("retry-after", "1".into()), (crate::error::CODE_HEADER, "request_in_progress".into())],
            ..ApiError::invalid(format!("a request with this {HEADER} is still running; retry shortly"))
        }),
        Record::Done { status, content_type, body, .. } => {
            let mut r = (StatusCode::from_u16(status).unwrap_or(StatusCode::OK), body).into_response();
            let headers = r.headers_mut();
            let kind = HeaderValue::from_str(&content_type).unwrap_or(HeaderValue::from_static("application/json"));
            headers.insert(header::CONTENT_TYPE, kind);
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
        let busy = answer_held(&running("f", "them"), "f").unwrap_err();
        assert_eq!((busy.status, busy.code), (StatusCode::CONFLICT, Some("request_in_progress")));
        assert!(busy.headers.contains(&("retry-after", "1".to_string())));
    }
}
