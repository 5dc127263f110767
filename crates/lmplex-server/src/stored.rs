//! Stored responses: the Responses API's `store` (default true, as OpenAI's), kept so that
//! `GET` and `DELETE /v1/responses/{id}` and `previous_response_id` find them: in the usage
//! store when it is shared (SQLite, Redis: every server on it finds them, and a restart keeps
//! them; `lmplex_engine::Documents`), else in this server's memory.
//!
//! Data flow: the responses handler puts each finished response with its conversation (the
//! turns it ran on, without its `instructions`, then its reply as one assistant turn); a call
//! with `previous_response_id` runs on that conversation followed by its own input.
//!
//! Invariants: a response is found only by the tenant that made it (another tenant's id reads
//! as not found, so that its existence is not revealed); at most `max_stored_responses` are kept
//! (in memory and SQLite; Redis bounds them by age only), the oldest going first, and none
//! older than `stored_responses_ttl_s`; ids carry 128 random bits from the OS, so they cannot be
//! guessed from time or order. The methods block on the shared store: call them off the async
//! threads.

use crate::error::ApiError;
use lmplex_core::ToolCall;
use lmplex_engine::{ChatMessage, ContentPart, Documents};
use serde::{Deserialize, Serialize};
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
    /// Its own input as items, each with an id (`GET /v1/responses/{id}/input_items`), oldest
    /// first.
    pub input_items: Vec<Value>,
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

/// A kept response as the shared store holds it (JSON).
#[derive(Serialize, Deserialize)]
struct Kept {
    response: Value,
    conversation: Vec<Turn>,
    #[serde(default)]
    input_items: Vec<Value>,
}

/// A chat turn as the shared store holds it.
#[derive(Serialize, Deserialize)]
struct Turn {
    role: String,
    content: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<ToolCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    /// A turn with images: its parts in order (`ChatMessage::parts`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    parts: Vec<Part>,
}

/// A part of a turn with images: its text, or an image's bytes (base64 in the JSON).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Part {
    Text(String),
    ImageBase64(#[serde(with = "base64_bytes")] Vec<u8>),
}

