//! Speculative drafts through the scheduler, with a fake model whose next token depends on the
//! last two (so prompt lookup is right often, not always): every request ends with the tokens
//! it has without speculation, whatever was drafted, accepted, rejected or preempted, and a
//! rejected draft's K/V is never read (`FakeKv`). The same with a "draft model" (the fake model,
//! wrong at every fifth position) handing proposals in before each step, where a proposal for
//! another length than the request's is dropped.

use lmplex_core::SpeculativeConfig;
use lmplex_kv::manager::ReqId;
use lmplex_kv::KvCacheManager;
use lmplex_sched::{DraftRequest, Drafter, NgramProposer, Proposal, Scheduler, SchedulerConfig};
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

/// Prompt lookup drafting up to `k` tokens, n-grams of 1 to 3.
fn ngram(k: usize) -> Option<Drafter> {
    let cfg =
        SpeculativeConfig { prompt_lookup_min: Some(1), prompt_lookup_max: Some(3), ..SpeculativeConfig::ngram(k) };
    Some(Drafter::Ngram(NgramProposer::new(&cfg)))
}

/// The "draft model": the fake model, wrong wherever the sequence's length is a multiple of 5.
fn draft_next(tokens: &[u32]) -> u32 {
    (next(tokens) + u32::from(tokens.len().is_multiple_of(5))) % 11
}

/// Runs requests of `(prompt_len, max_out)` on `blocks` KV blocks, with `speculative` drafts or
/// none; `pass_s` gives the measured seconds of a pass of so many generated rows, if any.
fn run(
    speculative: Option<Drafter>,
    blocks: usize,
    requests: &[(usize, usize)],
    pass_s: Option<fn(usize) -> f64>,
) -> Run {
    let t = Instant::now();
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
        if let Some(Drafter::Model { num_speculative_tokens: k }) = speculative {
            let mut proposals = HashMap::new();
            for DraftRequest { id, tokens, n, .. } in s.draft_requests() {
                assert!(n <= k, "{n} tokens asked of a draft of at most {k}");
                let mut seq = tokens.to_vec();
                for _ in 0..n {
                    seq.push(draft_next(&seq));
                }
                // Every third step, request 1's proposal is for a length it no longer has.
                let at = tokens.len() - usize::from(id == 1 && steps % 3 == 0);
                proposals.insert(id, Proposal { at, tokens: seq[tokens.len()..].to_vec() });
            }
            s.set_proposals(proposals);
        }
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
    let spec = run(ngram(4), 64, &requests, None);
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
    let spec = run(ngram(6), 14, &requests, None);
    assert!(spec.preempted > 0, "the pool is short enough to preempt");
    assert_eq!(spec.outputs, plain.outputs);
    assert!(spec.accepted > 0);
}

#[test]
fn speculation_steps_aside_when_a_row_costs_its_share_of_the_step() {
    // Passes whose time is all per row (no fixed part): a draft never pays, so only the one
    // token more every few steps is drafted; passes that are all fixed part: drafts always pay.
    let requests = [(5, 100)];
    let costly = run(ngram(4), 64, &requests, Some(|rows| rows as f64 * 1e-3));
    let cheap = run(ngram(4), 64, &requests, Some(|rows| 1.0 + rows as f64 * 1e-6));
    assert_eq!(costly.outputs, cheap.outputs);
    assert!(costly.drafted * 4 < cheap.drafted, "{} drafted against {}", costly.drafted, cheap.drafted);
    assert!(costly.drafted > 0, "exploration drafts");
}

#[test]
fn a_draft_models_proposals_never_change_a_token_and_stale_ones_are_dropped() {
    let requests = [(5, 60), (20, 90), (33, 40), (2, 120), (17, 75)];
    let plain = run(None, 64, &requests, None);
    let model = Some(Drafter::Model { num_speculative_tokens: 4 });
    let spec = run(model, 64, &requests, None);
    assert_eq!(spec.outputs, plain.outputs);
    assert!(spec.accepted * 2 > spec.drafted, "mostly right: {} of {}", spec.accepted, spec.drafted);
    assert!(spec.accepted < spec.drafted, "and sometimes wrong: {} of {}", spec.accepted, spec.drafted);
    let tight = [(10, 100), (30, 70), (8, 90), (12, 60)];
    let short = run(model, 14, &tight, None);
    assert!(short.preempted > 0 && short.accepted > 0);
    assert_eq!(short.outputs, run(None, 14, &tight, None).outputs);
}

