//! Prompt logprobs (`SamplingParams::prompt_logprobs`) on a tiny random llama: scoring a
//! generated continuation as a prompt gives the logprobs generation reported; a prompt split
//! into many prefill chunks scores as in one; a request scoring a cached prompt computes it
//! again (and its numbers do not change); `max_tokens: 0` only scores.

mod common;

use common::{ids_request, solo, tiny_engine};
use lmplex_core::{FinishReason, SamplingParams};

fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 3 + (i * 37 + 11) % 250).collect()
}

fn scoring(k: usize) -> SamplingParams {
    SamplingParams { max_tokens: 0, prompt_logprobs: Some(k), ..SamplingParams::greedy(0) }
}

#[test]
fn scoring_a_continuation_gives_the_logprobs_generation_reported() {
    let (engine, _dir) = tiny_engine(|_| {});
    let p = prompt(40);
    let params = SamplingParams { logprobs: Some(3), ignore_eos: true, ..SamplingParams::greedy(12) };
    let gen = solo(&engine, &ids_request(p.clone(), params));
    let full: Vec<u32> = p.iter().chain(&gen.token_ids).copied().collect();
    let scored = solo(&engine, &ids_request(full.clone(), scoring(3)));
    assert_eq!(
        (scored.finish_reason, scored.token_ids.len(), scored.usage.completion_tokens),
        (FinishReason::Length, 0, 0)
    );
    let plp = scored.prompt_logprobs.expect("asked for");
    assert_eq!(plp.len(), full.len());
    assert!(plp[0].is_none());
    for (pos, e) in plp.iter().enumerate().skip(1) {
        let e = e.as_ref().expect("every position after the first");
        assert_eq!(e.token_id, full[pos]);
        assert_eq!(e.top.len(), 3);
    }
    for (i, g) in gen.logprobs.expect("asked for").iter().enumerate() {
        let s = plp[p.len() + i].as_ref().unwrap();
        // Prefill rows and decode rows take different kernels: equal up to summation order.
        assert!((s.logprob - g.logprob).abs() < 1e-3, "token {i}: scored {} generated {}", s.logprob, g.logprob);
        assert_eq!(s.top[0].token_id, g.top[0].token_id, "token {i}");
    }
}

#[test]
fn chunked_prefill_and_the_prefix_cache_do_not_change_the_scores() {
    let p = prompt(150);
    let (whole, _a) = tiny_engine(|c| c.max_num_batched_tokens = Some(512));
    let (chunked, _b) = tiny_engine(|c| c.max_num_batched_tokens = Some(16));
    let want = solo(&whole, &ids_request(p.clone(), scoring(2))).prompt_logprobs.unwrap();
    let got = solo(&chunked, &ids_request(p.clone(), scoring(2))).prompt_logprobs.unwrap();
    assert_eq!(want.len(), got.len());
    for (pos, (w, g)) in want.iter().zip(&got).enumerate().skip(1) {
        let (w, g) = (w.as_ref().unwrap(), g.as_ref().unwrap());
        assert!((w.logprob - g.logprob).abs() < 1e-4, "position {pos}: {} vs {}", w.logprob, g.logprob);
    }
    // The prompt is cached now: a plain request reads it, a scoring one computes it again.
    let plain = solo(&whole, &ids_request(p.clone(), SamplingParams::greedy(1)));
    assert!(plain.usage.cached_tokens > 0);
    let again = solo(&whole, &ids_request(p, scoring(2)));
    assert_eq!(again.usage.cached_tokens, 0);
    let again = again.prompt_logprobs.unwrap();
    assert!(want.iter().zip(&again).all(|(w, a)| w.as_ref().map(|w| w.logprob) == a.as_ref().map(|a| a.logprob)));
}

#[test]
fn no_tokens_needs_prompt_logprobs() {
    let (engine, _dir) = tiny_engine(|_| {});
    let e = engine.generate(&[ids_request(prompt(5), SamplingParams::greedy(0))]).unwrap_err();
    assert!(e.to_string().contains("max_tokens must be at least 1"), "{e}");
    // A scoring request next to generating ones: each gets its own result.
    let reqs = [ids_request(prompt(30), scoring(1)), ids_request(prompt(20), SamplingParams::greedy(5))];
    let outs = engine.generate(&reqs).unwrap();
    assert_eq!(outs[0].prompt_logprobs.as_ref().map(Vec::len), Some(30));
    assert_eq!((outs[1].token_ids.len(), outs[1].prompt_logprobs.is_none()), (5, true));
}
