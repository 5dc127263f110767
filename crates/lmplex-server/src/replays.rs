//! Where `Idempotency-Key` records live (`crate::idempotency` reads and writes them): the
//! shared usage store's `idempotency` documents, else this server's memory, bounded by count and
//! bytes, and for how long.
//!
//! Invariants: a record changes only from what it holds (`replace`, `delete_if`), atomically in
//! the shared store and under one lock in memory; an expired record reads as missing. The
//! shared store's methods block: call them off the async threads.

use crate::error::ApiError;
use lmplex_engine::Documents;
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// How long a finished reply is kept for replay (and a record at all).
pub const REPLAY_TTL_S: f64 = 3600.0;
/// Records kept at most: in memory, and in a SQLite store (Redis bounds them by age only).
pub const MAX_RECORDS: usize = 10_000;
/// The bytes of records kept at most in memory.
const MAX_LOCAL_BYTES: usize = 64 << 20;

/// Seconds since the Unix epoch: records' expiries and claims' `until`.
pub(crate) fn now_s() -> f64 {
    std::time::UNIX_EPOCH.elapsed().map_or(0.0, |d| d.as_secs_f64())
}

/// Where the records live: the shared usage store's `idempotency` documents, else this
/// server's memory.
pub enum Records {
    /// Every server on the store sees them.
    Shared(Documents),
    /// This server's own.
    Local(Mutex<Local>),
}

/// The records in memory: id to (expiry, body), and their bytes.
#[derive(Default)]
pub struct Local {
    map: HashMap<String, (f64, String)>,
    bytes: usize,
}

impl Local {
    fn live(&self, id: &str) -> Option<&String> {
        self.map.get(id).filter(|(until, _)| *until > now_s()).map(|(_, b)| b)
    }

    fn insert(&mut self, id: &str, body: &str, ttl_s: f64) {
        self.remove(id);
        let now = now_s();
        self.bytes += body.len();
        self.map.insert(id.to_string(), (now + ttl_s, body.to_string()));
        if self.map.len() > MAX_RECORDS || self.bytes > MAX_LOCAL_BYTES {
            let expired: Vec<String> =
                self.map.iter().filter(|(_, (u, _))| *u <= now).map(|(k, _)| k.clone()).collect();
            expired.iter().for_each(|k| self.remove(k));
        }
        while self.map.len() > MAX_RECORDS || self.bytes > MAX_LOCAL_BYTES {
            let Some(first) = self.map.iter().min_by(|a, b| a.1 .0.total_cmp(&b.1 .0)).map(|(k, _)| k.clone()) else {
                break;
            };
            self.remove(&first);
        }
    }

    fn remove(&mut self, id: &str) {
        if let Some((_, b)) = self.map.remove(id) {
            self.bytes -= b.len();
        }
    }
}

impl Records {
    /// In `shared` (its `idempotency` namespace) when given, else in memory.
    pub fn new(shared: Option<Documents>) -> Self {
        shared.map_or_else(|| Self::Local(Mutex::default()), |d| Self::Shared(d.namespace("idempotency")))
    }

    fn local(m: &Mutex<Local>) -> std::sync::MutexGuard<'_, Local> {
        m.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `body` as `id` unless a live record holds it; that record's body if one does.
    pub(crate) fn claim(&self, tenant: &str, id: &str, body: &str) -> Result<Option<String>, ApiError> {
        match self {
            Self::Shared(docs) => Ok(docs.claim(tenant, id, body, REPLAY_TTL_S, MAX_RECORDS)?),
            Self::Local(m) => {
                let mut g = Self::local(m);
                if let Some(held) = g.live(id) {
                    return Ok(Some(held.clone()));
                }
                g.insert(id, body, REPLAY_TTL_S);
                Ok(None)
            }
        }
    }

    /// Replaces record `id` with `body` (for `ttl_s`) if it holds `expected`; whether it did.
    pub(crate) fn replace(
        &self,
        tenant: &str,
        id: &str,
        expected: &str,
        body: &str,
        ttl_s: f64,
    ) -> Result<bool, ApiError> {
        match self {
            Self::Shared(docs) => Ok(docs.replace(tenant, id, expected, body, ttl_s)?),
            Self::Local(m) => {
                let mut g = Self::local(m);
                let ours = g.live(id).is_some_and(|b| b == expected);
                if ours {
                    g.insert(id, body, ttl_s);
                }
                Ok(ours)
            }
        }
    }

    /// Removes record `id` if it holds `expected`.
    pub(crate) fn delete_if(&self, tenant: &str, id: &str, expected: &str) -> Result<bool, ApiError> {
        match self {
            Self::Shared(docs) => Ok(docs.delete_if(tenant, id, expected)?),
            Self::Local(m) => {
                let mut g = Self::local(m);
                let ours = g.live(id).is_some_and(|b| b == expected);
                if ours {
                    g.remove(id);
                }
                Ok(ours)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(fingerprint: &str, owner: &str) -> String {
        format!("{{\"state\":\"running\",\"fingerprint\":\"{fingerprint}\",\"owner\":\"{owner}\"}}")
    }

    #[test]
    fn a_local_record_changes_only_from_what_it_holds() {
        let records = Records::new(None);
        let ours = running("f", "me");
        assert!(records.claim("a", "k", &ours).unwrap().is_none());
        assert_eq!(records.claim("a", "k", "other").unwrap().as_deref(), Some(ours.as_str()));
        assert!(!records.replace("a", "k", "other", "x", 60.0).unwrap(), "not its record");
        assert!(records.replace("a", "k", &ours, "x", 60.0).unwrap());
        assert!(!records.delete_if("a", "k", &ours).unwrap() && records.delete_if("a", "k", "x").unwrap());
        assert!(records.claim("a", "k", &ours).unwrap().is_none(), "given up");
        assert!(records.replace("a", "k", &ours, "gone", -1.0).unwrap());
        assert!(records.claim("a", "k", &ours).unwrap().is_none(), "expired");
    }

    #[test]
    fn memory_keeps_within_its_bounds_dropping_the_soonest_to_expire() {
        let mut local = Local::default();
        let big = "x".repeat(MAX_LOCAL_BYTES / 4 + 1);
        for (i, ttl) in [60.0, 10.0, 30.0, 20.0].into_iter().enumerate() {
            local.insert(&format!("k{i}"), &big, ttl);
        }
        assert_eq!(local.map.len(), 3, "the fourth went over the bytes");
        assert!(!local.map.contains_key("k1"), "the soonest to expire went");
        assert_eq!(local.bytes, 3 * big.len());
    }
}
