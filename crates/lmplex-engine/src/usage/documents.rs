//! Documents kept in a shared usage store beside the usage: JSON texts by id, each one
//! tenant's, each with an expiry, in namespaces of their own (the server's stored responses, and
//! its `Idempotency-Key` records), so that any server on the store finds them and a restart keeps
//! them.
//!
//! Invariants: a document is found only with its tenant (another tenant's id reads as
//! missing); an expired one is never returned; a namespace's documents never evict another's;
//! SQLite keeps at most `max` per namespace (the soonest to expire go first) in a table of the
//! namespace's name, created when first needed; Redis keeps each under
//! `lmplex:NAMESPACE:{TENANT}:ID` with its expiry as the key's TTL (no count bound: Redis's own
//! memory policy applies). A `claim`, `replace` or `delete_if` is one atomic step of the store.
//! Store failures are `Unavailable`, as for usage.

use super::redis::RedisStore;
use super::sqlite::SqliteStore;
use super::{quota, Store};
use lmplex_core::Result;
use std::sync::Arc;

/// A shared usage store's documents in one namespace (`Tenants::documents`).
#[derive(Debug, Clone)]
pub struct Documents {
    kind: Kind,
    /// The namespace: the SQLite table and the Redis key's second part.
    space: &'static str,
}

#[derive(Debug, Clone)]
enum Kind {
    Sqlite(Arc<SqliteStore>),
    Redis(Arc<RedisStore>),
}

/// Sets `KEYS[1]` to `ARGV[2]` for `ARGV[3]` ms if it holds `ARGV[1]`.
const REPLACE: &str = r"if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end return 0";
/// Deletes `KEYS[1]` if it holds `ARGV[1]`.
const DELETE_IF: &str = r"if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1]) end return 0";

fn missing_table(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(_, Some(m)) if m.starts_with("no such table"))
}

impl Documents {
    /// The documents of `store` (the `documents` namespace); `None` for the memory store (its
    /// documents stay with the caller).
    pub(crate) fn of(store: &Store) -> Option<Self> {
        let kind = match store {
            Store::Memory => return None,
            Store::Sqlite(s) => Kind::Sqlite(s.clone()),
            Store::Redis(s) => Kind::Redis(s.clone()),
        };
        Some(Self { kind, space: "documents" })
    }

    /// The same store's namespace `space` (a SQL identifier: lower-case letters and `_`).
    pub fn namespace(&self, space: &'static str) -> Self {
        assert!(space.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'), "namespace {space:?}");
        Self { kind: self.kind.clone(), space }
    }

    fn key(&self, tenant: &str, id: &str) -> String {
        let space = if self.space == "documents" { "doc" } else { self.space };
        format!("lmplex:{space}:{{{tenant}}}:{id}")
    }

    fn table_sql(&self) -> String {
        let t = self.space;
        format!(
            "CREATE TABLE IF NOT EXISTS {t}(id TEXT PRIMARY KEY, tenant TEXT NOT NULL, expires REAL NOT NULL,
                                           body TEXT NOT NULL);
             CREATE INDEX IF NOT EXISTS {t}_by_expiry ON {t}(expires);"
        )
    }

    /// Keeps `body` as `tenant`'s document `id` for `ttl_s` seconds, with at most `max` kept.
    pub fn put(&self, tenant: &str, id: &str, body: &str, ttl_s: f64, max: usize) -> Result<()> {
        self.write(tenant, id, body, ttl_s, max, false).map(|_| ())
    }

    /// Keeps `body` as `tenant`'s document `id` as [`Documents::put`] does, unless a document
    /// that has not expired holds `id` already: `None` when kept, else that document's body (in
    /// one transaction, so of two claims at once exactly one is kept). `id` is one namespace
    /// over every tenant here: callers that claim give ids their tenant cannot share.
    pub fn claim(&self, tenant: &str, id: &str, body: &str, ttl_s: f64, max: usize) -> Result<Option<String>> {
        self.write(tenant, id, body, ttl_s, max, true)
    }

