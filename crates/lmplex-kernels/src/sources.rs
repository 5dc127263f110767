//! The kernel sources, embedded in the binary, and the functions each one defines.
//!
//! Invariant: `functions` lists every `extern "C" __global__` entry point of the source (the
//! NVRTC test checks each one is in the compiled CUBIN), and every source compiles on its own
//! after `PRELUDE`.

/// Types, conversions and reductions shared by every kernel.
pub const PRELUDE: &str = include_str!("../kernels/prelude.cuh");

/// Storage types a templated kernel is instantiated for, as suffixes of its function names.
pub const DTYPES: [&str; 3] = ["f32", "f16", "bf16"];

pub struct KernelSource {
    pub name: &'static str,
    code: &'static str,
    /// Function names before the dtype suffix; `typed == false` means the names are exact.
    stems: &'static [&'static str],
    typed: bool,
}

impl KernelSource {
    /// A source outside the backend's list (e.g. a test's altered copy of a kernel) whose entry
    /// points are exactly `functions`.
    pub fn custom(name: &'static str, code: &'static str, functions: &'static [&'static str]) -> Self {
        Self { name, code, stems: functions, typed: false }
    }

    /// The kernel's CUDA C, without the prelude.
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// The text NVRTC compiles: the prelude, then the kernel.
    pub fn full_source(&self) -> String {
        format!("{PRELUDE}\n#line 1 \"{}.cu\"\n{}", self.name, self.code)
    }

    /// Every entry point, e.g. `rope_f32`, `rope_f16`, `rope_bf16`.
    pub fn functions(&self) -> Vec<String> {
        if !self.typed {
            return self.stems.iter().map(|s| s.to_string()).collect();
        }
        self.stems.iter().flat_map(|s| DTYPES.iter().map(move |d| format!("{s}_{d}"))).collect()
    }
}

const fn typed(name: &'static str, code: &'static str, stems: &'static [&'static str]) -> KernelSource {
    KernelSource { name, code, stems, typed: true }
}

/// The tensor-core tile GEMM's entry points: `tgemm_<weights>_<dtype>` for dense or GGUF-block
/// weights and the 16-bit storage types only (the tensor cores take no f32 inputs), the same with
/// the fused path's norm prologue and residual epilogue (`tgemm_fused_<weights>_<dtype>`) and
/// with the SwiGLU activation fused (`tgemm_swiglu_<weights>_<dtype>`).
pub const TGEMM_FUNCTIONS: [&str; 54] = [
    "tgemm_dense_f16",
    "tgemm_q4_0_f16",
    "tgemm_q4_1_f16",
    "tgemm_q5_0_f16",
    "tgemm_q5_1_f16",
    "tgemm_q8_0_f16",
    "tgemm_q4_k_f16",
    "tgemm_q5_k_f16",
    "tgemm_q6_k_f16",
    "tgemm_dense_bf16",
    "tgemm_q4_0_bf16",
    "tgemm_q4_1_bf16",
    "tgemm_q5_0_bf16",
    "tgemm_q5_1_bf16",
    "tgemm_q8_0_bf16",
    "tgemm_q4_k_bf16",
    "tgemm_q5_k_bf16",
    "tgemm_q6_k_bf16",
    "tgemm_fused_dense_f16",
    "tgemm_fused_q4_0_f16",
    "tgemm_fused_q4_1_f16",
    "tgemm_fused_q5_0_f16",
    "tgemm_fused_q5_1_f16",
    "tgemm_fused_q8_0_f16",
    "tgemm_fused_q4_k_f16",
    "tgemm_fused_q5_k_f16",
    "tgemm_fused_q6_k_f16",
    "tgemm_fused_dense_bf16",
    "tgemm_fused_q4_0_bf16",
    "tgemm_fused_q4_1_bf16",
    "tgemm_fused_q5_0_bf16",
    "tgemm_fused_q5_1_bf16",
    "tgemm_fused_q8_0_bf16",
    "tgemm_fused_q4_k_bf16",
    "tgemm_fused_q5_k_bf16",
    "tgemm_fused_q6_k_bf16",
    "tgemm_swiglu_dense_f16",
    "tgemm_swiglu_q4_0_f16",
    "tgemm_swiglu_q4_1_f16",
    "tgemm_swiglu_q5_0_f16",
    "tgemm_swiglu_q5_1_f16",
    "tgemm_swiglu_q8_0_f16",
    "tgemm_swiglu_q4_k_f16",
    "tgemm_swiglu_q5_k_f16",
    "tgemm_swiglu_q6_k_f16",
    "tgemm_swiglu_dense_bf16",
    "tgemm_swiglu_q4_0_bf16",
    "tgemm_swiglu_q4_1_bf16",
    "tgemm_swiglu_q5_0_bf16",
    "tgemm_swiglu_q5_1_bf16",
    "tgemm_swiglu_q8_0_bf16",
    "tgemm_swiglu_q4_k_bf16",
    "tgemm_swiglu_q5_k_bf16",
    "tgemm_swiglu_q6_k_bf16",
];

