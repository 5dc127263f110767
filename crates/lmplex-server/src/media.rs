//! Images given by URL: a request's `http`/`https` image URLs are fetched here, before the
//! request becomes chat messages, when their host is listed in `allowed_media_domains`.
//!
//! Data flow: a handler parses its body -> `fetch_images` takes the request's image URLs
//! (`WithImages::image_urls`) and fetches the distinct ones concurrently, as tasks on the async
//! runtime (no worker thread blocks) -> `Fetched`, kept in the request -> its conversion to chat
//! messages takes each URL's bytes from there (`image_bytes`), as it takes a `data:` URL's, and
//! the bytes then flow exactly as a `data:` URL's do.
//!
//! Invariants: with no host listed (the default) nothing is fetched and nothing is connected to;
//! a URL is fetched only when its scheme is `http` or `https` and its host is listed (exact
//! host, case-insensitive, as the `url` crate normalizes it; no wildcards, as vLLM's list), and
//! every redirect is checked the same way (at most `MAX_REDIRECTS`; no `Referer` is sent); one
//! image's fetch (connection, redirects, body) ends within `media_fetch_timeout_s`; a body is
//! read up to `max_bytes` (the image decoder's cap) and refused as soon as it passes it; at most
//! `MAX_FETCHED_IMAGES` URLs per request. Every failure is a 400 naming the host and the reason,
//! never the URL's path or query (which may carry a token), and the logs name the host only.

use crate::error::ApiError;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `media_fetch_timeout_s` when the config says nothing (vLLM's `VLLM_IMAGE_FETCH_TIMEOUT`).
pub const DEFAULT_MEDIA_FETCH_TIMEOUT_S: f64 = 5.0;
/// Most image URLs one request may give (the engine's default `limit_mm_per_prompt` is 8 images).
pub const MAX_FETCHED_IMAGES: usize = 8;
/// Most redirects one fetch follows.
pub const MAX_REDIRECTS: usize = 10;

/// What may be fetched: the hosts listed, how long a fetch may take and how large a body may be.
#[derive(Debug, Clone)]
pub struct MediaPolicy {
    /// The hosts listed, each as the `url` crate writes a URL's host (lowercase, IDNA, `[v6]`).
    allowed: Arc<[String]>,
    /// Longest one image's fetch may take.
    pub timeout: Duration,
    /// Largest body fetched, in bytes (`lmplex_image::ImageLimits::default().max_bytes`).
    pub max_bytes: usize,
}

impl Default for MediaPolicy {
    fn default() -> Self {
        Self {
            allowed: Arc::from([]),
            timeout: Duration::from_secs_f64(DEFAULT_MEDIA_FETCH_TIMEOUT_S),
            max_bytes: lmplex_image::ImageLimits::default().max_bytes,
        }
    }
}

/// Why a URL is not fetched.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    /// Not `http` or `https`.
    Scheme(String),
    /// A host not listed (or none).
    Host(String),
}

impl MediaPolicy {
    /// The policy of `domains` (host names, no scheme, port or path; `::1` or `[::1]` for an
    /// IPv6 address) and `timeout_s` (positive); a bad entry is an error naming it.
    pub fn new(domains: &[String], timeout_s: f64) -> Result<Self, String> {
        if !(timeout_s.is_finite() && timeout_s > 0.0) {
            return Err(format!("media_fetch_timeout_s must be positive, got {timeout_s}"));
        }
        let allowed = domains.iter().map(|d| normal_host(d)).collect::<Result<Vec<_>, _>>()?;
        Ok(Self { allowed: allowed.into(), timeout: Duration::from_secs_f64(timeout_s), ..Self::default() })
    }

    /// Whether no host is listed (nothing is ever fetched).
    pub fn is_off(&self) -> bool {
        self.allowed.is_empty()
    }

    /// `url`'s host when it may be fetched.
    fn check(&self, url: &reqwest::Url) -> Result<String, Refusal> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Refusal::Scheme(url.scheme().to_string()));
        }
        let host = url.host_str().unwrap_or_default().to_string();
        match self.allowed.contains(&host) {
            true => Ok(host),
            false => Err(Refusal::Host(host)),
        }
    }

    /// Why `refusal` stops the fetch of a URL the request gave.
    fn refused(&self, refusal: Refusal) -> String {
        match refusal {
            Refusal::Scheme(s) => format!("URLs of scheme '{s}' are not fetched (data:, http or https)"),
            Refusal::Host(h) if self.is_off() => format!(
                "only data: URLs are accepted: image URLs are not fetched, as allowed_media_domains (a server setting) \
                 lists no host; '{h}' would have to be listed there"
            ),
            Refusal::Host(h) => format!("the host '{h}' is not in allowed_media_domains: its URLs are not fetched"),
        }
    }
}

