//! Speculative decoding on the CUDA backend, without a device: the host executor
//! (`LMPLEX_CUDA_EXECUTOR=host`, every kernel's CPU twin) runs the target and its draft model,
//! with `LMPLEX_CUDA_SPECULATIVE=1`. Prompt lookup and a draft model on the target's device give
//! plain decoding's tokens and logprobs bit for bit, alone and in a batch whose draft passes
//! are cut to the step's token budget; drafts are accepted (and by lookup also rejected); the
//! draft's device bytes after the run (its step buffers never grew) are what the plan said. (One test in its own binary: it sets the process's
//! environment. The device run is `tests/gpu/test_speculative_gpu.py`.)

mod common;

use common::spec::{check_alone_and_together, draft_model, ngram, request, spec_counts};
use common::{solo, tiny_engine};
use lmplex_core::{DeviceKind, ModelConfig, RequestOutput, SpeculativeConfig};
use lmplex_engine::{EnginePlan, Request};

#[test]
fn speculation_on_the_cuda_backend_gives_plain_decodings_tokens() {
    std::env::set_var("LMPLEX_CUDA_EXECUTOR", "host");
    std::env::set_var("LMPLEX_CUDA_SPECULATIVE", "1");
    let tweak = |c: &mut ModelConfig| {
        c.device = DeviceKind::Cuda(0);
        c.max_model_concurrency = 8;
        c.max_num_batched_tokens = Some(64);
        c.max_model_len = Some(256);
    };
    let (plain, _d1) = tiny_engine(tweak);
    assert_eq!(plain.info().runtime.device, "cuda");
    let mut reqs: Vec<Request> = (0..8).map(request).collect();
    // A prompt of 150 tokens: the draft's first pass over it takes three passes of 64 at most.
    let mut long = request(0);
    if let lmplex_engine::Prompt::TokenIds(ids) = &mut long.prompt {
        *ids = ids.iter().cycle().take(150).copied().collect();
    }
    reqs.insert(0, long);
    let want: Vec<RequestOutput> = reqs.iter().map(|r| solo(&plain, r)).collect();
    // The target's own weights (seed 7) as the draft: its greedy picks are mostly accepted.
    let (_d, path) = draft_model(7);
    for cfg in [ngram(4), SpeculativeConfig::draft(path, 4)] {
        let what = format!("{:?}", cfg.method);
        let (spec, dir) = tiny_engine(|c| {
            tweak(c);
            c.speculative = Some(cfg.clone());
        });
        check_alone_and_together(&spec, &reqs, &want, 5, &what);
        let (drafts, drafted, accepted) = spec_counts(&spec);
        assert!(drafts > 0 && accepted > 0, "{what}: nothing accepted: {accepted} of {drafted}");
        // A draft as large as its target stops drafting once its passes are measured (they
        // cannot pay), so only the first steps draft; lookup drafts throughout.
        if cfg.model.is_none() {
            assert!(accepted < drafted, "{what}: nothing rejected: {accepted} of {drafted}");
        }
        let mut c = ModelConfig::new(dir.path().to_string_lossy());
        tweak(&mut c);
        c.speculative = Some(cfg);
        let plan = EnginePlan::new(&c).unwrap();
        let (held, m) = (spec.memory().other, spec.memory());
        if c.speculative.as_ref().unwrap().model.is_some() {
            // Weights, KV pool and workspace on the device, as planned, short by what the
            // target's own workspace is short of its plan: the cuBLAS workspace, which an
            // executor without a device does not hold.
            let short = plan.workspace_bytes - m.workspace;
            assert!(plan.draft_bytes > short, "planned {}", plan.draft_bytes);
            assert_eq!(held, plan.draft_bytes - short, "the draft's bytes, held against planned");
        } else {
            assert_eq!((plan.draft_bytes, held), (0, 0));
        }
    }
}
