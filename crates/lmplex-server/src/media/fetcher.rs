//! `MediaFetcher`: fetches image URLs under a `MediaPolicy`, as tasks on the async runtime (no
//! worker thread blocks).
//!
//! Invariants: with no host listed nothing is fetched and no HTTP client exists; every redirect
//! is checked as the first URL is (at most `MAX_REDIRECTS`; no `Referer` is sent); at most
//! `max_concurrent_media_fetches` fetches are in flight at once across the server (one
//! semaphore, a permit per fetch, held until its body is read or it fails); one image's fetch
//! (waiting for a permit, connection, redirects, body) ends within `media_fetch_timeout_s`; a
//! body is read up to `max_bytes` and refused as soon as it passes it. Every failure names the
//! host and the reason, never the URL's path or query, and the logs name the host only.

use super::policy::{MediaPolicy, Refusal};
use super::Fetched;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::Semaphore;

/// Most redirects one fetch follows.
pub const MAX_REDIRECTS: usize = 10;

/// Fetches image URLs under a `MediaPolicy` (see the module's invariants).
#[derive(Debug, Clone)]
pub struct MediaFetcher {
    policy: MediaPolicy,
    /// `None` while no host is listed: nothing is fetched.
    client: Option<reqwest::Client>,
    /// One permit per fetch in flight (`policy.max_concurrent` in all), shared by every clone.
    in_flight: Arc<Semaphore>,
}

impl Default for MediaFetcher {
    fn default() -> Self {
        let policy = MediaPolicy::default();
        let in_flight = Arc::new(Semaphore::new(policy.max_concurrent));
        Self { policy, client: None, in_flight }
    }
}

