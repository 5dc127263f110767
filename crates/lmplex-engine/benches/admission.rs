//! What admitting one request costs a multi-tenant server beyond the model: the bearer key
//! checked against 100 tenants' digests, every quota checked and charged and later settled (in
//! memory, and in a SQLite usage store: two transactions, the tenant's window read back, its
//! calls cycling over the 100 tenants; 1-second windows, so a window holds about a hundred
//! admissions), and the `fair`
//! queue ordering the request among 256 waiting ones of 16 tenants (a whole scheduler step that
//! cannot admit, so the sort and the rank lookups are all that runs).
//!
//! `cargo bench -p lmplex-engine --bench admission` (the goals: under 50 us together in memory;
//! admission and settlement under 100 us with SQLite).

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use lmplex_core::{ModelConfig, TenantConfig, Usage};
use lmplex_engine::{Tenants, UsageStoreSpec};
use lmplex_kv::KvCacheManager;
use lmplex_sched::{Policy, Scheduler, SchedulerConfig, SchedulerRequest, TenantShare};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

fn tenants() -> Tenants {
    tenants_in(&UsageStoreSpec::Memory)
}

fn tenants_in(store: &UsageStoreSpec) -> Tenants {
    let configs = (0..100)
        .map(|i| TenantConfig {
            api_key: Some(format!("sk-tenant-{i:03}")),
            requests_per_minute: Some(1_000_000_000),
            quota_window_s: 1.0,
            tokens_per_minute: Some(1_000_000_000),
            max_concurrency: Some(1_000_000),
            max_cost_per_day: Some(1e12),
            ..TenantConfig::new(format!("tenant-{i}"))
        })
        .collect();
    Tenants::new(configs).and_then(|t| t.with_store(store, false)).expect("valid tenants")
}

/// A fair scheduler whose 8 slots are running and 256 requests of 16 tenants wait.
fn busy_scheduler() -> Scheduler {
    let cfg = SchedulerConfig { max_num_seqs: 8, policy: Policy::Fair, ..Default::default() };
    let mut s = Scheduler::new(cfg, KvCacheManager::new(8192, 16, true));
    let t = Instant::now();
    for id in 0..264u64 {
        let mut r = SchedulerRequest::new(id, vec![(id % 30_000) as u32 + 1; 64], 128, t);
        r.tenant = TenantShare { name: Arc::from(format!("tenant-{}", id % 16)), weight: 1.0 + (id % 3) as f64 };
        s.add_request(r).expect("add");
    }
    let out = s.schedule(t).expect("schedule");
    let sampled: HashMap<_, _> = out.scheduled.iter().filter(|r| r.sample).map(|r| (r.id, vec![7])).collect();
    s.update(&out, &sampled, &[]).expect("update");
    s
}

fn admission(c: &mut Criterion) {
    let mut g = c.benchmark_group("admission");
    let t = tenants();
    let model = ModelConfig {
        price_per_million_input_tokens: 0.1,
        price_per_million_output_tokens: 0.4,
        ..ModelConfig::new("m")
    };
    g.bench_function("auth_and_quota_of_100_tenants", |b| {
        b.iter(|| {
            let tenant = t.authenticate("sk-tenant-077").expect("known key");
            let a = tenant.admit(&model, 500, 200).expect("admitted");
            a.record(Usage { prompt_tokens: 500, completion_tokens: 100, ..Default::default() });
            drop(a); // settles
        })
    });
    let dir = tempfile::tempdir().expect("a temporary folder");
    let store = UsageStoreSpec::Sqlite { path: dir.path().join("usage.sqlite"), lease_s: 30.0 };
    let on_disk = tenants_in(&store);
    let mut i = 0usize;
    g.bench_function("quota_of_100_tenants_sqlite", |b| {
        b.iter(|| {
            i += 1;
            let tenant = on_disk.get(Some(&format!("tenant-{}", i % 100))).expect("known tenant");
            let a = tenant.admit(&model, 500, 200).expect("admitted");
            a.record(Usage { prompt_tokens: 500, completion_tokens: 100, ..Default::default() });
            drop(a); // settles
        })
    });
    let mut next = 1_000_000u64;
    g.bench_function("fair_queue_of_256_waiting", |b| {
        b.iter_batched_ref(
            busy_scheduler,
            |s| {
                next += 1;
                let mut r = SchedulerRequest::new(next, vec![5; 64], 128, Instant::now());
                r.tenant = TenantShare { name: Arc::from("tenant-3"), weight: 1.0 };
                s.add_request(r).expect("add");
                let out = s.schedule(Instant::now()).expect("schedule");
                assert!(out.scheduled.iter().all(|r| r.id != next));
                s.abort(next).expect("abort");
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(benches, admission);
criterion_main!(benches);
