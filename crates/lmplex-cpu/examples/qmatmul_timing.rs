//! Times the decode kernel (`QWeight::matmul`) on the benchmark models' matrix shapes, for
//! `benches/kernel_ab.sh`, which runs two builds of it in alternation.
//! `cargo run --release -p lmplex-cpu --example qmatmul_timing -- [ROWS] [SECONDS] [--cold] [--gbps]`
//!
//! Prints one line: for each shape of `SHAPES`, the fastest of the calls made in `SECONDS`
//! (default 0.3) on `ROWS` input rows (default 8), in microseconds. The minimum, not a mean:
//! this machine's speed moves by 10-20% between phases, and the fastest call is the one a
//! phase disturbed least. `--cold` cycles through copies of each matrix (64 MiB of them), so
//! that each call streams its weights from memory. `--shapes` prints the shapes' names
//! instead. The weights are seeded pseudo-random values quantized by candle, so every build
//! times the same bytes. `--gbps` prints weight bytes per second (GB/s) instead of times.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use lmplex_cpu::qmatmul::QWeight;
use lmplex_cpu::testing::seeded_values as values;
use std::time::Instant;

/// (weight rows, row length, format, name): SmolLM2-135M's Q4_1/Q8_0 gate_up and down, and
/// Qwen2.5-0.5B Q4_K_M's gate_up (Q5_0), down (Q6_K), head (Q8_0, a slice of its 151,936 rows)
/// a K-quant row length, and the synthetic MoE's (`benches/moe_gguf.py`) expert gate_up and
/// down (Q4_0; the down's 2,816-value rows are a long-row case).
const SHAPES: [(usize, usize, GgmlDType, &str); 9] = [
    (3072, 576, GgmlDType::Q4_1, "smollm2.gate_up.q4_1"),
    (576, 1536, GgmlDType::Q4_1, "smollm2.down.q4_1"),
    (3072, 576, GgmlDType::Q8_0, "smollm2.gate_up.q8_0"),
    (9728, 896, GgmlDType::Q5_0, "qwen.gate_up.q5_0"),
    (896, 4864, GgmlDType::Q6K, "qwen.down.q6_k"),
    (8192, 896, GgmlDType::Q8_0, "qwen.head.q8_0"),
    (4864, 1024, GgmlDType::Q4K, "k1024.q4_k"),
    (5632, 1024, GgmlDType::Q4_0, "moe.gate_up.q4_0"),
    (1024, 2816, GgmlDType::Q4_0, "moe.down.q4_0"),
];

/// Weight bytes cycled through with `--cold`: twice this machine's 32 MiB last-level cache.
const COLD_BYTES: usize = 64 << 20;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "--shapes") {
        println!("{}", SHAPES.map(|s| s.3).join(" "));
        return;
    }
    let cold = args.iter().any(|a| a == "--cold");
    let gbps = args.iter().any(|a| a == "--gbps");
    let args: Vec<String> = args.into_iter().filter(|a| a != "--cold" && a != "--gbps").collect();
    let rows: usize = args.first().map_or(8, |s| s.parse().expect("ROWS must be a number"));
    let secs: f64 = args.get(1).map_or(0.3, |s| s.parse().expect("SECONDS must be a number"));
    let mut line = Vec::new();
    for (n, k, dtype, _) in SHAPES {
        let w = Tensor::from_vec(values(n * k, 1), (n, k), &Device::Cpu).expect("weights");
        let q = QTensor::quantize(&w, dtype).expect("quantize");
        let qw = QWeight::from_qtensor(&q).expect("pack");
        // Copies enough to overflow the last-level cache when --cold: each call then streams
        // its weights from memory, as decode does.
        let copies = if cold { (COLD_BYTES / qw.size_in_bytes()).max(2) } else { 1 };
        let qws: Vec<QWeight> = (0..copies).map(|_| QWeight::from_qtensor(&q).expect("pack")).collect();
        let x = values(rows * k, 2);
        let mut best = f64::MAX;
        let t0 = Instant::now();
        for qw in qws.iter().cycle() {
            if t0.elapsed().as_secs_f64() >= secs {
                break;
            }
            let t = Instant::now();
            std::hint::black_box(qw.matmul(&x, rows));
            best = best.min(t.elapsed().as_secs_f64());
        }
        if gbps {
            line.push(format!("{:.1}", qw.size_in_bytes() as f64 / best / 1e9));
        } else {
            line.push(format!("{:.1}", best * 1e6));
        }
    }
    println!("{}", line.join(" "));
}
