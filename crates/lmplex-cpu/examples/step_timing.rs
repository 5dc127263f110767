//! Times the matrix products of whole decode steps streamed from memory: the synthetic
//! Mixtral-shaped model of `benches/moe_gguf.py` (8 layers of Q4_0 q, k, v, o and two of
//! eight experts' gate_up and down picked at random per layer, then a 49,152-row head),
//! 118 MB of weights per step and 330 MB in all, so nothing stays in the last-level cache.
//! `cargo run --release -p lmplex-cpu --example step_timing -- [SECONDS] [all|attn|gate_up|down]`
//!
//! Prints steps/s and weight GB/s (default: `all` for 3 seconds). `qmatmul_timing --cold`
//! times one shape at a time and keeps the fastest call; this keeps every call of a real
//! sequence, the figure a decode step sees. The weights are seeded pseudo-random values
//! quantized by candle, so every build times the same bytes.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use lmplex_cpu::qmatmul::QWeight;
use lmplex_cpu::testing::seeded_values as values;
use std::hint::black_box;
use std::time::Instant;

const LAYERS: usize = 8;
const EXPERTS: usize = 8;
const TOP_K: usize = 2;
const HIDDEN: usize = 1024;
const EXPERT_WIDTH: usize = 2816;

fn q4_0(n: usize, k: usize, seed: u64) -> QWeight {
    let w = Tensor::from_vec(values(n * k, seed), (n, k), &Device::Cpu).expect("weights");
    QWeight::from_qtensor(&QTensor::quantize(&w, GgmlDType::Q4_0).expect("quantize")).expect("pack")
}

struct Layer {
    attn: [QWeight; 4],
    /// (gate_up, down) per expert.
    experts: Vec<(QWeight, QWeight)>,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let secs: f64 = args.first().map_or(3.0, |s| s.parse().expect("SECONDS must be a number"));
    let part = args.get(1).map_or("all", String::as_str);
    assert!(["all", "attn", "gate_up", "down"].contains(&part), "unknown part {part}");
    let layers: Vec<Layer> = (0..LAYERS as u64)
        .map(|l| {
            let s = 100 * l;
            Layer {
                attn: [
                    q4_0(HIDDEN, HIDDEN, s),
                    q4_0(256, HIDDEN, s + 1),
                    q4_0(256, HIDDEN, s + 2),
                    q4_0(HIDDEN, HIDDEN, s + 3),
                ],
                experts: (0..EXPERTS as u64)
                    .map(|e| (q4_0(2 * EXPERT_WIDTH, HIDDEN, s + 10 + e), q4_0(HIDDEN, EXPERT_WIDTH, s + 50 + e)))
                    .collect(),
            }
        })
        .collect();
    let head = q4_0(49152, HIDDEN, 9999);
    let (x, xi) = (values(HIDDEN, 1), values(EXPERT_WIDTH, 2));
    let mut bytes = 0usize;
    let mut run = |w: &QWeight, x: &[f32]| {
        black_box(w.matmul(x, 1));
        bytes += w.size_in_bytes();
    };
    let (mut steps, mut rng) = (0usize, 12345u64);
    let t0 = Instant::now();
    while t0.elapsed().as_secs_f64() < secs {
        for layer in &layers {
            if matches!(part, "all" | "attn") {
                layer.attn.iter().for_each(|w| run(w, &x));
            }
            for _ in 0..TOP_K {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let (gate_up, down) = &layer.experts[(rng >> 33) as usize % EXPERTS];
                if matches!(part, "all" | "gate_up") {
                    run(gate_up, &x);
                }
                if matches!(part, "all" | "down") {
                    run(down, &xi);
                }
            }
        }
        if part == "all" {
            run(&head, &x);
        }
        steps += 1;
    }
    let dt = t0.elapsed().as_secs_f64();
    println!("{:.1} steps/s, {:.1} GB/s", steps as f64 / dt, bytes as f64 / dt / 1e9);
}
