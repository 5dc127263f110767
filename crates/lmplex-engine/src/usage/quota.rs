//! One tenant's quotas: sliding request and token windows, concurrency, and a daily cost; the
//! rules every usage store applies (the memory store keeps a `QuotaState` per tenant, the SQLite
//! store rebuilds one from its rows inside each transaction). Times are wall-clock seconds since
//! the Unix epoch, so a state can be stored and read back by another process.
//!
//! The windows are logs of what was admitted in the last `quota_window_s` seconds, not token
//! buckets: a bucket admits its whole capacity at once and then its refill, up to twice the
//! limit in one window, where the issue asks that a limit is never exceeded. (This is also why
//! `governor` does not fit: its GCRA cannot give back the unused part of a reservation.)
//!
//! Invariants, under the one lock: in any window of `quota_window_s` seconds at most
//! `requests_per_minute` admissions and at most `tokens_per_minute` tokens (reservations, less
//! what ended requests gave back) are admitted; at most `max_concurrency` admissions are live;
//! today's settled cost plus the live reservations' worst-case cost never exceeds
//! `max_cost_per_day`. An admission is checked against every limit before any is charged, so a
//! refused request costs nothing.

use lmplex_core::{LimitKind, LimitStatus, QuotaStatus, RateLimit, TenantConfig};
use std::collections::VecDeque;
use std::time::{SystemTime, UNIX_EPOCH};

/// What one admission asks for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ask {
    /// Tokens reserved: the prompts' tokens plus the most tokens they may generate.
    pub tokens: u64,
    /// Money reserved: the cost if every reserved token is spent.
    pub cost: f64,
}

/// The live state of one tenant's quotas.
#[derive(Debug, Default)]
pub(crate) struct QuotaState {
    /// Admission times in the window, oldest first.
    requests: VecDeque<f64>,
    /// `(admission id, time, tokens)` in the window, oldest (and smallest id) first.
    tokens: VecDeque<(u64, f64, u64)>,
    tokens_in_window: u64,
    /// Admissions a store counted in the window without listing them (`restore_summary`):
    /// how many, the oldest's and the newest's times. Their tokens are in `tokens_in_window`.
    summarized: Option<(u64, f64, f64)>,
    pub in_flight: u64,
    /// Days since the epoch (UTC) that `settled_cost` is for.
    day: u64,
    pub settled_cost: f64,
    pub reserved_cost: f64,
}

/// Seconds since the Unix epoch, now.
pub(crate) fn now_s() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The UTC day of `now` (days since the epoch) and the seconds left in it.
pub(crate) fn utc_day_and_rest(now: f64) -> (u64, f64) {
    ((now / 86_400.0) as u64, 86_400.0 - now % 86_400.0)
}

fn limit(kind: LimitKind, what: String, retry_after_s: f64, status: QuotaStatus) -> RateLimit {
    let message = format!("{what}; retry in {retry_after_s:.2} s");
    RateLimit { message, kind, retry_after_s, status }
}

impl QuotaState {
    /// A state read back from a store: the admissions in the window (`(id, time, tokens)`,
    /// oldest first), the live reservations and today's settled cost.
    pub(crate) fn restore(
        window: Vec<(u64, f64, u64)>,
        in_flight: u64,
        reserved_cost: f64,
        settled_cost: f64,
        now: f64,
    ) -> Self {
        let requests = window.iter().map(|e| e.1).collect();
        let tokens_in_window = window.iter().map(|e| e.2).sum();
        let day = utc_day_and_rest(now).0;
        let tokens = window.into();
        Self { requests, tokens, tokens_in_window, summarized: None, in_flight, day, settled_cost, reserved_cost }
    }

    /// A state read back from a store's summary of the window at `now`: `count` admissions of
    /// `tokens` in all, the oldest and newest at `span`, and the rest as `restore`. A token
    /// refusal's wait is not known from a summary (it is 0): restore the whole window for it.
    pub(crate) fn restore_summary(
        (count, tokens, span): (u64, u64, Option<(f64, f64)>),
        in_flight: u64,
        reserved_cost: f64,
        settled_cost: f64,
        now: f64,
    ) -> Self {
        let mut s = Self::restore(Vec::new(), in_flight, reserved_cost, settled_cost, now);
        s.tokens_in_window = tokens;
        s.summarized = span.filter(|_| count > 0).map(|(oldest, newest)| (count, oldest, newest));
        s
    }

    /// Admissions in the window.
    fn num_requests(&self) -> u64 {
        self.requests.len() as u64 + self.summarized.map_or(0, |s| s.0)
    }

