//! Model configuration as the user gives it (`ModelConfig`), before any checkpoint is read.
//!
//! Invariant: a `ModelConfig` that passed `validate()` has positive limits and a known dtype and
//! device; fields the checkpoint decides (`max_model_len` when `None`) are resolved at load time.

use crate::{Error, Result};

/// Activation / dense-weight dtype requested for the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// Let the backend choose (f32 on CPU).
    Auto,
    F32,
    F16,
    BF16,
}

impl DType {
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "f32" | "float32" => Ok(Self::F32),
            "f16" | "float16" | "half" => Ok(Self::F16),
            "bf16" | "bfloat16" => Ok(Self::BF16),
            other => Err(Error::invalid(format!(
                "unknown dtype '{other}': expected one of auto, float32, float16, bfloat16"
            ))),
        }
    }
}

/// Element type of the CPU backend's KV cache (vLLM's `kv_cache_dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvCacheDtype {
    /// float32 for a checkpoint whose weights are all float32, else float16 (a 16-bit or
    /// quantized checkpoint; llama.cpp's default). On CUDA the cache takes the compute dtype.
    Auto,
    F32,
    F16,
}

impl KvCacheDtype {
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "f32" | "float32" => Ok(Self::F32),
            "f16" | "float16" | "half" => Ok(Self::F16),
            other => {
                Err(Error::invalid(format!("unknown kv_cache_dtype '{other}': expected one of auto, float32, float16")))
            }
        }
    }
}

/// Device requested for the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// CUDA when present, else CPU.
    Auto,
    Cpu,
    Cuda,
}

impl DeviceKind {
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" | "gpu" => Ok(Self::Cuda),
            other => Err(Error::invalid(format!("unknown device '{other}': expected auto, cpu or cuda"))),
        }
    }
}

/// Order in which waiting requests are admitted (and running ones preempted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchedulingPolicy {
    /// First come, first served.
    Fcfs,
    /// Lower `priority` first, then arrival (vLLM's convention).
    Priority,
}

impl SchedulingPolicy {
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "fcfs" => Ok(Self::Fcfs),
            "priority" => Ok(Self::Priority),
            other => Err(Error::invalid(format!("unknown scheduling_policy '{other}': expected fcfs or priority"))),
        }
    }
}

/// What a running request loses when the KV pool runs out of blocks (vLLM's
/// `preemption_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreemptionMode {
    /// Swap when the warm tier has room and the cost rule says copying out and back is
    /// cheaper than recomputing; recompute otherwise.
    Auto,
    /// Swap whenever the warm tier has room.
    Swap,
    /// Always free the blocks and recompute later.
    Recompute,
}

impl PreemptionMode {
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "swap" => Ok(Self::Swap),
            "recompute" => Ok(Self::Recompute),
            other => {
                Err(Error::invalid(format!("unknown preemption_mode '{other}': expected auto, swap or recompute")))
            }
        }
    }
}

/// One model to load: where it is and how much work it may take at once.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// Local HF folder, `.gguf` path or known alias (aliases are resolved by the Python layer).
    pub model_id: String,
    /// Longest prompt plus completion; `None` means the checkpoint's context length.
    pub max_model_len: Option<usize>,
    /// Most sequences run together in one step.
    pub max_model_concurrency: usize,
    /// Batch mode window: 0 runs a step at once (single mode).
    pub model_batch_execute_timeout_ms: u64,
    pub dtype: DType,
    pub device: DeviceKind,
    /// Element type of the KV cache (`Auto`: see `KvCacheDtype`).
    pub kv_cache_dtype: KvCacheDtype,
    /// KV pool size in bytes; `None` sizes it for `max_model_concurrency` sequences of
    /// `max_model_len` tokens.
    pub kv_cache_bytes: Option<usize>,
    /// Most tokens in one forward pass (prefill chunks plus decodes); `None` means 2048.
    pub max_num_batched_tokens: Option<usize>,
    /// Most requests waiting for their first step; one more is a `Capacity` error.
    pub max_queue_len: usize,
    /// Reuse the KV blocks of earlier prompts that share a prefix.
    pub enable_prefix_caching: bool,
    pub scheduling_policy: SchedulingPolicy,
    /// Warm (host) tier for preempted requests' KV blocks, in bytes; `None` is as large as the
    /// KV pool, at most 4 GiB; `Some(0)` turns swapping off. Pages are committed when used.
    pub kv_swap_bytes: Option<usize>,
    pub preemption_mode: PreemptionMode,
}

impl ModelConfig {
    pub fn new(model_id: impl Into<String>) -> Self {
        Self {
            model_id: model_id.into(),
            max_model_len: None,
            max_model_concurrency: 8,
            model_batch_execute_timeout_ms: 0,
            dtype: DType::Auto,
            device: DeviceKind::Auto,
            kv_cache_dtype: KvCacheDtype::Auto,
            kv_cache_bytes: None,
            max_num_batched_tokens: None,
            max_queue_len: 1024,
            enable_prefix_caching: true,
            scheduling_policy: SchedulingPolicy::Fcfs,
            kv_swap_bytes: None,
            preemption_mode: PreemptionMode::Auto,
        }
    }

    pub fn validate(&self) -> Result<()> {
        if self.model_id.trim().is_empty() {
            return Err(Error::invalid("model_id must not be empty"));
        }
        if self.max_model_len == Some(0) {
            return Err(Error::invalid("max_model_len must be positive"));
        }
        if self.max_model_concurrency == 0 {
            return Err(Error::invalid("max_model_concurrency must be positive"));
        }
        if self.kv_cache_bytes == Some(0) {
            return Err(Error::invalid("kv_cache_bytes must be positive"));
        }
        if self.max_num_batched_tokens == Some(0) {
            return Err(Error::invalid("max_num_batched_tokens must be positive"));
        }
        if self.max_queue_len == 0 {
            return Err(Error::invalid("max_queue_len must be positive"));
        }
        Ok(())
    }
}
