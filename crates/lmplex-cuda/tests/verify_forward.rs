//! Speculative decoding's premise on the CUDA forward pass: a verification chunk (a sequence's
//! next token and its drafts, one logits row each) gives every row the same bits as decoding
//! those tokens one step at a time, and so does the chunk that recomputes a position over a
//! rejected draft's K/V. Checked on the host executor (each kernel's CPU twin) and on the CPU
//! kernels (the real `.cu` code) with each switch, in bf16 and f32, on a short context (one
//! attention partition) and a long one (two), with another sequence decoding in the same step,
//! eager and with CUDA graphs on.

mod common;

use common::{chunk, tokens};

use candle_core::quantized::GgmlDType;
use lmplex_cuda::{CudaModel, CudaSizing, Dt, GemmKind, Gpu};
use lmplex_kernels::Order;
use lmplex_model::testing::{write_tiny_checkpoint, write_tiny_gguf, Family, VOCAB};
use lmplex_model::{ForwardBatch, LogitsSelect};
use std::path::Path;

const BS: usize = 16;

fn sizing() -> CudaSizing {
    CudaSizing {
        num_blocks: 96,
        num_warm_blocks: 0,
        block_size: BS,
        max_num_batched_tokens: 1024,
        max_num_seqs: 4,
        enforce_eager: false,
        max_loras: 0,
    }
}

type MakeGpu = fn() -> Gpu;

fn twins() -> Gpu {
    Gpu::host()
}

fn kernels() -> Gpu {
    Gpu::emulated(Order::Forward).unwrap()
}

fn tile_gemm() -> Gpu {
    let mut g = kernels();
    g.gemm_kind = GemmKind::Tiles;
    g
}

fn every_switch() -> Gpu {
    let mut g = tile_gemm();
    (g.fused, g.tensor_attention) = (true, true);
    g
}

/// A run: the executor and switches, the storage type, A's prompt length (40: one attention
/// partition; 530: two) and whether CUDA graphs are on.
type Case = (&'static str, MakeGpu, Dt, usize, bool);

const SHORT: [Case; 6] = [
    ("twins", twins, Dt::F32, 40, false),
    ("twins", twins, Dt::Bf16, 40, true),
    ("CPU kernels", kernels, Dt::Bf16, 40, false),
    ("CPU kernels", kernels, Dt::Bf16, 40, true),
    ("tile GEMM", tile_gemm, Dt::Bf16, 40, true),
    ("every switch", every_switch, Dt::Bf16, 40, true),
];

const LONG: [Case; 2] =
    [("CPU kernels", kernels, Dt::Bf16, 530, false), ("every switch", every_switch, Dt::Bf16, 530, true)];

/// Sequence A (`prompt` tokens) with sequence B (9 tokens) beside it. After both prefills,
/// `steps` are run, each a list of A's tokens at A's next position (rolled back by `back`
/// positions first) beside one decode token of B. Returns each step's A rows, `[step][row]`.
fn run(m: &mut CudaModel, prompt: usize, steps: &[(usize, &[u32])]) -> Vec<Vec<Vec<f32>>> {
    let a_table: Vec<u32> = (0..prompt.div_ceil(BS) as u32 + 2).collect();
    let b_table: Vec<u32> = (90..92).collect();
    let (a, b) = (tokens(prompt, 1), tokens(9, 2));
    let prefill = ForwardBatch {
        seqs: vec![chunk(&a, 0, &a_table, LogitsSelect::Last), chunk(&b, 0, &b_table, LogitsSelect::Last)],
    };
    m.forward(&prefill).unwrap();
    let (mut pos, mut out) = (prompt, Vec::new());
    for (i, &(back, ids)) in steps.iter().enumerate() {
        pos -= back;
        let b_next = [(i * 5 + 1) as u32];
        let seqs =
            vec![chunk(&b_next, 9 + i, &b_table, LogitsSelect::Last), chunk(ids, pos, &a_table, LogitsSelect::All)];
        let logits = m.forward(&ForwardBatch { seqs }).unwrap().to_vec();
        assert_eq!(logits.len(), (1 + ids.len()) * VOCAB);
        out.push(logits[VOCAB..].chunks_exact(VOCAB).map(<[f32]>::to_vec).collect());
        pos += ids.len();
    }
    out
}

fn check(path: &Path, label: &str, cases: &[Case]) {
    let ckpt = lmplex_model::open(path, None).unwrap();
    let (next, drafts) = ([3u32, 8, 21, 40], [9u32, 17]);
    for &(exec, make, dt, prompt, graphs) in cases {
        let load = || {
            let mut m = CudaModel::load(make(), &ckpt, dt, sizing()).unwrap();
            m.set_graphs(graphs);
            m
        };
        let what = format!("{label} {exec} {dt:?}, {prompt}-token prompt, graphs {graphs}");
        // Plain decoding: one token a step.
        let one_by_one: Vec<(usize, &[u32])> = next.chunks(1).map(|t| (0, t)).collect();
        let plain: Vec<Vec<f32>> = run(&mut load(), prompt, &one_by_one).into_iter().flatten().collect();
        // One verification chunk of all four.
        let verified = run(&mut load(), prompt, &[(0, &next[..])]);
        assert_eq!(verified[0], plain, "{what}: a chunk of 4");
        // Two drafts rejected after next[0]: their K/V stays and is overwritten.
        let redo = [(0, &[next[0], drafts[0], drafts[1]][..]), (2, &next[1..])];
        let rows = run(&mut load(), prompt, &redo);
        assert_eq!(rows[0][0], plain[0], "{what}: the rejected chunk's first row");
        assert_eq!(rows[1], plain[1..], "{what}: the chunk over rejected K/V");
    }
}

#[test]
fn a_verification_chunk_gives_each_row_the_bits_of_plain_decoding() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_checkpoint(dir.path(), Family::Qwen3).unwrap();
    check(dir.path(), "qwen3", &[&SHORT[..], &LONG[..]].concat());
}

#[test]
fn a_quantized_gguf_verification_chunk_gives_each_row_the_bits_of_plain_decoding() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("q8_0.gguf");
    write_tiny_gguf(&gguf, Family::Llama, &|_| GgmlDType::Q8_0).unwrap();
    check(&gguf, "llama q8_0", &SHORT[2..]);
}
