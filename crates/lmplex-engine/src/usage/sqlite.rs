//! The SQLite usage store: every admission, settlement and report is one transaction on a file
//! that outlives the process and that every process opening it shares (the replicas of an
//! `LMLiteBlock` on one machine, a server and its restart).
//!
//! Tables: `admissions` (each admission's time and tokens: the request and token windows),
//! `reservations` (the live calls: worst-case cost, owning process and lease), `daily_cost`
//! (settled cost per tenant and UTC day), `totals` (per tenant, since the file was made) and
//! `owners` (one row per process that opened it, naming its reservations).
//!
//! Invariants:
//! - An admission is `BEGIN IMMEDIATE` (one writer at a time across processes), then the
//!   quota rules (`QuotaState`) on the tenant's rows as they are inside it, then its rows: so N
//!   processes on one file admit exactly what one would.
//! - A process renews its reservations' leases every third of `lease_s` (a thread of its
//!   own); a reservation whose lease has passed belongs to a process that died (or stalled) and
//!   is charged at its reserved worst-case cost by the next transaction that touches its
//!   tenant. A settlement deletes its reservation first and adds nothing if it was already
//!   charged so: nothing is counted twice, and a crash never makes a call free.
//! - The file is opened in WAL mode with `synchronous=NORMAL`: a committed transaction survives
//!   `kill -9` of the process (an OS crash may lose the last ones, never corrupt the file). Calls
//!   never checkpoint the WAL (its `fsync` would stall them): the lease thread does, on a
//!   connection of its own, four times a second (`PASSIVE`: it waits for no one). A file
//!   that is not an lmplex usage store (another SQLite database, or not SQLite at all) is refused
//!   at open with its path, and nothing is written to it.

use super::{quota, Admitted, Ask, QuotaState, TenantUsage};
use lmplex_core::{Error, LimitKind, QuotaStatus, Result, TenantConfig, Usage};
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

/// `PRAGMA application_id` of an lmplex usage store ("LMPX").
const APPLICATION_ID: i64 = 0x4c4d_5058;
/// The schema's version (`PRAGMA user_version`).
const VERSION: i64 = 1;

const SCHEMA: &str = "
CREATE TABLE owners(id INTEGER PRIMARY KEY, pid INTEGER NOT NULL, started REAL NOT NULL);
CREATE TABLE admissions(id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, t REAL NOT NULL, tokens INTEGER NOT NULL);
CREATE INDEX admissions_by_tenant ON admissions(tenant, t, tokens);
CREATE TABLE reservations(id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, owner INTEGER NOT NULL,
                          lease_until REAL NOT NULL, cost REAL NOT NULL);
CREATE TABLE daily_cost(tenant TEXT NOT NULL, day INTEGER NOT NULL, cost REAL NOT NULL, PRIMARY KEY(tenant, day));
CREATE TABLE totals(tenant TEXT PRIMARY KEY, requests INTEGER NOT NULL, prompt_tokens INTEGER NOT NULL,
                    completion_tokens INTEGER NOT NULL, cost REAL NOT NULL);
";

struct Inner {
    conn: Mutex<Connection>,
    owner: i64,
    lease_s: f64,
}

/// An opened SQLite usage store.
pub(crate) struct SqliteStore {
    inner: Arc<Inner>,
    path: PathBuf,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").field("path", &self.path).finish_non_exhaustive()
    }
}

/// SQLite's busy handler: while another connection writes, retry every 50 us for up to 30 s
/// (its own `busy_timeout` sleeps a millisecond or more between tries, which a transaction of
/// tens of microseconds would pay whenever two servers share the file).
fn wait_briefly(tries: i32) -> bool {
    std::thread::sleep(Duration::from_micros(50));
    tries < 600_000
}

/// Switches `conn`'s file to WAL mode (a no-op once it is). The switch needs the file to itself,
/// and SQLite answers a busy file at once, without its busy handler (another server opening the
/// same new file at the same moment): so wait here, as the handler would, for up to 30 s.
fn wal_mode(conn: &Connection) -> rusqlite::Result<String> {
    let since = std::time::Instant::now();
    loop {
        match conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0)) {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy && since.elapsed() < Duration::from_secs(30) =>
            {
                std::thread::sleep(Duration::from_millis(1));
            }
            done => return done,
        }
    }
}

fn day(now: f64) -> i64 {
    quota::utc_day_and_rest(now).0 as i64
}