    /// The oldest and newest admission times in the window.
    fn oldest_and_newest(&self) -> (Option<f64>, Option<f64>) {
        let (front, back) = (self.requests.front().copied(), self.requests.back().copied());
        match self.summarized {
            None => (front, back),
            Some((_, o, n)) => (Some(front.map_or(o, |f| f.min(o))), Some(back.map_or(n, |b| b.max(n)))),
        }
    }

    /// Drops what left the window and rolls the day over.
    fn expire(&mut self, cfg: &TenantConfig, now: f64) {
        let window = cfg.quota_window_s;
        while self.requests.front().is_some_and(|&t| now - t >= window) {
            self.requests.pop_front();
        }
        while let Some(&(_, t, n)) = self.tokens.front() {
            if now - t < window {
                break;
            }
            self.tokens.pop_front();
            self.tokens_in_window -= n;
        }
        let (day, _) = utc_day_and_rest(now);
        if day != self.day {
            self.day = day;
            self.settled_cost = 0.0;
        }
    }

    /// The request and token windows now (after `expire`).
    fn status(&self, cfg: &TenantConfig, now: f64) -> QuotaStatus {
        let reset = |newest: Option<f64>| newest.map_or(0.0, |t| (t + cfg.quota_window_s - now).max(0.0));
        QuotaStatus {
            requests: cfg.requests_per_minute.map(|l| LimitStatus {
                limit: l,
                remaining: l.saturating_sub(self.num_requests()),
                reset_s: reset(self.oldest_and_newest().1),
            }),
            tokens: cfg.tokens_per_minute.map(|l| LimitStatus {
                limit: l,
                remaining: l.saturating_sub(self.tokens_in_window),
                reset_s: reset(self.oldest_and_newest().1),
            }),
        }
    }

    /// The windows at `now`, expiring first.
    pub fn status_at(&mut self, cfg: &TenantConfig, now: f64) -> QuotaStatus {
        self.expire(cfg, now);
        self.status(cfg, now)
    }

    /// Seconds until the oldest entries that free `need` of the token window have left it.
    fn tokens_free_in(&self, cfg: &TenantConfig, need: u64, now: f64) -> f64 {
        let mut freed = 0;
        for &(_, t, n) in &self.tokens {
            freed += n;
            if freed >= need {
                return (t + cfg.quota_window_s - now).max(0.0);
            }
        }
        0.0
    }

    /// Admits `ask` at `now` as admission `id` (charging every limit) or says which limit
    /// refuses it. An ask no window could ever hold is a `RateLimit` too, with an infinite retry
    /// time (the caller turns it into an invalid request).
    pub fn admit(&mut self, cfg: &TenantConfig, id: u64, ask: Ask, now: f64) -> Result<QuotaStatus, RateLimit> {
        self.expire(cfg, now);
        let status = self.status(cfg, now);
        let name = &cfg.name;
        // What no window could ever hold, first: retrying would not help.
        if let Some(tpm) = cfg.tokens_per_minute.filter(|&l| ask.tokens > l) {
            let what = format!(
                "the request needs {} tokens (prompt plus max_tokens) but tenant '{name}' may use {tpm} per {} s",
                ask.tokens, cfg.quota_window_s
            );
            return Err(limit(LimitKind::Tokens, what, f64::INFINITY, status));
        }
        if let Some(max) = cfg.max_cost_per_day.filter(|&m| ask.cost > m) {
            let what = format!("the request may cost {:.6} but tenant '{name}' may spend {max} a day", ask.cost);
            return Err(limit(LimitKind::Cost, what, f64::INFINITY, status));
        }
        if let Some(max) = cfg.max_concurrency.filter(|&m| self.in_flight >= m) {
            let what = format!("tenant '{name}' has {max} requests in flight, its max_concurrency");
            return Err(limit(LimitKind::Concurrency, what, 1.0, status));
        }
        if let Some(rpm) = cfg.requests_per_minute.filter(|&l| self.num_requests() >= l) {
            let wait = self.oldest_and_newest().0.map_or(0.0, |t| (t + cfg.quota_window_s - now).max(0.0));
            let what = format!("tenant '{name}' reached its limit of {rpm} requests per {} s", cfg.quota_window_s);
            return Err(limit(LimitKind::Requests, what, wait, status));
        }
        if let Some(tpm) = cfg.tokens_per_minute {
            if self.tokens_in_window + ask.tokens > tpm {
                let wait = self.tokens_free_in(cfg, self.tokens_in_window + ask.tokens - tpm, now);
                let what = format!(
                    "tenant '{name}' has {} of its {tpm} tokens per {} s left and the request needs {} \
                     (prompt plus max_tokens)",
                    tpm - self.tokens_in_window,
                    cfg.quota_window_s,
                    ask.tokens
                );
                return Err(limit(LimitKind::Tokens, what, wait, status));
            }
        }
        if let Some(max) = cfg.max_cost_per_day {
            if self.settled_cost + self.reserved_cost + ask.cost > max {
                let (_, rest) = utc_day_and_rest(now);
                let what = format!(
                    "tenant '{name}' has spent or reserved {:.6} of its {max} a day and the request may cost {:.6}",
                    self.settled_cost + self.reserved_cost,
                    ask.cost
                );
                return Err(limit(LimitKind::Cost, what, rest, status));
            }
        }
        self.in_flight += 1;
        self.requests.push_back(now);
        self.tokens.push_back((id, now, ask.tokens));
        self.tokens_in_window += ask.tokens;
        self.reserved_cost += ask.cost;
        Ok(self.status(cfg, now))
    }

