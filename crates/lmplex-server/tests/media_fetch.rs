//! Image URLs fetched against a loopback HTTP server (`lmplex_server::media`): a listed host's
//! image arrives whole, and every way a fetch can go wrong (a status, a body past the cap, a
//! stall, a redirect off the list or in a loop) is an error that names the host and the reason,
//! in time, never the URL's query; fetches run at once up to `max_concurrent_media_fetches` and
//! never more (counted on the server's side); and the server fetches nothing for a caller it
//! refuses (no key, a model it may not use, a model not ready, a used-up quota, more image URLs
//! than its models take).

use lmplex_core::{ModelConfig, TenantConfig};
use lmplex_engine::{Admission, ModelHost, Tenants};
use lmplex_server::media::{MediaFetcher, MediaPolicy};
use lmplex_server::AppState;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

const IMAGE: &[u8] = b"\x89PNG not really, but bytes";
const CAP: usize = 1000;

/// What the loopback host counts: the requests it has read, the `/hold` requests it holds now
/// and the most it held at once; and the permits that let a held request answer.
struct Counters {
    hits: watch::Sender<usize>,
    held: AtomicUsize,
    most_held: AtomicUsize,
    release: Semaphore,
}

/// The loopback image host: its base URL and its counters.
struct Host {
    base: String,
    counters: Arc<Counters>,
}

impl Host {
    /// The requests read so far.
    fn hits(&self) -> usize {
        *self.counters.hits.borrow()
    }

    /// Waits until the host has read `n` requests (a safety net of 30 s, not a measure).
    async fn wait_for_hits(&self, n: usize) {
        let mut hits = self.counters.hits.subscribe();
        let seen = tokio::time::timeout(Duration::from_secs(30), hits.wait_for(|&h| h >= n)).await;
        assert!(seen.is_ok(), "the host read {} requests, not {n}", self.hits());
    }
}

