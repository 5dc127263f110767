//! The typed reports the engine and host hand out: `ModelInfo` (what was loaded),
//! `MemoryReport` (one model's bytes by category) and `HostMemory` (a host's budget and its
//! models, keyed so that no model name can collide with a host figure).
//!
//! Invariant: one name per figure everywhere (Rust fields, the dicts Python and the server get
//! through serde, the docs); a report is a snapshot, never a live view.

use lmplex_model::CheckpointInfo;
use serde::Serialize;
use std::collections::BTreeMap;

/// What was loaded and how it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelInfo {
    /// What the checkpoint says of itself: format, quantization, name.
    #[serde(flatten)]
    pub checkpoint: CheckpointInfo,
    /// The architecture family (`llama`, `qwen2`, `qwen3`, `phi3`).
    pub architecture: &'static str,
    /// Parameters, embeddings included.
    pub num_parameters: usize,
    /// Transformer layers.
    pub num_hidden_layers: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of a dense layer's MLP (`gate_proj`/`up_proj` outputs).
    pub intermediate_size: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads.
    pub num_key_value_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// The checkpoint's trained context.
    pub context_length: usize,
    /// The most tokens one request may hold here.
    pub max_model_len: usize,
    /// Whether chat messages can be rendered.
    pub has_chat_template: bool,
    /// Tokens per KV block.
    pub kv_block_size: usize,
    /// Blocks in the KV pool.
    pub kv_num_blocks: usize,
    /// Blocks in the swap space (host memory for preempted requests).
    pub kv_swap_num_blocks: usize,
    /// How it runs: device, dtypes, bytes a decode step reads.
    #[serde(flatten)]
    pub runtime: RuntimeInfo,
}

/// How a loaded model runs (the backend's part of `ModelInfo`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuntimeInfo {
    /// `cpu` or `cuda`.
    pub device: &'static str,
    /// The activations' dtype.
    pub compute_dtype: &'static str,
    /// The KV cache's element type.
    pub kv_dtype: &'static str,
    /// Weight bytes one decode step reads (all but an embedding table that is not the head).
    pub decode_weight_bytes: usize,
    /// The GPU's name (CUDA only).
    pub gpu_name: Option<String>,
    /// The GPU's architecture, `sm_90` (CUDA only).
    pub cuda_arch: Option<String>,
}

/// One model's bytes by category.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct MemoryReport {
    /// The weights as held (quantized ones at their quantized size).
    pub weights: usize,
    /// Of `weights`, the routed experts of Mixture-of-Experts layers (0 for dense models).
    pub expert_weights: usize,
    /// The KV pool, reserved at load: `kv_cache_used + kv_cache_cached + kv_cache_free`.
    pub kv_cache: usize,
    /// Blocks held by requests.
    pub kv_cache_used: usize,
    /// Free blocks still holding reusable prefixes.
    pub kv_cache_cached: usize,
    /// Free blocks holding nothing.
    pub kv_cache_free: usize,
    /// The swap space (host memory, committed as it is used).
    pub kv_swap: usize,
    /// Swap blocks held by swapped-out requests.
    pub kv_swap_used: usize,
    /// The CUDA backend's step buffers (0 on the CPU).
    pub workspace: usize,
    /// Captured CUDA graphs, by the driver's count (0 on the CPU and before any capture).
    pub graphs: usize,
    /// Everything else the model holds (rope tables; a draft model's weights and KV pool; a
    /// vision tower's weights).
    pub other: usize,
    /// The LoRA adapters held in memory now: the `max_loras` most recently used, and any more
    /// that queued requests hold.
    pub lora_adapters: usize,
    /// `weights + kv_cache + kv_swap + workspace + graphs + other + lora_adapters`.
    pub total: usize,
    /// The whole device's bytes in use now, every process included (CUDA only).
    pub device_used: Option<usize>,
    /// The device's bytes (CUDA only).
    pub device_total: Option<usize>,
}

/// One CUDA device's budget in a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct DeviceBudget {
    /// Bytes the device's models may reserve together.
    pub budget: usize,
    /// Bytes reserved by its loading and ready models.
    pub reserved: usize,
    /// `budget - reserved`.
    pub free: usize,
    /// What the CUDA context and the kernels took when the device was opened, by the driver's
    /// own count (NVML, before and after); `None` before a model opens it or without NVML.
    /// The budget set `CUDA_CONTEXT_BYTES` aside for it.
    pub context: Option<usize>,
}

/// A host's budgets and the memory of each loaded model.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct HostMemory {
    /// Bytes the CPU's models may reserve together (host memory).
    pub budget: usize,
    /// Bytes reserved by the CPU's loading and ready models.
    pub reserved: usize,
    /// `budget - reserved`.
    pub free: usize,
    /// Each CUDA device's budget, by `cuda:N`, for the devices models were planned on.
    pub cuda: BTreeMap<String, DeviceBudget>,
    /// Models unloaded after their keep-alive (they reserve nothing until reloaded).
    pub idle_models: usize,
    /// Each loaded model's report, by served name.
    pub models: BTreeMap<String, MemoryReport>,
}
