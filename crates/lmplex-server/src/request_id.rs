//! Request ids and one log event per HTTP request.
//!
//! Each request runs inside a `request` span carrying its id (the client's `x-request-id` when it
//! is short printable ASCII, else one made here), method and path; the id is echoed in the
//! response's `x-request-id`, and a `request` event with the status and latency is logged when the
//! response starts. Invariant: headers and bodies are never logged (they may carry credentials).

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use tracing::Instrument;

const HEADER: &str = "x-request-id";
/// The request log's target (its logger in Python and JSON logs): the name operators filter on,
/// kept from before this module had its present name.
const TARGET: &str = "lmplex_server::trace";
const MAX_ID_LEN: usize = 128;

static NEXT: AtomicU64 = AtomicU64::new(1);

/// The client's id if usable, else a new one.
fn request_id(req: &Request) -> String {
    let given = req.headers().get(HEADER).and_then(|v| v.to_str().ok());
    match given.filter(|v| !v.is_empty() && v.len() <= MAX_ID_LEN && v.bytes().all(|b| b.is_ascii_graphic())) {
        Some(id) => id.to_string(),
        None => format!("req-{:x}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)),
    }
}

/// The middleware: span, id header, one event per request.
pub async fn with_request_id(req: Request, next: Next) -> Response {
    let id = request_id(&req);
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let span = tracing::info_span!(target: TARGET, "request", id = %id, method = %method, path = %path);
    let start = Instant::now();
    let mut response = next.run(req).instrument(span.clone()).await;
    let status = response.status().as_u16();
    let ms = start.elapsed().as_secs_f64() * 1e3;
    span.in_scope(|| {
        // The id again as a field: where spans are not kept (Python's logging), it still shows.
        tracing::info!(target: TARGET, request_id = %id, %method, %path, status, ms = format!("{ms:.1}"), "request");
    });
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(HEADER, v);
    }
    response
}
