//! The CUDA forward pass, run by the host executor (each kernel's CPU twin, the same argument
//! lists and buffers) and by the CPU kernels (the real `.cu` code compiled for the CPU), equals
//! the CPU model's logits on tiny random llama, qwen2 (biases, tied
//! head), qwen3 (q/k norms) and phi3 (fused projections) checkpoints: a 530-token prompt (two
//! attention partitions) batched with a 37-token prompt scoring every position, then decode
//! steps; and a swap of one sequence's blocks to the warm tier and back into other blocks
//! changes nothing; and the CPU kernels give bit-identical logits whatever order the threads of
//! each phase run in (forward, reverse, random); and decode steps laid out for CUDA graphs
//! (padded block tables and attention rows) give the same bits as the exact layout.
//!
//! Tolerances, relative to the step's largest |logit| (of order 1 to 10): f32 storage, 1e-5
//! (the GEMM and norms sum in another order than the CPU's); bf16 storage, 3e-2 (weights,
//! activations and KV rounded to 8 significant bits), with the same argmax
//! wherever the f32 top two differ by more than 5% of that scale.

use lmplex_cuda::{CudaModel, CudaSizing, Dt, Gpu};
use lmplex_kernels::Order;
use lmplex_model::testing::{write_tiny_checkpoint, Family, VOCAB};
use lmplex_model::{ForwardBatch, KvCache, LogitsSelect, SeqChunk};

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
    }
}

fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + salt * 11 + 5) % VOCAB as u32).collect()
}

fn chunk<'a>(ids: &'a [u32], start_pos: usize, block_table: &'a [u32], logits: LogitsSelect) -> SeqChunk<'a> {
    SeqChunk { token_ids: ids, start_pos, block_table, logits, num_prompt_tokens: usize::MAX }
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
    let a = &cpu.args;
    let mut kv = KvCache::new(a.num_hidden_layers, BLOCKS, BS, a.num_key_value_heads, a.head_dim).unwrap();
    let want = steps(|b| cpu.forward(b, &mut kv).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap());
    assert_eq!(want[0].len(), 38 * VOCAB);
    assert!(want[0].iter().fold(0f32, |m, x| m.max(x.abs())) > 0.1, "{fam:?}: degenerate logits");
    let emulated = || Gpu::emulated(Order::Forward).unwrap();
    let runs: [(&str, MakeGpu, Dt, f32); 4] = [
        ("twins", Gpu::host, Dt::F32, 1e-5),
        ("twins", Gpu::host, Dt::Bf16, 3e-2),
        ("CPU kernels", emulated, Dt::F32, 1e-5),
        ("CPU kernels", emulated, Dt::Bf16, 3e-2),
    ];
    for (exec, gpu, dt, tol) in runs {
        let ckpt = lmplex_model::open(dir.path(), None).unwrap();
        let mut gpu = CudaModel::load(gpu(), &ckpt, dt, sizing()).unwrap();
        let got = steps(|b| gpu.forward(b).unwrap().to_vec());
        let fam = format!("{fam:?} ({exec})");
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
    let run = |order| {
        let mut m = CudaModel::load(Gpu::emulated(order).unwrap(), &ckpt, Dt::Bf16, sizing()).unwrap();
        steps(|b| m.forward(b).unwrap().to_vec())
    };
    let forward = run(Order::Forward);
    assert_eq!(run(Order::Reverse), forward, "reverse order");
    assert_eq!(run(Order::Random(7)), forward, "random order");
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
    let dir = tempfile::tempdir().unwrap();
    write_tiny_checkpoint(dir.path(), Family::Qwen2).unwrap();
    let ckpt = lmplex_model::open(dir.path(), None).unwrap();
    let makers: [(&str, MakeGpu); 2] =
        [("twins", Gpu::host), ("CPU kernels", || Gpu::emulated(Order::Forward).unwrap())];
    for (exec, make) in makers {
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
        assert_eq!(run(true), run(false), "{exec}");
    }
}