/// Answers one connection by its request's path (see the match).
async fn answer(mut io: TcpStream, port: u16, c: Arc<Counters>) {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match io.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let head = String::from_utf8_lossy(&head);
    let path = head.split(' ').nth(1).unwrap_or("/").split('?').next().unwrap_or("/").to_string();
    if path == "/hold" {
        c.most_held.fetch_max(c.held.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
    }
    c.hits.send_modify(|h| *h += 1);
    let redirect = |to: String| format!("HTTP/1.1 302 Found\r\nlocation: {to}\r\ncontent-length: 0\r\n\r\n");
    let ok = format!("HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: {}\r\n\r\n", IMAGE.len());
    let reply = match path.as_str() {
        "/ok" => ok,
        "/hold" => {
            // Held until the test releases it, and no longer counted before it answers.
            c.release.acquire().await.unwrap().forget();
            c.held.fetch_sub(1, Ordering::SeqCst);
            ok
        }
        "/missing" => "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".into(),
        "/declared" => format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", CAP + 1),
        "/big" => {
            // No length: the body runs to the connection's close, one byte past the cap.
            let _ = io.write_all(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n").await;
            for _ in 0..=CAP / 100 {
                if io.write_all(&[7u8; 100]).await.is_err() {
                    return;
                }
            }
            return;
        }
        "/stall" => {
            tokio::time::sleep(Duration::from_secs(30)).await;
            return;
        }
        "/redirect-in" => redirect("/ok".into()),
        "/redirect-out" => redirect(format!("http://localhost:{port}/ok?token=sekrit")),
        "/redirect-ftp" => redirect("ftp://127.0.0.1/ok".into()),
        "/loop" => redirect("/loop".into()),
        _ => "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n".into(),
    };
    let _ = io.write_all(reply.as_bytes()).await;
    if reply.starts_with("HTTP/1.1 200") && path != "/declared" {
        let _ = io.write_all(IMAGE).await;
    }
}

/// A loopback HTTP server on a free port.
async fn server() -> Host {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let counters = Arc::new(Counters {
        hits: watch::Sender::new(0),
        held: AtomicUsize::new(0),
        most_held: AtomicUsize::new(0),
        release: Semaphore::new(0),
    });
    let c = counters.clone();
    tokio::spawn(async move {
        while let Ok((io, _)) = listener.accept().await {
            tokio::spawn(answer(io, port, c.clone()));
        }
    });
    Host { base: format!("http://127.0.0.1:{port}"), counters }
}

fn fetcher(timeout_s: f64, max_concurrent: usize) -> MediaFetcher {
    let mut policy =
        MediaPolicy::new(&["127.0.0.1".into()], timeout_s).unwrap().with_max_concurrent(max_concurrent).unwrap();
    policy.max_bytes = CAP;
    MediaFetcher::new(policy).unwrap()
}

#[tokio::test]
async fn a_listed_host_is_fetched_and_each_failure_is_named() {
    let host = server().await;
    let base = &host.base;
    let media = fetcher(0.5, 16);
    assert_eq!(&*media.fetch(&format!("{base}/ok?token=sekrit")).await.unwrap(), IMAGE);
    assert_eq!(&*media.fetch(&format!("{base}/redirect-in")).await.unwrap(), IMAGE, "a redirect on a listed host");
    for (path, want) in [
        ("/missing", "HTTP 404 Not Found"),
        ("/declared", "larger than 1000 bytes"),
        ("/big", "larger than 1000 bytes"),
        ("/redirect-out", "redirects to 'localhost', which is not in allowed_media_domains"),
        ("/redirect-ftp", "scheme 'ftp'"),
        ("/loop", "more than 10 redirects"),
        ("/stall", "longer than 0.5 s (media_fetch_timeout_s)"),
    ] {
        let start = Instant::now();
        let e = media.fetch(&format!("{base}{path}?token=sekrit")).await.unwrap_err();
        assert!(e.contains(want) && e.contains("'127.0.0.1'"), "{path}: {e}");
        assert!(!e.contains("sekrit") && !e.contains(path), "{path}: the error shows the URL: {e}");
        assert!(start.elapsed() < Duration::from_secs(3), "{path} took {:?}", start.elapsed());
    }
}

/// Distinct URLs are all in flight at once (the host holds all four before any answers), the
/// same URL is fetched once, and one failure fails the request.
#[tokio::test]
async fn several_images_are_fetched_at_once_and_the_same_url_once() {
    let host = server().await;
    let media = fetcher(30.0, 16);
    let urls: Vec<String> = (0..4).map(|i| format!("{}/hold?i={i}", host.base)).collect();
    let mut asked: Vec<String> = urls.clone();
    asked.push(urls[0].clone());
    let fetching =
        tokio::spawn(async move { media.fetch_all(&asked.iter().map(String::as_str).collect::<Vec<_>>()).await });
    host.wait_for_hits(4).await;
    assert_eq!(host.counters.held.load(Ordering::SeqCst), 4, "the four fetches are in flight together");
    host.counters.release.add_permits(4);
    let fetched = fetching.await.unwrap().unwrap();
    assert!(urls.iter().all(|u| fetched.get(u).is_some_and(|b| &*b == IMAGE)));
    assert_eq!(host.hits(), 4, "the repeated URL was fetched once");
    let media = fetcher(5.0, 16);
    let e = media.fetch_all(&[&format!("{}/ok", host.base), &format!("{}/missing", host.base)]).await.unwrap_err();
    assert!(e.contains("404"), "one failure fails the request: {e}");
}

/// With `max_concurrent_media_fetches = 2`, six fetches (two requests' worth) never have more
/// than two requests open at the host: each one released lets exactly one more in.
#[tokio::test]
async fn at_most_the_cap_of_fetches_is_in_flight() {
    let host = server().await;
    let media = fetcher(30.0, 2);
    let batch =
        |from: usize| -> Vec<String> { (from..from + 3).map(|i| format!("{}/hold?i={i}", host.base)).collect() };
    let (a, b) = (batch(0), batch(3));
    let (m1, m2) = (media.clone(), media.clone());
    let first = tokio::spawn(async move { m1.fetch_all(&a.iter().map(String::as_str).collect::<Vec<_>>()).await });
    let second = tokio::spawn(async move { m2.fetch_all(&b.iter().map(String::as_str).collect::<Vec<_>>()).await });
    host.wait_for_hits(2).await;
    for released in 1..=6 {
        host.counters.release.add_permits(1);
        host.wait_for_hits((released + 2).min(6)).await;
    }
    assert_eq!(first.await.unwrap().unwrap().get(&format!("{}/hold?i=0", host.base)).as_deref(), Some(IMAGE));
    assert!(second.await.unwrap().is_ok());
    assert_eq!((host.hits(), host.counters.most_held.load(Ordering::SeqCst)), (6, 2));
}

/// An in-process server with keys and no model loaded, fetching from 127.0.0.1: `sk-admin` (the
/// default tenant), `sk-narrow` (may use only `other`) and `sk-once` (one request a minute, used
/// by the admission returned, which holds it); its URL.
async fn keyed_server() -> (String, Admission) {
    let narrow = TenantConfig {
        api_key: Some("sk-narrow".into()),
        models: Some(vec!["other".into()]),
        ..TenantConfig::new("narrow")
    };
    let once =
        TenantConfig { api_key: Some("sk-once".into()), requests_per_minute: Some(1), ..TenantConfig::new("once") };
    let tenants = Tenants::new(vec![narrow, once]).unwrap().with_default_keys(&["sk-admin".into()]).unwrap();
    let spent = tenants.authenticate("sk-once").unwrap().admit(&ModelConfig::new("m"), 1, 1).unwrap();
    let mut state = AppState::new(ModelHost::with_tenants(None, Arc::new(tenants)), vec!["m".into()]);
    state.media = fetcher(5.0, 16);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, lmplex_server::router(Arc::new(state))).await });
    (format!("http://{addr}"), spent)
}

