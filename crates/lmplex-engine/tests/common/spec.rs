//! Speculative decoding's test helpers: requests that exercise every sampling path, the check
//! that two outputs are the same bits, the drafting counters, and draft models.

use super::{ids_request, solo, wait_until_idle, write_tiny_llama, VOCAB};
use lmplex_core::{RequestOutput, SamplingParams, SpeculativeConfig};
use lmplex_engine::{Engine, Request};
use std::sync::atomic::Ordering;

/// Prompt lookup of 1- to 3-grams drafting up to `k` tokens.
pub fn ngram(k: usize) -> SpeculativeConfig {
    SpeculativeConfig { prompt_lookup_min: Some(1), prompt_lookup_max: Some(3), ..SpeculativeConfig::ngram(k) }
}

/// Request `i`: a prompt that repeats a phrase (so lookup finds matches) and parameters that
/// cycle through greedy, seeded top-p, penalties, `min_tokens`, stops and `ignore_eos`.
pub fn request(i: usize) -> Request {
    let phrase: Vec<u32> = (0..3 + i % 5).map(|j| 3 + ((i * 37 + j * 11) % (VOCAB - 3)) as u32).collect();
    let ids: Vec<u32> = phrase.iter().cycle().take(phrase.len() * (2 + i % 4)).copied().collect();
    let mut p = SamplingParams { max_tokens: 16 + (i * 7) % 40, logprobs: Some(2), ..Default::default() };
    match i % 6 {
        0 => p.temperature = 0.0,
        1 => (p.temperature, p.top_p, p.seed) = (0.8, 0.9, Some(i as u64)),
        2 => (p.temperature, p.repetition_penalty, p.frequency_penalty) = (0.0, 1.3, 0.2),
        3 => (p.temperature, p.seed, p.min_tokens, p.presence_penalty) = (0.6, Some(9), 12, 0.3),
        4 => (p.temperature, p.stop, p.stop_token_ids) = (0.0, vec!["t7".into()], vec![phrase[1]]),
        _ => (p.temperature, p.top_k, p.seed, p.ignore_eos) = (1.0, 20, Some(3 + i as u64), true),
    }
    ids_request(ids, p)
}

/// Asserts `got` is `want`: tokens, logprobs bit for bit, text and finish.
pub fn assert_same(got: &RequestOutput, want: &RequestOutput, what: &str) {
    assert_eq!(got.token_ids, want.token_ids, "{what}: tokens differ");
    let (a, b) = (got.logprobs.as_ref().unwrap(), want.logprobs.as_ref().unwrap());
    assert_eq!(a.len(), b.len(), "{what}");
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.logprob.to_bits(), y.logprob.to_bits(), "{what}: a logprob differs");
        assert_eq!(x.top, y.top, "{what}");
    }
    assert_eq!((&got.text, got.finish_reason, &got.stop_reason), (&want.text, want.finish_reason, &want.stop_reason));
}

/// (drafts, drafted tokens, accepted tokens) so far.
pub fn spec_counts(engine: &Engine) -> (u64, u64, u64) {
    let s = engine.stats();
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    (n(&s.spec_decode_num_drafts), n(&s.spec_decode_num_draft_tokens), n(&s.spec_decode_num_accepted_tokens))
}

/// A tiny llama with `tiny_engine`'s tokenizer and other weights (`seed`), as a draft model.
pub fn draft_model(seed: u64) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(dir.path(), seed);
    let path = dir.path().to_string_lossy().into_owned();
    (dir, path)
}

/// Runs the first `alone` of `reqs` one at a time on `spec`, then all of them together, and
/// asserts each output is `want`'s (`what` names the case); returns once `spec` is idle.
pub fn check_alone_and_together(spec: &Engine, reqs: &[Request], want: &[RequestOutput], alone: usize, what: &str) {
    for (i, r) in reqs.iter().enumerate().take(alone) {
        assert_same(&solo(spec, r), &want[i], &format!("{what}: request {i} alone"));
    }
    let handles: Vec<_> = reqs.iter().map(|r| spec.submit(r).unwrap()).collect();
    for (i, h) in handles.into_iter().enumerate() {
        assert_same(&h.collect_blocking().unwrap(), &want[i], &format!("{what}: request {i} among {}", reqs.len()));
    }
    wait_until_idle(spec);
}
