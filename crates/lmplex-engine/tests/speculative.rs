//! Speculative decoding (prompt lookup, and a draft model) never changes a token: outputs,
//! logprobs bit for bit, text and finish reasons equal plain decoding's, greedy and seeded, with
//! penalties, `min_tokens`, stop strings and stop ids, alone, in a batch of 64 with chunked
//! prefill, under preemption, and (on SmolLM2-135M) with structured output; and some drafts are
//! accepted and some rejected, so both paths ran. A draft model whose tokenizer is not the
//! target's is refused at load, naming the difference.

mod common;
#[path = "../../lmplex-model/tests/common.rs"]
mod model_common;

use common::spec::{assert_same, check_alone_and_together, draft_model, ngram, request, spec_counts};
use common::{solo, tiny_engine, wait_until_idle, write_tiny_llama};
use lmplex_core::{ModelConfig, RequestOutput, SamplingParams, SpeculativeConfig, StructuredOutput};
use lmplex_engine::{ChatMessage, Engine, Prompt, Request};
use std::sync::atomic::Ordering;

#[test]
fn speculation_gives_plain_decodings_tokens_alone_and_in_a_batch_of_64() {
    let tweak = |c: &mut ModelConfig| {
        c.max_model_concurrency = 64;
        c.max_num_batched_tokens = Some(96);
        c.max_model_len = Some(512);
    };
    let (plain, _d1) = tiny_engine(tweak);
    let (spec, _d2) = tiny_engine(|c| {
        tweak(c);
        c.speculative = Some(ngram(4));
    });
    let reqs: Vec<Request> = (0..64).map(request).collect();
    let want: Vec<RequestOutput> = reqs.iter().map(|r| solo(&plain, r)).collect();
    check_alone_and_together(&spec, &reqs, &want, 12, "prompt lookup");
    let (drafts, drafted, accepted) = spec_counts(&spec);
    assert!(drafts > 0 && accepted > 0, "nothing accepted: {accepted} of {drafted}");
    assert!(accepted < drafted, "nothing rejected: {accepted} of {drafted}");
    assert_eq!(spec_counts(&plain), (0, 0, 0));
}

#[test]
fn speculation_under_preemption_gives_the_same_tokens() {
    let tweak = |c: &mut ModelConfig| {
        c.max_model_concurrency = 16;
        c.max_model_len = Some(256);
        c.kv_cache_bytes = Some(24 * 8192); // 24 blocks of 16 tokens for 16 requests
    };
    let (plain, _d1) = tiny_engine(tweak);
    let (spec, _d2) = tiny_engine(|c| {
        tweak(c);
        c.speculative = Some(ngram(6));
    });
    let reqs: Vec<Request> = (0..16)
        .map(|i| {
            let mut r = request(i);
            r.params.max_tokens = 60;
            r
        })
        .collect();
    let want: Vec<RequestOutput> = reqs.iter().map(|r| solo(&plain, r)).collect();
    let handles: Vec<_> = reqs.iter().map(|r| spec.submit(r).unwrap()).collect();
    for (i, h) in handles.into_iter().enumerate() {
        assert_same(&h.collect_blocking().unwrap(), &want[i], &format!("request {i} under preemption"));
    }
    wait_until_idle(&spec);
    assert!(spec.stats().num_preemptions.load(Ordering::Relaxed) > 0, "the pool never ran short");
    assert!(spec_counts(&spec).2 > 0, "nothing accepted");
}

#[test]
fn guided_and_copying_requests_on_smollm2_are_unchanged_and_accepted() {
    let Some(path) = model_common::smollm2_gguf() else { return };
    let load = |speculative| {
        let mut cfg = ModelConfig::new(path.to_string_lossy());
        cfg.max_model_len = Some(1024);
        cfg.speculative = speculative;
        Engine::new(cfg).unwrap()
    };
    let (plain, spec) = (load(None), load(Some(SpeculativeConfig::ngram(5))));
    let source = "def area(width, height):\n    return width * height\n\n\ndef perimeter(width, height):\n    \
                  return 2 * (width + height)\n";
    let ask = |text: String, structured: Option<StructuredOutput>, seed: Option<u64>| {
        let p = SamplingParams {
            max_tokens: 80,
            temperature: if seed.is_some() { 0.7 } else { 0.0 },
            seed,
            logprobs: Some(1),
            structured_outputs: structured,
            ..Default::default()
        };
        Request::new(Prompt::Messages(vec![ChatMessage::new("user", &text)]), p)
    };
    let reqs = [
        ask(format!("Rename `width` to `w` in this code and print all of it:\n{source}"), None, None),
        ask(format!("Copy this code exactly:\n{source}"), None, Some(5)),
        ask("Describe a cat as JSON.".into(), Some(StructuredOutput::JsonObject), None),
        ask("Pick one.".into(), Some(StructuredOutput::Choice(vec!["yes yes yes".into(), "no".into()])), Some(2)),
    ];
    for (i, r) in reqs.iter().enumerate() {
        assert_same(&solo(&spec, r), &solo(&plain, r), &format!("SmolLM2 request {i}"));
    }
    let (_, drafted, accepted) = spec_counts(&spec);
    assert!(accepted * 2 > drafted, "copying code is mostly accepted: {accepted} of {drafted}");
}