#[test]
fn a_draft_model_is_asked_for_tokens_only_where_its_passes_pay() {
    // Passes of any row count cost the same (drafted rows are free to verify): a draft pass
    // that costs next to nothing is worth all 4 tokens; one that costs 100 steps, none.
    let t = Instant::now();
    for (pass_s, want) in [(1e-6, vec![4]), (1.0, vec![0])] {
        let speculative = Some(Drafter::Model { num_speculative_tokens: 4 });
        let cfg = SchedulerConfig { max_num_seqs: 4, max_num_batched_tokens: 64, speculative, ..Default::default() };
        let mut s = Scheduler::new(cfg, KvCacheManager::new(64, BS, true));
        for rows in 1..=8 {
            s.observe_decode_pass(rows, 0.01);
        }
        s.add_request(create_request(1, 5, 50, t)).unwrap();
        let mut kv = FakeKv::new(64, 0);
        let out = s.schedule(t).unwrap();
        kv.step_with(&mut s, &out, next);
        assert!(s.draft_requests().iter().map(|r| r.n).eq([3]), "unmeasured: the acceptance rule");
        s.observe_draft_pass(pass_s);
        let asked: Vec<usize> = s.draft_requests().iter().map(|r| r.n).collect();
        assert_eq!(asked, want, "a pass of {pass_s} s");
        // One call in 16 explores: where drafts pay, it asks for none (a pass without drafts
        // is measured again); where none can pay, it asks for none either.
        let next16: Vec<usize> = (0..16).map(|_| s.draft_requests()[0].n).collect();
        let plain = next16.iter().filter(|&&n| n == 0).count();
        assert_eq!(plain, if want == [4] { 1 } else { 16 }, "{next16:?} at a pass of {pass_s} s");
    }
}

#[test]
fn a_draft_model_waits_for_its_figures_and_prices_catching_up() {
    // A step costs 10 ms whatever its rows and a draft pass 0.1 ms: drafting pays, except where
    // feeding the draft model a 300-token prompt it has not seen, at `catch_up_s` a token,
    // costs more than the few steps the request has left can win back.
    let t = Instant::now();
    for (catch_up_s, long_drafts) in [(1e-3, false), (1e-9, true)] {
        let speculative = Some(Drafter::Model { num_speculative_tokens: 4 });
        let cfg = SchedulerConfig { max_num_seqs: 4, max_num_batched_tokens: 512, speculative, ..Default::default() };
        let mut s = Scheduler::new(cfg, KvCacheManager::new(128, BS, true));
        for rows in 1..=8 {
            s.observe_decode_pass(rows, 0.010);
        }
        // Request 1: 5 prompt tokens, 600 to go; 2: 300 and 600; 3: 300 and 6.
        for (id, prompt, out) in [(1, 5, 600), (2, 300, 600), (3, 300, 6)] {
            s.add_request(create_request(id, prompt, out, t)).unwrap();
        }
        let mut kv = FakeKv::new(128, 0);
        while s.draft_requests().len() < 3 {
            let out = s.schedule(t).unwrap();
            kv.step_with(&mut s, &out, next);
        }
        // Nothing measured yet: the first request drafts (by its acceptance rule), the others wait.
        let first: Vec<(ReqId, usize)> = s.draft_requests().iter().map(|r| (r.id, r.n)).collect();
        assert_eq!(first, [(1, 3), (2, 0), (3, 0)], "unmeasured");
        s.observe_draft_pass(1e-4);
        s.observe_draft_catch_up(catch_up_s);
        let asked: Vec<(ReqId, usize)> = s.draft_requests().iter().map(|r| (r.id, r.n)).collect();
        assert!(asked[0].1 > 0 && asked[1].1 > 0, "{asked:?} at {catch_up_s} s a token");
        assert_eq!(asked[2].1 > 0, long_drafts, "{asked:?} at {catch_up_s} s a token");
    }
}