impl SqliteStore {
    /// Opens (or creates) the store at `path`; see the invariants for what is refused. Admissions
    /// older than `max_window_s` (the longest window of its tenants) are purged in the background.
    pub(crate) fn open(path: &Path, lease_s: f64, max_window_s: f64) -> Result<Self> {
        let at = |e: rusqlite::Error| Error::invalid(format!("usage store {}: {e}", path.display()));
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                Error::invalid(format!("usage store {}: cannot create its folder: {e}", path.display()))
            })?;
        }
        let mut conn = Connection::open(path).map_err(at)?;
        conn.busy_handler(Some(wait_briefly)).map_err(at)?;
        // Small pages for small rows: a call writes a few pages to the WAL, 1 KiB each (a new file
        // only; an existing one keeps its own).
        conn.execute_batch("PRAGMA page_size = 1024").map_err(at)?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(at)?;
        let app: i64 = tx.query_row("PRAGMA application_id", [], |r| r.get(0)).map_err(at)?;
        let version: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(at)?;
        let tables: i64 = tx.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0)).map_err(at)?;
        match (app, version, tables) {
            (0, 0, 0) => {
                tx.execute_batch(SCHEMA).map_err(at)?;
                tx.execute_batch(&format!(
                    "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {VERSION};"
                ))
                .map_err(at)?;
            }
            (APPLICATION_ID, VERSION, _) => {}
            (APPLICATION_ID, v, _) => {
                return Err(Error::invalid(format!(
                    "usage store {}: schema version {v}, this lmplex reads version {VERSION}",
                    path.display()
                )))
            }
            _ => {
                return Err(Error::invalid(format!(
                    "usage store {}: not an lmplex usage store (another SQLite database); give another path",
                    path.display()
                )))
            }
        }
        tx.execute("INSERT INTO owners(pid, started) VALUES (?1, ?2)", (std::process::id(), quota::now_s()))
            .map_err(at)?;
        let owner = tx.last_insert_rowid();
        tx.commit().map_err(at)?;
        let mode = wal_mode(&conn).map_err(at)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(Error::invalid(format!("usage store {}: the file system refused WAL mode", path.display())));
        }
        conn.execute_batch("PRAGMA synchronous = NORMAL; PRAGMA wal_autocheckpoint = 0").map_err(at)?;
        let background = Connection::open(path).map_err(at)?;
        background.busy_handler(Some(wait_briefly)).map_err(at)?;
        background.execute_batch("PRAGMA synchronous = NORMAL").map_err(at)?;
        let inner = Arc::new(Inner { conn: Mutex::new(conn), owner, lease_s });
        let weak = Arc::downgrade(&inner);
        std::thread::Builder::new()
            .name("lmplex-usage-lease".into())
            .spawn(move || keep_up(weak, background, owner, (lease_s, max_window_s)))
            .map_err(|e| Error::internal(format!("cannot start the usage store's lease thread: {e}")))?;
        Ok(Self { inner, path: path.to_path_buf() })
    }

    pub(super) fn conn(&self) -> MutexGuard<'_, Connection> {
        self.inner.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn failed(&self, e: rusqlite::Error) -> Error {
        Error::Unavailable(format!("usage store {}: {e}; retry later", self.path.display()))
    }

    /// Whether the file answers a query now.
    pub(crate) fn check(&self) -> Result<()> {
        self.conn().query_row("SELECT count(*) FROM owners", [], |_| Ok(())).map_err(|e| self.failed(e))
    }

    pub(crate) fn admit(&self, cfg: &TenantConfig, ask: Ask, now: f64) -> Result<Admitted> {
        let run = || -> rusqlite::Result<Admitted> {
            let mut conn = self.conn();
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            // A placeholder id above every stored one: the new entry is the window's last. A
            // summary of the window decides; a token refusal's wait needs the whole window.
            let mut out = load(&tx, cfg, now, false)?.admit(cfg, u64::MAX, ask, now);
            if out.as_ref().is_err_and(|r| r.kind == LimitKind::Tokens && r.retry_after_s.is_finite()) {
                out = load(&tx, cfg, now, true)?.admit(cfg, u64::MAX, ask, now);
            }
            let status = match out {
                Ok(s) => s,
                Err(refused) => {
                    tx.commit()?;
                    return Ok(Err(refused));
                }
            };
            let name = &cfg.name;
            tx.prepare_cached("INSERT INTO admissions(tenant, t, tokens) VALUES (?1, ?2, ?3)")?.execute((
                name,
                now,
                ask.tokens as i64,
            ))?;
            let id = tx.last_insert_rowid();
            let lease = now + self.inner.lease_s;
            tx.prepare_cached(
                "INSERT INTO reservations(id, tenant, owner, lease_until, cost) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute((id, name, self.inner.owner, lease, ask.cost))?;
            add_totals(&tx, name, (1, 0, 0, 0.0))?;
            tx.commit()?;
            Ok(Ok((id as u64, status)))
        };
        run().map_err(|e| self.failed(e))
    }

    pub(crate) fn settle(&self, cfg: &TenantConfig, id: u64, used: Usage, cost: f64, now: f64) -> Result<()> {
        let run = || -> rusqlite::Result<()> {
            let mut conn = self.conn();
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mine = tx
                .prepare_cached("DELETE FROM reservations WHERE id = ?1 AND owner = ?2")?
                .execute((id as i64, self.inner.owner))?;
            if mine == 1 {
                let tokens = used.total_tokens() as i64;
                tx.prepare_cached("UPDATE admissions SET tokens = min(tokens, ?2) WHERE id = ?1")?
                    .execute((id as i64, tokens))?;
                add_cost(&tx, &cfg.name, day(now), cost)?;
                let (p, c) = (used.prompt_tokens as i64, used.completion_tokens as i64);
                add_totals(&tx, &cfg.name, (0, p, c, cost))?;
            } // else: its lease passed and it was charged at its reservation already
            tx.commit()
        };
        run().map_err(|e| self.failed(e))
    }

    pub(crate) fn usage(&self, cfg: &TenantConfig, now: f64) -> Result<TenantUsage> {
        let run = || -> rusqlite::Result<TenantUsage> {
            let mut conn = self.conn();
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let state = load(&tx, cfg, now, false)?;
            let totals = tx
                .prepare_cached(
                    "SELECT requests, prompt_tokens, completion_tokens, cost FROM totals WHERE tenant = ?1",
                )?
                .query_row([&cfg.name], |r| {
                    Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?, r.get::<_, f64>(3)?))
                })
                .optional()?
                .unwrap_or_default();
            tx.commit()?;
            Ok(TenantUsage {
                requests: totals.0 as u64,
                prompt_tokens: totals.1 as u64,
                completion_tokens: totals.2 as u64,
                cost: totals.3,
                cost_today: state.settled_cost + state.reserved_cost,
                in_flight: state.in_flight,
            })
        };
        run().map_err(|e| self.failed(e))
    }

    pub(crate) fn status(&self, cfg: &TenantConfig, now: f64) -> Result<QuotaStatus> {
        let run = || -> rusqlite::Result<QuotaStatus> {
            let mut conn = self.conn();
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut state = load(&tx, cfg, now, false)?;
            tx.commit()?;
            Ok(state.status_at(cfg, now))
        };
        run().map_err(|e| self.failed(e))
    }
}

