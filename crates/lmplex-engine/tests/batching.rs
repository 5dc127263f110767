//! The continuous-batching engine over a tiny random llama: batch invariance against solo runs,
//! a 1,000-request soak with cancellations, prefix caching, the bounded queue, cancellation
//! and the LM Lite batch window.

mod common;

use common::{ids_request, solo, tiny_engine, wait_until_idle, VOCAB};
use lmplex_core::{Error, PreemptionMode, SamplingParams};
use lmplex_engine::RequestHandle;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// A small LCG so the tests need no RNG crate and replay exactly.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn random_request(rng: &mut Lcg, i: usize, max_len: u64) -> lmplex_engine::Request {
    let len = 1 + rng.below(max_len) as usize;
    let ids = prompt(rng, len);
    ids_request(ids, params(rng, i))
}

fn prompt(rng: &mut Lcg, len: usize) -> Vec<u32> {
    (0..len).map(|_| 3 + rng.below(VOCAB as u64 - 3) as u32).collect()
}

fn params(rng: &mut Lcg, i: usize) -> SamplingParams {
    let mut p = SamplingParams { max_tokens: 4 + rng.below(24) as usize, logprobs: Some(3), ..Default::default() };
    if i.is_multiple_of(2) {
        p.temperature = 0.0;
    } else {
        p.temperature = 0.9;
        p.top_p = 0.95;
        p.seed = Some(i as u64);
    }
    p
}

fn drain(h: RequestHandle) -> lmplex_core::RequestOutput {
    h.collect_blocking().unwrap()
}

#[test]
fn batched_requests_are_bit_identical_to_solo_runs() {
    // A small token budget forces chunked prefill and mixes prefill chunks with decodes.
    let (engine, _dir) = tiny_engine(|c| {
        c.max_model_concurrency = 64;
        c.max_num_batched_tokens = Some(96);
        c.max_model_len = Some(512);
    });
    let mut rng = Lcg(11);
    let reqs: Vec<_> = (0..64).map(|i| random_request(&mut rng, i, 200)).collect();
    let alone: Vec<_> = reqs.iter().map(|r| solo(&engine, r)).collect();
    for n in [1usize, 2, 7, 64] {
        // Arrivals spread over time: a few now, the rest while the first ones run.
        let mut handles = Vec::new();
        for (i, r) in reqs.iter().take(n).enumerate() {
            handles.push(engine.submit(r).unwrap());
            if i % 5 == 4 {
                std::thread::sleep(Duration::from_millis(3));
            }
        }
        for (i, h) in handles.into_iter().enumerate() {
            let got = drain(h);
            assert_eq!(got.token_ids, alone[i].token_ids, "request {i} among {n}: tokens differ");
            let (a, b) = (got.logprobs.unwrap(), alone[i].logprobs.clone().unwrap());
            for (x, y) in a.iter().zip(&b) {
                assert_eq!(x.logprob.to_bits(), y.logprob.to_bits(), "request {i} among {n}: logprob differs");
                assert_eq!(x.top, y.top);
            }
            assert_eq!(got.text, alone[i].text);
            assert_eq!(got.finish_reason, alone[i].finish_reason);
        }
    }
    wait_until_idle(&engine);
}

#[test]
fn soak_1000_requests_with_cancellations_and_recompute_preemption() {
    let engine = soak(PreemptionMode::Recompute);
    assert_eq!(engine.stats().num_swaps.load(Ordering::Relaxed), 0);
}

#[test]
fn soak_1000_requests_with_cancellations_and_swap_preemption() {
    let engine = soak(PreemptionMode::Swap);
    assert!(engine.stats().num_swaps.load(Ordering::Relaxed) > 0, "nothing was swapped");
}

