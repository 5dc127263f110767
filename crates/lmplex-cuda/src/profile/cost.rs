//! A step's modeled time on an H100: each launch takes `max(bytes / bandwidth, flops / peak)`
//! plus a fixed cost of its kind, summed in issue order (one stream, no overlap).
//!
//! Calibration: the one device profile of a Llama-3.2-1B bf16 batch-1 decode step
//! (docs/performance.md, `benches/gpu_profile.py` on an H100 80GB HBM3, 48 tokens, CUDA graphs):
//! 2.19 ms of kernels, of which the cuBLAS GEMMs took 1.11 ms, attention 0.53 ms, the norms
//! 0.20 ms, SwiGLU 0.16 ms and the rest (RoPE, KV write, embedding, argmax) 0.19 ms. The profile
//! gave times per kind, not launch counts: the counts below (65 GEMMs, 32 attention launches, 33
//! norms, 16 SwiGLU, 34 others) are those the forward pass of that version issued for the step,
//! 16 layers of 4 GEMMs, two attention passes, two norms, SwiGLU, RoPE and the KV write, plus the
//! embedding, the final norm, the head and the argmax. A kind's fixed cost is its time less its
//! bytes at the measured device-copy bandwidth (3.0 TB/s), per launch: the GEMMs read the 2.47 GB
//! of weights; the others move under 1% of their time's worth of bytes, so their cost is their
//! time per launch.

use crate::counting::LaunchRecord;

/// Bytes per second of a device-to-device copy on the profiled H100.
pub const BANDWIDTH: f64 = 3.0e12;
/// Dense bf16 products per second on the tensor cores (H100 SXM).
pub const TENSOR_PEAK: f64 = 989e12;
/// f32 products per second on the CUDA cores (H100 SXM).
pub const CUDA_CORE_PEAK: f64 = 67e12;

/// The profile's kinds: (name, milliseconds, launches, bytes moved).
pub const PROFILE: [(&str, f64, usize, f64); 5] = [
    ("gemm", 1.11, 65, 2.47e9),
    ("attention", 0.53, 32, 0.0),
    ("norm", 0.20, 33, 0.0),
    ("swiglu", 0.16, 16, 0.0),
    ("other", 0.19, 34, 0.0),
];

/// The kind of a launch, by its kernel's name.
pub fn kind(name: &str) -> &'static str {
    if name.starts_with("cublas_gemm") || name.starts_with("qgemv") || name.starts_with("tgemm") {
        "gemm"
    } else if name.starts_with("paged_attention") {
        "attention"
    } else if name.starts_with("fused_add_rmsnorm") || name.starts_with("rmsnorm_heads") {
        "norm"
    } else if name.starts_with("silu_and_mul") {
        "swiglu"
    } else {
        "other"
    }
}

/// A kind's fixed cost per launch, in seconds (the module header).
pub fn launch_cost(kind: &str) -> f64 {
    let (_, ms, n, bytes) = PROFILE.iter().find(|p| p.0 == kind).copied().unwrap_or(PROFILE[4]);
    (ms * 1e-3 - bytes / BANDWIDTH).max(0.0) / n as f64
}

/// The modeled seconds of `launches`, in issue order.
pub fn seconds(launches: &[LaunchRecord]) -> f64 {
    launches
        .iter()
        .map(|l| {
            let peak = if l.traffic.tensor_cores { TENSOR_PEAK } else { CUDA_CORE_PEAK };
            let work = (l.traffic.bytes as f64 / BANDWIDTH).max(l.traffic.flops as f64 / peak);
            work + launch_cost(kind(&l.name))
        })
        .sum()
}
