//! LoRA adapters on the CUDA forward pass (on when `CudaSizing::max_loras` is set), run by the
//! host executor (the kernels' twins) and by the CPU kernels (the real `lora.cu` compiled for the
//! CPU), against the CPU model under the same adapters: tiny random llama, qwen2 (biases), qwen3
//! (head norms) and phi3 (fused projections), with a rank-4 adapter of every projection, a rank-8
//! adapter of attention alone and the base mixed in one batch, a prefill then decode steps.
//!
//! Also: the device's adaptable projections are the CPU model's; a sequence's logits under an
//! adapter are the same bits alone as in the mixed batch; a pool too small for the step's
//! adapters grows; LoRA off refuses an adapter's batch naming the switch.
//!
//! Tolerances as `host_forward.rs`: relative to the step's largest |logit|, 1e-5 in f32, 3e-2 in
//! bf16 (there the deltas are rounded into the bf16 projection outputs once more than on the CPU).

use lmplex_cuda::{CudaModel, CudaSizing, Dt, Gpu};
use lmplex_kernels::Order;
use lmplex_model::lora::{LoraAdapter, Target};
use lmplex_model::testing::{write_tiny_adapter, write_tiny_checkpoint, Family, VOCAB};
use lmplex_model::{ForwardBatch, KvCache, LogitsSelect, Model, SeqChunk};
use std::path::Path;

const BS: usize = 16;
const BLOCKS: usize = 32;

fn sizing(max_loras: usize) -> CudaSizing {
    CudaSizing {
        num_blocks: BLOCKS,
        num_warm_blocks: 0,
        block_size: BS,
        max_num_batched_tokens: 256,
        max_num_seqs: 4,
        enforce_eager: false,
        max_loras,
    }
}

/// The two adapters of `model`: every projection at rank 4; attention only at rank 8.
fn adapters(model: &Model, dir: &Path) -> [LoraAdapter; 2] {
    let all = model.lora_modules();
    let attn: Vec<_> =
        all.iter().copied().filter(|m| matches!(m.target, Target::Q | Target::V | Target::Qkv | Target::O)).collect();
    let layers = model.args.num_hidden_layers;
    let mut out = Vec::new();
    for (name, modules, rank) in [("all", &all, 4), ("attn", &attn, 8)] {
        write_tiny_adapter(&dir.join(name), modules, rank, 0.08, name).unwrap();
        out.push(LoraAdapter::load(&dir.join(name), &all, layers, 64).unwrap());
    }
    out.try_into().unwrap()
}

fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 29 + salt * 13 + 3) % VOCAB as u32).collect()
}

