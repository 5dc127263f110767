//! `LMPLEX_CUDA_EXECUTOR=counting`: the engine runs a CUDA model on the counting executor (no
//! device, no kernel work), as `lmplex bench --workloads gpu-model` does to time the engine's own
//! work per step: every request runs to its length through the real scheduler and CUDA forward
//! pass. Any other value than `device` or `counting` is an `InvalidRequest` naming it. (One test
//! in its own binary: it sets the process's environment.)

mod common;

use common::{ids_request, tiny_engine};
use lmplex_core::{DeviceKind, Error, SamplingParams};

#[test]
fn the_counting_executor_runs_the_engine_without_a_device() {
    std::env::set_var("LMPLEX_CUDA_EXECUTOR", "nothing");
    let dir = tempfile::tempdir().unwrap();
    common::write_tiny_llama(dir.path(), 3);
    let mut cfg = lmplex_core::ModelConfig::new(dir.path().to_string_lossy());
    cfg.device = DeviceKind::Cuda(0);
    match lmplex_engine::Engine::new(cfg) {
        Err(Error::InvalidRequest(m)) => assert!(m.contains("LMPLEX_CUDA_EXECUTOR=\"nothing\""), "{m}"),
        other => panic!("expected an InvalidRequest, got {:?}", other.err()),
    }

    std::env::set_var("LMPLEX_CUDA_EXECUTOR", "counting");
    let (engine, _dir) = tiny_engine(|c| c.device = DeviceKind::Cuda(0));
    assert_eq!(engine.info().runtime.device, "cuda");
    let p = SamplingParams { temperature: 0.0, max_tokens: 5, ignore_eos: true, ..Default::default() };
    let reqs: Vec<_> = (0..3).map(|i| ids_request(vec![3 + i, 4, 5], p.clone())).collect();
    let outs = engine.generate(&reqs).unwrap();
    // No kernel ran: the logits read back are zeros, whose argmax is token 0.
    assert!(
        outs.iter().all(|o| o.token_ids == vec![0; 5]),
        "{:?}",
        outs.iter().map(|o| &o.token_ids).collect::<Vec<_>>()
    );
}
