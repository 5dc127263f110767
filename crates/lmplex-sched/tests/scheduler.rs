//! The scheduler fed with fake model outputs (vLLM's `create_scheduler` / `create_requests`
//! pattern): a "model" whose next token is a pure function of the request and its position, so
//! every finished request has one right answer whatever the batching, chunking or preemption.

use lmplex_kv::manager::ReqId;
use lmplex_kv::KvCacheManager;
use lmplex_sched::{
    BatchMode, CostModel, Policy, PreemptionMode, Scheduler, SchedulerConfig, SchedulerRequest, StepCost,
};
use std::collections::HashMap;
use std::time::{Duration, Instant};

mod common;
use common::{admission_order, create_request, create_scheduler, fake_step, next_token, FakeKv, BS};

/// Runs `s` (with a `FakeKv` of `warm` blocks) until every request is done; returns the tokens
/// computed over the run and how many requests were swapped out.
fn run_to_end(s: &mut Scheduler, hot: usize, warm: usize, t: Instant) -> (usize, usize) {
    let mut kv = FakeKv::new(hot, warm);
    let (mut computed, mut swaps, mut steps) = (0, 0, 0);
    while s.has_unfinished() {
        let out = s.schedule(t).unwrap();
        computed += out.num_batched_tokens;
        swaps += out.swapped_out.len();
        kv.step(s, &out);
        s.kv().check_invariants().unwrap();
        steps += 1;
        assert!(steps < 10_000, "no progress");
    }
    (computed, swaps)
}

#[test]
fn chunked_prefill_follows_the_token_budget() {
    let t = Instant::now();
    let mut s = create_scheduler(64, 4, 16);
    s.add_request(create_request(1, 40, 4, t)).unwrap();
    let mut chunks = Vec::new();
    while s.has_unfinished() {
        let out = s.schedule(t).unwrap();
        assert!(out.num_batched_tokens <= 16);
        chunks.push((out.scheduled[0].token_ids.len(), out.scheduled[0].sample));
        fake_step(&mut s, &out);
    }
    assert_eq!(chunks, vec![(16, false), (16, false), (8, true), (1, true), (1, true), (1, true)]);
    assert_eq!(s.kv().num_free_blocks(), 64);
}

/// A prompt with unsplit spans (a Gemma 3 image's tokens) is chunked at their edges: a chunk
/// that would cut a span ends where it starts, and one that starts at a span longer than the
/// budget takes it whole.
#[test]
fn chunks_end_at_the_edges_of_unsplit_spans() {
    let t = Instant::now();
    let mut s = create_scheduler(64, 4, 16);
    let mut r = create_request(1, 60, 2, t);
    r.unsplit_spans = vec![10..30, 40..50, 52..54];
    s.add_request(r).unwrap();
    let mut chunks = Vec::new();
    while s.has_unfinished() {
        let out = s.schedule(t).unwrap();
        let c = &out.scheduled[0];
        assert_eq!(out.num_batched_tokens, c.token_ids.len());
        chunks.push((c.num_computed_tokens, c.token_ids.len()));
        fake_step(&mut s, &out);
    }
    // 0..10 (not 0..16: it would cut 10..30), 10..30 whole (20 > 16), 30..40 (not 30..46),
    // 40..56 (holding 40..50 and 52..54 whole), 56..60, then the decode step.
    assert_eq!(chunks, vec![(0, 10), (10, 20), (30, 10), (40, 16), (56, 4), (60, 1)]);
    assert_eq!(s.kv().num_free_blocks(), 64);
    // Within a cap (a reservation for a waiting request), a chunk never goes past it.
    let mut r = create_request(2, 60, 2, t);
    r.unsplit_spans = vec![10..30, 40..44];
    assert_eq!((r.fit_chunk_within(0, 16), r.fit_chunk_within(10, 16), r.fit_chunk_within(10, 25)), (10, 0, 25));
    assert_eq!((r.fit_chunk(10, 16), r.fit_chunk(20, 4), r.fit_chunk_within(20, 4)), (20, 10, 0));
}

