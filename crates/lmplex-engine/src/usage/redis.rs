//! The Redis usage store (`redis://HOST:PORT/DB`): one store for servers on any number of
//! machines, so every replica of a deployment holds each tenant's quota whole.
//!
//! Keys, per tenant `T` (its name inside `{}`, so one tenant's keys share a cluster slot):
//! `lmplex:u:{T}:adm` (a sorted set of admissions `ID:TOKENS` by time: the windows),
//! `:res` (live reservations by lease expiry), `:info` (each reservation's `TOKENS:COST`),
//! `:day` (settled cost per UTC day), `:totals`, and `:ver` (bumped by every change). Admission
//! ids come from `lmplex:u:ids`.
//!
//! Invariants:
//! - An admission is optimistic: `WATCH :ver`, read the window's summary (one Lua script), apply
//!   the quota rules (`QuotaState`) in Rust, then `MULTI` the writes with a bump of `:ver`; if
//!   another server changed the tenant meanwhile, `EXEC` fails and the admission starts again. So
//!   N servers admit exactly what one would, with the same rules as the other stores.
//! - Reservations whose lease has passed (a dead server's) are charged their reserved cost in the
//!   next admission's transaction; a settlement is one script that does nothing when its
//!   reservation is gone, so nothing is counted twice.
//! - A server renews the leases of its own live reservations every third of `lease_s`, on a
//!   connection of its own. Every command has a timeout: an unreachable Redis fails the call
//!   (`Unavailable`: a 503 with `Retry-After`) instead of hanging it, and the next call connects
//!   again, so the server recovers by itself when Redis is back.

use super::{quota, Admitted, Ask, QuotaState, TenantUsage};
use lmplex_core::{Error, LimitKind, QuotaStatus, Result, TenantConfig, Usage};
use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

/// Longest a command may take before the call fails.
const TIMEOUT: Duration = Duration::from_secs(2);
/// Admissions that lose the optimistic race this many times in a row fail (retry later).
const MAX_RACES: usize = 1000;

