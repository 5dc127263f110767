//! The CUDA forward pass, run by the host executor (each kernel's CPU twin, the same argument
//! lists and buffers) and by the CPU kernels (the real `.cu` code compiled for the CPU), equals
//! the CPU model's logits on tiny random llama, qwen2 (biases, tied
//! head), qwen3 (q/k norms) and phi3 (fused projections) checkpoints: a 530-token prompt (two
//! attention partitions) batched with a 37-token prompt scoring every position, then decode
//! steps; and a swap of one sequence's blocks to the warm tier and back into other blocks
//! changes nothing; and the CPU kernels give bit-identical logits whatever order the threads of
//! each phase run in (forward, reverse, random); and decode steps laid out for CUDA graphs
//! (padded block tables and attention rows) give the same bits as the exact layout, with every
//! switch on too (the tile GEMM, the fused kernels, attention on the tensor cores); and the fused
//! kernels (`Gpu::fused`) give the same bits as the launches they replace.
//!
//! Tolerances, relative to the step's largest |logit| (of order 1 to 10): f32 storage, 1e-5
//! (the GEMM and norms sum in another order than the CPU's); bf16 storage, 3e-2 (weights,
//! activations and KV rounded to 8 significant bits), with the same argmax
//! wherever the f32 top two differ by more than 5% of that scale.

mod common;

use common::{chunk, tokens};

use candle_core::quantized::GgmlDType;
use lmplex_core::SamplingParams;
use lmplex_cuda::weights::planned_bytes;
use lmplex_cuda::{CudaModel, CudaSizing, Dt, GemmKind, Gpu};
use lmplex_kernels::Order;
use lmplex_model::sample::pick::Pick;
use lmplex_model::testing::{write_tiny_checkpoint, write_tiny_gguf, Family, VOCAB};
use lmplex_model::Sampler;
use lmplex_model::{ForwardBatch, KvCache, LogitsSelect, Model};
use std::path::Path;

type MakeGpu = fn() -> Gpu;

const BS: usize = 16;
const BLOCKS: usize = 64;

fn sizing() -> CudaSizing {
    CudaSizing {
        num_blocks: BLOCKS,
        num_warm_blocks: 8,
        block_size: BS,
        max_num_batched_tokens: 256,
        max_num_seqs: 4,
        enforce_eager: false,
        max_loras: 0,
    }
}

/// Logits rows of each step, `[step][rows * vocab]`, from `run(batch)`.
fn steps(mut run: impl FnMut(&ForwardBatch) -> Vec<f32>) -> Vec<Vec<f32>> {
    let a_table: Vec<u32> = (0..40).collect();
    let b_table: Vec<u32> = (40..44).collect();
    let (a, b) = (tokens(530, 1), tokens(37, 2));
    let mut out = Vec::new();
    let seqs = vec![chunk(&a, 0, &a_table, LogitsSelect::Last), chunk(&b, 0, &b_table, LogitsSelect::All)];
    out.push(run(&ForwardBatch { seqs }));
    for step in 0..3usize {
        let (ta, tb) = ([(step * 7) as u32], [(step * 5 + 1) as u32]);
        let seqs = vec![
            chunk(&tb, 37 + step, &b_table, LogitsSelect::Last),
            chunk(&ta, 530 + step, &a_table, LogitsSelect::Last),
        ];
        out.push(run(&ForwardBatch { seqs }));
    }
    out
}

/// `g` multiplying with the tensor-core tile GEMM (`GemmKind::Tiles`).
fn tiles(mut g: Gpu) -> Gpu {
    g.gemm_kind = GemmKind::Tiles;
    g
}

/// `g` with the fused kernels on (`Gpu::fused`).
fn fused(mut g: Gpu) -> Gpu {
    g.fused = true;
    g
}

