//! Micro-benchmarks of the scheduler's per-step cost (what the engine pays on top of the
//! forward pass): steady decode steps with 8, 64 and 256 running requests, prefix caching on,
//! fed with fake tokens as in `tests/scheduler.rs`.
//!
//! `cargo bench -p lmplex-sched --bench scheduler`

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use lmplex_kv::KvCacheManager;
use lmplex_sched::{Scheduler, SchedulerConfig, SchedulerOutput, SchedulerRequest};
use std::collections::HashMap;
use std::time::Instant;

const BS: usize = 16;
const PROMPT: usize = 256;
const STEPS: usize = 8;
/// Each request's token limit; the pool holds all of them, so nothing is preempted.
const MAX_TOKENS: usize = PROMPT + 256;

/// One step with fake tokens: every sampled request gets token `7`; nobody finishes.
fn step(s: &mut Scheduler, now: Instant) -> SchedulerOutput {
    let out = s.schedule(now).expect("schedule");
    let sampled: HashMap<_, _> = out.scheduled.iter().filter(|r| r.sample).map(|r| (r.id, vec![7])).collect();
    s.update(&out, &sampled, &[]).expect("update");
    out
}

/// A scheduler whose `n` requests have all finished their prefill.
fn running(n: usize) -> Scheduler {
    let blocks = n * MAX_TOKENS.div_ceil(BS);
    let cfg = SchedulerConfig { max_num_seqs: n, max_num_batched_tokens: 8192, ..Default::default() };
    let mut s = Scheduler::new(cfg, KvCacheManager::new(blocks, BS, true));
    let t = Instant::now();
    for id in 0..n as u64 {
        let prompt = (0..PROMPT as u32).map(|i| (id as u32 * 7919 + i) % 30_000).collect();
        s.add_request(SchedulerRequest::new(id, prompt, MAX_TOKENS, t)).expect("add");
    }
    while step(&mut s, t).scheduled.iter().any(|r| r.token_ids.len() > 1) {}
    s
}

fn decode_steps(c: &mut Criterion) {
    let mut g = c.benchmark_group("scheduler_decode");
    for n in [8usize, 64, 256] {
        g.throughput(Throughput::Elements((n * STEPS) as u64));
        g.bench_function(BenchmarkId::new("running", n), |b| {
            b.iter_batched(
                || running(n),
                |mut s| {
                    let t = Instant::now();
                    for _ in 0..STEPS {
                        assert_eq!(step(&mut s, t).scheduled.len(), n);
                    }
                    s
                },
                BatchSize::LargeInput,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, decode_steps);
criterion_main!(benches);