#[test]
fn a_draft_model_gives_plain_decodings_tokens_alone_in_a_batch_and_under_preemption() {
    let tweak = |c: &mut ModelConfig| {
        c.max_model_concurrency = 16;
        c.max_num_batched_tokens = Some(96);
        c.max_model_len = Some(256);
    };
    let (plain, _d1) = tiny_engine(tweak);
    let reqs: Vec<Request> = (0..16).map(request).collect();
    let want: Vec<RequestOutput> = reqs.iter().map(|r| solo(&plain, r)).collect();
    // The target's own weights (seed 7) draft its greedy picks; other weights (seed 8) mostly miss.
    let mut rates = Vec::new();
    for (seed, short_pool) in [(7, false), (8, false), (7, true)] {
        let (_d, path) = draft_model(seed);
        let (spec, _d2) = tiny_engine(|c| {
            tweak(c);
            c.speculative = Some(SpeculativeConfig::draft(path, 4));
            if short_pool {
                c.kv_cache_bytes = Some(24 * 8192); // 24 blocks of 16 tokens for 16 requests
            }
        });
        let what = format!("draft seed {seed}, short pool {short_pool}");
        check_alone_and_together(&spec, &reqs, &want, 6, &what);
        let (drafts, drafted, accepted) = spec_counts(&spec);
        // How many tokens are drafted depends on measured pass times; that some are, does not
        // (the first decode steps draft before anything is measured).
        assert!(drafts > 0, "{what}: nothing drafted");
        rates.push((seed, accepted as f64 / drafted as f64));
        if short_pool {
            assert!(spec.stats().num_preemptions.load(Ordering::Relaxed) > 0, "{what}: the pool never ran short");
        }
    }
    let (own, other) = (rates[0].1.min(rates[2].1), rates[1].1);
    assert!(own > 0.5 && other < own, "acceptance: own weights {own}, other weights {other}");
}

#[test]
fn a_draft_model_with_another_tokenizer_is_refused_naming_the_difference() {
    let (_d, path) = draft_model(7);
    let file = std::path::Path::new(&path).join("tokenizer.json");
    let text = std::fs::read_to_string(&file).unwrap().replace("\"t5\"", "\"five\"");
    std::fs::write(&file, text).unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(dir.path(), 7);
    let mut cfg = ModelConfig::new(dir.path().to_string_lossy());
    cfg.speculative = Some(SpeculativeConfig::draft(path, 4));
    let e = Engine::new(cfg).err().expect("a draft with another tokenizer loads").to_string();
    assert!(e.contains("does not share the target's tokenizer") && e.contains("token 5 is"), "{e}");
}

#[test]
fn a_draft_model_with_a_shorter_context_drafts_within_it() {
    // The draft reads 48 positions, the target 256: past 48, requests decode without drafts.
    let (_d, path) = draft_model(7);
    let file = std::path::Path::new(&path).join("config.json");
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace("\"max_position_embeddings\":1024", "\"max_position_embeddings\":48");
    std::fs::write(&file, text).unwrap();
    let tweak = |c: &mut ModelConfig| c.max_model_len = Some(256);
    let (plain, _d1) = tiny_engine(tweak);
    let (spec, _d2) = tiny_engine(|c| {
        tweak(c);
        c.speculative = Some(SpeculativeConfig::draft(path, 4));
    });
    for i in [0, 2, 4] {
        let mut r = request(i);
        r.params.max_tokens = 80;
        assert_same(&solo(&spec, &r), &solo(&plain, &r), &format!("request {i}"));
    }
    assert!(spec_counts(&spec).0 > 0, "nothing drafted within the draft's context");
}