/// A refused caller makes the server fetch nothing: no key or a wrong one (401), a model the
/// tenant may not use (404), a model still loading (503), a used-up quota (429), and image URLs
/// past the limit of the models a routed call may run on (400).
#[tokio::test]
async fn a_refused_caller_fetches_nothing() {
    let host = server().await;
    let (url, _spent) = keyed_server().await;
    let client = reqwest::Client::new();
    let image = format!("{}/ok?token=sekrit", host.base);
    let chat = |model: &str| {
        let part = serde_json::json!({"type": "image_url", "image_url": {"url": image}});
        serde_json::json!({"model": model, "messages": [{"role": "user", "content": [part]}]}).to_string()
    };
    let anthropic = serde_json::json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": image}}]}]})
    .to_string();
    let responses =
        serde_json::json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": image}]}]})
            .to_string();
    for (path, key, body, status, says) in [
        ("/v1/chat/completions", None, chat("m"), 401, "didn't provide an API key"),
        ("/v1/chat/completions", Some("sk-wrong"), chat("m"), 401, "Incorrect API key"),
        ("/v1/responses", Some("sk-wrong"), responses.clone(), 401, "Incorrect API key"),
        ("/v1/messages", Some("sk-wrong"), anthropic.clone(), 401, "Incorrect API key"),
        ("/tokenize", None, chat("m"), 401, "didn't provide an API key"),
        ("/v1/chat/completions", Some("sk-narrow"), chat("m"), 404, "model_not_found"),
        ("/v1/responses", Some("sk-narrow"), responses, 404, "model_not_found"),
        ("/v1/chat/completions", Some("sk-admin"), chat("m"), 503, "still loading"),
        ("/v1/messages", Some("sk-admin"), anthropic, 503, "still loading"),
        ("/v1/chat/completions", Some("sk-once"), chat("lmplex:auto"), 429, "limit of 1 requests per 60 s"),
        (
            "/v1/chat/completions",
            Some("sk-admin"),
            chat("lmplex:auto"),
            400,
            "more than 0, the limit_mm_per_prompt.image",
        ),
    ] {
        let mut req = client.post(format!("{url}{path}")).header("content-type", "application/json").body(body);
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        let res = req.send().await.unwrap();
        let got = res.status().as_u16();
        let text = res.text().await.unwrap();
        assert_eq!(got, status, "{path} with {key:?}: {text}");
        assert!(text.contains(says) && !text.contains("sekrit"), "{path} with {key:?}: {text}");
        assert_eq!(host.hits(), 0, "{path} with {key:?} fetched the image");
    }
}