/// The window's summary and the reservations, read atomically. Returns `{count, tokens, oldest,
/// newest, live, live_cost, settled, expired...}` (numbers as strings; `expired` as id, cost pairs);
/// with `ARGV[4] == "1"` the whole window follows as time, tokens pairs.
const SUMMARY: &str = r"
local adm = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], '+inf', 'WITHSCORES')
local count, tokens, oldest, newest, whole = 0, 0, '', '', {}
for i = 1, #adm, 2 do
  local n = tonumber(string.match(adm[i], ':(%d+)$'))
  count = count + 1
  tokens = tokens + n
  if oldest == '' then oldest = adm[i + 1] end
  newest = adm[i + 1]
  if ARGV[4] == '1' then whole[#whole + 1] = adm[i + 1]; whole[#whole + 1] = tostring(n) end
end
local live, live_cost, expired = 0, 0, {}
local res = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for i = 1, #res, 2 do
  local info = redis.call('HGET', KEYS[3], res[i]) or '0:0'
  local cost = tonumber(string.match(info, ':(.+)$'))
  if tonumber(res[i + 1]) < tonumber(ARGV[2]) then
    expired[#expired + 1] = res[i]; expired[#expired + 1] = tostring(cost)
  else
    live = live + 1; live_cost = live_cost + cost
  end
end
local settled = redis.call('HGET', KEYS[4], ARGV[3]) or '0'
local out = {tostring(count), tostring(tokens), oldest, newest, tostring(live), tostring(live_cost), settled, tostring(#expired / 2)}
for _, v in ipairs(expired) do out[#out + 1] = v end
for _, v in ipairs(whole) do out[#out + 1] = v end
return out
";

/// Settles reservation `ARGV[1]`: gives back unused tokens, adds the cost to the day and the
/// totals; nothing when it is gone (charged at its lease's expiry). Returns 1 if it settled.
const SETTLE: &str = r"
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
local info = redis.call('HGET', KEYS[2], ARGV[1]) or '0:0'
redis.call('HDEL', KEYS[2], ARGV[1])
local reserved = string.match(info, '^(%d+):')
local member = ARGV[1] .. ':' .. reserved
local at = redis.call('ZSCORE', KEYS[3], member)
if at then
  redis.call('ZREM', KEYS[3], member)
  redis.call('ZADD', KEYS[3], at, ARGV[1] .. ':' .. math.min(tonumber(reserved), tonumber(ARGV[2])))
end
redis.call('HINCRBYFLOAT', KEYS[4], ARGV[6], ARGV[5])
redis.call('HINCRBY', KEYS[5], 'prompt_tokens', ARGV[3])
redis.call('HINCRBY', KEYS[5], 'completion_tokens', ARGV[4])
redis.call('HINCRBYFLOAT', KEYS[5], 'cost', ARGV[5])
redis.call('INCR', KEYS[6])
return 1
";

/// One tenant's keys.
struct Keys {
    adm: String,
    res: String,
    info: String,
    day: String,
    totals: String,
    ver: String,
}

impl Keys {
    fn of(tenant: &str) -> Self {
        let k = |s: &str| format!("lmplex:u:{{{tenant}}}:{s}");
        Self { adm: k("adm"), res: k("res"), info: k("info"), day: k("day"), totals: k("totals"), ver: k("ver") }
    }
}

/// What the summary script read.
struct Read {
    state: QuotaState,
    expired: Vec<(String, f64)>,
}

struct Inner {
    client: redis::Client,
    /// `None` after a failure: the next call connects again (Redis restarted, or came back).
    conn: Mutex<Option<redis::Connection>>,
    /// This server's live reservations, `(tenant, id)`: the lease thread renews them.
    mine: Mutex<HashSet<(String, u64)>>,
    lease_s: f64,
}

/// An opened Redis usage store.
pub(crate) struct RedisStore {
    inner: Arc<Inner>,
    url: String,
    summary: redis::Script,
    settle: redis::Script,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").field("url", &self.url).finish_non_exhaustive()
    }
}

fn connect(client: &redis::Client) -> redis::RedisResult<redis::Connection> {
    let conn = client.get_connection_with_timeout(TIMEOUT)?;
    conn.set_read_timeout(Some(TIMEOUT))?;
    conn.set_write_timeout(Some(TIMEOUT))?;
    Ok(conn)
}

fn num(v: &str) -> f64 {
    v.parse().unwrap_or(0.0)
}

impl RedisStore {
    /// Connects to `url` (checked with a `PING`; an unreachable server is an error now).
    pub(crate) fn open(url: &str, lease_s: f64) -> Result<Self> {
        let shown = url.split('@').next_back().unwrap_or(url).to_string(); // never a password
        let at = |e: redis::RedisError| {
            Error::invalid(format!("usage store redis://{}: {e}", shown.trim_start_matches("redis://")))
        };
        let client = redis::Client::open(url).map_err(at)?;
        let mut conn = connect(&client).map_err(at)?;
        redis::cmd("PING").query::<String>(&mut conn).map_err(at)?;
        let inner = Arc::new(Inner { client, conn: Mutex::new(Some(conn)), mine: Mutex::default(), lease_s });
        let weak = Arc::downgrade(&inner);
        std::thread::Builder::new()
            .name("lmplex-usage-lease".into())
            .spawn(move || renew_leases(weak))
            .map_err(|e| Error::internal(format!("cannot start the usage store's lease thread: {e}")))?;
        let (summary, settle) = (redis::Script::new(SUMMARY), redis::Script::new(SETTLE));
        Ok(Self { inner, url: format!("redis://{}", shown.trim_start_matches("redis://")), summary, settle })
    }

    /// Runs `f` on the store's connection (connecting first if the last call lost it); a
    /// failure drops the connection, and is the call's `Unavailable` error (a 503: retry later).
    pub(super) fn with_conn<T>(&self, f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>) -> Result<T> {
        let mut guard = self.inner.conn.lock().unwrap_or_else(PoisonError::into_inner);
        if guard.is_none() {
            *guard = Some(connect(&self.inner.client).map_err(|e| self.failed(e))?);
        }
        let Some(con) = guard.as_mut() else { return Err(Error::internal("no Redis connection")) };
        f(con).map_err(|e| {
            *guard = None;
            self.failed(e)
        })
    }

    fn failed(&self, e: redis::RedisError) -> Error {
        Error::Unavailable(format!("usage store {}: {e}; retry later", self.url))
    }

    /// The tenant's state at `now` (the window summarized, or whole with `whole`) and the
    /// reservations whose lease has passed.
    fn read(
        &self,
        con: &mut redis::Connection,
        k: &Keys,
        cfg: &TenantConfig,
        now: f64,
        whole: bool,
    ) -> redis::RedisResult<Read> {
        let day = quota::utc_day_and_rest(now).0;
        let since = now - cfg.quota_window_s;
        let v: Vec<String> = self
            .summary
            .key(&k.adm)
            .key(&k.res)
            .key(&k.info)
            .key(&k.day)
            .arg(since)
            .arg(now)
            .arg(day)
            .arg(if whole { "1" } else { "0" })
            .invoke(con)?;
        let get = |i: usize| v.get(i).map_or("", String::as_str);
        let n_expired = num(get(7)) as usize;
        let expired: Vec<(String, f64)> =
            (0..n_expired).map(|j| (get(8 + 2 * j).to_string(), num(get(9 + 2 * j)))).collect();
        let charged: f64 = expired.iter().map(|e| e.1).sum();
        let (live, live_cost, settled) = (num(get(4)) as u64, num(get(5)), num(get(6)) + charged);
        let state = if whole {
            let rest = &v[(8 + 2 * n_expired).min(v.len())..];
            let window =
                rest.chunks_exact(2).enumerate().map(|(i, p)| (i as u64, num(&p[0]), num(&p[1]) as u64)).collect();
            QuotaState::restore(window, live, live_cost, settled, now)
        } else {
            let span = (!get(2).is_empty()).then(|| (num(get(2)), num(get(3))));
            QuotaState::restore_summary((num(get(0)) as u64, num(get(1)) as u64, span), live, live_cost, settled, now)
        };
        Ok(Read { state, expired })
    }

    /// Adds to `pipe` the charge of the reservations whose lease has passed.
    fn charge_expired(pipe: &mut redis::Pipeline, k: &Keys, expired: &[(String, f64)], day: u64) {
        for (id, cost) in expired {
            pipe.cmd("ZREM").arg(&k.res).arg(id).ignore();
            pipe.cmd("HDEL").arg(&k.info).arg(id).ignore();
            pipe.cmd("HINCRBYFLOAT").arg(&k.day).arg(day).arg(*cost).ignore();
            pipe.cmd("HINCRBYFLOAT").arg(&k.totals).arg("cost").arg(*cost).ignore();
        }
    }

    /// Whether Redis answers a `PING` now.
    pub(crate) fn check(&self) -> Result<()> {
        self.with_conn(|con| redis::cmd("PING").query::<String>(con)).map(|_| ())
    }

    pub(crate) fn admit(&self, cfg: &TenantConfig, ask: Ask, now: f64) -> Result<Admitted> {
        let k = Keys::of(&cfg.name);
        let day = quota::utc_day_and_rest(now).0;
        let run = |con: &mut redis::Connection| -> redis::RedisResult<Option<Admitted>> {
            redis::cmd("WATCH").arg(&k.ver).query::<()>(con)?;
            let mut read = self.read(con, &k, cfg, now, false)?;
            let mut out = read.state.admit(cfg, u64::MAX, ask, now);
            if out.as_ref().is_err_and(|r| r.kind == LimitKind::Tokens && r.retry_after_s.is_finite()) {
                read = self.read(con, &k, cfg, now, true)?;
                out = read.state.admit(cfg, u64::MAX, ask, now);
            }
            let mut pipe = redis::pipe();
            pipe.atomic().cmd("INCR").arg(&k.ver).ignore();
            Self::charge_expired(&mut pipe, &k, &read.expired, day);
            let status = match out {
                Ok(status) => status,
                Err(refused) if read.expired.is_empty() => {
                    redis::cmd("UNWATCH").query::<()>(con)?;
                    return Ok(Some(Err(refused)));
                }
                Err(refused) => return Ok(pipe.query::<Option<()>>(con)?.map(|_| Err(refused))),
            };
            let id: u64 = redis::cmd("INCR").arg("lmplex:u:ids").query(con)?;
            let lease = now + self.inner.lease_s;
            pipe.cmd("ZADD").arg(&k.adm).arg(now).arg(format!("{id}:{}", ask.tokens)).ignore();
            pipe.cmd("ZADD").arg(&k.res).arg(lease).arg(id).ignore();
            pipe.cmd("HSET").arg(&k.info).arg(id).arg(format!("{}:{}", ask.tokens, ask.cost)).ignore();
            pipe.cmd("HINCRBY").arg(&k.totals).arg("requests").arg(1).ignore();
            // Admissions older than a day leave the log (no window is that long in practice).
            pipe.cmd("ZREMRANGEBYSCORE").arg(&k.adm).arg("-inf").arg(now - cfg.quota_window_s.max(86_400.0)).ignore();
            Ok(pipe.query::<Option<()>>(con)?.map(|_| Ok((id, status))))
        };
        for _ in 0..MAX_RACES {
            match self.with_conn(run)? {
                Some(Ok((id, status))) => {
                    self.mine().insert((cfg.name.clone(), id));
                    return Ok(Ok((id, status)));
                }
                Some(refused) => return Ok(refused),
                None => continue, // another server changed the tenant: read again
            }
        }
        Err(Error::Capacity(format!("usage store {}: too busy; retry later", self.url)))
    }

    fn mine(&self) -> MutexGuard<'_, HashSet<(String, u64)>> {
        self.inner.mine.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn settle(&self, cfg: &TenantConfig, id: u64, used: Usage, cost: f64, now: f64) -> Result<()> {
        self.mine().remove(&(cfg.name.clone(), id));
        let k = Keys::of(&cfg.name);
        let day = quota::utc_day_and_rest(now).0;
        let mut invocation = self.settle.prepare_invoke();
        invocation
            .key(&k.res)
            .key(&k.info)
            .key(&k.adm)
            .key(&k.day)
            .key(&k.totals)
            .key(&k.ver)
            .arg(id)
            .arg(used.total_tokens())
            .arg(used.prompt_tokens)
            .arg(used.completion_tokens)
            .arg(cost)
            .arg(day);
        self.with_conn(|con| invocation.invoke::<i64>(con)).map(|_| ())
    }

    pub(crate) fn usage(&self, cfg: &TenantConfig, now: f64) -> Result<TenantUsage> {
        let k = Keys::of(&cfg.name);
        let run = |con: &mut redis::Connection| -> redis::RedisResult<TenantUsage> {
            let read = self.read(con, &k, cfg, now, false)?;
            let t: std::collections::HashMap<String, String> = redis::cmd("HGETALL").arg(&k.totals).query(con)?;
            let get = |f: &str| t.get(f).map_or(0.0, |v| num(v));
            let charged: f64 = read.expired.iter().map(|e| e.1).sum();
            Ok(TenantUsage {
                requests: get("requests") as u64,
                prompt_tokens: get("prompt_tokens") as u64,
                completion_tokens: get("completion_tokens") as u64,
                cost: get("cost") + charged,
                cost_today: read.state.settled_cost + read.state.reserved_cost,
                in_flight: read.state.in_flight,
            })
        };
        self.with_conn(run)
    }

    /// Every tenant's usage (`lmplex usage`), read without writing: each tenant that has had a
    /// call, found by its totals key, by name.
    pub(crate) fn report(&self, now: f64) -> Result<Vec<(String, TenantUsage)>> {
        let keys: Vec<String> = self.with_conn(|con| {
            redis::Commands::scan_match::<_, String>(con, "lmplex:u:{*}:totals").map(Iterator::collect)
        })?;
        let mut names: Vec<String> = keys
            .iter()
            .filter_map(|k| k.strip_prefix("lmplex:u:{")?.strip_suffix("}:totals").map(str::to_string))
            .collect();
        names.sort_unstable();
        names.into_iter().map(|n| self.usage(&TenantConfig::new(&n), now).map(|u| (n, u))).collect()
    }

    pub(crate) fn status(&self, cfg: &TenantConfig, now: f64) -> Result<QuotaStatus> {
        let k = Keys::of(&cfg.name);
        let mut read = self.with_conn(|con| self.read(con, &k, cfg, now, false))?;
        Ok(read.state.status_at(cfg, now))
    }
}

/// Until the store is dropped: renews the leases of this server's live reservations every
/// third of the lease, on a connection of its own (made again after a failure).
fn renew_leases(inner: Weak<Inner>) {
    let mut conn: Option<redis::Connection> = None;
    loop {
        let Some(period) = inner.upgrade().map(|i| Duration::from_secs_f64((i.lease_s / 3.0).clamp(0.05, 10.0))) else {
            return;
        };
        std::thread::sleep(period);
        let Some(i) = inner.upgrade() else { return };
        let mine: Vec<(String, u64)> = i.mine.lock().unwrap_or_else(PoisonError::into_inner).iter().cloned().collect();
        if mine.is_empty() {
            continue;
        }
        let lease = quota::now_s() + i.lease_s;
        let mut pipe = redis::pipe();
        for (tenant, id) in &mine {
            pipe.cmd("ZADD").arg(Keys::of(tenant).res).arg("XX").arg(lease).arg(*id).ignore();
        }
        let renewed = match conn.as_mut() {
            Some(c) => pipe.query::<()>(c),
            None => connect(&i.client).and_then(|mut c| pipe.query::<()>(&mut c).map(|()| conn = Some(c))),
        };
        if let Err(e) = renewed {
            conn = None;
            tracing::warn!(error = %e, "usage store: leases not renewed");
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A `redis-server` on a free loopback port, stopped on drop; `None` (the test is skipped)
    /// when the binary is missing, unless `LMPLEX_REQUIRE_REDIS` is set (`scripts/test` sets it).
    pub(in crate::usage) struct Server(std::process::Child, pub(in crate::usage) String);

    impl Server {
        pub(in crate::usage) fn start() -> Option<Self> {
            let port = std::net::TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port();
            let child = std::process::Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .stdout(std::process::Stdio::null())
                .spawn();
            let child = match child {
                Ok(c) => c,
                Err(e) if std::env::var_os("LMPLEX_REQUIRE_REDIS").is_some() => panic!("redis-server: {e}"),
                Err(_) => return None,
            };
            let url = format!("redis://127.0.0.1:{port}/0");
            for _ in 0..200 {
                if RedisStore::open(&url, 30.0).is_ok() {
                    return Some(Self(child, url));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            panic!("redis-server did not start on port {port}");
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn two_stores_share_windows_leases_expire_once_and_token_waits_are_exact() {
        let Some(server) = Server::start() else { return };
        let (a, b) = (RedisStore::open(&server.1, 100.0).unwrap(), RedisStore::open(&server.1, 100.0).unwrap());
        let c = TenantConfig {
            requests_per_minute: Some(3),
            tokens_per_minute: Some(100),
            quota_window_s: 60.0,
            ..TenantConfig::new("t")
        };
        let now = quota::now_s();
        let (id, _) = a.admit(&c, Ask { tokens: 30, cost: 1.0 }, now - 50.0).unwrap().unwrap();
        b.admit(&c, Ask { tokens: 50, cost: 2.0 }, now - 20.0).unwrap().unwrap();
        // 60 more tokens need 40 freed: the second admission frees them at now + 40.
        let refused = b.admit(&c, Ask { tokens: 60, cost: 0.0 }, now).unwrap().unwrap_err();
        assert_eq!(refused.kind, LimitKind::Tokens);
        assert!((refused.retry_after_s - 40.0).abs() < 1e-6, "{}", refused.retry_after_s);
        a.settle(
            &c,
            id,
            Usage {
                prompt_tokens: 5,
                completion_tokens: 5,
                cached_tokens: 0,
                reasoning_tokens: 0,
                cache_created_tokens: 0,
            },
            0.5,
            now,
        )
        .unwrap();
        b.admit(&c, Ask { tokens: 10, cost: 0.0 }, now).unwrap().unwrap();
        assert_eq!(a.admit(&c, Ask { tokens: 1, cost: 0.0 }, now).unwrap().unwrap_err().kind, LimitKind::Requests);
        let u = a.usage(&c, now).unwrap();
        assert_eq!((u.requests, u.prompt_tokens, u.in_flight), (3, 5, 2));
        assert!((u.cost - 0.5).abs() < 1e-9 && (u.cost_today - 2.5).abs() < 1e-9, "{u:?}");
        // b's two reservations (cost 2.0 and 0.0) pass their leases unrenewed: charged once.
        let later = a.usage(&c, now + 101.0).unwrap();
        assert_eq!(later.in_flight, 0);
        assert!((later.cost - 2.5).abs() < 1e-9, "a read counts them: {later:?}");
        a.admit(&c, Ask { tokens: 0, cost: 0.0 }, now + 102.0).unwrap().unwrap();
        let u = a.usage(&c, now + 103.0).unwrap();
        assert!((u.cost - 2.5).abs() < 1e-9, "{u:?}");
        // The report finds every tenant by its keys, with what its server would say.
        b.admit(&TenantConfig::new("other"), Ask { tokens: 1, cost: 0.0 }, now + 103.0).unwrap().unwrap();
        let report = b.report(now + 103.0).unwrap();
        let names: Vec<&str> = report.iter().map(|r| r.0.as_str()).collect();
        assert_eq!(names, ["other", "t"]);
        assert_eq!(report[1].1, u);
        assert_eq!((report[0].1.requests, report[0].1.in_flight), (1, 1));
    }
}