/// Every tenant's usage in the store at `path`, by name, read without writing: the totals, with
/// the reservations whose lease has passed counted as charged (as the next admission will) and
/// the others as in flight.
pub(crate) fn report(path: &Path, now: f64) -> Result<Vec<(String, TenantUsage)>> {
    let at = |e: rusqlite::Error| Error::invalid(format!("usage store {}: {e}", path.display()));
    if !path.is_file() {
        return Err(Error::invalid(format!("usage store {}: no such file", path.display())));
    }
    let conn = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(at)?;
    conn.busy_timeout(Duration::from_secs(30)).map_err(at)?;
    let app: i64 = conn.query_row("PRAGMA application_id", [], |r| r.get(0)).map_err(at)?;
    if app != APPLICATION_ID {
        return Err(Error::invalid(format!("usage store {}: not an lmplex usage store", path.display())));
    }
    let sql = "SELECT t.tenant, t.requests, t.prompt_tokens, t.completion_tokens, t.cost,
                      coalesce((SELECT cost FROM daily_cost d WHERE d.tenant = t.tenant AND d.day = ?1), 0.0),
                      (SELECT count(*) FROM reservations r WHERE r.tenant = t.tenant AND r.lease_until >= ?2),
                      coalesce((SELECT sum(cost) FROM reservations r WHERE r.tenant = t.tenant AND r.lease_until >= ?2), 0.0),
                      coalesce((SELECT sum(cost) FROM reservations r WHERE r.tenant = t.tenant AND r.lease_until < ?2), 0.0)
               FROM totals t ORDER BY t.tenant";
    let mut stmt = conn.prepare(sql).map_err(at)?;
    let rows = stmt
        .query_map((day(now), now), |r| {
            let (live, expired): (f64, f64) = (r.get(7)?, r.get(8)?);
            let usage = TenantUsage {
                requests: r.get::<_, i64>(1)? as u64,
                prompt_tokens: r.get::<_, i64>(2)? as u64,
                completion_tokens: r.get::<_, i64>(3)? as u64,
                cost: r.get::<_, f64>(4)? + expired,
                cost_today: r.get::<_, f64>(5)? + expired + live,
                in_flight: r.get::<_, i64>(6)? as u64,
            };
            Ok((r.get::<_, String>(0)?, usage))
        })
        .map_err(at)?;
    rows.collect::<rusqlite::Result<_>>().map_err(at)
}

