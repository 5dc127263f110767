//! Stored responses: the Responses API's `store` (default true, as OpenAI's), kept in this
//! server's memory so that `GET` and `DELETE /v1/responses/{id}` and `previous_response_id` find
//! them.
//!
//! Data flow: the responses handler puts each finished response with its conversation (the
//! turns it ran on, without its `instructions`, then its reply as one assistant turn); a call
//! with `previous_response_id` runs on that conversation followed by its own input.
//!
//! Invariants: a response is found only by the tenant that made it (another tenant's id reads
//! as not found, so that its existence is not revealed); at most `max_stored_responses` are kept,
//! the oldest going first, and none older than `stored_responses_ttl_s`; ids carry 128 random
//! bits from the OS, so they cannot be guessed from time or order.

use lmplex_engine::ChatMessage;
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Responses kept when the config says nothing.
pub const DEFAULT_MAX_STORED_RESPONSES: usize = 10_000;
/// How long a response is kept when the config says nothing: a day.
pub const DEFAULT_STORED_RESPONSES_TTL_S: f64 = 86_400.0;

/// One kept response.
#[derive(Debug)]
pub struct StoredResponse {
    /// The response object, as `GET /v1/responses/{id}` answers it.
    pub response: Value,
    /// The turns it ran on (no `instructions`) and its reply: what a follow-up continues.
    pub conversation: Vec<ChatMessage>,
}

struct Entry {
    tenant: String,
    at: Instant,
    stored: Arc<StoredResponse>,
}

#[derive(Default)]
struct Inner {
    by_id: HashMap<String, Entry>,
    /// Ids in the order they were put (deleted ones are skipped when they come up).
    order: VecDeque<(Instant, String)>,
}

/// The server's stored responses; see the module docs.
pub struct ResponseStore {
    max: usize,
    ttl: Duration,
    inner: Mutex<Inner>,
}

impl ResponseStore {
    /// A store of at most `max` responses (0 stores none), each kept `ttl`.
    pub fn new(max: usize, ttl: Duration) -> Self {
        Self { max, ttl, inner: Mutex::default() }
    }

    /// Whether responses are stored at all.
    pub fn is_on(&self) -> bool {
        self.max > 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `stored` as `id` for `tenant`, letting the oldest go past the bounds.
    pub fn put(&self, tenant: &str, id: String, stored: StoredResponse) {
        if !self.is_on() {
            return;
        }
        let now = Instant::now();
        let mut g = self.lock();
        g.order.push_back((now, id.clone()));
        g.by_id.insert(id, Entry { tenant: tenant.to_string(), at: now, stored: Arc::new(stored) });
        while let Some((at, id)) = g.order.front().cloned() {
            let over = g.by_id.len() > self.max || now.duration_since(at) > self.ttl;
            let stale = g.by_id.get(&id).is_none_or(|e| e.at != at);
            if !(over || stale) {
                break;
            }
            g.order.pop_front();
            if !stale {
                g.by_id.remove(&id);
            }
        }
    }

    /// Response `id`, if `tenant` stored it and it has not expired.
    pub fn get(&self, tenant: &str, id: &str) -> Option<Arc<StoredResponse>> {
        let g = self.lock();
        let e = g.by_id.get(id).filter(|e| e.tenant == tenant && e.at.elapsed() <= self.ttl)?;
        Some(e.stored.clone())
    }

    /// Forgets response `id` of `tenant`; whether there was one.
    pub fn delete(&self, tenant: &str, id: &str) -> bool {
        let mut g = self.lock();
        let mine = g.by_id.get(id).is_some_and(|e| e.tenant == tenant && e.at.elapsed() <= self.ttl);
        if mine {
            g.by_id.remove(id);
        }
        mine
    }
}

/// A new response id: `resp_` and 32 hex digits of OS randomness.
pub fn new_response_id() -> String {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        // No OS randomness (never on the platforms lmplex runs on): unique, if guessable.
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        bytes = t.as_nanos().to_le_bytes();
    }
    format!("resp_{}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> StoredResponse {
        StoredResponse {
            response: serde_json::json!({"text": text}),
            conversation: vec![ChatMessage::new("user", text)],
        }
    }

    #[test]
    fn responses_are_the_tenants_own_and_bounded() {
        let s = ResponseStore::new(2, Duration::from_secs(60));
        s.put("a", "r1".into(), one("1"));
        assert_eq!(s.get("a", "r1").unwrap().conversation[0].content, "1");
        assert!(s.get("b", "r1").is_none() && !s.delete("b", "r1"), "another tenant's reads as missing");
        s.put("a", "r2".into(), one("2"));
        s.put("b", "r3".into(), one("3"));
        assert!(s.get("a", "r1").is_none(), "the oldest went first");
        assert!(s.get("a", "r2").is_some() && s.get("b", "r3").is_some());
        assert!(s.delete("a", "r2") && s.get("a", "r2").is_none() && !s.delete("a", "r2"));
        let none = ResponseStore::new(0, Duration::from_secs(60));
        none.put("a", "r".into(), one("x"));
        assert!(!none.is_on() && none.get("a", "r").is_none());
    }

    #[test]
    fn responses_expire() {
        let s = ResponseStore::new(10, Duration::from_millis(30));
        s.put("a", "r1".into(), one("1"));
        std::thread::sleep(Duration::from_millis(60));
        assert!(s.get("a", "r1").is_none());
        s.put("a", "r2".into(), one("2"));
        assert_eq!(s.lock().by_id.len(), 1, "an expired response is let go at the next put");
    }

    #[test]
    fn ids_are_random() {
        let (a, b) = (new_response_id(), new_response_id());
        assert!(a.starts_with("resp_") && a.len() == 37 && a != b);
    }
}