    fn write(&self, tenant: &str, id: &str, body: &str, ttl_s: f64, max: usize, claim: bool) -> Result<Option<String>> {
        let now = quota::now_s();
        let t = self.space;
        match &self.kind {
            Kind::Sqlite(s) => {
                let mut conn = s.conn();
                let run = |conn: &mut rusqlite::Connection| -> rusqlite::Result<Option<String>> {
                    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                    tx.execute_batch(&self.table_sql())?;
                    if claim {
                        let held = tx
                            .query_row(
                                &format!("SELECT body FROM {t} WHERE id = ?1 AND expires >= ?2"),
                                (id, now),
                                |r| r.get::<_, String>(0),
                            )
                            .map(Some)
                            .or_else(|e| if e == rusqlite::Error::QueryReturnedNoRows { Ok(None) } else { Err(e) })?;
                        if held.is_some() {
                            return Ok(held);
                        }
                    }
                    tx.execute(
                        &format!("INSERT OR REPLACE INTO {t}(id, tenant, expires, body) VALUES (?1, ?2, ?3, ?4)"),
                        (id, tenant, now + ttl_s, body),
                    )?;
                    tx.execute(&format!("DELETE FROM {t} WHERE expires < ?1"), [now])?;
                    tx.execute(
                        &format!(
                            "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} ORDER BY expires
                             LIMIT max(0, (SELECT count(*) FROM {t}) - ?1))"
                        ),
                        [max as i64],
                    )?;
                    tx.commit()?;
                    Ok(None)
                };
                run(&mut conn).map_err(|e| s.failed(e))
            }
            Kind::Redis(r) => {
                let ms = (ttl_s * 1e3).ceil().max(1.0) as u64;
                let k = self.key(tenant, id);
                if !claim {
                    return r
                        .with_conn(|con| redis::cmd("SET").arg(&k).arg(body).arg("PX").arg(ms).query::<()>(con))
                        .map(|()| None);
                }
                // SET NX, else the holder's body; a holder expiring in between is claimed again.
                for _ in 0..3 {
                    let set: Option<String> =
                        r.with_conn(|con| redis::cmd("SET").arg(&k).arg(body).arg("NX").arg("PX").arg(ms).query(con))?;
                    if set.is_some() {
                        return Ok(None);
                    }
                    if let Some(held) = r.with_conn(|con| redis::cmd("GET").arg(&k).query::<Option<String>>(con))? {
                        return Ok(Some(held));
                    }
                }
                Err(lmplex_core::Error::Unavailable(format!(
                    "usage store: document {id} changed hands while claimed; retry"
                )))
            }
        }
    }

    /// Replaces `tenant`'s document `id` with `body` for `ttl_s` seconds if it holds `expected`
    /// now; whether it did.
    pub fn replace(&self, tenant: &str, id: &str, expected: &str, body: &str, ttl_s: f64) -> Result<bool> {
        let now = quota::now_s();
        match &self.kind {
            Kind::Sqlite(s) => {
                let sql = format!(
                    "UPDATE {} SET body = ?1, expires = ?2 WHERE id = ?3 AND tenant = ?4 AND body = ?5 AND expires >= ?6",
                    self.space
                );
                match s.conn().execute(&sql, (body, now + ttl_s, id, tenant, expected, now)) {
                    Ok(n) => Ok(n > 0),
                    Err(e) if missing_table(&e) => Ok(false),
                    Err(e) => Err(s.failed(e)),
                }
            }
            Kind::Redis(r) => {
                let ms = (ttl_s * 1e3).ceil().max(1.0) as u64;
                let script = redis::Script::new(REPLACE);
                let k = self.key(tenant, id);
                r.with_conn(|con| script.key(&k).arg(expected).arg(body).arg(ms).invoke::<i64>(con)).map(|n| n > 0)
            }
        }
    }

    /// `tenant`'s document `id`, unless missing, another tenant's or expired.
    pub fn get(&self, tenant: &str, id: &str) -> Result<Option<String>> {
        match &self.kind {
            Kind::Sqlite(s) => {
                let conn = s.conn();
                let sql = format!("SELECT body FROM {} WHERE id = ?1 AND tenant = ?2 AND expires >= ?3", self.space);
                let found =
                    conn.prepare_cached(&sql).and_then(|mut q| q.query_row((id, tenant, quota::now_s()), |r| r.get(0)));
                match found {
                    Ok(body) => Ok(Some(body)),
                    Err(rusqlite::Error::QueryReturnedNoRows) => Ok(None),
                    Err(e) if missing_table(&e) => Ok(None),
                    Err(e) => Err(s.failed(e)),
                }
            }
            Kind::Redis(r) => r.with_conn(|con| redis::cmd("GET").arg(self.key(tenant, id)).query(con)),
        }
    }

    /// Forgets `tenant`'s document `id`; whether there was one.
    pub fn delete(&self, tenant: &str, id: &str) -> Result<bool> {
        self.remove(tenant, id, None)
    }

    /// Forgets `tenant`'s document `id` if it holds `expected` now; whether it did.
    pub fn delete_if(&self, tenant: &str, id: &str, expected: &str) -> Result<bool> {
        self.remove(tenant, id, Some(expected))
    }

    fn remove(&self, tenant: &str, id: &str, expected: Option<&str>) -> Result<bool> {
        match &self.kind {
            Kind::Sqlite(s) => {
                let conn = s.conn();
                let t = self.space;
                let now = quota::now_s();
                let done = match expected {
                    None => conn.execute(
                        &format!("DELETE FROM {t} WHERE id = ?1 AND tenant = ?2 AND expires >= ?3"),
                        (id, tenant, now),
                    ),
                    Some(x) => conn.execute(
                        &format!("DELETE FROM {t} WHERE id = ?1 AND tenant = ?2 AND expires >= ?3 AND body = ?4"),
                        (id, tenant, now, x),
                    ),
                };
                match done {
                    Ok(n) => Ok(n > 0),
                    Err(e) if missing_table(&e) => Ok(false),
                    Err(e) => Err(s.failed(e)),
                }
            }
            Kind::Redis(r) => {
                let k = self.key(tenant, id);
                let n = match expected {
                    None => r.with_conn(|con| redis::cmd("DEL").arg(&k).query::<i64>(con))?,
                    Some(x) => r.with_conn(|con| redis::Script::new(DELETE_IF).key(&k).arg(x).invoke::<i64>(con))?,
                };
                Ok(n > 0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::UsageStoreSpec;

    #[test]
    fn sqlite_documents_are_the_tenants_own_bounded_and_kept_across_reopen() {
        let dir = std::env::temp_dir().join(format!("lmplex-docs-{}", std::process::id()));
        let path = dir.join("usage.sqlite");
        let _ = std::fs::remove_dir_all(&dir);
        let spec = UsageStoreSpec::Sqlite { path: path.clone(), lease_s: 30.0 };
        let docs = Documents::of(&Store::open(&spec, 60.0).unwrap()).unwrap();
        assert_eq!(docs.get("a", "r0").unwrap(), None, "no table yet");
        docs.put("a", "r1", "{\"n\":1}", 60.0, 2).unwrap();
        assert_eq!(docs.get("a", "r1").unwrap().as_deref(), Some("{\"n\":1}"));
        assert_eq!(docs.get("b", "r1").unwrap(), None);
        assert!(!docs.delete("b", "r1").unwrap());
        docs.put("a", "r2", "2", 60.0, 2).unwrap();
        docs.put("b", "r3", "3", 60.0, 2).unwrap();
        assert_eq!(docs.get("a", "r1").unwrap(), None, "over the bound: the soonest to expire went");
        assert_eq!(docs.claim("a", "c1", "mine", 60.0, 10).unwrap(), None, "claimed");
        assert_eq!(docs.claim("b", "c1", "theirs", 60.0, 10).unwrap().as_deref(), Some("mine"), "held");
        docs.put("a", "c2", "old", -1.0, 10).unwrap();
        assert_eq!(docs.claim("a", "c2", "new", 60.0, 10).unwrap(), None, "an expired holder holds nothing");
        assert_eq!(docs.get("a", "c2").unwrap().as_deref(), Some("new"));
        assert!(!docs.replace("a", "c2", "old", "x", 60.0).unwrap(), "not what it holds");
        assert!(docs.replace("a", "c2", "new", "newer", 60.0).unwrap());
        assert!(!docs.delete_if("a", "c2", "new").unwrap() && docs.delete_if("a", "c2", "newer").unwrap());
        let keys = docs.namespace("idempotency");
        assert_eq!(keys.get("a", "c1").unwrap(), None, "another namespace");
        keys.put("a", "k", "1", 60.0, 1).unwrap();
        keys.put("a", "k2", "2", 60.0, 1).unwrap();
        assert_eq!(docs.get("a", "c1").unwrap().as_deref(), Some("mine"), "a namespace evicts only its own");
        assert!(docs.delete("a", "c1").unwrap());
        docs.put("a", "gone", "x", -1.0, 10).unwrap();
        assert_eq!(docs.get("a", "gone").unwrap(), None, "expired");
        drop(docs);
        let again = Documents::of(&Store::open(&spec, 60.0).unwrap()).unwrap();
        assert_eq!(again.get("a", "r2").unwrap().as_deref(), Some("2"));
        assert!(again.delete("a", "r2").unwrap() && again.get("a", "r2").unwrap().is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn redis_documents_are_the_tenants_own_and_expire() {
        let Some(server) = crate::usage::redis::tests::Server::start() else { return };
        let spec = UsageStoreSpec::Redis { url: server.1.clone(), lease_s: 30.0 };
        let docs = Documents::of(&Store::open(&spec, 60.0).unwrap()).unwrap();
        docs.put("a", "r1", "one", 60.0, 1).unwrap();
        docs.put("a", "r2", "two", 0.05, 1).unwrap();
        assert_eq!(docs.get("a", "r1").unwrap().as_deref(), Some("one"));
        assert_eq!(docs.get("b", "r1").unwrap(), None);
        assert_eq!(docs.claim("a", "r1", "again", 60.0, 1).unwrap().as_deref(), Some("one"), "held");
        assert!(!docs.delete("b", "r1").unwrap() && docs.delete("a", "r1").unwrap());
        assert_eq!(docs.claim("a", "r1", "again", 60.0, 1).unwrap(), None, "free once deleted");
        assert!(
            !docs.replace("a", "r1", "one", "x", 60.0).unwrap() && docs.replace("a", "r1", "again", "x", 60.0).unwrap()
        );
        assert_eq!(docs.namespace("idempotency").get("a", "r1").unwrap(), None, "another namespace");
        assert!(!docs.delete_if("a", "r1", "again").unwrap() && docs.delete_if("a", "r1", "x").unwrap());
        std::thread::sleep(std::time::Duration::from_millis(120));
        assert_eq!(docs.get("a", "r2").unwrap(), None, "expired");
    }
}
