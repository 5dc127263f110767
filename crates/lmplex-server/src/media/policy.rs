//! `MediaPolicy`: which image URLs may be fetched (`allowed_media_domains`), how long one fetch
//! may take (`media_fetch_timeout_s`), how many may be in flight at once across the server
//! (`max_concurrent_media_fetches`) and how large a body may be.
//!
//! Invariants: a URL passes only when its scheme is `http` or `https` and its host is listed
//! (exact host, case-insensitive, as the `url` crate normalizes it; no wildcards, as vLLM's
//! list); a listed entry is a bare host name or IP address, checked once here; a refusal names
//! the host, never the URL's path or query.

use std::sync::Arc;
use std::time::Duration;

/// `media_fetch_timeout_s` when the config says nothing (vLLM's `VLLM_IMAGE_FETCH_TIMEOUT`).
pub const DEFAULT_MEDIA_FETCH_TIMEOUT_S: f64 = 5.0;
/// `max_concurrent_media_fetches` when the config says nothing.
pub const DEFAULT_MAX_CONCURRENT_MEDIA_FETCHES: usize = 16;

/// What may be fetched: the hosts listed, how long a fetch may take, how many may run at once and
/// how large a body may be.
#[derive(Debug, Clone)]
pub struct MediaPolicy {
    /// The hosts listed, each as the `url` crate writes a URL's host (lowercase, IDNA, `[v6]`).
    allowed: Arc<[String]>,
    /// Longest one image's fetch may take, waiting for a turn included.
    pub timeout: Duration,
    /// Most fetches in flight at once, across every request of the server.
    pub max_concurrent: usize,
    /// Largest body fetched, in bytes (`lmplex_image::ImageLimits::default().max_bytes`).
    pub max_bytes: usize,
}

impl Default for MediaPolicy {
    fn default() -> Self {
        Self {
            allowed: Arc::from([]),
            timeout: Duration::from_secs_f64(DEFAULT_MEDIA_FETCH_TIMEOUT_S),
            max_concurrent: DEFAULT_MAX_CONCURRENT_MEDIA_FETCHES,
            max_bytes: lmplex_image::ImageLimits::default().max_bytes,
        }
    }
}

/// Why a URL is not fetched.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refusal {
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

    /// This policy with at most `max` fetches in flight at once (at least 1).
    pub fn with_max_concurrent(self, max: usize) -> Result<Self, String> {
        match max {
            0 => Err("max_concurrent_media_fetches must be at least 1, got 0".into()),
            max => Ok(Self { max_concurrent: max, ..self }),
        }
    }

    /// Whether no host is listed (nothing is ever fetched).
    pub fn is_off(&self) -> bool {
        self.allowed.is_empty()
    }

    /// `url`'s host when it may be fetched.
    pub(super) fn check(&self, url: &reqwest::Url) -> Result<String, Refusal> {
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
    pub(super) fn refused(&self, refusal: Refusal) -> String {
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

    /// Entries that are not bare host names are refused, naming the entry; the timeout must be
    /// positive and the cap on fetches in flight at least 1.
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
        assert_eq!(policy(&[]).max_concurrent, DEFAULT_MAX_CONCURRENT_MEDIA_FETCHES);
        assert_eq!(policy(&[]).with_max_concurrent(3).unwrap().max_concurrent, 3);
        assert!(policy(&[]).with_max_concurrent(0).unwrap_err().contains("max_concurrent_media_fetches"));
    }
}
