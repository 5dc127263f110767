//! Micro-benchmarks of the CPU kernels on the shapes of the supported small models:
//! quantized matmuls per GGUF format (throughput in weight bytes per second, the decode
//! roofline's unit). Paged attention and the sampler are benchmarked in lmplex-model
//! (`benches/ops.rs`), which owns the KV cache and the sampler.
//!
//! `cargo bench -p lmplex-cpu --bench kernels` (set `RAYON_NUM_THREADS` to pin the thread
//! count; the figures in `lmplex bench` are end to end, these isolate one kernel).

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use lmplex_cpu::qmatmul::QWeight;
use lmplex_cpu::testing::seeded_values as values;

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

criterion_group!(benches, qmatmul);
criterion_main!(benches);