/// Bytes as a base64 string; a string that is not base64 fails the record's deserialization.
mod base64_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        base64::decode(String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl From<&ChatMessage> for Turn {
    fn from(m: &ChatMessage) -> Self {
        let m = m.clone();
        let parts = m
            .parts
            .iter()
            .map(|p| match p {
                ContentPart::Text(t) => Part::Text(t.clone()),
                ContentPart::Image(b) => Part::ImageBase64(b.to_vec()),
            })
            .collect();
        Self {
            role: m.role,
            content: m.content,
            tool_calls: m.tool_calls,
            tool_call_id: m.tool_call_id,
            name: m.name,
            parts,
        }
    }
}

impl From<Turn> for ChatMessage {
    fn from(t: Turn) -> Self {
        Self {
            role: t.role,
            content: t.content,
            tool_calls: t.tool_calls,
            tool_call_id: t.tool_call_id,
            name: t.name,
            parts: t
                .parts
                .into_iter()
                .map(|p| match p {
                    Part::Text(t) => ContentPart::Text(t),
                    Part::ImageBase64(b) => ContentPart::Image(b.into()),
                })
                .collect(),
        }
    }
}

/// The server's stored responses; see the module docs.
pub struct ResponseStore {
    max: usize,
    ttl: Duration,
    inner: Mutex<Inner>,
    shared: Option<Documents>,
}

impl ResponseStore {
    /// A store of at most `max` responses (0 stores none), each kept `ttl`, in `shared` when
    /// given, else in memory.
    pub fn new(max: usize, ttl: Duration, shared: Option<Documents>) -> Self {
        Self { max, ttl, inner: Mutex::default(), shared }
    }

    /// Whether responses are stored at all.
    pub fn is_on(&self) -> bool {
        self.max > 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `stored` as `id` for `tenant`, letting the oldest go past the bounds; a shared
    /// store that cannot be written is logged (the response was answered; it is not kept).
    pub fn put(&self, tenant: &str, id: String, stored: StoredResponse) {
        if !self.is_on() {
            return;
        }
        if let Some(docs) = &self.shared {
            let conversation = stored.conversation.iter().map(Turn::from).collect();
            let kept = Kept { response: stored.response, conversation, input_items: stored.input_items };
            let body = serde_json::to_string(&kept).unwrap_or_default();
            if let Err(e) = docs.put(tenant, &id, &body, self.ttl.as_secs_f64(), self.max) {
                tracing::warn!(response_id = %id, error = %e, "a response was not stored");
            }
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

    /// Response `id`, if `tenant` stored it and it has not expired; an error (503) when the
    /// shared store cannot be read.
    pub fn get(&self, tenant: &str, id: &str) -> Result<Option<Arc<StoredResponse>>, ApiError> {
        if let Some(docs) = &self.shared {
            let Some(body) = docs.get(tenant, id)? else { return Ok(None) };
            let kept: Kept = serde_json::from_str(&body)
                .map_err(|e| ApiError::from(lmplex_core::Error::internal(format!("stored response {id}: {e}"))))?;
            let conversation = kept.conversation.into_iter().map(ChatMessage::from).collect();
            let (response, input_items) = (kept.response, kept.input_items);
            return Ok(Some(Arc::new(StoredResponse { response, conversation, input_items })));
        }
        let g = self.lock();
        Ok(g.by_id.get(id).filter(|e| e.tenant == tenant && e.at.elapsed() <= self.ttl).map(|e| e.stored.clone()))
    }

    /// Forgets response `id` of `tenant`; whether there was one.
    pub fn delete(&self, tenant: &str, id: &str) -> Result<bool, ApiError> {
        if let Some(docs) = &self.shared {
            return Ok(docs.delete(tenant, id)?);
        }
        let mut g = self.lock();
        let mine = g.by_id.get(id).is_some_and(|e| e.tenant == tenant && e.at.elapsed() <= self.ttl);
        if mine {
            g.by_id.remove(id);
        }
        Ok(mine)
    }
}

/// A new response id: `resp_` and 32 hex digits of OS randomness.
pub fn new_response_id() -> String {
    new_id("resp")
}

/// A new id: `prefix`, `_` and 32 hex digits of OS randomness.
pub fn new_id(prefix: &str) -> String {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        // No OS randomness (never on the platforms lmplex runs on): unique, if guessable.
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        bytes = t.as_nanos().to_le_bytes();
    }
    format!("{prefix}_{}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> StoredResponse {
        StoredResponse {
            response: serde_json::json!({"text": text}),
            conversation: vec![ChatMessage::new("user", text)],
            input_items: Vec::new(),
        }
    }

    #[test]
    fn responses_are_the_tenants_own_and_bounded() {
        let s = ResponseStore::new(2, Duration::from_secs(60), None);
        let get = |t: &str, id: &str| s.get(t, id).unwrap();
        let delete = |t: &str, id: &str| s.delete(t, id).unwrap();
        s.put("a", "r1".into(), one("1"));
        assert_eq!(get("a", "r1").unwrap().conversation[0].content, "1");
        assert!(get("b", "r1").is_none() && !delete("b", "r1"), "another tenant's reads as missing");
        s.put("a", "r2".into(), one("2"));
        s.put("b", "r3".into(), one("3"));
        assert!(get("a", "r1").is_none(), "the oldest went first");
        assert!(get("a", "r2").is_some() && get("b", "r3").is_some());
        assert!(delete("a", "r2") && get("a", "r2").is_none() && !delete("a", "r2"));
        let none = ResponseStore::new(0, Duration::from_secs(60), None);
        none.put("a", "r".into(), one("x"));
        assert!(!none.is_on() && none.get("a", "r").unwrap().is_none());
    }

    #[test]
    fn responses_expire() {
        let s = ResponseStore::new(10, Duration::from_millis(30), None);
        s.put("a", "r1".into(), one("1"));
        std::thread::sleep(Duration::from_millis(60));
        assert!(s.get("a", "r1").unwrap().is_none());
        s.put("a", "r2".into(), one("2"));
        assert_eq!(s.lock().by_id.len(), 1, "an expired response is let go at the next put");
    }

    /// A turn with an image round-trips through the shared store's JSON; a record whose image
    /// is not base64 fails to load rather than losing the image.
    #[test]
    fn image_turns_keep_their_images_in_the_shared_store() {
        let parts = vec![ContentPart::Image(Arc::from(&b"\x89PNG bytes"[..])), ContentPart::Text("what is it".into())];
        let turn = ChatMessage::with_parts("user", parts);
        let json = serde_json::to_string(&Turn::from(&turn)).unwrap();
        assert!(json.contains(r#"{"image_base64":"iVBORyBieXRlcw=="}"#), "{json}");
        let back: ChatMessage = serde_json::from_str::<Turn>(&json).unwrap().into();
        assert_eq!(back, turn);
        let corrupt = json.replace("iVBORyBieXRlcw==", "not base64!");
        assert!(serde_json::from_str::<Turn>(&corrupt).is_err());
    }

    #[test]
    fn ids_are_random() {
        let (a, b) = (new_response_id(), new_response_id());
        assert!(a.starts_with("resp_") && a.len() == 37 && a != b);
    }
}