/// `g` with every switch on: the tile GEMM, the fused kernels, attention on the tensor cores.
fn every_switch(mut g: Gpu) -> Gpu {
    g.tensor_attention = true;
    fused(tiles(g))
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn argmax(r: &[f32]) -> usize {
    (0..r.len()).max_by(|&x, &y| r[x].total_cmp(&r[y]).then(y.cmp(&x))).unwrap()
}

fn check(fam: Family) {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_checkpoint(dir.path(), fam).unwrap();
    let cpu = lmplex_model::load(dir.path(), None).unwrap().model;
    matches_cpu(&cpu, dir.path(), &format!("{fam:?}"), |_| ());
}

/// The CUDA forward pass on `path` (each executor, f32 and bf16) against the CPU `cpu`;
/// `inspect` sees each loaded model first.
fn matches_cpu(cpu: &Model, path: &Path, label: &str, inspect: impl Fn(&CudaModel)) {
    let a = &cpu.args;
    let mut kv = KvCache::new(a.num_hidden_layers, BLOCKS, BS, a.num_key_value_heads, a.head_dim).unwrap();
    let want = steps(|b| cpu.forward(b, &mut kv).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap());
    assert_eq!(want[0].len(), 38 * VOCAB);
    assert!(want[0].iter().fold(0f32, |m, x| m.max(x.abs())) > 0.1, "{label}: degenerate logits");
    let emulated = || Gpu::emulated(Order::Forward).unwrap();
    let runs: [(&str, MakeGpu, Dt, f32); 9] = [
        ("twins", Gpu::host, Dt::F32, 1e-5),
        ("twins", Gpu::host, Dt::Bf16, 3e-2),
        ("twins, tile GEMM", || tiles(Gpu::host()), Dt::Bf16, 3e-2),
        ("CPU kernels", emulated, Dt::F32, 1e-5),
        ("CPU kernels", emulated, Dt::Bf16, 3e-2),
        ("CPU kernels, tile GEMM", || tiles(Gpu::emulated(Order::Forward).unwrap()), Dt::Bf16, 3e-2),
        ("CPU kernels, fused", || fused(Gpu::emulated(Order::Forward).unwrap()), Dt::F32, 1e-5),
        ("twins, tile GEMM, fused", || fused(tiles(Gpu::host())), Dt::Bf16, 3e-2),
        ("CPU kernels, every switch", || every_switch(Gpu::emulated(Order::Forward).unwrap()), Dt::Bf16, 3e-2),
    ];
    for (exec, gpu, dt, tol) in runs {
        let ckpt = lmplex_model::open(path, None).unwrap();
        let mut gpu = CudaModel::load(gpu(), &ckpt, dt, sizing()).unwrap();
        inspect(&gpu);
        let got = steps(|b| gpu.forward(b).unwrap().to_vec());
        let fam = format!("{label} ({exec})");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let (d, scale) = (max_diff(g, w), w.iter().fold(0f32, |m, x| m.max(x.abs())));
            assert!(d < tol * scale, "{fam} {dt:?} step {i}: max |logit diff| {d}, logits up to {scale}");
            for (gr, wr) in g.chunks_exact(VOCAB).zip(w.chunks_exact(VOCAB)) {
                let mut sorted = wr.to_vec();
                sorted.sort_by(|x, y| y.total_cmp(x));
                if sorted[0] - sorted[1] > 0.05 * scale {
                    assert_eq!(argmax(gr), argmax(wr), "{fam} {dt:?} step {i}: argmax differs");
                }
            }
        }
    }
}

#[test]
fn llama_matches_the_cpu_model() {
    check(Family::Llama);
}

#[test]
fn qwen2_biases_and_tied_head_match_the_cpu_model() {
    check(Family::Qwen2);
}

#[test]
fn qwen3_head_norms_match_the_cpu_model() {
    check(Family::Qwen3);
}

#[test]
fn phi3_fused_projections_match_the_cpu_model() {
    check(Family::Phi3);
}

#[test]
fn cpu_kernels_give_the_same_bits_in_every_thread_order() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_checkpoint(dir.path(), Family::Qwen3).unwrap();
    let ckpt = lmplex_model::open(dir.path(), None).unwrap();
    let switches = [(GemmKind::Vendor, false, false), (GemmKind::Tiles, false, false), (GemmKind::Tiles, true, true)];
    for (kind, on, tensor) in switches {
        let run = |order| {
            let mut gpu = Gpu::emulated(order).unwrap();
            (gpu.gemm_kind, gpu.fused, gpu.tensor_attention) = (kind, on, tensor);
            let mut m = CudaModel::load(gpu, &ckpt, Dt::Bf16, sizing()).unwrap();
            steps(|b| m.forward(b).unwrap().to_vec())
        };
        let forward = run(Order::Forward);
        assert_eq!(run(Order::Reverse), forward, "{kind:?}, fused {on}, tensor {tensor}: reverse order");
        assert_eq!(run(Order::Random(7)), forward, "{kind:?}, fused {on}, tensor {tensor}: random order");
    }
}

