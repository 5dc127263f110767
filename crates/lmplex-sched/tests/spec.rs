//! Speculative drafts through the scheduler, with a fake model whose next token depends on the
//! last two (so prompt lookup is right often, not always): every request ends with the tokens
//! it has without speculation, whatever was drafted, accepted, rejected or preempted, and a
//! rejected draft's K/V is never read (`FakeKv`).

use lmplex_core::SpeculativeConfig;
use lmplex_kv::manager::ReqId;
use lmplex_kv::KvCacheManager;
use lmplex_sched::{NgramProposer, Scheduler, SchedulerConfig};
use std::collections::HashMap;
use std::time::Instant;

mod common;
use common::{create_request, FakeKv, BS};

/// The fake model: a function of the last two tokens, into a small vocabulary, so sequences
/// fall into cycles that prompt lookup catches.
fn next(tokens: &[u32]) -> u32 {
    let n = tokens.len();
    let (a, b) = (tokens[n - 1], tokens[n.saturating_sub(2)]);
    (a.wrapping_mul(7) ^ b.wrapping_mul(13)).wrapping_add(3) % 11
}

struct Run {
    outputs: HashMap<ReqId, Vec<u32>>,
    drafted: usize,
    accepted: usize,
    preempted: usize,
}

/// Runs requests of `(prompt_len, max_out)` on `blocks` KV blocks, with `spec` drafts or none;
/// `pass_s` gives the measured seconds of a pass of so many generated rows, if any.
fn run(spec: Option<usize>, blocks: usize, requests: &[(usize, usize)], pass_s: Option<fn(usize) -> f64>) -> Run {
    let t = Instant::now();
    let speculative = spec.map(|k| {
        NgramProposer::new(&SpeculativeConfig {
            prompt_lookup_min: Some(1),
            prompt_lookup_max: Some(3),
            ..SpeculativeConfig::ngram(k)
        })
    });
    let cfg = SchedulerConfig { max_num_seqs: 4, max_num_batched_tokens: 64, speculative, ..Default::default() };
    let mut s = Scheduler::new(cfg, KvCacheManager::new(blocks, BS, true));
    if let Some(f) = pass_s {
        for rows in 1..=64 {
            s.observe_decode_pass(rows, f(rows));
        }
    }
    for (i, &(p, n)) in requests.iter().enumerate() {
        s.add_request(create_request(i as ReqId + 1, p, n, t)).unwrap();
    }
    let mut kv = FakeKv::new(blocks, 0);
    let mut r = Run { outputs: HashMap::new(), drafted: 0, accepted: 0, preempted: 0 };
    let mut steps = 0;
    while s.has_unfinished() {
        let out = s.schedule(t).unwrap();
        assert!(out.num_batched_tokens <= 64);
        r.preempted += out.preempted.len();
        let drafts: HashMap<ReqId, usize> = out.scheduled.iter().map(|c| (c.id, c.num_draft_tokens)).collect();
        for (id, new) in kv.step_with(&mut s, &out, next) {
            r.drafted += drafts[&id];
            r.accepted += new.len() - 1;
            r.outputs.entry(id).or_default().extend(new);
        }
        s.kv().check_invariants().unwrap();
        steps += 1;
        assert!(steps < 10_000, "no progress");
    }
    assert_eq!(s.kv().num_free_blocks(), blocks, "every block is free at the end");
    r
}

#[test]
fn drafts_never_change_a_token_and_rejected_kv_is_never_read() {
    let requests = [(5, 60), (20, 90), (33, 40), (2, 120), (17, 75)];
    let plain = run(None, 64, &requests, None);
    assert_eq!(plain.drafted, 0);
    let spec = run(Some(4), 64, &requests, None);
    assert_eq!(spec.outputs, plain.outputs);
    for (i, &(_, n)) in requests.iter().enumerate() {
        assert_eq!(spec.outputs[&(i as ReqId + 1)].len(), n, "request {} runs to its length", i + 1);
    }
    assert!(spec.accepted > 50, "prompt lookup on cycles is accepted: {} of {}", spec.accepted, spec.drafted);
    assert!(spec.accepted < spec.drafted, "and sometimes rejected: {} of {}", spec.accepted, spec.drafted);
}

#[test]
fn drafts_survive_preemption_and_a_short_pool() {
    // 14 blocks of 16 for four requests of up to 110 tokens: they preempt one another.
    let requests = [(10, 100), (30, 70), (8, 90), (12, 60)];
    let plain = run(None, 14, &requests, None);
    let spec = run(Some(6), 14, &requests, None);
    assert!(spec.preempted > 0, "the pool is short enough to preempt");
    assert_eq!(spec.outputs, plain.outputs);
    assert!(spec.accepted > 0);
}

#[test]
fn speculation_steps_aside_when_a_row_costs_its_share_of_the_step() {
    // Passes whose time is all per row (no fixed part): a draft never pays, so only the one
    // token more every few steps is drafted; passes that are all fixed part: drafts always pay.
    let requests = [(5, 100)];
    let costly = run(Some(4), 64, &requests, Some(|rows| rows as f64 * 1e-3));
    let cheap = run(Some(4), 64, &requests, Some(|rows| 1.0 + rows as f64 * 1e-6));
    assert_eq!(costly.outputs, cheap.outputs);
    assert!(costly.drafted * 4 < cheap.drafted, "{} drafted against {}", costly.drafted, cheap.drafted);
    assert!(costly.drafted > 0, "exploration drafts");
}