/// The tenant's quota state inside `tx`, after charging the reservations whose lease passed: its
/// window summarized (count, tokens, oldest, newest), or listed whole with `whole`.
fn load(tx: &Transaction<'_>, cfg: &TenantConfig, now: f64, whole: bool) -> rusqlite::Result<QuotaState> {
    let name = &cfg.name;
    let expired: Vec<(i64, f64)> = tx
        .prepare_cached("SELECT id, cost FROM reservations WHERE tenant = ?1 AND lease_until < ?2")?
        .query_map((name, now), |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (id, cost) in expired {
        tx.prepare_cached("DELETE FROM reservations WHERE id = ?1")?.execute([id])?;
        add_cost(tx, name, day(now), cost)?;
        add_totals(tx, name, (0, 0, 0, cost))?;
    }
    let since = now - cfg.quota_window_s;
    let (in_flight, reserved): (i64, f64) = tx
        .prepare_cached("SELECT count(*), coalesce(sum(cost), 0.0) FROM reservations WHERE tenant = ?1")?
        .query_row([name], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let settled: f64 = tx
        .prepare_cached("SELECT cost FROM daily_cost WHERE tenant = ?1 AND day = ?2")?
        .query_row((name, day(now)), |r| r.get(0))
        .optional()?
        .unwrap_or(0.0);
    if whole {
        let window: Vec<(u64, f64, u64)> = tx
            .prepare_cached("SELECT id, t, tokens FROM admissions WHERE tenant = ?1 AND t > ?2 ORDER BY id")?
            .query_map((name, since), |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?, r.get::<_, i64>(2)? as u64)))?
            .collect::<rusqlite::Result<_>>()?;
        return Ok(QuotaState::restore(window, in_flight as u64, reserved, settled, now));
    }
    let (count, tokens, oldest, newest): (i64, i64, Option<f64>, Option<f64>) = tx
        .prepare_cached(
            "SELECT count(*), coalesce(sum(tokens), 0), min(t), max(t) FROM admissions WHERE tenant = ?1 AND t > ?2",
        )?
        .query_row((name, since), |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
    let summary = (count as u64, tokens as u64, oldest.zip(newest));
    Ok(QuotaState::restore_summary(summary, in_flight as u64, reserved, settled, now))
}

fn add_cost(tx: &Transaction<'_>, tenant: &str, day: i64, cost: f64) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO daily_cost(tenant, day, cost) VALUES (?1, ?2, ?3)
         ON CONFLICT(tenant, day) DO UPDATE SET cost = cost + excluded.cost",
    )?
    .execute((tenant, day, cost))
    .map(|_| ())
}

fn add_totals(tx: &Transaction<'_>, tenant: &str, (r, p, c, cost): (i64, i64, i64, f64)) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO totals(tenant, requests, prompt_tokens, completion_tokens, cost) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT(tenant) DO UPDATE SET requests = requests + excluded.requests,
           prompt_tokens = prompt_tokens + excluded.prompt_tokens,
           completion_tokens = completion_tokens + excluded.completion_tokens, cost = cost + excluded.cost",
    )?
    .execute((tenant, r, p, c, cost))
    .map(|_| ())
}

/// Until the store is dropped: renews the leases of `owner`'s reservations every third of
/// `lease_s`, purges the admissions older than `max_window_s` and checkpoints the WAL, four
/// times a second, on `conn`, a connection of its own.
fn keep_up(inner: Weak<Inner>, conn: Connection, owner: i64, (lease_s, max_window_s): (f64, f64)) {
    const TICK: Duration = Duration::from_millis(250);
    let renew_every = Duration::from_secs_f64((lease_s / 3.0).clamp(0.05, 10.0));
    let mut renewed = std::time::Instant::now();
    loop {
        std::thread::sleep(TICK.min(renew_every));
        if inner.strong_count() == 0 {
            return;
        }
        if renewed.elapsed() >= renew_every {
            renewed = std::time::Instant::now();
            let lease = quota::now_s() + lease_s;
            let renew = conn.prepare_cached("UPDATE reservations SET lease_until = ?1 WHERE owner = ?2");
            if let Err(e) = renew.and_then(|mut st| st.execute((lease, owner))) {
                tracing::warn!(error = %e, "usage store: leases not renewed");
            }
        }
        let purge = conn.prepare_cached("DELETE FROM admissions WHERE t <= ?1");
        if let Err(e) = purge.and_then(|mut st| st.execute([quota::now_s() - max_window_s])) {
            tracing::warn!(error = %e, "usage store: old admissions not purged");
        }
        if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::warn!(error = %e, "usage store: WAL checkpoint failed");
        }
    }
}

#[cfg(test)]
#[path = "sqlite_tests.rs"]
mod tests;