/// A listed host as the `url` crate writes one, or why `entry` is not a host name.
fn normal_host(entry: &str) -> Result<String, String> {
    let bad = |why: &str| format!("allowed_media_domains: '{entry}' {why}");
    let trimmed = entry.trim();
    if trimmed.is_empty() || trimmed.contains(char::is_whitespace) {
        return Err(bad("is not a host name"));
    }
    if trimmed.contains('*') {
        return Err(bad("has a wildcard: list each host"));
    }
    if trimmed.contains("://") || trimmed.contains(['/', '?', '#', '@']) {
        return Err(bad("is not a host name (no scheme, path or user: `example.com`)"));
    }
    let host = match trimmed.parse::<std::net::Ipv6Addr>() {
        Ok(_) => format!("[{trimmed}]"),
        Err(_) => trimmed.to_string(),
    };
    let url = reqwest::Url::parse(&format!("http://{host}/")).map_err(|e| bad(&format!("is not a host name: {e}")))?;
    if url.port().is_some() || host.rsplit_once(']').map_or(host.as_str(), |(_, p)| p).contains(':') {
        return Err(bad("has a port: list the host name alone"));
    }
    url.host_str().map(str::to_string).ok_or_else(|| bad("is not a host name"))
}

/// The images fetched for one request, by the URL the request gave.
#[derive(Debug, Default, Clone)]
pub struct Fetched(HashMap<String, Arc<[u8]>>);

impl Fetched {
    /// The bytes fetched for `url`, if it was.
    pub fn get(&self, url: &str) -> Option<Arc<[u8]>> {
        self.0.get(url).cloned()
    }
}

/// Whether `url` names a scheme that is fetched (`http:` or `https:`, any case).
pub fn is_fetched_scheme(url: &str) -> bool {
    let scheme = url.split_once(':').map_or("", |(s, _)| s);
    scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")
}

/// An image's bytes from its URL: a `data:` URL's, or those fetched for an `http(s)` URL; any
/// other URL (or one this endpoint does not fetch) is an error saying so.
pub fn image_bytes(url: &str, fetched: &Fetched) -> Result<Arc<[u8]>, String> {
    if url.starts_with("data:") {
        return lmplex_image::data_url(url).map(Arc::from).map_err(|e| e.to_string());
    }
    match fetched.get(url) {
        Some(bytes) => Ok(bytes),
        None if is_fetched_scheme(url) => Err("this endpoint fetches no image URL: send a data: URL".into()),
        None => Err("only data: URLs, and http(s) URLs of hosts in allowed_media_domains, are accepted".into()),
    }
}

/// A request body whose content may give images by URL.
pub trait WithImages {
    /// The request field a failed fetch is reported under (`messages`, `input`).
    const PARAM: &'static str = "messages";
    /// The kind of content part an image is (`image_url`, `input_image`, `image`).
    const PART: &'static str = "image_url";
    /// The `http(s)` image URLs in the request's content, in order.
    fn image_urls(&self) -> Vec<&str> {
        Vec::new()
    }
    /// Keeps the images fetched for `image_urls`, for the conversion to chat messages.
    fn set_images(&mut self, _images: Fetched) {}
}

/// Fetches `req`'s image URLs with `media` and keeps them in `req`; a failure is a 400 naming
/// `R::PARAM`.
pub(crate) async fn fetch_images<R: WithImages>(media: &MediaFetcher, req: &mut R) -> Result<(), ApiError> {
    let urls = req.image_urls();
    if urls.is_empty() {
        return Ok(());
    }
    let fetched =
        media.fetch_all(&urls).await.map_err(|e| ApiError::invalid_param(R::PARAM, format!("{}: {e}", R::PART)))?;
    req.set_images(fetched);
    Ok(())
}

/// Fetches image URLs under a `MediaPolicy` (see the module's invariants).
#[derive(Debug, Clone, Default)]
pub struct MediaFetcher {
    policy: MediaPolicy,
    /// `None` while no host is listed: nothing is fetched.
    client: Option<reqwest::Client>,
}

