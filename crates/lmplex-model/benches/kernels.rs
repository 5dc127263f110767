//! Micro-benchmarks of the CPU kernels on the shapes of the supported small models:
//! quantized matmuls per GGUF format (throughput in weight bytes per second, the decode
//! roofline's unit), paged attention for decode and prefill, and the sampler over a
//! 151,936-token vocabulary (Qwen2.5's).
//!
//! `cargo bench -p lmplex-model --bench kernels` (set `RAYON_NUM_THREADS` to pin the thread
//! count; the figures in `lmplex bench` are end to end, these isolate one kernel).

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use lmplex_core::SamplingParams;
use lmplex_model::args::RopeArgs;
use lmplex_model::kv::{ForwardBatch, KvCache, KvDtype, LogitsSelect, SeqChunk};
use lmplex_model::ops::{paged_attention, AttnDims, RopeTable};
use lmplex_model::qmatmul::QWeight;
use lmplex_model::testing::seeded_values as values;
use lmplex_model::Sampler;

fn qmatmul(c: &mut Criterion) {
    // Qwen2.5-0.5B's MLP up projection: 4864 x 896.
    let (n, k) = (4864, 896);
    let w = Tensor::from_vec(values(n * k, 1), (n, k), &Device::Cpu).unwrap();
    let mut g = c.benchmark_group("qmatmul_4864x896");
    g.sample_size(20);
    for dt in [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q5_0, GgmlDType::Q8_0] {
        let qw = QWeight::from_qtensor(&QTensor::quantize(&w, dt).unwrap()).unwrap();
        for m in [1usize, 8, 16] {
            let x = values(m * k, 2);
            g.throughput(Throughput::Bytes(qw.size_in_bytes() as u64));
            g.bench_with_input(BenchmarkId::new(format!("{dt:?}"), m), &m, |b, &m| b.iter(|| qw.matmul(&x, m)));
        }
    }
    g.finish();
    // SmolLM2-135M's MLP gate/up: 1536 x 576, rows of 18 units (a group of 16 and a tail of 2).
    let (n, k) = (1536, 576);
    let w = Tensor::from_vec(values(n * k, 7), (n, k), &Device::Cpu).unwrap();
    let mut g = c.benchmark_group("qmatmul_1536x576");
    g.sample_size(20);
    for dt in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
        let qw = QWeight::from_qtensor(&QTensor::quantize(&w, dt).unwrap()).unwrap();
        for m in [1usize, 8] {
            let x = values(m * k, 8);
            g.throughput(Throughput::Bytes(qw.size_in_bytes() as u64));
            g.bench_with_input(BenchmarkId::new(format!("{dt:?}"), m), &m, |b, &m| b.iter(|| qw.matmul(&x, m)));
        }
    }
    g.finish();
    let mut g = c.benchmark_group("qmatmul_4864x896");
    // Q4_K needs rows of 256-multiples: SmolLM2/Llama-like 1536 x 1024.
    let (n, k) = (1536, 1024);
    let w = Tensor::from_vec(values(n * k, 3), (n, k), &Device::Cpu).unwrap();
    for dt in [GgmlDType::Q4K, GgmlDType::Q5K, GgmlDType::Q6K] {
        let qw = QWeight::from_qtensor(&QTensor::quantize(&w, dt).unwrap()).unwrap();
        let x = values(k, 4);
        g.throughput(Throughput::Bytes(qw.size_in_bytes() as u64));
        g.bench_function(BenchmarkId::new(format!("{dt:?}_1536x1024"), 1), |b| b.iter(|| qw.matmul(&x, 1)));
    }
    g.finish();
    // The same kernels on a matrix that stays in L2 (256 x 1024): compute cost without DRAM.
    let (n, k) = (256, 1024);
    let w = Tensor::from_vec(values(n * k, 5), (n, k), &Device::Cpu).unwrap();
    let mut g = c.benchmark_group("qmatmul_l2_256x1024");
    for dt in [GgmlDType::Q4_1, GgmlDType::Q5_0, GgmlDType::Q8_0, GgmlDType::Q4K, GgmlDType::Q6K] {
        let qw = QWeight::from_qtensor(&QTensor::quantize(&w, dt).unwrap()).unwrap();
        for m in [1usize, 16, 64] {
            let x = values(m * k, 6);
            g.throughput(Throughput::Bytes(qw.size_in_bytes() as u64));
            g.bench_with_input(BenchmarkId::new(format!("{dt:?}"), m), &m, |b, &m| b.iter(|| qw.matmul(&x, m)));
            let prompt = format!("{dt:?}_prompt");
            g.bench_with_input(BenchmarkId::new(prompt, m), &m, |b, &m| b.iter(|| qw.matmul_prompt(&x, m)));
        }
    }
    g.finish();
}