/// 1,000 random requests, 30% dropped mid-stream, on a pool small enough to preempt: every
/// completed request equals its solo run, and both KV tiers end free.
fn soak(mode: PreemptionMode) -> lmplex_engine::Engine {
    let (engine, _dir) = tiny_engine(|c| {
        c.preemption_mode = mode;
        c.max_model_concurrency = 32;
        c.max_num_batched_tokens = Some(256);
        c.max_model_len = Some(256);
        c.max_queue_len = 2000;
        // A pool smaller than 32 full sequences, so preemption happens too.
        c.kv_cache_bytes = Some(64 * 8192); // 64 blocks of 16 tokens
    });
    let mut rng = Lcg(5);
    let reqs: Vec<_> = (0..1000).map(|i| random_request(&mut rng, i, 120)).collect();
    let cancel_after: Vec<Option<usize>> =
        (0..1000).map(|_| (rng.below(10) < 3).then(|| rng.below(4) as usize)).collect();
    let mut handles: Vec<Option<RequestHandle>> = reqs.iter().map(|r| Some(engine.submit(r).unwrap())).collect();
    let mut outs: Vec<Option<lmplex_core::RequestOutput>> = (0..1000).map(|_| None).collect();
    // Read the streams round-robin, dropping the cancelled ones after their quota of chunks.
    let mut seen = vec![0usize; 1000];
    let mut partial: Vec<lmplex_core::RequestOutput> = reqs.iter().map(|_| solo_placeholder()).collect();
    while handles.iter().any(Option::is_some) {
        for i in 0..1000 {
            let Some(h) = handles[i].as_mut() else { continue };
            if cancel_after[i] == Some(seen[i]) {
                handles[i] = None; // dropped mid-stream: aborts and frees its blocks
                continue;
            }
            match h.next_blocking() {
                Some(c) => {
                    let c = c.unwrap();
                    seen[i] += 1;
                    fold(&mut partial[i], c);
                }
                None => {
                    handles[i] = None;
                    outs[i] = Some(std::mem::replace(&mut partial[i], solo_placeholder()));
                }
            }
        }
    }
    wait_until_idle(&engine);
    let completed: Vec<usize> = (0..1000).filter(|&i| outs[i].is_some()).collect();
    assert!(completed.len() > 600 && completed.len() < 800, "{} completed", completed.len());
    assert!(engine.stats().num_preemptions.load(Ordering::Relaxed) > 0, "the pool never ran short");
    for &i in &completed {
        let want = solo(&engine, &reqs[i]);
        assert_eq!(outs[i].as_ref().unwrap().token_ids, want.token_ids, "request {i} differs from its solo run");
    }
    wait_until_idle(&engine);
    engine
}

fn solo_placeholder() -> lmplex_core::RequestOutput {
    lmplex_core::RequestOutput {
        prompt: String::new(),
        text: String::new(),
        reasoning: String::new(),
        token_ids: Vec::new(),
        finish_reason: lmplex_core::FinishReason::Length,
        stop_reason: None,
        usage: Default::default(),
        logprobs: None,
        tool_calls: Vec::new(),
        prompt_logprobs: None,
        embedding: None,
    }
}

fn fold(out: &mut lmplex_core::RequestOutput, c: lmplex_core::StreamChunk) {
    out.text.push_str(&c.text);
    out.token_ids.extend(c.token_ids);
    if let Some(f) = c.finish_reason {
        out.finish_reason = f;
    }
}

#[test]
fn a_shared_512_token_prefix_is_computed_once() {
    let (engine, _dir) = tiny_engine(|c| c.max_model_len = Some(1024));
    let mut rng = Lcg(3);
    let prefix = prompt(&mut rng, 512);
    let greedy = SamplingParams { temperature: 0.0, max_tokens: 8, ..Default::default() };
    let with = |tail: &[u32]| ids_request(prefix.iter().chain(tail).copied().collect(), greedy.clone());
    let (a, b) = (with(&prompt(&mut rng, 20)), with(&prompt(&mut rng, 20)));
    let first = solo(&engine, &a);
    let hits0 = engine.stats().prefix_cache_hits.load(Ordering::Relaxed);
    let second = solo(&engine, &b);
    let hits = engine.stats().prefix_cache_hits.load(Ordering::Relaxed) - hits0;
    assert_eq!(hits, 512, "the second request should find all 32 prefix blocks");
    assert_eq!(first.usage.prompt_tokens, 532);
    // The cached K/V give the same tokens as computing everything.
    let (fresh, _d) = tiny_engine(|c| {
        c.max_model_len = Some(1024);
        c.enable_prefix_caching = false;
    });
    assert_eq!(solo(&fresh, &b).token_ids, second.token_ids);
    assert_eq!(fresh.stats().prefix_cache_hits.load(Ordering::Relaxed), 0);
}

