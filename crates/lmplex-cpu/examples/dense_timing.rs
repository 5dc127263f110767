//! Times the dense kernels (`DenseWeight::matmul_prompt`, `matmul`) on SmolLM2-135M's and Qwen2.5-0.5B's
//! projection shapes: prompt rows (GFLOP/s) and one decode row (weight GB/s, from memory: the
//! shapes' weights are cycled through copies that together exceed the last-level cache).
//! `cargo run --release -p lmplex-cpu --example dense_timing -- [f32|bf16|bf16a|f16] [ROWS] [SECONDS]`
//! (`bf16a`: bf16 weights with prompt activations rounded to bf16, `dtype="bfloat16"`)
//!
//! Prints, per shape, the fastest of the timed calls for prompt rows and the mean for decode,
//! and the prompt figure as a share of this CPU's peak, measured first on every thread at once
//! (the fastest round, as for the shapes): independent `vdpbf16ps` for `bf16a` (the `vdpbf16ps`
//! kernel), independent 512-bit FMAs for the others (the FMA chain). A gate_up shape also times
//! its gated product (`matmul_prompt_gated`, SiLU applied as the sums are stored).

use half::{bf16, f16};
use lmplex_cpu::dense::{Activations, DenseWeight};
use lmplex_cpu::rowops::Activation;
use lmplex_cpu::testing::seeded_values as values;
use std::hint::black_box;
use std::time::Instant;

/// (name, n, k): SmolLM2-135M's fused q/k/v, gate_up and down; Qwen2.5-0.5B's gate_up, down.
const SHAPES: [(&str, usize, usize); 5] = [
    ("smol qkv", 960, 576),
    ("smol gate_up", 3072, 576),
    ("smol down", 576, 1536),
    ("qwen gate_up", 9728, 896),
    ("qwen down", 896, 4864),
];

fn make(dtype: &str, n: usize, k: usize, seed: u64) -> DenseWeight {
    let w = values(n * k, seed);
    match dtype {
        "f32" => DenseWeight::new(n, k, w),
        "bf16" | "bf16a" => {
            let act = if dtype == "bf16a" { Activations::Bf16 } else { Activations::Split };
            let bits: Vec<u16> = w.iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
            DenseWeight::from_bf16(n, k, &bits).with_activations(act)
        }
        "f16" => DenseWeight::from_f16(n, k, &w.iter().map(|&v| f16::from_f32(v).to_bits()).collect::<Vec<_>>()),
        other => panic!("unknown dtype {other} (f32, bf16, bf16a, f16)"),
    }
}

/// Independent accumulators per thread: more than the units' latency times their throughput.
const CHAINS: usize = 12;

/// GFLOP/s of every thread running `CHAINS` independent 512-bit `vdpbf16ps` (`bf16`: 64 flops
/// each) or `vfmadd231ps` (32) for `secs`; `None` off AVX-512 (or its BF16 extension).
fn peak_gflops(bf16: bool, secs: f64) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        let feature = if bf16 { is_x86_feature_detected!("avx512bf16") } else { is_x86_feature_detected!("avx512f") };
        if !feature {
            return None;
        }
        #[target_feature(enable = "avx512f,avx512bf16")]
        unsafe fn run(bf16: bool, iters: usize) -> f32 {
            let mut acc: [__m512; CHAINS] = std::array::from_fn(|i| _mm512_set1_ps(i as f32));
            let (a, b) = (black_box(_mm512_set1_ps(1.0)), black_box(_mm512_set1_ps(0.5)));
            let (ab, bb) = (_mm512_cvtne2ps_pbh(a, a), _mm512_cvtne2ps_pbh(b, b));
            for _ in 0..iters {
                for c in acc.iter_mut() {
                    *c = if bf16 { _mm512_dpbf16_ps(*c, ab, bb) } else { _mm512_fmadd_ps(*c, a, b) };
                }
            }
            acc.iter().map(|&c| _mm512_reduce_add_ps(c)).sum()
        }
        let iters = 1 << 18;
        let flops = (iters * CHAINS * if bf16 { 64 } else { 32 }) as f64;
        // SAFETY: the features were detected above.
        let best = fastest(secs, || black_box(rayon::broadcast(|_| unsafe { run(bf16, iters) })));
        Some(flops * rayon::current_num_threads() as f64 / best / 1e9)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (bf16, secs);
        None
    }
}

/// The fastest of the calls of `f` made in `secs` seconds (at least one), in seconds.
fn fastest<T>(secs: f64, mut f: impl FnMut() -> T) -> f64 {
    let (start, mut best) = (Instant::now(), f64::INFINITY);
    while best.is_infinite() || start.elapsed().as_secs_f64() < secs {
        let t = Instant::now();
        black_box(f());
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dtype = args.first().map_or("bf16", String::as_str);
    let rows: usize = args.get(1).map_or(512, |s| s.parse().expect("ROWS must be a number"));
    let secs: f64 = args.get(2).map_or(2.0, |s| s.parse().expect("SECONDS must be a number"));
    println!("dense {dtype}, {rows} prompt rows, {} threads", rayon::current_num_threads());
    let peak = peak_gflops(dtype == "bf16a", 1.0);
    let unit = if dtype == "bf16a" { "vdpbf16ps" } else { "FMA" };
    if let Some(p) = peak {
        println!("peak, independent 512-bit {unit} on every thread: {p:.1} GFLOP/s");
    }
    for (name, n, k) in SHAPES {
        let w = make(dtype, n, k, 1);
        let x = values(rows * k, 2);
        let rate = |best: f64| {
            let gflops = 2.0 * (rows * n * k) as f64 / best / 1e9;
            let share = peak.map_or(String::new(), |p| format!(" ({:.0}% of peak)", 100.0 * gflops / p));
            format!("prompt {gflops:7.1} GFLOP/s{share}")
        };
        let prompt = rate(fastest(secs / 2.0, || w.matmul_prompt(black_box(&x), rows)));
        // Decode: enough copies to exceed 300 MB, taken in turn.
        let copies = (300 << 20) / w.size_in_bytes() + 1;
        let ws: Vec<DenseWeight> = (0..copies).map(|c| make(dtype, n, k, 10 + c as u64)).collect();
        let x1 = values(k, 3);
        let (mut calls, start) = (0usize, Instant::now());
        while start.elapsed().as_secs_f64() < secs / 2.0 {
            black_box(ws[calls % copies].matmul(black_box(&x1), 1));
            calls += 1;
        }
        let gbps = (calls * w.size_in_bytes()) as f64 / start.elapsed().as_secs_f64() / 1e9;
        println!("{name:>13} [{n:>5}, {k:>5}]: {prompt}, decode {gbps:5.1} GB/s");
        // A gated MLP's gate_up: the product with SiLU applied as the kernel stores its sums.
        if let Some(gated) = name.ends_with("gate_up").then(|| w.interleave_halves()).flatten() {
            let prompt = rate(fastest(secs / 2.0, || gated.matmul_prompt_gated(black_box(&x), rows, Activation::Silu)));
            println!("{:>13} [{n:>5}, {k:>5}]: {prompt}, SiLU applied", "gated");
        }
    }
}