#[test]
fn the_planned_workspace_is_what_a_load_allocates() {
    // The memory plan (`CudaSizing::workspace_bytes`) is what a device load reports, cuBLAS's
    // workspace included (which the host executor does not allocate).
    let dir = tempfile::tempdir().unwrap();
    write_tiny_checkpoint(dir.path(), Family::Qwen2).unwrap();
    let ckpt = lmplex_model::open(dir.path(), None).unwrap();
    for (dt, sizing) in
        [(Dt::Bf16, sizing()), (Dt::F32, CudaSizing { max_num_batched_tokens: 2048, max_num_seqs: 100, ..sizing() })]
    {
        let m = CudaModel::load(Gpu::host(), &ckpt, dt, sizing).unwrap();
        let planned = sizing.workspace_bytes(&ckpt.args, dt);
        assert_eq!(planned, m.workspace_bytes() + lmplex_cuda::gpu::BLAS_WORKSPACE, "{dt:?}");
    }
}

#[test]
fn swapped_blocks_come_back_bit_for_bit_in_other_blocks() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_checkpoint(dir.path(), Family::Llama).unwrap();
    let ckpt = lmplex_model::open(dir.path(), None).unwrap();
    let mut m = CudaModel::load(Gpu::host(), &ckpt, Dt::Bf16, sizing()).unwrap();
    let p = tokens(40, 3);
    let (t1, t2): (Vec<u32>, Vec<u32>) = ((0..3).collect(), (10..13).collect());
    let run = |m: &mut CudaModel, ids: &[u32], start: usize, table: &[u32]| {
        m.forward(&ForwardBatch { seqs: vec![chunk(ids, start, table, LogitsSelect::Last)] }).unwrap().to_vec()
    };
    run(&mut m, &p, 0, &t1);
    let direct = run(&mut m, &[7], 40, &t1);
    // Out to warm blocks 5..8, back into device blocks 10..13: the same next step.
    let out: Vec<(u32, u32)> = (0..3).map(|i| (i, 5 + i)).collect();
    let into: Vec<(u32, u32)> = (0..3).map(|i| (5 + i, 10 + i)).collect();
    m.kv.swap_out(&m.gpu, &out).unwrap();
    m.kv.swap_in(&m.gpu, &into).unwrap();
    assert_eq!(run(&mut m, &[7], 40, &t2), direct);
    assert!(m.kv.swap_out(&m.gpu, &[(BLOCKS as u32, 0)]).is_err(), "an out-of-range block is an error");
}

#[test]
fn decode_steps_in_the_graph_layout_give_the_same_bits_as_the_exact_layout() {
    // A dense folder, and a GGUF whose tied head is quantized (the graph layout multiplies 4
    // head rows where the exact one multiplies 3).
    let dir = tempfile::tempdir().unwrap();
    write_tiny_checkpoint(dir.path(), Family::Qwen2).unwrap();
    let gguf = dir.path().join("q8_0.gguf");
    write_tiny_gguf(&gguf, Family::Qwen2, &|_| GgmlDType::Q8_0).unwrap();
    let makers: [(&str, MakeGpu); 4] = [
        ("twins", Gpu::host),
        ("CPU kernels", || Gpu::emulated(Order::Forward).unwrap()),
        ("CPU kernels, tile GEMM", || tiles(Gpu::emulated(Order::Forward).unwrap())),
        ("CPU kernels, every switch", || every_switch(Gpu::emulated(Order::Forward).unwrap())),
    ];
    for ((exec, make), path) in makers.into_iter().flat_map(|m| [(m, dir.path()), (m, gguf.as_path())]) {
        let ckpt = lmplex_model::open(path, None).unwrap();
        let run = |graphs: bool| {
            let mut m = CudaModel::load(make(), &ckpt, Dt::Bf16, sizing()).unwrap();
            m.set_graphs(graphs);
            assert_eq!(m.graphs_enabled(), graphs);
            let mut out = steps(|b| m.forward(b).unwrap().to_vec());
            // Three sequences decoding together: the graph layout runs 4 rows (a power of two)
            // and pads the block tables to a stride of 4, the exact one 3 rows and a stride of 3.
            let tables: [Vec<u32>; 3] = [(44..47).collect(), (47..49).collect(), (49..50).collect()];
            let prompts = [tokens(40, 3), tokens(20, 4), tokens(9, 5)];
            let prefill =
                ForwardBatch { seqs: (0..3).map(|i| chunk(&prompts[i], 0, &tables[i], LogitsSelect::Last)).collect() };
            m.forward(&prefill).unwrap();
            let next = [[1u32], [2], [3]];
            let decode = ForwardBatch {
                seqs: (0..3).map(|i| chunk(&next[i], prompts[i].len(), &tables[i], LogitsSelect::Last)).collect(),
            };
            out.push(m.forward(&decode).unwrap().to_vec());
            out
        };
        assert_eq!(run(true), run(false), "{exec} {}", path.display());
    }
}