impl MediaFetcher {
    /// A fetcher for `policy`; its HTTP client is built only when a host is listed.
    pub fn new(policy: MediaPolicy) -> lmplex_core::Result<Self> {
        let in_flight = Arc::new(Semaphore::new(policy.max_concurrent));
        if policy.is_off() {
            return Ok(Self { policy, client: None, in_flight });
        }
        let redirects = policy.clone();
        let follow = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() > MAX_REDIRECTS {
                return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
            }
            match redirects.check(attempt.url()) {
                Ok(_) => attempt.follow(),
                Err(Refusal::Host(h)) => {
                    attempt.error(format!("it redirects to '{h}', which is not in allowed_media_domains"))
                }
                Err(Refusal::Scheme(s)) => attempt.error(format!("it redirects to a URL of scheme '{s}'")),
            }
        });
        let client = reqwest::Client::builder()
            .redirect(follow)
            .referer(false)
            .connect_timeout(policy.timeout)
            .user_agent(concat!("lmplex/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| lmplex_core::Error::internal(format!("cannot build the media fetcher: {e}")))?;
        Ok(Self { policy, client: Some(client), in_flight })
    }

    /// The policy in force.
    pub fn policy(&self) -> &MediaPolicy {
        &self.policy
    }

    /// Whether `url` would be fetched (scheme and host), without connecting; else the refusal
    /// a fetch would give.
    pub fn check(&self, url: &str) -> Result<(), String> {
        let parsed = reqwest::Url::parse(url).map_err(|e| format!("the image URL is not valid: {e}"))?;
        self.policy.check(&parsed).map(|_| ()).map_err(|r| self.policy.refused(r))
    }

    /// The images of `urls`, each distinct URL fetched once and all at once (each within the
    /// cap on fetches in flight); the first failure ends the others.
    pub async fn fetch_all(&self, urls: &[&str]) -> Result<Fetched, String> {
        let mut distinct: Vec<&str> = urls.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let fetches = distinct.iter().map(|url| async move { self.fetch(url).await.map(|b| (url.to_string(), b)) });
        Ok(Fetched(futures_util::future::try_join_all(fetches).await?.into_iter().collect()))
    }

    /// One image's bytes, or why it was not fetched.
    pub async fn fetch(&self, url: &str) -> Result<Arc<[u8]>, String> {
        let parsed = reqwest::Url::parse(url).map_err(|e| format!("the image URL is not valid: {e}"))?;
        let host = self.policy.check(&parsed).map_err(|r| self.policy.refused(r))?;
        let client = self.client.as_ref().ok_or_else(|| self.policy.refused(Refusal::Host(host.clone())))?;
        let start = Instant::now();
        let timeout = self.policy.timeout;
        let admitted = AtomicBool::new(false);
        let fetch = async {
            let _permit = self.in_flight.acquire().await.map_err(|_| "the media fetcher has stopped".to_string())?;
            admitted.store(true, Ordering::Relaxed);
            self.get(client, parsed, &host).await
        };
        let got = tokio::time::timeout(timeout, fetch).await;
        let got = match got {
            Ok(got) => got,
            Err(_) if !admitted.load(Ordering::Relaxed) => Err(format!(
                "the image from '{host}' waited longer than {} s (media_fetch_timeout_s) for one of the {} fetches \
                 in flight (max_concurrent_media_fetches) to end",
                timeout.as_secs_f64(),
                self.policy.max_concurrent
            )),
            Err(_) => Err(format!(
                "fetching the image from '{host}' took longer than {} s (media_fetch_timeout_s)",
                timeout.as_secs_f64()
            )),
        };
        let ms = start.elapsed().as_secs_f64() * 1e3;
        match &got {
            Ok(bytes) => tracing::debug!(%host, bytes = bytes.len(), ms, "fetched an image"),
            Err(e) => tracing::info!(%host, ms, error = %e, "an image was not fetched"),
        }
        got
    }

    /// The body of `url` (on `host`), read up to the cap.
    async fn get(&self, client: &reqwest::Client, url: reqwest::Url, host: &str) -> Result<Arc<[u8]>, String> {
        let mut res = client.get(url).send().await.map_err(|e| failed(host, e))?;
        if !res.status().is_success() {
            return Err(format!("fetching the image from '{host}' failed: HTTP {}", res.status()));
        }
        let max = self.policy.max_bytes;
        let too_large = || format!("the image from '{host}' is larger than {max} bytes, the most an image may have");
        if res.content_length().is_some_and(|n| n > max as u64) {
            return Err(too_large());
        }
        let mut body = Vec::with_capacity(res.content_length().map_or(0, |n| n as usize));
        while let Some(chunk) = res.chunk().await.map_err(|e| failed(host, e))? {
            if body.len() + chunk.len() > max {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body.into())
    }
}

/// Why a fetch from `host` failed: the error and its causes, without the URL.
fn failed(host: &str, e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut reason = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        reason = format!("{reason}: {s}");
        source = s.source();
    }
    format!("fetching the image from '{host}' failed: {reason}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(hosts: &[&str]) -> MediaPolicy {
        MediaPolicy::new(&hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>(), 5.0).unwrap()
    }

    /// With no host listed nothing is fetched, and the refusal says how to allow one; `check`
    /// refuses as `fetch` does.
    #[tokio::test]
    async fn no_host_listed_fetches_nothing_and_says_how_to_allow_one() {
        let media = MediaFetcher::new(MediaPolicy::default()).unwrap();
        assert!(media.client.is_none());
        let e = media.fetch("https://example.com/cat.png?token=secret").await.unwrap_err();
        assert!(
            e.contains("only data: URLs") && e.contains("allowed_media_domains") && e.contains("'example.com'"),
            "{e}"
        );
        assert!(!e.contains("secret") && !e.contains("cat.png"), "{e}");
        assert_eq!(media.check("https://example.com/cat.png?token=secret").unwrap_err(), e);
        let listed = MediaFetcher::new(policy(&["a.example"])).unwrap();
        let e = listed.fetch("http://b.example/x").await.unwrap_err();
        assert!(e.contains("'b.example' is not in allowed_media_domains"), "{e}");
        assert_eq!(listed.check("http://b.example/x").unwrap_err(), e);
        assert_eq!(listed.check("HTTPS://A.example/x?sig=1"), Ok(()));
        let e = listed.fetch("not a url").await.unwrap_err();
        assert!(e.contains("not valid"), "{e}");
    }

    /// A fetch that cannot get a turn ends within the timeout too, saying why, and never connects.
    #[tokio::test]
    async fn waiting_for_a_turn_counts_against_the_timeout() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let policy = MediaPolicy::new(&["127.0.0.1".into()], 0.2).unwrap().with_max_concurrent(2).unwrap();
        let media = MediaFetcher::new(policy).unwrap();
        let _busy = media.in_flight.clone().acquire_many_owned(2).await.unwrap();
        let e = media.fetch(&format!("http://127.0.0.1:{port}/x.png?sig=secret")).await.unwrap_err();
        assert!(
            e.contains(
                "'127.0.0.1' waited longer than 0.2 s (media_fetch_timeout_s) for one of the 2 fetches in flight"
            ),
            "{e}"
        );
        assert!(!e.contains("secret"), "{e}");
        assert_eq!(listener.accept().unwrap_err().kind(), std::io::ErrorKind::WouldBlock, "it connected");
    }

    /// A refused or unreachable fetch names the host, never the URL's query.
    #[tokio::test]
    async fn a_closed_port_is_an_error_naming_the_host() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let media = MediaFetcher::new(policy(&["127.0.0.1"])).unwrap();
        let e = media.fetch(&format!("http://127.0.0.1:{port}/x.png?sig=secret")).await.unwrap_err();
        assert!(e.contains("'127.0.0.1' failed") && !e.contains("secret"), "{e}");
    }
}