    /// Ends admission `id` at `now`: it spent `tokens` of its `ask` and cost `cost`.
    pub fn settle(&mut self, cfg: &TenantConfig, id: u64, ask: Ask, tokens: u64, cost: f64, now: f64) {
        self.expire(cfg, now);
        self.in_flight -= 1;
        // Ids grow with each admission, so the window is sorted by id.
        if let Ok(i) = self.tokens.binary_search_by_key(&id, |e| e.0) {
            let e = &mut self.tokens[i];
            let unused = e.2.saturating_sub(tokens);
            e.2 -= unused;
            self.tokens_in_window -= unused;
        }
        self.reserved_cost = (self.reserved_cost - ask.cost).max(0.0);
        self.settled_cost += cost;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> TenantConfig {
        TenantConfig {
            requests_per_minute: Some(2),
            tokens_per_minute: Some(100),
            max_concurrency: Some(3),
            quota_window_s: 0.2,
            ..TenantConfig::new("t")
        }
    }

    #[test]
    fn requests_are_limited_per_sliding_window_and_recover() {
        let (c, mut q) = (cfg(), QuotaState::default());
        let ask = Ask { tokens: 10, cost: 0.0 };
        let s = q.admit(&c, 1, ask, now_s()).unwrap();
        assert_eq!(s.requests.unwrap().remaining, 1);
        q.admit(&c, 2, ask, now_s()).unwrap();
        let e = q.admit(&c, 3, ask, now_s()).unwrap_err();
        assert_eq!(e.kind, LimitKind::Requests);
        assert!(e.retry_after_s > 0.0 && e.retry_after_s <= 0.2, "{}", e.retry_after_s);
        std::thread::sleep(std::time::Duration::from_secs_f64(e.retry_after_s + 0.01));
        q.admit(&c, 3, ask, now_s()).unwrap();
    }

    #[test]
    fn unused_tokens_come_back_and_concurrency_is_counted() {
        let c = TenantConfig { requests_per_minute: None, ..cfg() };
        let mut q = QuotaState::default();
        let ask = Ask { tokens: 60, cost: 0.0 };
        q.admit(&c, 1, ask, now_s()).unwrap();
        assert_eq!(q.admit(&c, 2, ask, now_s()).unwrap_err().kind, LimitKind::Tokens);
        q.settle(&c, 1, ask, 15, 0.0, now_s()); // used 15 of 60
        let s = q.admit(&c, 2, ask, now_s()).unwrap();
        assert_eq!(s.tokens.unwrap().remaining, 100 - 15 - 60);
        q.admit(&c, 3, Ask { tokens: 1, cost: 0.0 }, now_s()).unwrap();
        q.admit(&c, 4, Ask { tokens: 1, cost: 0.0 }, now_s()).unwrap();
        assert_eq!(q.admit(&c, 5, Ask { tokens: 1, cost: 0.0 }, now_s()).unwrap_err().kind, LimitKind::Concurrency);
        let too_big = q.admit(&c, 6, Ask { tokens: 101, cost: 0.0 }, now_s()).unwrap_err();
        assert!(too_big.retry_after_s.is_infinite());
    }

    #[test]
    fn cost_reserves_the_worst_case_and_settles_the_real_one() {
        let c = TenantConfig { max_cost_per_day: Some(1.0), ..TenantConfig::new("t") };
        let mut q = QuotaState::default();
        q.admit(&c, 1, Ask { tokens: 0, cost: 0.6 }, now_s()).unwrap();
        let e = q.admit(&c, 2, Ask { tokens: 0, cost: 0.6 }, now_s()).unwrap_err();
        assert_eq!(e.kind, LimitKind::Cost);
        q.settle(&c, 1, Ask { tokens: 0, cost: 0.6 }, 0, 0.1, now_s());
        q.admit(&c, 2, Ask { tokens: 0, cost: 0.6 }, now_s()).unwrap();
        assert!((q.settled_cost - 0.1).abs() < 1e-12 && (q.reserved_cost - 0.6).abs() < 1e-12);
    }
}