#[test]
fn a_full_queue_is_a_capacity_error_and_dropping_frees_it() {
    let (engine, _dir) = tiny_engine(|c| {
        c.max_model_concurrency = 4;
        c.max_queue_len = 2;
        c.model_batch_execute_timeout_ms = 60_000; // the window holds both requests in the queue
    });
    let p = SamplingParams { temperature: 0.0, max_tokens: 4, ..Default::default() };
    let a = engine.submit(&ids_request(vec![5, 6, 7], p.clone())).unwrap();
    let b = engine.submit(&ids_request(vec![8, 9], p.clone())).unwrap();
    match engine.submit(&ids_request(vec![10], p.clone())) {
        Err(Error::Capacity(m)) => assert!(m.contains("max_queue_len=2"), "{m}"),
        other => panic!("expected a capacity error, got {:?}", other.map(|h| h.id())),
    }
    drop((a, b));
    wait_until_idle(&engine);
    // Room again; generate() of more prompts than the queue holds feeds them in as room appears.
    let (engine, _dir) = tiny_engine(|c| c.max_queue_len = 2);
    let outs = engine.generate(&(0..9).map(|i| ids_request(vec![3 + i], p.clone())).collect::<Vec<_>>()).unwrap();
    assert_eq!(outs.len(), 9);
    assert!(outs.iter().all(|o| o.token_ids.len() == 4 || o.finish_reason == lmplex_core::FinishReason::Stop));
}

#[test]
fn dropping_a_stream_frees_its_blocks_at_once() {
    let (engine, _dir) = tiny_engine(|c| c.max_model_len = Some(1024));
    let p = SamplingParams { temperature: 0.0, max_tokens: 900, ignore_eos: true, ..Default::default() };
    let mut h = engine.stream(&ids_request((3..100).collect(), p)).unwrap();
    h.next_blocking().unwrap().unwrap();
    assert!(engine.stats().num_free_kv_blocks.load(Ordering::Acquire) < engine.num_kv_blocks());
    drop(h);
    wait_until_idle(&engine);
    let m = engine.memory();
    assert_eq!(m.kv_cache_used, 0);
    assert_eq!(m.kv_cache_used + m.kv_cache_cached + m.kv_cache_free, m.kv_cache);
}

#[test]
fn batch_window_waits_for_the_timeout_or_a_full_batch() {
    let p = SamplingParams { temperature: 0.0, max_tokens: 2, ..Default::default() };
    let (engine, _dir) = tiny_engine(|c| {
        c.max_model_concurrency = 4;
        c.model_batch_execute_timeout_ms = 300;
    });
    let t0 = Instant::now();
    let mut h = engine.submit(&ids_request(vec![5, 6], p.clone())).unwrap();
    h.next_blocking().unwrap().unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(300), "first step after {:?}", t0.elapsed());
    drop(h);

    let (engine, _dir) = tiny_engine(|c| {
        c.max_model_concurrency = 4;
        c.model_batch_execute_timeout_ms = 5_000;
    });
    let t0 = Instant::now();
    let hs: Vec<_> = (0..4).map(|i| engine.submit(&ids_request(vec![5 + i], p.clone())).unwrap()).collect();
    for h in hs {
        drain(h);
    }
    assert!(t0.elapsed() < Duration::from_millis(2_500), "a full batch waited {:?}", t0.elapsed());
}

#[test]
fn oversized_requests_and_budgets_are_refused_clearly() {
    let (engine, _dir) = tiny_engine(|c| {
        c.max_model_len = Some(1024);
        c.kv_cache_bytes = Some(2 * 2 * 2 * 16 * 4 * 16 * 4); // 4 blocks of 16 tokens
    });
    let p = SamplingParams { max_tokens: 100, ..Default::default() };
    match engine.submit(&ids_request(vec![5; 10], p)) {
        Err(Error::InvalidRequest(m)) => assert!(m.contains("KV pool holds 4 blocks"), "{m}"),
        other => panic!("expected InvalidRequest, got {:?}", other.map(|h| h.id())),
    }
    let dir = tempfile::tempdir().unwrap();
    common::write_tiny_llama(dir.path(), 1);
    let mut cfg = lmplex_core::ModelConfig::new(dir.path().to_string_lossy());
    cfg.kv_cache_bytes = Some(100);
    match lmplex_engine::Engine::new(cfg) {
        Err(Error::InvalidRequest(m)) => assert!(m.contains("smaller than one KV block"), "{m}"),
        other => panic!("expected InvalidRequest, got {:?}", other.err()),
    }
}