impl MediaFetcher {
    /// A fetcher for `policy`; its HTTP client is built only when a host is listed.
    pub fn new(policy: MediaPolicy) -> lmplex_core::Result<Self> {
        if policy.is_off() {
            return Ok(Self { policy, client: None });
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
        Ok(Self { policy, client: Some(client) })
    }

    /// The policy in force.
    pub fn policy(&self) -> &MediaPolicy {
        &self.policy
    }

    /// The images of `urls`, each distinct URL fetched once and all at once; the first failure
    /// ends the others.
    pub async fn fetch_all(&self, urls: &[&str]) -> Result<Fetched, String> {
        let mut distinct: Vec<&str> = urls.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() > MAX_FETCHED_IMAGES {
            return Err(format!("a request may give at most {MAX_FETCHED_IMAGES} image URLs, got {}", distinct.len()));
        }
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
        let got = match tokio::time::timeout(timeout, self.get(client, parsed, &host)).await {
            Ok(got) => got,
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

    fn check(p: &MediaPolicy, url: &str) -> Result<String, Refusal> {
        p.check(&reqwest::Url::parse(url).unwrap())
    }

    /// Hosts match exactly and case-insensitively, on both schemes and any port; IP addresses as
    /// the `url` crate writes them; subdomains, other schemes and unlisted hosts do not.
    #[test]
    fn hosts_match_exactly_and_ignore_case() {
        let p = policy(&["Images.Example.com", "127.0.0.1", "::1"]);
        for url in [
            "https://images.example.com/cat.png?token=x",
            "http://IMAGES.example.COM:8080/a",
            "http://127.0.0.1:9/x",
            "http://[::1]/x",
        ] {
            assert!(check(&p, url).is_ok(), "{url}");
        }
        assert_eq!(check(&p, "https://cdn.images.example.com/x"), Err(Refusal::Host("cdn.images.example.com".into())));
        assert_eq!(check(&p, "https://example.com/x"), Err(Refusal::Host("example.com".into())));
        assert_eq!(check(&p, "ftp://images.example.com/x"), Err(Refusal::Scheme("ftp".into())));
        assert_eq!(check(&p, "file:///etc/passwd"), Err(Refusal::Scheme("file".into())));
    }

    /// With no host listed nothing is fetched, and the refusal says how to allow one.
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
        let listed = MediaFetcher::new(policy(&["a.example"])).unwrap();
        let e = listed.fetch("http://b.example/x").await.unwrap_err();
        assert!(e.contains("'b.example' is not in allowed_media_domains"), "{e}");
        let e = listed.fetch("not a url").await.unwrap_err();
        assert!(e.contains("not valid"), "{e}");
    }

    /// Entries that are not bare host names are refused, naming the entry.
    #[test]
    fn bad_entries_are_refused() {
        for (entry, want) in [
            ("http://example.com", "no scheme"),
            ("example.com/images", "no scheme"),
            ("*.example.com", "wildcard"),
            ("example.com:8080", "port"),
            ("[::1]:80", "port"),
            ("", "not a host"),
        ] {
            let e = MediaPolicy::new(&[entry.to_string()], 5.0).unwrap_err();
            assert!(e.contains(want) && e.contains(&format!("'{entry}'")), "{entry}: {e}");
        }
        assert!(MediaPolicy::new(&[], 0.0).unwrap_err().contains("media_fetch_timeout_s"));
        assert_eq!(&*policy(&["[::1]", "LOCALHOST"]).allowed, ["[::1]", "localhost"]);
    }

    /// A refused or unreachable fetch ends in time and names the host, never the URL's query.
    #[tokio::test]
    async fn a_closed_port_is_an_error_naming_the_host() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let media = MediaFetcher::new(policy(&["127.0.0.1"])).unwrap();
        let e = media.fetch(&format!("http://127.0.0.1:{port}/x.png?sig=secret")).await.unwrap_err();
        assert!(e.contains("'127.0.0.1' failed") && !e.contains("secret"), "{e}");
    }

    /// `image_bytes` takes data: URLs and what was fetched, and names what it refuses.
    #[test]
    fn image_bytes_reads_data_urls_and_fetched_ones() {
        let mut fetched = Fetched::default();
        fetched.0.insert("http://h/x".into(), Arc::from(&b"png"[..]));
        assert_eq!(&*image_bytes("data:image/png;base64,aGk=", &fetched).unwrap(), b"hi");
        assert_eq!(&*image_bytes("http://h/x", &fetched).unwrap(), b"png");
        assert!(image_bytes("HTTPS://h/y", &fetched).unwrap_err().contains("fetches no image URL"));
        assert!(image_bytes("ftp://h/y", &fetched).unwrap_err().contains("only data: URLs"));
        assert!(is_fetched_scheme("HtTp://x") && !is_fetched_scheme("data:x") && !is_fetched_scheme("httpx://"));
    }
}
