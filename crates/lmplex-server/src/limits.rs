//! What one client may hold or send: a request's headers within `request_read_timeout_s`
//! (else the connection is closed), its body of at most `max_request_body_bytes` (413) with no
//! pause longer than `request_read_timeout_s` (408), over at most `max_connections` open
//! connections across all clients (past that, a new connection is answered 503 with
//! `Retry-After` and closed). Headers past hyper's buffer are a 431.
//!
//! Data flow: `CappedListener` wraps the server's TCP listener (counting each connection from
//! accept to close); `serve` runs each connection with hyper's header timeout and drains them
//! on shutdown; `guard_body` wraps every request (the router's layer): a declared length past
//! the cap is refused before the body is read, the body is read through a timeout, and the body
//! extractor's plain-text refusals become OpenAI-shaped errors.
//!
//! Invariants: every refusal is an `ApiError` body (never axum's or hyper's plain text); a
//! refused connection never reaches a handler; a client that stalls cannot hold a connection,
//! nor the server's shutdown, longer than the read timeout.

use crate::error::ApiError;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// `max_request_body_bytes` when the config says nothing: 32 MiB.
pub const DEFAULT_MAX_REQUEST_BODY_BYTES: usize = 32 << 20;
/// `request_read_timeout_s` when the config says nothing.
pub const DEFAULT_REQUEST_READ_TIMEOUT_S: f64 = 30.0;
/// `max_connections` when the config says nothing.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// The limits in force, resolved from the config once.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest request body, in bytes.
    pub max_request_body_bytes: usize,
    /// Longest a request's headers may take, and longest pause while its body arrives.
    pub request_read_timeout: Duration,
    /// Most connections open at once.
    pub max_connections: usize,
}

/// Refuses a body declared larger than the cap, reads the body through the timeout, and turns
/// the body extractor's plain-text refusals (413, 400) into `ApiError`s.
pub async fn guard_body(limits: Limits, req: Request, next: Next) -> Response {
    // Anthropic's routes answer in its error shape.
    let anthropic = req.uri().path().starts_with("/v1/messages");
    let answer = |e: ApiError| if anthropic { e.into_anthropic() } else { e.into_response() };
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_request_body_bytes as u64) {
        return answer(too_large(limits));
    }
    let (parts, body) = req.into_parts();
    let body = Body::new(tower_http::timeout::TimeoutBody::new(limits.request_read_timeout, body));
    let res = next.run(Request::from_parts(parts, body)).await;
    let plain =
        res.headers().get(header::CONTENT_TYPE).is_some_and(|t| t.to_str().is_ok_and(|t| t.starts_with("text/plain")));
    match res.status() {
        StatusCode::PAYLOAD_TOO_LARGE if plain => answer(too_large(limits)),
        StatusCode::BAD_REQUEST if plain => {
            let text = axum::body::to_bytes(res.into_body(), 64 << 10).await.unwrap_or_default();
            let text = String::from_utf8_lossy(&text);
            // tower-http's `TimeoutError`: the body paused longer than the timeout.
            if text.contains("designated timeout") {
                let s = limits.request_read_timeout.as_secs_f64();
                let msg = format!("the request body stopped arriving for {s} s (request_read_timeout_s)");
                answer(ApiError { status: StatusCode::REQUEST_TIMEOUT, ..ApiError::invalid(msg) })
            } else {
                answer(ApiError::invalid(text.trim().to_string()))
            }
        }
        _ => res,
    }
}

fn too_large(limits: Limits) -> ApiError {
    let msg =
        format!("the request body is larger than {} bytes (max_request_body_bytes)", limits.max_request_body_bytes);
    ApiError { status: StatusCode::PAYLOAD_TOO_LARGE, code: Some("request_too_large"), ..ApiError::invalid(msg) }
}

/// Serves `app` on `listener` until `shutdown` completes, each connection with the header
/// timeout of `limits`; then accepts no more and waits for the open connections, each asked to
/// close once its request in flight is answered (axum's graceful shutdown, with the timeout).
pub async fn serve(
    mut listener: CappedListener,
    app: axum::Router,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    use axum::serve::Listener;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(());
    let mut conns = tokio::task::JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (io, _) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let mut stop = stop_rx.clone();
        let timeout = limits.request_read_timeout;
        conns.spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(timeout);
            let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(io), service);
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => return,
                _ = stop.changed() => conn.as_mut().graceful_shutdown(),
            }
            let _ = conn.await;
        });
        while conns.try_join_next().is_some() {}
    }
    drop(listener);
    drop(stop_tx);
    while conns.join_next().await.is_some() {}
}

/// The server's listener, holding at most `max` connections open; see the module docs.
pub struct CappedListener {
    inner: TcpListener,
    open: Arc<AtomicUsize>,
    max: usize,
}

impl CappedListener {
    /// `inner`, capped at `max` open connections.
    pub fn new(inner: TcpListener, max: usize) -> Self {
        Self { inner, open: Arc::default(), max }
    }
}

impl axum::serve::Listener for CappedListener {
    type Io = Counted;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (io, addr) = axum::serve::Listener::accept(&mut self.inner).await;
            if self.open.fetch_add(1, Ordering::AcqRel) >= self.max {
                self.open.fetch_sub(1, Ordering::AcqRel);
                tokio::spawn(refuse(io, self.max));
                continue;
            }
            return (Counted { io, open: self.open.clone() }, addr);
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// Answers a connection past the cap 503 with `Retry-After: 1` once its request's headers have
/// come (or after a second), then closes it.
async fn refuse(mut io: TcpStream, max: usize) {
    let mut buf = vec![0u8; 16 << 10];
    let mut seen = 0;
    let read_head = async {
        while seen < buf.len() {
            match io.read(&mut buf[seen..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => seen += n,
            }
            if buf[..seen].windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), read_head).await;
    let msg = format!("the server has {max} connections open (max_connections): retry shortly");
    let body = ApiError { status: StatusCode::SERVICE_UNAVAILABLE, ..ApiError::invalid(msg) }.body().to_string();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = io.write_all(format!("{head}{body}").as_bytes()).await;
    let _ = io.shutdown().await;
}

/// An accepted connection, counted open until it is dropped.
pub struct Counted {
    io: TcpStream,
    open: Arc<AtomicUsize>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl AsyncRead for Counted {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