/// Each step's logits rows from `run`: the sequences `(prompt, adapter)` (block tables 8 blocks
/// apart), their prompts in one step, then three decode steps.
fn steps(
    seqs: &[(Vec<u32>, Option<&LoraAdapter>)],
    mut run: impl FnMut(&ForwardBatch<'_>) -> Vec<f32>,
) -> Vec<Vec<f32>> {
    let tables: Vec<Vec<u32>> = (0..seqs.len() as u32).map(|i| (i * 8..i * 8 + 8).collect()).collect();
    let mut out = Vec::new();
    let batch = ForwardBatch {
        seqs: seqs
            .iter()
            .zip(&tables)
            .map(|((p, lora), t)| SeqChunk {
                token_ids: p,
                start_pos: 0,
                block_table: t,
                logits: LogitsSelect::Last,
                num_prompt_tokens: p.len(),
                lora: *lora,
                embeds: None,
            })
            .collect(),
    };
    out.push(run(&batch));
    for step in 0..3usize {
        let next: Vec<[u32; 1]> = seqs.iter().map(|(p, _)| [((step * 7 + p.len() * 3) % VOCAB) as u32]).collect();
        let batch = ForwardBatch {
            seqs: seqs
                .iter()
                .zip(&tables)
                .zip(&next)
                .map(|(((p, lora), t), n)| SeqChunk {
                    token_ids: n,
                    start_pos: p.len() + step,
                    block_table: t,
                    logits: LogitsSelect::Last,
                    num_prompt_tokens: p.len(),
                    lora: *lora,
                    embeds: None,
                })
                .collect(),
        };
        out.push(run(&batch));
    }
    out
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn check(fam: Family) {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_checkpoint(dir.path(), fam).unwrap();
    let cpu = lmplex_model::load(dir.path(), None).unwrap().model;
    let [all, attn] = adapters(&cpu, dir.path());
    let seqs = vec![
        (tokens(37, 1), Some(&all)),
        (tokens(20, 2), None),
        (tokens(45, 3), Some(&attn)),
        (tokens(9, 4), Some(&all)),
    ];
    let a = &cpu.args;
    let mut kv = KvCache::new(a.num_hidden_layers, BLOCKS, BS, a.num_key_value_heads, a.head_dim).unwrap();
    let want = steps(&seqs, |b| cpu.forward(b, &mut kv).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap());
    // The adapters change the logits: the check is not of the base alone.
    let base = {
        let plain: Vec<_> = seqs.iter().map(|(p, _)| (p.clone(), None)).collect();
        let mut kv = KvCache::new(a.num_hidden_layers, BLOCKS, BS, a.num_key_value_heads, a.head_dim).unwrap();
        steps(&plain, |b| cpu.forward(b, &mut kv).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap())
    };
    let scale = want[0].iter().fold(0f32, |m, x| m.max(x.abs()));
    assert!(max_diff(&want[0][..VOCAB], &base[0][..VOCAB]) > 0.05 * scale, "{fam:?}: the adapter changes nothing");
    type Run = (&'static str, fn() -> Gpu, Dt, f32);
    let runs: [Run; 4] = [
        ("twins", Gpu::host, Dt::F32, 1e-5),
        ("twins", Gpu::host, Dt::Bf16, 3e-2),
        ("CPU kernels", || Gpu::emulated(Order::Forward).unwrap(), Dt::F32, 1e-5),
        ("CPU kernels", || Gpu::emulated(Order::Forward).unwrap(), Dt::Bf16, 3e-2),
    ];
    let ckpt = lmplex_model::open(dir.path(), None).unwrap();
    for (exec, gpu, dt, tol) in runs {
        let mut m = CudaModel::load(gpu(), &ckpt, dt, sizing(2)).unwrap();
        assert_eq!(m.lora_modules().unwrap(), cpu.lora_modules(), "{fam:?}: the device adapts what the CPU does");
        let got = steps(&seqs, |b| m.forward(b).unwrap().to_vec());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let (d, scale) = (max_diff(g, w), w.iter().fold(0f32, |m, x| m.max(x.abs())));
            assert!(d < tol * scale, "{fam:?} ({exec}, {dt:?}) step {i}: max |logit diff| {d}, logits up to {scale}");
        }
        assert!(m.lora_bytes() > 0);
        if exec == "CPU kernels" && dt == Dt::F32 {
            // The last sequence alone: the bits of its row in the batch.
            let mut m = CudaModel::load(gpu(), &ckpt, dt, sizing(2)).unwrap();
            let alone = steps(&seqs[3..], |b| m.forward(b).unwrap().to_vec());
            for (s, (x, y)) in alone.iter().zip(&got).enumerate() {
                assert_eq!(x[..], y[3 * VOCAB..], "{fam:?} step {s}: alone differs from in the batch");
            }
        }
    }
}

#[test]
fn llama_adapters_match_the_cpu_model() {
    check(Family::Llama);
}

#[test]
fn qwen2_adapters_match_the_cpu_model() {
    check(Family::Qwen2);
}

#[test]
fn qwen3_adapters_match_the_cpu_model() {
    check(Family::Qwen3);
}

#[test]
fn phi3_fused_adapters_match_the_cpu_model() {
    check(Family::Phi3);
}

#[test]
fn lora_off_refuses_naming_the_switch_and_evicted_adapters_come_back() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_checkpoint(dir.path(), Family::Llama).unwrap();
    let cpu = lmplex_model::load(dir.path(), None).unwrap().model;
    let [all, attn] = adapters(&cpu, dir.path());
    let ckpt = lmplex_model::open(dir.path(), None).unwrap();
    let seqs = [(tokens(12, 1), Some(&all)), (tokens(10, 2), Some(&attn))];
    let mut off = CudaModel::load(Gpu::host(), &ckpt, Dt::F32, sizing(0)).unwrap();
    assert!(off.lora_modules().is_none());
    let table: Vec<u32> = (0..8).collect();
    let one = ForwardBatch {
        seqs: vec![SeqChunk {
            token_ids: &seqs[0].0,
            start_pos: 0,
            block_table: &table,
            logits: LogitsSelect::Last,
            num_prompt_tokens: 12,
            lora: Some(&all),
            embeds: None,
        }],
    };
    let e = off.forward(&one).unwrap_err().to_string();
    assert!(e.contains("LMPLEX_CUDA_LORA=1"), "{e}");
    // Keeping one adapter between steps: a step of two adapters still runs both, and steps of
    // one adapter then the other (each evicting the other) give what two resident ones give.
    let mut m1 = CudaModel::load(Gpu::host(), &ckpt, Dt::F32, sizing(1)).unwrap();
    let mut m2 = CudaModel::load(Gpu::host(), &ckpt, Dt::F32, sizing(2)).unwrap();
    for part in [&seqs[..], &seqs[..1], &seqs[1..], &seqs[..1]] {
        let one = steps(part, |b| m1.forward(b).unwrap().to_vec());
        assert_eq!(one, steps(part, |b| m2.forward(b).unwrap().to_vec()));
    }
}
