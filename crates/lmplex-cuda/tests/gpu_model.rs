//! The GPU path's device-free figures (`lmplex_cuda::profile`, the counting executor under the
//! real forward pass of Llama-3.2-1B and Llama-3-8B shapes) against the committed run,
//! `docs/bench/gpu-model.json` (`lmplex bench --workloads gpu-model --json`): no step may issue
//! more launches, or move more bytes against its minimum, than there, on the default path, the
//! tile GEMM's, the fused kernels' or with every switch on. An improvement passes; rerun the command into that file to
//! make it the new bar. Needs no GPU and no CUDA library.

use serde_json::Value;

fn steps(shape: &Value) -> Vec<(String, &Value)> {
    let mut out: Vec<(String, &Value)> =
        shape["decode"].as_object().unwrap().iter().map(|(b, v)| (format!("decode {b}"), v)).collect();
    out.push(("prefill_1000".into(), &shape["prefill_1000"]));
    out
}

/// `is` issues no more launches, and moves no more bytes against its minimum, than `was`.
fn no_worse(is: &Value, was: &Value, at: &str) {
    let n = |v: &Value, k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{at}: no {k}"));
    for key in ["launches_per_layer", "launches_per_step"] {
        assert!(n(is, key) <= n(was, key), "{at}: {key} {} where the committed run has {}", is[key], was[key]);
    }
    let (a, b) = (n(is, "bytes_ratio"), n(was, "bytes_ratio"));
    assert!(a <= b + 1e-3, "{at}: bytes_ratio {a} > {b}");
}

#[test]
fn no_step_launches_or_moves_more_than_the_committed_run() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/bench/gpu-model.json");
    let committed: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let now = lmplex_cuda::profile::report().unwrap();
    for (k, v) in now["settings"].as_object().unwrap() {
        assert_eq!(v, &committed["settings"][k], "the committed run was measured with another {k}");
    }
    let shapes = committed["shapes"].as_object().unwrap();
    assert_eq!(shapes.len(), 2);
    for (name, shape) in shapes {
        for (step, was) in steps(shape) {
            let is = match step.strip_prefix("decode ") {
                Some(b) => &now["shapes"][name]["decode"][b],
                None => &now["shapes"][name][&step],
            };
            for path in ["default", "tile_gemm", "fused", "every_switch"] {
                let (is, was) = if path == "default" { (is, was) } else { (&is[path], &was[path]) };
                no_worse(is, was, &format!("{name} {step} ({path})"));
            }
            let at = format!("{name} {step}");
            let n = |v: &Value, k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{at}: no {k}"));
            // What holds of any step: it moves at least its minimum, its layer's launches add up,
            // and its modeled time is no faster than its bytes at the bandwidth.
            assert!(n(is, "bytes_ratio") >= 1.0, "{at}: moves less than the step's minimum");
            let layer: f64 = is["layer_launches"].as_object().unwrap().values().map(|v| v.as_f64().unwrap()).sum();
            assert_eq!(layer, n(is, "launches_per_layer"), "{at}");
            assert!(n(is, "modeled_roofline_pct") <= 100.0, "{at}");
        }
    }
}

#[test]
fn a_replayed_graph_is_one_launch_moving_what_its_launches_moved() {
    // The counting executor captures decode steps as a device does: the first step of a shape
    // records its launches into the graph, and every replay logs one `graph` launch with their
    // bytes and products, beside the pick's own launches (the argmax), which stay outside it.
    use lmplex_cuda::{CudaModel, CudaSizing, Dt, Gpu};
    use lmplex_model::testing::{write_tiny_checkpoint, Family};
    use lmplex_model::{ForwardBatch, LogitsSelect, SeqChunk};
    let dir = tempfile::tempdir().unwrap();
    write_tiny_checkpoint(dir.path(), Family::Llama).unwrap();
    let ckpt = lmplex_model::open(dir.path(), None).unwrap();
    let sizing = |enforce_eager| CudaSizing {
        num_blocks: 16,
        num_warm_blocks: 0,
        block_size: 16,
        max_num_batched_tokens: 64,
        max_num_seqs: 4,
        enforce_eager,
        max_loras: 0,
    };
    let table: Vec<u32> = (0..4).collect();
    let ids = [5u32];
    let chunk = || SeqChunk {
        token_ids: &ids,
        start_pos: 20,
        block_table: &table,
        logits: LogitsSelect::Last,
        num_prompt_tokens: usize::MAX,
        lora: None,
        embeds: None,
    };
    let step = |m: &mut CudaModel| {
        m.forward(&ForwardBatch { seqs: vec![chunk()] }).unwrap();
        m.gpu.take_launches()
    };
    let mut eager = CudaModel::load(Gpu::counting(), &ckpt, Dt::Bf16, sizing(true)).unwrap();
    let mut graphed = CudaModel::load(Gpu::counting(), &ckpt, Dt::Bf16, sizing(false)).unwrap();
    let want = step(&mut eager);
    assert!(want.len() > 10, "{want:?}");
    for _ in 0..3 {
        let got = step(&mut graphed);
        assert_eq!(got.len(), 1, "one replay per step: {got:?}");
        assert_eq!(got[0].name, "graph");
        assert_eq!(got[0].traffic.bytes, want.iter().map(|l| l.traffic.bytes).sum::<u64>());
        assert_eq!(got[0].traffic.flops, want.iter().map(|l| l.traffic.flops).sum::<u64>());
    }
    assert_eq!(graphed.num_graphs(), 1);
}