fn attention(c: &mut Criterion) {
    // Qwen2.5-0.5B: 14 query heads, 2 KV heads, head_dim 64.
    let d = AttnDims { num_heads: 14, num_kv_heads: 2, head_dim: 64 };
    let (qw, kw) = (d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim);
    let block = 16;
    let rope = RopeTable::new(&RopeArgs { theta: 1e6, llama3: None, interleaved: false }, 64, 4096, None);
    let mut g = c.benchmark_group("paged_attention");
    g.sample_size(10);
    let cases =
        [(512usize, 1usize, KvDtype::F32), (2048, 1, KvDtype::F32), (2048, 1, KvDtype::F16), (512, 512, KvDtype::F32)];
    for (ctx, new, dtype) in cases {
        let blocks = ctx.div_ceil(block);
        let mut kv = KvCache::with_dtype(1, blocks, block, d.num_kv_heads, d.head_dim, dtype).unwrap();
        let table: Vec<u32> = (0..blocks as u32).rev().collect();
        // Fill the context once (a prefill of ctx tokens), then time `new` tokens at the end.
        let fill = |kv: &mut KvCache, start: usize, len: usize| {
            let ids = vec![0u32; len];
            let seqs = vec![SeqChunk {
                token_ids: &ids,
                start_pos: start,
                block_table: &table,
                logits: LogitsSelect::Last,
                num_prompt_tokens: usize::MAX,
            }];
            let (mut q, mut k) = (values(len * qw, 5), values(len * kw, 6));
            paged_attention(&ForwardBatch { seqs }, &mut q, &mut k, &values(len * kw, 7), kv, 0, &rope, d)
        };
        fill(&mut kv, 0, ctx - new);
        g.throughput(Throughput::Elements(new as u64));
        let name = if dtype == KvDtype::F32 { format!("ctx{ctx}") } else { format!("ctx{ctx}-{}", dtype.name()) };
        g.bench_function(BenchmarkId::new(name, new), |b| b.iter(|| fill(&mut kv, ctx - new, new)));
    }
    g.finish();
}

fn sampler(c: &mut Criterion) {
    let logits: Vec<f32> = values(151_936, 8).iter().map(|v| v * 8.0).collect();
    let prompt: Vec<u32> = (0..512).collect();
    let mut g = c.benchmark_group("sampler_vocab151936");
    let cases = [
        ("greedy", SamplingParams { temperature: 0.0, ..Default::default() }),
        ("temp0.8_top_p0.95", SamplingParams { temperature: 0.8, top_p: 0.95, seed: Some(1), ..Default::default() }),
        ("temp0.8_top_k50", SamplingParams { temperature: 0.8, top_k: 50, seed: Some(1), ..Default::default() }),
        (
            "penalties_logprobs5",
            SamplingParams {
                temperature: 0.8,
                repetition_penalty: 1.1,
                presence_penalty: 0.5,
                logprobs: Some(5),
                seed: Some(1),
                ..Default::default()
            },
        ),
    ];
    for (name, params) in cases {
        let mut s = Sampler::new(params, &prompt);
        g.bench_function(name, |b| b.iter(|| s.sample(&logits)));
    }
    g.finish();
}

criterion_group!(benches, qmatmul, attention, sampler);
criterion_main!(benches);