/// A cached prefix that ends inside an unsplit span (the first blocks of a Gemma 3 image that a
/// request with the same image computed before, the same salt): the next chunk starts there and
/// takes the rest of the span whole, past a token budget smaller than it, as a chunk starting at
/// the span would.
#[test]
fn a_cached_prefix_ending_inside_a_span_resumes_with_the_rest_of_it() {
    let t = Instant::now();
    let mut s = create_scheduler(64, 4, 4);
    let same = |id: ReqId| {
        let prompt: Vec<u32> = (0..40).map(|i| 100 + i).collect();
        let mut r = SchedulerRequest::new(id, prompt, 42, t);
        r.unsplit_spans = std::iter::once(20..40).collect();
        r.cache_salt = Some("images:ab12".into());
        r
    };
    s.add_request(same(1)).unwrap();
    let mut chunks = Vec::new();
    while s.has_unfinished() {
        let out = s.schedule(t).unwrap();
        chunks.push((out.scheduled[0].num_computed_tokens, out.scheduled[0].token_ids.len()));
        fake_step(&mut s, &out);
    }
    // Budget 4: 0..20 by fours, then the span 20..40 whole, then the decode steps.
    assert_eq!(chunks[4..], [(16, 4), (20, 20), (40, 1)]);
    s.add_request(same(2)).unwrap();
    let out = s.schedule(t).unwrap();
    let c = &out.scheduled[0];
    // Blocks 0..16 and 16..32 come from the cache; 32 is inside the span, whose rest is 8 tokens.
    assert_eq!((c.num_computed_tokens, c.token_ids.len()), (32, 8));
    assert_eq!(out.num_batched_tokens, 8);
    // Another image (salt): nothing is shared; its first chunk starts at 0, and the span is
    // again taken whole from its start.
    let mut other = same(3);
    other.cache_salt = Some("images:cd34".into());
    fake_step(&mut s, &out);
    s.add_request(other).unwrap();
    let mut starts = Vec::new();
    while s.has_unfinished() {
        let out = s.schedule(t).unwrap();
        starts.extend(out.scheduled.iter().filter(|c| c.id == 3).map(|c| (c.num_computed_tokens, c.token_ids.len())));
        fake_step(&mut s, &out);
    }
    assert_eq!(starts[0].0, 0, "no cached prefix under another salt");
    assert!(starts.contains(&(20, 20)), "{starts:?}");
}

#[test]
fn shared_512_token_prefix_computes_only_the_rest() {
    let t = Instant::now();
    let mut s = create_scheduler(200, 4, 4096);
    let shared: Vec<u32> = (0..512).map(|i| (i * 13) % 1000).collect();
    let mk = |id: ReqId, tail: u32| {
        let mut p = shared.clone();
        p.extend((0..20).map(|i| 5000 + tail * 100 + i));
        SchedulerRequest::new(id, p, 532 + 2, t)
    };
    s.add_request(mk(1, 1)).unwrap();
    let out = s.schedule(t).unwrap();
    assert_eq!(out.num_batched_tokens, 532);
    fake_step(&mut s, &out);
    s.add_request(mk(2, 2)).unwrap();
    let out = s.schedule(t).unwrap();
    let second = out.scheduled.iter().find(|r| r.id == 2).unwrap();
    assert_eq!(second.num_computed_tokens, 512, "the shared prefix comes from the cache");
    assert_eq!(second.token_ids.len(), 20);
    assert_eq!(s.request(2).unwrap().num_cached_tokens, 512);
    assert_eq!(s.kv().stats().hits, 512);
    // SchedulerRequest 1 decodes one token in the same step.
    assert_eq!(out.num_batched_tokens, 21);
}

#[test]
fn batch_window_waits_for_a_full_batch_or_the_timeout() {
    let t0 = Instant::now();
    let timeout = Duration::from_millis(50);
    let cfg = SchedulerConfig { max_num_seqs: 4, batch_mode: BatchMode::Batch { timeout }, ..Default::default() };
    let mut s = Scheduler::new(cfg.clone(), KvCacheManager::new(64, BS, true));
    s.add_request(create_request(1, 8, 4, t0)).unwrap();
    s.add_request(create_request(2, 8, 4, t0 + Duration::from_millis(10))).unwrap();
    let out = s.schedule(t0 + Duration::from_millis(49)).unwrap();
    assert!(out.is_empty());
    assert_eq!(out.wait_until, Some(t0 + timeout), "the window closes T after the oldest arrival");
    let out = s.schedule(t0 + timeout).unwrap();
    assert_eq!(out.scheduled.len(), 2);

    // A full batch starts at once.
    let mut s = Scheduler::new(cfg, KvCacheManager::new(64, BS, true));
    for id in 0..4 {
        s.add_request(create_request(id, 8, 4, t0)).unwrap();
    }
    let out = s.schedule(t0).unwrap();
    assert_eq!(out.scheduled.len(), 4);
    assert_eq!(out.wait_until, None);
}

