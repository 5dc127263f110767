//! The `fair` policy (virtual token counters), deterministically: admission order, the lift of
//! a returning tenant, preemption of the tenant furthest over its share, slots taken from a
//! tenant running several by one running nothing (and by a higher priority), weighted shares.

mod common;

use common::{admission_order, create_request, fake_step, BS};
use lmplex_kv::manager::ReqId;
use lmplex_kv::KvCacheManager;
use lmplex_sched::{Policy, PreemptionMode, Scheduler, SchedulerConfig, SchedulerRequest, StepCost, TenantShare};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn scheduler(policy: Policy, max_num_seqs: usize, num_blocks: usize) -> Scheduler {
    let cfg =
        SchedulerConfig { max_num_seqs, policy, preemption_mode: PreemptionMode::Recompute, ..Default::default() };
    Scheduler::new(cfg, KvCacheManager::new(num_blocks, BS, true))
}

fn request(id: ReqId, tenant: &str, weight: f64, prompt: usize, out: usize, t: Instant) -> SchedulerRequest {
    let mut r = create_request(id, prompt, out, t);
    r.tenant = TenantShare { name: Arc::from(tenant), weight };
    r
}

/// Tenant `a` queues four requests, then `b` two (all the same size), one runs at a time.
fn two_tenants(policy: Policy, weight_b: f64) -> Vec<ReqId> {
    let t = Instant::now();
    let mut s = scheduler(policy, 1, 64);
    for id in 1..=4 {
        s.add_request(request(id, "a", 1.0, 8, 3, t + Duration::from_millis(id))).unwrap();
    }
    for id in 5..=6 {
        s.add_request(request(id, "b", weight_b, 8, 3, t + Duration::from_millis(id))).unwrap();
    }
    admission_order(&mut s, t + Duration::from_secs(1))
}

