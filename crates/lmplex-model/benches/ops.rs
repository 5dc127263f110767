//! Micro-benchmarks of the forward pass's operations besides matmuls, on the shapes of the
//! supported small models: paged attention for decode and prefill (`ops::paged_attention`
//! over a `KvCache`), and the sampler over a 151,936-token vocabulary (Qwen2.5's). The
//! quantized matmuls are benchmarked in lmplex-cpu (`benches/kernels.rs`).
//!
//! `cargo bench -p lmplex-model --bench ops` (set `RAYON_NUM_THREADS` to pin the thread
//! count; the figures in `lmplex bench` are end to end, these isolate one kernel).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use lmplex_core::SamplingParams;
use lmplex_model::args::RopeArgs;
use lmplex_model::attention::AttnOpts;
use lmplex_model::kv::{ForwardBatch, KvCache, KvDtype, LogitsSelect, SeqChunk};
use lmplex_model::ops::{paged_attention, AttnDims, RopeTable};
use lmplex_model::testing::seeded_values as values;
use lmplex_model::Sampler;

fn attention(c: &mut Criterion) {
    // Qwen2.5-0.5B: 14 query heads, 2 KV heads, head_dim 64.
    let d = AttnDims { num_heads: 14, num_kv_heads: 2, head_dim: 64 };
    let (qw, kw) = (d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim);
    let block = 16;
    let rope = RopeTable::new(&RopeArgs::plain(1e6), 64, 4096, None);
    let opts = AttnOpts::scaled(1.0 / 8.0);
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
                lora: None,
                embeds: None,
            }];
            let (mut q, mut k) = (values(len * qw, 5), values(len * kw, 6));
            paged_attention(&ForwardBatch { seqs }, &mut q, &mut k, &values(len * kw, 7), kv, 0, &rope, d, &opts)
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

criterion_group!(benches, attention, sampler);
criterion_main!(benches);