#[test]
fn preemption_when_blocks_run_out_then_every_request_completes() {
    let t = Instant::now();
    // 6 blocks of 16: two requests of 40 + 40 tokens cannot both finish without preemption.
    let mut s = create_scheduler(6, 4, 256);
    s.add_request(create_request(1, 40, 40, t)).unwrap();
    s.add_request(create_request(2, 40, 40, t + Duration::from_millis(1))).unwrap();
    let mut preempted = Vec::new();
    let mut steps = 0;
    let mut outputs: HashMap<ReqId, Vec<u32>> = HashMap::new();
    while s.has_unfinished() {
        let out = s.schedule(t).unwrap();
        preempted.extend(out.preempted.iter().copied());
        for r in &out.scheduled {
            outputs.insert(r.id, s.request(r.id).unwrap().all_token_ids.clone());
        }
        fake_step(&mut s, &out);
        steps += 1;
        assert!(steps < 1000, "no progress");
    }
    assert_eq!(preempted.first(), Some(&2), "FCFS preempts the latest arrival");
    assert_eq!(s.kv().num_free_blocks(), 6);
    s.kv().check_invariants().unwrap();
    // Each request's tokens follow the fake model whatever happened.
    for (id, tokens) in outputs {
        for i in 40..tokens.len() {
            assert_eq!(tokens[i], next_token(&tokens[..i]), "request {id} position {i}");
        }
    }
}

fn swapping_scheduler(mode: PreemptionMode, cost: CostModel) -> Scheduler {
    let cfg =
        SchedulerConfig { max_num_seqs: 4, max_num_batched_tokens: 256, preemption_mode: mode, ..Default::default() };
    let mut s = Scheduler::new(cfg, KvCacheManager::new(6, BS, true).with_warm_tier(8));
    s.set_cost_model(cost);
    let t = Instant::now();
    s.add_request(create_request(1, 40, 40, t)).unwrap();
    s.add_request(create_request(2, 40, 40, t + Duration::from_millis(1))).unwrap();
    s
}

#[test]
fn swap_preemption_keeps_computed_tokens_and_recompute_does_not() {
    let t = Instant::now();
    // Each request computes 40 + 39 tokens once (its last sampled token is never fed back).
    let once = 2 * 79;
    let (computed, swaps) = run_to_end(&mut swapping_scheduler(PreemptionMode::Swap, CostModel::default()), 6, 8, t);
    assert!(swaps > 0);
    assert_eq!(computed, once, "a swapped request resumes where it stopped");
    let (computed, swaps) =
        run_to_end(&mut swapping_scheduler(PreemptionMode::Recompute, CostModel::default()), 6, 8, t);
    assert_eq!(swaps, 0);
    assert!(computed > once, "recompute runs tokens again: {computed}");
}

#[test]
fn auto_preemption_follows_the_cost_rule() {
    let t = Instant::now();
    let cheap_copy = CostModel { recompute_s_per_token: 1e-3, swap_s_per_token: 1e-6 };
    let (_, swaps) = run_to_end(&mut swapping_scheduler(PreemptionMode::Auto, cheap_copy), 6, 8, t);
    assert!(swaps > 0);
    let slow_copy = CostModel { recompute_s_per_token: 1e-6, swap_s_per_token: 1e-3 };
    let (_, swaps) = run_to_end(&mut swapping_scheduler(PreemptionMode::Auto, slow_copy), 6, 8, t);
    assert_eq!(swaps, 0);
    assert!(cheap_copy.prefers_swap(100, 0) && !cheap_copy.prefers_swap(100, 100), "resident tokens cost nothing");
}

#[test]
fn priority_policy_admits_lower_values_first() {
    let t = Instant::now();
    let cfg = SchedulerConfig { max_num_seqs: 1, policy: Policy::Priority, ..Default::default() };
    let mut s = Scheduler::new(cfg, KvCacheManager::new(64, BS, true));
    for (id, prio) in [(1, 5), (2, -1), (3, 0)] {
        let mut r = create_request(id, 8, 2, t);
        r.priority = prio;
        s.add_request(r).unwrap();
    }
    assert_eq!(admission_order(&mut s, t), vec![2, 3, 1]);
}