#[test]
fn fair_alternates_tenants_where_fcfs_serves_by_arrival() {
    assert_eq!(two_tenants(Policy::Fcfs, 1.0), vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(two_tenants(Policy::Fair, 1.0), vec![1, 5, 2, 6, 3, 4]);
    // b weighs 3: its two requests cost it a third as much, so both go before a's second.
    assert_eq!(two_tenants(Policy::Fair, 3.0), vec![1, 5, 6, 2, 3, 4]);
}

#[test]
fn service_is_charged_a_token_per_prompt_token_and_two_per_output_token_in_device_time() {
    let t = Instant::now();
    let mut s = scheduler(Policy::Fair, 4, 64);
    s.add_request(request(1, "a", 1.0, 10, 4, t)).unwrap();
    s.add_request(request(2, "b", 2.0, 10, 4, t)).unwrap();
    admission_order(&mut s, t);
    // Each request: 10 prompt tokens computed, then 4 tokens sampled, in device seconds.
    let token = s.seconds_per_token();
    assert!(token > 0.0);
    assert_close(s.fairness().counter("a"), (10.0 + 2.0 * 4.0) * token);
    assert_close(s.fairness().counter("b"), (10.0 + 2.0 * 4.0) * token / 2.0);
}

fn assert_close(got: f64, want: f64) {
    assert!((got - want).abs() <= 1e-9 * want.abs(), "{got} != {want}");
}

#[test]
fn a_returning_tenant_is_lifted_to_the_least_served_backlogged_one() {
    let t = Instant::now();
    let mut s = scheduler(Policy::Fair, 1, 64);
    // `a` is served alone for a while; `b` was served once, long ago.
    s.add_request(request(1, "b", 1.0, 8, 2, t)).unwrap();
    admission_order(&mut s, t);
    let b_before = s.fairness().counter("b");
    for id in 2..=5 {
        s.add_request(request(id, "a", 1.0, 8, 2, t)).unwrap();
    }
    for _ in 0..6 {
        let out = s.schedule(t).unwrap();
        fake_step(&mut s, &out);
    }
    let a_now = s.fairness().counter("a");
    assert!(a_now > b_before + 20.0 * s.seconds_per_token(), "a {a_now}, b {b_before}");
    s.add_request(request(9, "b", 1.0, 8, 2, t)).unwrap();
    // b banks no credit for its idle time: it starts level with a, the only backlogged tenant.
    assert_eq!(s.fairness().counter("b"), a_now);
}

#[test]
fn preemption_takes_from_the_tenant_furthest_over_its_share() {
    for (policy, victim) in [(Policy::Fcfs, 3), (Policy::Fair, 2)] {
        let t = Instant::now();
        // 10 blocks of 16: three requests of 40 prompt tokens take 3 blocks each; the second
        // to need a fourth block preempts.
        let mut s = scheduler(policy, 4, 10);
        for (id, tenant) in [(1, "a"), (2, "a"), (3, "b")] {
            s.add_request(request(id, tenant, 1.0, 40, 40, t + Duration::from_millis(id))).unwrap();
        }
        let mut preempted = Vec::new();
        for _ in 0..20 {
            let out = s.schedule(t).unwrap();
            preempted.extend(out.preempted.iter().copied());
            fake_step(&mut s, &out);
            if !preempted.is_empty() {
                break;
            }
        }
        // FCFS preempts the last to arrive (b's); fair preempts the latest of a, which has
        // been served twice as much as b.
        assert_eq!(preempted.first(), Some(&victim), "{policy:?}");
    }
}

#[test]
fn backlogged_tenants_share_service_by_weight() {
    for (wa, wb) in [(1.0, 1.0), (1.0, 3.0)] {
        let t = Instant::now();
        let mut s = scheduler(Policy::Fair, 2, 256);
        let mut id = 0;
        for _ in 0..150 {
            for (name, w) in [("a", wa), ("b", wb)] {
                id += 1;
                s.add_request(request(id, name, w, 24, 12, t + Duration::from_micros(id))).unwrap();
            }
        }
        // Serve while both stay backlogged, counting each tenant's charged service.
        let mut served: HashMap<&str, f64> = HashMap::new();
        for _ in 0..400 {
            let out = s.schedule(t).unwrap();
            let before = [("a", wa), ("b", wb)].map(|(n, w)| (n, s.fairness().counter(n) * w));
            fake_step(&mut s, &out);
            for (n, b) in before {
                let w = if n == "a" { wa } else { wb };
                *served.entry(n).or_default() += s.fairness().counter(n) * w - b;
            }
        }
        let share_b = served["b"] / (served["a"] + served["b"]);
        let want = wb / (wa + wb);
        assert!((share_b - want).abs() <= 0.1 * want, "weights {wa}:{wb}: b's share {share_b:.3}, want {want:.3}");
    }
}

/// Runs steps until `id` is scheduled; the steps taken and every request preempted meanwhile.
fn until_scheduled(s: &mut Scheduler, id: ReqId, t: Instant) -> (usize, Vec<ReqId>) {
    let mut preempted = Vec::new();
    for step in 1..=50 {
        let out = s.schedule(t).unwrap();
        preempted.extend(out.preempted.iter().copied());
        let done = out.scheduled.iter().any(|r| r.id == id);
        fake_step(s, &out);
        if done {
            return (step, preempted);
        }
    }
    panic!("request {id} was never scheduled");
}

#[test]
fn a_tenant_running_nothing_takes_a_slot_from_one_running_several() {
    for policy in [Policy::Fcfs, Policy::Fair] {
        let t = Instant::now();
        let mut s = scheduler(policy, 2, 64);
        for id in 1..=3 {
            s.add_request(request(id, "heavy", 1.0, 16, 40, t + Duration::from_millis(id))).unwrap();
        }
        for _ in 0..3 {
            let out = s.schedule(t).unwrap();
            fake_step(&mut s, &out);
        }
        s.add_request(request(9, "light", 1.0, 8, 3, t + Duration::from_millis(9))).unwrap();
        let (steps, preempted) = until_scheduled(&mut s, 9, t);
        if policy == Policy::Fcfs {
            // Waits for a slot: request 1 ends after its 40 tokens, then 3 (first come) runs.
            assert!(steps > 30 && preempted.is_empty(), "{steps} steps, preempted {preempted:?}");
            continue;
        }
        // light arrives level with heavy (the lift), and at equal counters the tenant running
        // nothing goes first: the next step light takes heavy's last-ranked running slot.
        assert_eq!((steps, preempted), (1, vec![2]));
        let mut later = Vec::new();
        while s.has_unfinished() {
            let out = s.schedule(t).unwrap();
            later.extend(out.preempted.iter().copied());
            fake_step(&mut s, &out);
        }
        // heavy keeps a slot throughout, so light never takes a second one: no thrashing.
        assert!(later.is_empty(), "preempted later: {later:?}");
    }
}

#[test]
fn a_waiting_request_preempts_only_strictly_lower_priority() {
    for (policy, prio, preempts) in [
        (Policy::Priority, -1, true),
        (Policy::Priority, 0, false),
        (Policy::Fair, -1, true),
        (Policy::Fcfs, -1, false),
    ] {
        let t = Instant::now();
        let mut s = scheduler(policy, 1, 64);
        s.add_request(request(1, "a", 1.0, 16, 20, t)).unwrap();
        let out = s.schedule(t).unwrap();
        fake_step(&mut s, &out);
        let mut urgent = request(2, "a", 1.0, 8, 2, t + Duration::from_millis(1));
        urgent.priority = prio;
        s.add_request(urgent).unwrap();
        let out = s.schedule(t).unwrap();
        let ids: Vec<ReqId> = out.scheduled.iter().map(|r| r.id).collect();
        let want = if preempts { (vec![1], vec![2]) } else { (vec![], vec![1]) };
        assert_eq!((out.preempted.clone(), ids), want, "{policy:?}, priority {prio}");
        fake_step(&mut s, &out);
    }
}

#[test]
fn a_running_prefill_of_a_later_rank_leaves_the_first_waiting_request_its_chunk() {
    for (policy, want) in [(Policy::Fcfs, vec![(1, 1), (2, 31)]), (Policy::Fair, vec![(1, 1), (2, 11), (9, 20)])] {
        let t = Instant::now();
        let cfg = SchedulerConfig { max_num_seqs: 3, max_num_batched_tokens: 32, policy, ..Default::default() };
        let mut s = Scheduler::new(cfg, KvCacheManager::new(64, BS, true));
        s.add_request(request(1, "heavy", 1.0, 8, 50, t)).unwrap();
        let out = s.schedule(t).unwrap();
        fake_step(&mut s, &out);
        s.add_request(request(2, "heavy", 1.0, 100, 5, t + Duration::from_millis(2))).unwrap();
        let out = s.schedule(t).unwrap(); // 1 decodes, 2 starts its prefill
        fake_step(&mut s, &out);
        s.add_request(request(9, "light", 1.0, 20, 3, t + Duration::from_millis(9))).unwrap();
        let out = s.schedule(t).unwrap();
        let chunks: Vec<(ReqId, usize)> = out.scheduled.iter().map(|r| (r.id, r.token_ids.len())).collect();
        // Under fair, heavy's prefill chunk shrinks so light's whole prompt fits this step; the
        // decode token of request 1 is never held back.
        assert_eq!(chunks, want, "{policy:?}");
    }
}

#[test]
fn a_short_request_of_a_tenant_running_nothing_gets_its_prompt_in_one_capped_step() {
    let t = Instant::now();
    let mut s = scheduler(Policy::Fair, 4, 256);
    // 1 ms a token and nothing fixed: while requests wait, a step of b running takes
    // max(2b, b + 16) tokens: 20 at 4 running, 19 at 3.
    s.set_step_cost(StepCost { base_s: 0.0, s_per_token: 0.001 });
    for id in 1..=6 {
        s.add_request(request(id, "heavy", 1.0, 40, 50, t)).unwrap();
    }
    while s.num_running() < 4
        || (1..=6).any(|id| s.request(id).is_some_and(|r| r.num_output_tokens() == 0 && r.num_computed_tokens > 0))
    {
        let out = s.schedule(t).unwrap();
        fake_step(&mut s, &out);
    }
    let out = s.schedule(t).unwrap();
    assert!(out.num_batched_tokens <= 20, "heavy decodes and prefill chunks, capped: {}", out.num_batched_tokens);
    fake_step(&mut s, &out);
    s.add_request(request(7, "light", 1.0, 20, 4, t)).unwrap();
    let out = s.schedule(t).unwrap();
    let light = out.scheduled.iter().find(|r| r.id == 7).expect("the light request starts in this step");
    assert!(light.token_ids.len() == 20 && light.sample, "its whole prompt, sampled: {light:?}");
    assert_eq!(out.num_batched_tokens, 3 + 20, "three heavy decodes beside it (one was preempted for its slot)");
}