/// With one sequence at a time, which of two waiting requests runs first: once `low` (arrived
/// first, priority 5, 8 tokens) has finished, has `high` (priority -1, 900 tokens) finished too?
/// Under priority order `high` ran first, so yes, always; under FCFS `high` starts only after
/// `low` ends and would need its 900 steps in the moment between `low`'s last chunk and the check
/// (a short `high` made this check depend on thread timing on a loaded machine).
fn high_priority_finished_first(policy: lmplex_core::SchedulingPolicy) -> bool {
    let (engine, _dir) = tiny_engine(|c| {
        c.max_model_concurrency = 1;
        c.scheduling_policy = Some(policy);
    });
    let p = |n| SamplingParams { temperature: 0.0, max_tokens: n, ignore_eos: true, ..Default::default() };
    // Long enough (1,000 tokens, near the 1,024 context) that it is still running when the
    // next two are submitted, however fast the kernels; aborted below.
    let mut busy = engine.submit(&ids_request(vec![5, 6, 7], p(1000))).unwrap();
    busy.next_blocking().unwrap().unwrap(); // running: the next two must wait
    let mut low = ids_request(vec![8, 9], p(8));
    low.priority = 5;
    let mut high = ids_request(vec![10, 11], p(900));
    high.priority = -1;
    let low = engine.submit(&low).unwrap();
    let mut high = engine.submit(&high).unwrap();
    drop(busy); // aborted: frees the only sequence slot
    low.collect_blocking().unwrap();
    let mut finished = false;
    while let Some(c) = high.try_next() {
        finished |= c.unwrap().finish_reason.is_some();
    }
    finished
}

#[test]
fn priority_policy_runs_lower_priority_values_first() {
    assert!(high_priority_finished_first(lmplex_core::SchedulingPolicy::Priority));
    assert!(!high_priority_finished_first(lmplex_core::SchedulingPolicy::Fcfs));
}

#[test]
fn cache_salt_keeps_tenants_prefixes_apart() {
    let (engine, _dir) = tiny_engine(|c| c.max_model_len = Some(1024));
    let mut rng = Lcg(9);
    let prefix = prompt(&mut rng, 256);
    let greedy = SamplingParams { temperature: 0.0, max_tokens: 4, ..Default::default() };
    let req = |salt: &str, tail: u32| {
        let mut r = ids_request(prefix.iter().copied().chain([tail]).collect(), greedy.clone());
        r.cache_salt = Some(salt.to_string());
        r
    };
    let hits = || engine.stats().prefix_cache_hits.load(Ordering::Relaxed);
    let a = solo(&engine, &req("tenant-a", 3));
    let h0 = hits();
    let b = solo(&engine, &req("tenant-b", 3));
    assert_eq!(hits() - h0, 0, "another tenant's prefix must not be found");
    assert_eq!(a.token_ids, b.token_ids);
    let h1 = hits();
    solo(&engine, &req("tenant-a", 4));
    assert_eq!(hits() - h1, 256, "the same tenant reuses its prefix");
}

#[test]
fn seeded_draws_are_the_same_picked_by_the_runner_or_by_the_sampler() {
    // Without logprobs a step's picks are made by the runner from the logits (`Pick::pick`:
    // the penalties', bias's and held-back endings' edits, then the draw; kernels on CUDA);
    // asking for logprobs sends them through the sampler. The tokens are the same either way,
    // alone or batched with the other kind.
    let (engine, _dir) = tiny_engine(|c| c.max_model_concurrency = 16);
    let mut rng = Lcg(5);
    let reqs: Vec<_> = (0..8)
        .map(|i| {
            let p = SamplingParams {
                max_tokens: 24,
                temperature: 0.7 + 0.1 * i as f32,
                top_k: [0, 20][i % 2],
                top_p: [1.0, 0.9][i / 2 % 2],
                min_p: [0.0, 0.02][i / 4],
                seed: Some(40 + i as u64),
                ignore_eos: true,
                repetition_penalty: [1.0, 1.2][i % 2],
                presence_penalty: [0.0, 0.4][i / 2 % 2],
                frequency_penalty: [0.0, 0.3][i / 4],
                logit_bias: if i == 5 { [(17, 3.0)].into() } else { Default::default() },
                min_tokens: if i == 6 { 8 } else { 0 },
                ..Default::default()
            };
            ids_request(prompt(&mut rng, 10 + i), p)
        })
        .collect();
    let with_logprobs = |r: &lmplex_engine::Request| {
        let mut r = r.clone();
        r.params.logprobs = Some(0);
        r
    };
    let picked: Vec<_> = reqs.iter().map(|r| solo(&engine, r).token_ids).collect();
    let sampled: Vec<_> = reqs.iter().map(|r| solo(&engine, &with_logprobs(r)).token_ids).collect();
    assert_eq!(picked, sampled);
    let handles: Vec<_> = reqs
        .iter()
        .enumerate()
        .map(|(i, r)| engine.submit(&if i % 3 == 0 { with_logprobs(r) } else { r.clone() }).unwrap())
        .collect();
    let batched: Vec<_> = handles.into_iter().map(|h| drain(h).token_ids).collect();
    assert_eq!(batched, picked);
    assert!(picked.iter().any(|t| t.iter().any(|&x| x != t[0])), "the draws never varied");
}