/// Paged attention's entry points: its passes for every storage type, and the tensor-core first
/// pass (`paged_attention_tc`, `_tc_one`) for the 16-bit ones only.
pub const PAGED_ATTENTION_FUNCTIONS: [&str; 19] = [
    "paged_attention_partition_f32",
    "paged_attention_partition_f16",
    "paged_attention_partition_bf16",
    "paged_attention_tiles_f32",
    "paged_attention_tiles_f16",
    "paged_attention_tiles_bf16",
    "paged_attention_partition_one_f32",
    "paged_attention_partition_one_f16",
    "paged_attention_partition_one_bf16",
    "paged_attention_tiles_one_f32",
    "paged_attention_tiles_one_f16",
    "paged_attention_tiles_one_bf16",
    "paged_attention_reduce_f32",
    "paged_attention_reduce_f16",
    "paged_attention_reduce_bf16",
    "paged_attention_tc_f16",
    "paged_attention_tc_bf16",
    "paged_attention_tc_one_f16",
    "paged_attention_tc_one_bf16",
];

/// Every kernel of the backend.
pub fn all() -> Vec<KernelSource> {
    vec![
        typed("embedding", include_str!("../kernels/embedding.cu"), &["embedding"]),
        typed("rmsnorm", include_str!("../kernels/rmsnorm.cu"), &["fused_add_rmsnorm"]),
        typed("rope", include_str!("../kernels/rope.cu"), &["rope", "rope_and_cache"]),
        typed("swiglu", include_str!("../kernels/swiglu.cu"), &["silu_and_mul"]),
        typed("rowwise", include_str!("../kernels/rowwise.cu"), &["add_bias", "rmsnorm_heads"]),
        typed("kv_write", include_str!("../kernels/kv_write.cu"), &["reshape_and_cache"]),
        typed("lora", include_str!("../kernels/lora.cu"), &["lora_shrink", "lora_expand"]),
        KernelSource {
            name: "paged_attention",
            code: include_str!("../kernels/paged_attention.cu"),
            stems: &PAGED_ATTENTION_FUNCTIONS,
            typed: false,
        },
        typed(
            "qgemv",
            concat!(include_str!("../kernels/qformats.cuh"), include_str!("../kernels/qgemv.cu")),
            &[
                "qgemv_q4_0",
                "qgemv_q4_1",
                "qgemv_q5_0",
                "qgemv_q5_1",
                "qgemv_q8_0",
                "qgemv_q4_k",
                "qgemv_q5_k",
                "qgemv_q6_k",
                "qembedding_q4_0",
                "qembedding_q4_1",
                "qembedding_q5_0",
                "qembedding_q5_1",
                "qembedding_q8_0",
                "qembedding_q4_k",
                "qembedding_q5_k",
                "qembedding_q6_k",
            ],
        ),
        KernelSource {
            name: "tgemm",
            code: concat!(include_str!("../kernels/qformats.cuh"), include_str!("../kernels/tgemm.cu")),
            stems: &TGEMM_FUNCTIONS,
            typed: false,
        },
        KernelSource {
            name: "argmax",
            code: include_str!("../kernels/argmax.cu"),
            stems: &["argmax_f32"],
            typed: false,
        },
        KernelSource {
            name: "sampling",
            code: include_str!("../kernels/sampling.cu"),
            stems: &["sample_f32", "logit_edits_f32"],
            typed: false,
        },
    ]
}