#[test]
fn while_requests_wait_a_step_stays_within_its_measured_target() {
    let t = Instant::now();
    let mut s = create_scheduler(256, 4, 2048);
    // 10 ms a step and 1 ms a token: a decode step of b requests takes 10 + b ms, and a step
    // may take twice that while requests wait: 10 + 2b tokens, at least b + 16.
    let cost = StepCost { base_s: 0.010, s_per_token: 0.001 };
    assert_eq!((cost.token_budget(1), cost.token_budget(8), cost.token_budget(40)), (17, 26, 90));
    s.set_step_cost(cost);
    s.add_request(create_request(1, 100, 8, t)).unwrap();
    let out = s.schedule(t).unwrap();
    assert_eq!(out.num_batched_tokens, 100, "a lone request: the whole prompt in one step");
    fake_step(&mut s, &out);
    for id in 2..=6 {
        s.add_request(create_request(id, 100, 8, t)).unwrap();
    }
    let mut capped = 0;
    while s.has_unfinished() {
        let running = s.num_running();
        let waiting = s.num_waiting() > 0 && running > 0;
        let out = s.schedule(t).unwrap();
        if waiting {
            assert!(out.num_batched_tokens <= cost.token_budget(running), "{running}: {}", out.num_batched_tokens);
            capped += 1;
        }
        fake_step(&mut s, &out);
    }
    assert!(capped >= 10, "the prefills ran in chunks beside the decodes: {capped} capped steps");
}

#[test]
fn a_request_does_not_join_a_batch_whose_deadline_it_would_break() {
    let t = Instant::now();
    let ms = |n| t + Duration::from_millis(n);
    // Each case: the running request's deadline, the newcomer's, whether it joins at once.
    // A newcomer ranks after the running request whatever its own deadline: it came later.
    // At 100 ms the batch of two alone would do (98 ms); the newcomer's 8-token prefill breaks it.
    for (running, newcomer, joins) in
        [(60, None, false), (200, None, true), (100, None, false), (60, Some(30), false), (200, Some(90), true)]
    {
        let mut s = create_scheduler(256, 4, 2048);
        s.set_step_cost(StepCost { base_s: 0.0, s_per_token: 0.001 }); // a step of b requests: b ms
        let mut r = create_request(1, 8, 50, t);
        r.deadline = Some(ms(running));
        s.add_request(r).unwrap();
        let out = s.schedule(t).unwrap();
        fake_step(&mut s, &out);
        // 49 tokens left: 49 ms alone, 98 ms beside one more, whose prompt adds 8 ms.
        let mut w = create_request(2, 8, 5, t + Duration::from_millis(1));
        w.deadline = newcomer.map(ms);
        s.add_request(w).unwrap();
        let out = s.schedule(t).unwrap();
        assert_eq!(out.scheduled.iter().any(|r| r.id == 2), joins, "{running} {newcomer:?}");
    }
}

#[test]
fn requests_that_arrive_together_count_each_others_prefill_against_a_deadline() {
    let t = Instant::now();
    let mut s = create_scheduler(256, 4, 2048);
    s.set_step_cost(StepCost { base_s: 0.0, s_per_token: 0.001 }); // a step of b requests: b ms
    let mut r = create_request(1, 8, 50, t);
    r.deadline = Some(t + Duration::from_millis(200));
    s.add_request(r).unwrap();
    let out = s.schedule(t).unwrap();
    fake_step(&mut s, &out);
    // 49 tokens left: with 2 beside it 40 ms of 2's prompt + 49 x 2 ms = 138 ms; with 3 too,
    // 80 ms of prompts + 49 x 3 ms = 227 ms, past the deadline (each alone would fit: 187 ms).
    for id in [2, 3, 4] {
        s.add_request(create_request(id, 40, 5, t + Duration::from_millis(id))).unwrap();
    }
    let out = s.schedule(t).unwrap();
    let joined: Vec<u64> = out.scheduled.iter().map(|r| r.id).filter(|&id| id != 1).collect();
    assert_eq!(joined, [2]);
}