#[test]
fn fused_kernels_give_the_same_bits_as_the_launches_they_replace() {
    // Short contexts (one attention partition, so attention runs in one pass), a prefill of two
    // prompts then decode steps of three sequences, eager and in the graph layout, on the CPU
    // kernels: a dense folder (SwiGLU fused into the tile GEMM over dense weights), a GGUF with
    // gate and up in one format (fused over their blocks) and one with them in two (not fused).
    let dir = tempfile::tempdir().unwrap();
    write_tiny_checkpoint(dir.path(), Family::Qwen3).unwrap();
    let (q8, mixed_path) = (dir.path().join("q8_0.gguf"), dir.path().join("mixed.gguf"));
    write_tiny_gguf(&q8, Family::Qwen3, &|_| GgmlDType::Q8_0).unwrap();
    write_tiny_gguf(&mixed_path, Family::Llama, &mixed).unwrap();
    let short = |m: &mut CudaModel| {
        let tables: [Vec<u32>; 3] = [(0..4).collect(), (4..6).collect(), (6..7).collect()];
        let prompts = [tokens(50, 3), tokens(20, 4), tokens(9, 5)];
        let mut out = Vec::new();
        let prefill =
            ForwardBatch { seqs: (0..3).map(|i| chunk(&prompts[i], 0, &tables[i], LogitsSelect::All)).collect() };
        out.push(m.forward(&prefill).unwrap().to_vec());
        for step in 0..3usize {
            let next: Vec<[u32; 1]> = (0..3).map(|i| [(step * 3 + i) as u32 + 1]).collect();
            let decode = ForwardBatch {
                seqs: (0..3)
                    .map(|i| chunk(&next[i], prompts[i].len() + step, &tables[i], LogitsSelect::Last))
                    .collect(),
            };
            out.push(m.forward(&decode).unwrap().to_vec());
        }
        out
    };
    for path in [dir.path(), q8.as_path(), mixed_path.as_path()] {
        let ckpt = lmplex_model::open(path, None).unwrap();
        for kind in [GemmKind::Vendor, GemmKind::Tiles] {
            for graphs in [false, true] {
                let run = |on: bool| {
                    let mut gpu = Gpu::emulated(Order::Forward).unwrap();
                    (gpu.gemm_kind, gpu.fused) = (kind, on);
                    let mut m = CudaModel::load(gpu, &ckpt, Dt::Bf16, sizing()).unwrap();
                    m.set_graphs(graphs);
                    short(&mut m)
                };
                assert_eq!(run(true), run(false), "{} {kind:?}, graphs {graphs}", path.display());
            }
        }
    }
}

/// The ggml type of each matrix of a tiny GGUF, by HF name.
type QuantOf<'a> = &'a dyn Fn(&str) -> GgmlDType;

/// Layer 0 mixes formats: q and k Q5_0 with v Q8_0 (a qkv of two runs), gate Q4_1 with up
/// Q5_1, down f16 (held dense), o Q4_0; layer 1 and the head Q8_0, the embedding table Q4_0.
fn mixed(name: &str) -> GgmlDType {
    let pick = [
        ("layers.0.self_attn.q_proj", GgmlDType::Q5_0),
        ("layers.0.self_attn.k_proj", GgmlDType::Q5_0),
        ("layers.0.self_attn.o_proj", GgmlDType::Q4_0),
        ("layers.0.mlp.gate_proj", GgmlDType::Q4_1),
        ("layers.0.mlp.up_proj", GgmlDType::Q5_1),
        ("layers.0.mlp.down_proj", GgmlDType::F16),
        ("embed_tokens", GgmlDType::Q4_0),
    ];
    pick.iter().find(|(n, _)| name.contains(n)).map_or(GgmlDType::Q8_0, |p| p.1)
}

