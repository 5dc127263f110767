//! What a usage store costs one call: the quota check and charge at admission, and the
//! settlement when it ends, timed one by one (so the tail shows), in memory, in a SQLite store
//! and in Redis on loopback (a `redis-server` started here; left out when none is installed): 100
//! tenants with 1-second windows, calls cycling over them (a window holds about a hundred
//! admissions), after a warm-up of as many calls.
//!
//! `scripts/bench_usage_store` runs it and writes `docs/bench/usage-store-cpu.json`; the goals
//! are a p99 of admission under 100 us with SQLite and under 1 ms with Redis.

use lmplex_core::{ModelConfig, TenantConfig, Usage};
use lmplex_engine::{Tenants, UsageStoreSpec};
use std::time::Instant;

const CALLS: usize = 20_000;

fn tenants(store: &UsageStoreSpec) -> Tenants {
    let configs = (0..100)
        .map(|i| TenantConfig {
            requests_per_minute: Some(1_000_000_000),
            tokens_per_minute: Some(1_000_000_000_000),
            max_concurrency: Some(1_000_000),
            max_cost_per_day: Some(1e12),
            quota_window_s: 1.0,
            ..TenantConfig::new(format!("tenant-{i}"))
        })
        .collect();
    Tenants::new(configs).and_then(|t| t.with_store(store, false)).expect("valid tenants")
}

/// p50, p99 and mean of `v` (microseconds).
fn summary(mut v: Vec<f64>) -> serde_json::Value {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    serde_json::json!({"p50_us": at(0.5), "p99_us": at(0.99), "max_us": at(1.0), "mean_us": mean})
}

fn run(store: &UsageStoreSpec) -> serde_json::Value {
    let t = tenants(store);
    let model = ModelConfig { price_per_million_input_tokens: 0.1, ..ModelConfig::new("m") };
    let (mut admit, mut settle, mut both) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..2 * CALLS {
        let tenant = t.get(Some(&format!("tenant-{}", i % 100))).expect("known tenant");
        let t0 = Instant::now();
        let a = tenant.admit(&model, 500, 200).expect("admitted");
        let t1 = Instant::now();
        a.record(Usage { prompt_tokens: 500, completion_tokens: 100, ..Default::default() });
        drop(a);
        let t2 = Instant::now();
        if i >= CALLS {
            let us = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e6;
            admit.push(us(t0, t1));
            settle.push(us(t1, t2));
            both.push(us(t0, t2));
        }
    }
    serde_json::json!({"admit": summary(admit), "settle": summary(settle), "admit_and_settle": summary(both)})
}

/// A `redis-server` on a free loopback port, and its URL; `None` when none is installed.
fn redis_server() -> Option<(std::process::Child, String)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port();
    let child = std::process::Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .ok()?;
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Some((child, format!("redis://127.0.0.1:{port}/0")));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    None
}

fn main() {
    let out = std::env::args().skip_while(|a| a != "--out").nth(1);
    let dir = tempfile::tempdir().expect("a temporary folder");
    let sqlite = UsageStoreSpec::Sqlite { path: dir.path().join("usage.sqlite"), lease_s: 30.0 };
    let mut report = serde_json::json!({
        "what": "admission and settlement of one call, 100 tenants, 1-second windows, calls cycling over them",
        "calls_timed": CALLS,
        "goals": {"sqlite": "p99 of admit under 100 us", "redis": "p99 of admit under 1000 us (loopback)"},
        "memory": run(&UsageStoreSpec::Memory),
        "sqlite": run(&sqlite),
    });
    if let Some((mut child, url)) = redis_server() {
        report["redis"] = run(&UsageStoreSpec::Redis { url, lease_s: 30.0 });
        let _ = child.kill();
        let _ = child.wait();
    }
    let text = serde_json::to_string_pretty(&report).expect("JSON");
    match out {
        Some(path) => std::fs::write(&path, text + "\n").expect("written"),
        None => println!("{text}"),
    }
}
