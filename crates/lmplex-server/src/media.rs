//! Images given by URL: a request's `http`/`https` image URLs are fetched here, once the request
//! may run, when their host is listed in `allowed_media_domains` (`policy`, `fetcher`).
//!
//! Data flow of a generation: the handler parses its body and the caller is authenticated
//! (`Caller`) -> `submit` resolves the model (the tenant may use it, it is served and not
//! draining) and reads the tenant's quota (`quota::precheck`) -> `fetch_images` checks the
//! number of image URLs against the model's `limit_mm_per_prompt.image` and fetches the distinct
//! ones concurrently -> `Fetched`, kept in the request -> its conversion to chat messages takes
//! each URL's bytes from there (`image_bytes`), as it takes a `data:` URL's, and the bytes then
//! flow exactly as a `data:` URL's do.
//!
//! Counting (`/tokenize`, `/v1/messages/count_tokens`) fetches nothing: it renders the chat
//! template, where an image is the template's image marker whatever its bytes (the expansion to
//! the processor's image tokens, which depends on the image's size, happens only when a
//! generation is prepared), so `check_images` only checks each URL as a fetch would (scheme,
//! host, count) and gives the conversion empty bytes for it.
//!
//! Invariants: nothing is fetched for a caller that is not authenticated, may not use the model,
//! is over a quota that refuses any call now, or gives more image URLs than the model takes;
//! with no host listed nothing is fetched and nothing is connected to; every failure is a 400
//! naming the host and the reason, never the URL's path or query (which may carry a token).

mod fetcher;
mod policy;

pub use fetcher::{MediaFetcher, MAX_REDIRECTS};
pub use policy::{MediaPolicy, DEFAULT_MAX_CONCURRENT_MEDIA_FETCHES, DEFAULT_MEDIA_FETCH_TIMEOUT_S};

use crate::error::ApiError;
use std::collections::HashMap;
use std::sync::Arc;

/// The images fetched for one request, by the URL the request gave.
#[derive(Debug, Default, Clone)]
pub struct Fetched(HashMap<String, Arc<[u8]>>);

impl Fetched {
    /// The bytes fetched for `url`, if it was.
    pub fn get(&self, url: &str) -> Option<Arc<[u8]>> {
        self.0.get(url).cloned()
    }

    /// Empty bytes for each of `urls`: what counting (which never reads an image's bytes) gives
    /// the conversion to chat messages.
    fn unread(urls: &[&str]) -> Self {
        Self(urls.iter().map(|u| (u.to_string(), Arc::from(&[][..]))).collect())
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

/// The most images one prompt may hold where a request may run (`limit_mm_per_prompt.image`),
/// and whose limit that is, for the refusal (`the model 'm'`).
#[derive(Debug, Clone)]
pub(crate) struct ImageLimit {
    pub most: usize,
    pub of: String,
}

impl ImageLimit {
    /// A 400 naming `R::PARAM` when `urls` are more than the limit.
    fn check<R: WithImages>(&self, urls: &[&str]) -> Result<(), ApiError> {
        if urls.len() <= self.most {
            return Ok(());
        }
        Err(refused::<R>(format!(
            "the request gives {} image URLs, more than {}, the limit_mm_per_prompt.image of {}: none was fetched",
            urls.len(),
            self.most,
            self.of
        )))
    }
}

fn refused<R: WithImages>(e: String) -> ApiError {
    ApiError::invalid_param(R::PARAM, format!("{}: {e}", R::PART))
}

/// Fetches `req`'s image URLs with `media`, at most `limit` of them, and keeps them in `req`; a
/// failure is a 400 naming `R::PARAM`. The caller has been authorized first (module docs).
pub(crate) async fn fetch_images<R: WithImages>(
    media: &MediaFetcher,
    req: &mut R,
    limit: &ImageLimit,
) -> Result<(), ApiError> {
    let urls = req.image_urls();
    if urls.is_empty() {
        return Ok(());
    }
    limit.check::<R>(&urls)?;
    let fetched = media.fetch_all(&urls).await.map_err(refused::<R>)?;
    req.set_images(fetched);
    Ok(())
}

/// For counting: checks `req`'s image URLs as `fetch_images` would (scheme, host, at most
/// `limit`) without fetching them, and gives the conversion empty bytes for each.
pub(crate) fn check_images<R: WithImages>(
    media: &MediaFetcher,
    req: &mut R,
    limit: &ImageLimit,
) -> Result<(), ApiError> {
    let urls = req.image_urls();
    if urls.is_empty() {
        return Ok(());
    }
    limit.check::<R>(&urls)?;
    urls.iter().try_for_each(|u| media.check(u)).map_err(refused::<R>)?;
    let unread = Fetched::unread(&urls);
    req.set_images(unread);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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

    struct Urls(Vec<&'static str>, Option<Fetched>);

    impl WithImages for Urls {
        fn image_urls(&self) -> Vec<&str> {
            self.0.clone()
        }
        fn set_images(&mut self, images: Fetched) {
            self.1 = Some(images);
        }
    }

    /// More URLs than the limit are refused before any check or fetch, naming the limit; counting
    /// checks each URL as a fetch would and reads none.
    #[tokio::test]
    async fn the_limit_and_the_policy_refuse_before_anything_is_fetched() {
        let media = MediaFetcher::new(MediaPolicy::new(&["a.example".into()], 5.0).unwrap()).unwrap();
        let limit = ImageLimit { most: 2, of: "the model 'vlm'".into() };
        // Unresolvable hosts: a fetch would fail, so passing the limit check would show.
        let mut three = Urls(vec!["http://a.example/1", "http://a.example/2", "http://a.example/3"], None);
        for e in [fetch_images(&media, &mut three, &limit).await, check_images(&media, &mut three, &limit)] {
            let e = e.unwrap_err();
            assert_eq!(e.param.as_deref(), Some("messages"));
            assert!(
                e.message.contains("gives 3 image URLs, more than 2, the limit_mm_per_prompt.image of the model 'vlm'"),
                "{}",
                e.message
            );
        }
        assert!(three.1.is_none());
        let mut two = Urls(vec!["http://a.example/1", "http://a.example/1?sig=s"], None);
        check_images(&media, &mut two, &limit).unwrap();
        let unread = two.1.unwrap();
        assert_eq!(unread.get("http://a.example/1?sig=s").as_deref(), Some(&[][..]));
        let mut off = Urls(vec!["http://b.example/x?sig=s"], None);
        let e = check_images(&media, &mut off, &limit).unwrap_err();
        assert!(
            e.message.starts_with("image_url: the host 'b.example' is not in allowed_media_domains"),
            "{}",
            e.message
        );
        assert!(!e.message.contains("sig=s"), "{}", e.message);
    }
}