#[test]
fn quantized_ggufs_stay_in_their_blocks_and_match_their_dequantized_weights() {
    // The reference is the CPU model holding the same weights dequantized (`set_dequantize`).
    let cases: [(Family, &str, QuantOf); 3] = [
        (Family::Llama, "mixed", &mixed),
        (Family::Qwen2, "Q4_0, tied head", &|_| GgmlDType::Q4_0),
        (Family::Qwen3, "Q4_1", &|_| GgmlDType::Q4_1),
    ];
    for (fam, what, quant) in cases {
        let dir = tempfile::tempdir().unwrap();
        let gguf = dir.path().join("q.gguf");
        write_tiny_gguf(&gguf, fam, quant).unwrap();
        let mut ckpt = lmplex_model::open(&gguf, None).unwrap();
        ckpt.src.set_dequantize(true);
        let cpu = ckpt.into_cpu().unwrap().model;
        let ckpt = lmplex_model::open(&gguf, None).unwrap();
        let label = format!("{fam:?} {what}");
        matches_cpu(&cpu, &gguf, &label, |m| {
            let (dt, a) = (m.dt, &ckpt.args);
            assert_eq!(m.weight_bytes(), planned_bytes(a, &ckpt.src, dt), "{label} {dt:?}: the plan");
            assert!(m.weight_bytes() < a.num_parameters() * dt.size() * 2 / 3, "{label} {dt:?}: held dense");
        });
    }
}

#[test]
fn device_picks_are_the_host_samplers_picks_from_the_same_logits() {
    // Greedy and seeded draws of different cuts, with penalties, a bias and a held-back ending,
    // picked by the kernels (or their twins) after the forward pass, against `Pick::pick` on the
    // logits `forward` returns for the same step (the KV writes repeat the same values into the
    // same slots); the requests' samplers make the picks and record the tokens.
    let dir = tempfile::tempdir().unwrap();
    write_tiny_checkpoint(dir.path(), Family::Qwen3).unwrap();
    let ckpt = lmplex_model::open(dir.path(), None).unwrap();
    let params = |f: &dyn Fn(&mut SamplingParams)| {
        let mut p = SamplingParams { seed: Some(7), ..Default::default() };
        f(&mut p);
        p
    };
    let all = [
        params(&|p| (p.temperature, p.repetition_penalty, p.logit_bias) = (0.0, 1.5, [(7, 4.0)].into())),
        params(&|p| {
            (p.temperature, p.top_k, p.top_p, p.presence_penalty, p.frequency_penalty) = (0.8, 20, 0.9, 1.0, 0.5)
        }),
        params(&|p| (p.temperature, p.min_p, p.min_tokens) = (1.5, 0.05, 4)),
    ];
    let makers: [(&str, MakeGpu); 2] =
        [("twins", Gpu::host), ("CPU kernels", || Gpu::emulated(Order::Forward).unwrap())];
    for (exec, make) in makers {
        let mut m = CudaModel::load(make(), &ckpt, Dt::Bf16, sizing()).unwrap();
        let tables: [Vec<u32>; 3] = [(0..3).collect(), (3..5).collect(), (5..6).collect()];
        let prompts = [tokens(40, 3), tokens(20, 4), tokens(9, 5)];
        let mut ids: Vec<Vec<u32>> = prompts.iter().map(|_| Vec::new()).collect();
        let mut samplers: Vec<Sampler> =
            all.iter().zip(&prompts).map(|(p, t)| Sampler::new(p.clone(), t).with_eos(&[3])).collect();
        for step in 0..6u64 {
            let inputs: Vec<Vec<u32>> =
                (0..3).map(|i| if step == 0 { prompts[i].clone() } else { vec![*ids[i].last().unwrap()] }).collect();
            let batch = ForwardBatch {
                seqs: (0..3)
                    .map(|i| {
                        let start = if step == 0 { 0 } else { prompts[i].len() + step as usize - 1 };
                        chunk(&inputs[i], start, &tables[i], LogitsSelect::Last)
                    })
                    .collect(),
            };
            let picks: Vec<Pick> = samplers.iter().map(|s| s.pick().unwrap()).collect();
            // Repetition and bias always; presence and frequency once there is output; the
            // held-back ending for the first 4 tokens.
            let edited = [true, step > 0, step < 4];
            assert!(picks.iter().zip(edited).all(|(p, e)| p.edits.is_empty() != e), "{exec} step {step}: edits");
            let logits = m.forward(&batch).unwrap().to_vec();
            let want: Vec<u32> = logits.chunks_exact(VOCAB).zip(&picks).map(|(row, p)| p.pick(row)).collect();
            let got = m.forward_pick(&batch, &picks).unwrap();
            assert_eq!(got, want, "{exec} step {step}");
            samplers.iter_mut().zip(&got).for_each(|(s, &t)| _ = s.record(t));
            ids.iter_mut().zip(&got).for_each(|(v, &t)| v.push(t));
        }
        assert!(ids[1].iter().chain(&ids[2]).any(|&t| t != ids[1][0]), "{exec}: the draws never varied: {ids:?}");
    }
}