#[test]
fn requests_with_deadlines_go_first_in_arrival_order_in_every_policy() {
    let t = Instant::now();
    let ms = |n| Some(t + Duration::from_millis(n));
    for policy in [Policy::Fcfs, Policy::Priority, Policy::Fair] {
        let cfg = SchedulerConfig { max_num_seqs: 1, policy, ..Default::default() };
        let mut s = Scheduler::new(cfg, KvCacheManager::new(64, BS, true));
        // Arrival order 1..=5; 2 and 4 carry deadlines, 4's the earlier; 5 has a lower priority value.
        for (id, deadline, prio) in [(1, None, 0), (2, ms(900), 0), (3, None, 0), (4, ms(300), 0), (5, None, -1)] {
            let mut r = create_request(id, 8, 2, t + Duration::from_millis(id));
            (r.deadline, r.priority) = (deadline, prio);
            s.add_request(r).unwrap();
        }
        // 4's earlier deadline does not put it before 2, which came first.
        let want = if policy == Policy::Fcfs { vec![2, 4, 1, 3, 5] } else { vec![5, 2, 4, 1, 3] };
        assert_eq!(admission_order(&mut s, t), want, "{policy:?}");
    }
}

#[test]
fn full_queue_and_oversized_requests_are_refused() {
    let t = Instant::now();
    let cfg = SchedulerConfig { max_waiting: 2, ..Default::default() };
    let mut s = Scheduler::new(cfg, KvCacheManager::new(4, BS, true));
    s.add_request(create_request(1, 8, 8, t)).unwrap();
    s.add_request(create_request(2, 8, 8, t)).unwrap();
    let e = s.add_request(create_request(3, 8, 8, t)).unwrap_err();
    assert!(matches!(e, lmplex_core::Error::Capacity(_)), "{e}");
    let e = s.add_request(create_request(4, 60, 10, t)).unwrap_err();
    assert!(matches!(e, lmplex_core::Error::InvalidRequest(_)), "{e}");
    assert!(s.add_request(create_request(1, 8, 8, t)).is_err(), "duplicate id");
}

#[test]
fn soak_random_requests_with_aborts_end_with_a_free_pool() {
    for warm in [0, 48] {
        soak(warm);
    }
}

fn soak(warm: usize) {
    // 1,000 requests with seeded random lengths and arrivals, ~30% aborted mid-way; with a warm
    // tier, preempted requests swap (the FakeKv checks every computed position).
    let t = Instant::now();
    let cfg = SchedulerConfig { max_num_seqs: 16, max_num_batched_tokens: 512, ..Default::default() };
    let mut s = Scheduler::new(cfg, KvCacheManager::new(96, BS, true).with_warm_tier(warm));
    let mut kv = FakeKv::new(96, warm);
    let mut swaps = 0;
    let mut rng = 0x2545F4914F6CDD1Du64;
    let mut rand = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let (mut next_id, mut done, mut aborted) = (0u64, 0usize, 0usize);
    let mut live: Vec<ReqId> = Vec::new();
    let mut abort_at: HashMap<ReqId, usize> = HashMap::new();
    while done + aborted < 1000 {
        while next_id < 1000 && s.num_waiting() < 32 && rand(3) > 0 {
            let r = create_request(next_id, 1 + rand(200) as usize, 1 + rand(60) as usize, t);
            s.add_request(r).unwrap();
            if rand(10) < 3 {
                abort_at.insert(next_id, rand(40) as usize);
            }
            live.push(next_id);
            next_id += 1;
        }
        let out = s.schedule(t).unwrap();
        swaps += out.swapped_out.len();
        kv.step(&mut s, &out);
        live.retain(|&id| {
            let Some(r) = s.request(id) else {
                done += 1;
                return false;
            };
            if abort_at.get(&id).is_some_and(|&at| r.num_output_tokens() >= at) {
                s.abort(id).unwrap();
                aborted += 1;
                return false;
            }
            true
        });
        s.kv().check_invariants().unwrap();
    }
    assert!(aborted > 200, "{aborted}");
    assert_eq!(swaps > 0, warm > 0, "{swaps} swaps with {warm} warm blocks");
    assert!(!s.has_unfinished());
    assert_eq!(s.kv().num_free_blocks(), 96);
    assert_eq!(s.kv().warm_pool().num_free(), warm);
}
