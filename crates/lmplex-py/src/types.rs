//! Python classes for parameters and results; thin mirrors of the `lmplex_core` types.
//!
//! Invariant: a `SamplingParams` or `ModelConfig` that exists in Python has passed the core's
//! `validate()`; bad values raise `InvalidRequest` at construction.

use crate::errors::{invalid, to_py};
use crate::structured::StructuredOutputsParams;
use pyo3::prelude::*;
use pyo3::IntoPyObjectExt;

fn non_negative(name: &str, v: i64) -> PyResult<usize> {
    usize::try_from(v).map_err(|_| invalid(format!("{name} must be >= 0, got {v}")))
}

/// How to pick tokens. The defaults give plain sampling at temperature 1.0; ``temperature=0`` is greedy.
#[pyclass(module = "lmplex._core", frozen, get_all)]
#[derive(Clone)]
pub struct SamplingParams {
    max_tokens: usize,
    temperature: f32,
    top_k: usize,
    top_p: f32,
    min_p: f32,
    repetition_penalty: f32,
    presence_penalty: f32,
    frequency_penalty: f32,
    seed: Option<u64>,
    stop: Vec<String>,
    stop_token_ids: Vec<u32>,
    ignore_eos: bool,
    logprobs: Option<usize>,
    skip_special_tokens: bool,
    structured_outputs: Option<StructuredOutputsParams>,
}

#[pymethods]
impl SamplingParams {
    #[new]
    #[pyo3(signature = (*, max_tokens=256, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
        repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, seed=None, stop=None,
        stop_token_ids=None, ignore_eos=false, logprobs=None, skip_special_tokens=true,
        structured_outputs=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        max_tokens: i64,
        temperature: f32,
        top_k: i64,
        top_p: f32,
        min_p: f32,
        repetition_penalty: f32,
        presence_penalty: f32,
        frequency_penalty: f32,
        seed: Option<u64>,
        stop: Option<Vec<String>>,
        stop_token_ids: Option<Vec<u32>>,
        ignore_eos: bool,
        logprobs: Option<i64>,
        skip_special_tokens: bool,
        structured_outputs: Option<StructuredOutputsParams>,
    ) -> PyResult<Self> {
        let p = Self {
            max_tokens: non_negative("max_tokens", max_tokens)?,
            temperature,
            top_k: non_negative("top_k", top_k)?,
            top_p,
            min_p,
            repetition_penalty,
            presence_penalty,
            frequency_penalty,
            seed,
            stop: stop.unwrap_or_default(),
            stop_token_ids: stop_token_ids.unwrap_or_default(),
            ignore_eos,
            logprobs: logprobs.map(|n| non_negative("logprobs", n)).transpose()?,
            skip_special_tokens,
            structured_outputs,
        };
        p.to_core().validate().map_err(to_py)?;
        Ok(p)
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.to_core())
    }
}

impl SamplingParams {
    pub fn to_core(&self) -> lmplex_core::SamplingParams {
        lmplex_core::SamplingParams {
            max_tokens: self.max_tokens,
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            stop: self.stop.clone(),
            stop_token_ids: self.stop_token_ids.clone(),
            ignore_eos: self.ignore_eos,
            logprobs: self.logprobs,
            skip_special_tokens: self.skip_special_tokens,
            structured_outputs: self.structured_outputs.as_ref().map(|s| s.inner.clone()),
        }
    }
}

/// One model to serve. ``model_id`` is a local HF folder, a ``.gguf`` file or a known alias.
#[pyclass(module = "lmplex._core", frozen, get_all)]
#[derive(Clone)]
pub struct ModelConfig {
    model_id: String,
    max_model_len: Option<usize>,
    max_model_concurrency: usize,
    model_batch_execute_timeout_ms: u64,
    dtype: String,
    device: String,
    kv_cache_dtype: String,
    kv_cache_bytes: Option<usize>,
    max_num_batched_tokens: Option<usize>,
    max_queue_len: usize,
    enable_prefix_caching: bool,
    scheduling_policy: String,
    kv_swap_bytes: Option<usize>,
    preemption_mode: String,
}

#[pymethods]
impl ModelConfig {
    #[new]
    #[pyo3(signature = (model_id, *, max_model_len=None, max_model_concurrency=8,
        model_batch_execute_timeout_ms=0, dtype="auto", device="auto", kv_cache_dtype="auto", kv_cache_bytes=None,
        max_num_batched_tokens=None, max_queue_len=1024, enable_prefix_caching=true,
        scheduling_policy="fcfs", kv_swap_bytes=None, preemption_mode="auto"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        model_id: String,
        max_model_len: Option<i64>,
        max_model_concurrency: i64,
        model_batch_execute_timeout_ms: i64,
        dtype: &str,
        device: &str,
        kv_cache_dtype: &str,
        kv_cache_bytes: Option<i64>,
        max_num_batched_tokens: Option<i64>,
        max_queue_len: i64,
        enable_prefix_caching: bool,
        scheduling_policy: &str,
        kv_swap_bytes: Option<i64>,
        preemption_mode: &str,
    ) -> PyResult<Self> {
        let c = Self {
            model_id,
            max_model_len: max_model_len.map(|n| non_negative("max_model_len", n)).transpose()?,
            max_model_concurrency: non_negative("max_model_concurrency", max_model_concurrency)?,
            model_batch_execute_timeout_ms: non_negative(
                "model_batch_execute_timeout_ms",
                model_batch_execute_timeout_ms,
            )? as u64,
            dtype: dtype.to_string(),
            device: device.to_string(),
            kv_cache_dtype: kv_cache_dtype.to_string(),
            kv_cache_bytes: kv_cache_bytes.map(|n| non_negative("kv_cache_bytes", n)).transpose()?,
            max_num_batched_tokens: max_num_batched_tokens
                .map(|n| non_negative("max_num_batched_tokens", n))
                .transpose()?,
            max_queue_len: non_negative("max_queue_len", max_queue_len)?,
            enable_prefix_caching,
            scheduling_policy: scheduling_policy.to_string(),
            kv_swap_bytes: kv_swap_bytes.map(|n| non_negative("kv_swap_bytes", n)).transpose()?,
            preemption_mode: preemption_mode.to_string(),
        };
        c.to_core()?;
        Ok(c)
    }

    fn __repr__(&self) -> String {
        format!(
            "ModelConfig(model_id={:?}, max_model_len={:?}, max_model_concurrency={}, dtype={:?}, device={:?})",
            self.model_id, self.max_model_len, self.max_model_concurrency, self.dtype, self.device
        )
    }
}

impl ModelConfig {
    pub fn to_core(&self) -> PyResult<lmplex_core::ModelConfig> {
        let c = lmplex_core::ModelConfig {
            model_id: self.model_id.clone(),
            max_model_len: self.max_model_len,
            max_model_concurrency: self.max_model_concurrency,
            model_batch_execute_timeout_ms: self.model_batch_execute_timeout_ms,
            dtype: lmplex_core::DType::parse(&self.dtype).map_err(to_py)?,
            device: lmplex_core::DeviceKind::parse(&self.device).map_err(to_py)?,
            kv_cache_dtype: lmplex_core::KvCacheDtype::parse(&self.kv_cache_dtype).map_err(to_py)?,
            kv_cache_bytes: self.kv_cache_bytes,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_queue_len: self.max_queue_len,
            enable_prefix_caching: self.enable_prefix_caching,
            scheduling_policy: lmplex_core::SchedulingPolicy::parse(&self.scheduling_policy).map_err(to_py)?,
            kv_swap_bytes: self.kv_swap_bytes,
            preemption_mode: lmplex_core::PreemptionMode::parse(&self.preemption_mode).map_err(to_py)?,
        };
        c.validate().map_err(to_py)?;
        Ok(c)
    }
}

#[pyclass(module = "lmplex._core", frozen, get_all)]
#[derive(Clone)]
pub struct Logprob {
    token_id: u32,
    token: String,
    logprob: f32,
}

/// The sampled token's log-probability and the ``n`` most likely alternatives at that step.
#[pyclass(module = "lmplex._core", frozen, get_all)]
#[derive(Clone)]
pub struct TokenLogprobs {
    token_id: u32,
    token: String,
    logprob: f32,
    top: Vec<Logprob>,
}

fn logprobs(v: Option<Vec<lmplex_core::TokenLogprobs>>) -> Option<Vec<TokenLogprobs>> {
    v.map(|v| {
        v.into_iter()
            .map(|t| TokenLogprobs {
                token_id: t.token_id,
                token: t.token,
                logprob: t.logprob,
                top: t
                    .top
                    .into_iter()
                    .map(|l| Logprob { token_id: l.token_id, token: l.token, logprob: l.logprob })
                    .collect(),
            })
            .collect()
    })
}

#[pyclass(module = "lmplex._core", frozen, get_all)]
#[derive(Clone)]
pub struct Usage {
    prompt_tokens: usize,
    completion_tokens: usize,
    total_tokens: usize,
}

#[pymethods]
impl Usage {
    fn __repr__(&self) -> String {
        format!(
            "Usage(prompt_tokens={}, completion_tokens={}, total_tokens={})",
            self.prompt_tokens, self.completion_tokens, self.total_tokens
        )
    }
}

impl From<lmplex_core::Usage> for Usage {
    fn from(u: lmplex_core::Usage) -> Self {
        Self { prompt_tokens: u.prompt_tokens, completion_tokens: u.completion_tokens, total_tokens: u.total_tokens() }
    }
}

fn stop_reason(py: Python<'_>, r: Option<lmplex_core::StopReason>) -> PyResult<Py<PyAny>> {
    use lmplex_core::StopReason::*;
    match r {
        None | Some(Eos) => Ok(py.None()),
        Some(TokenId(t)) => t.into_py_any(py),
        Some(String(s)) => s.into_py_any(py),
    }
}

/// The finished result of one request.
#[pyclass(module = "lmplex._core", frozen, get_all)]
pub struct RequestOutput {
    prompt: String,
    text: String,
    token_ids: Vec<u32>,
    finish_reason: &'static str,
    stop_reason: Py<PyAny>,
    usage: Usage,
    logprobs: Option<Vec<TokenLogprobs>>,
}

#[pymethods]
impl RequestOutput {
    fn __repr__(&self) -> String {
        format!(
            "RequestOutput(text={:?}, finish_reason={:?}, usage={})",
            self.text,
            self.finish_reason,
            self.usage.__repr__()
        )
    }
}

impl RequestOutput {
    pub fn new(py: Python<'_>, o: lmplex_core::RequestOutput) -> PyResult<Self> {
        Ok(Self {
            prompt: o.prompt,
            text: o.text,
            token_ids: o.token_ids,
            finish_reason: o.finish_reason.as_str(),
            stop_reason: stop_reason(py, o.stop_reason)?,
            usage: o.usage.into(),
            logprobs: logprobs(o.logprobs),
        })
    }
}

/// A piece of a streamed reply: text and token ids new since the previous chunk.
#[pyclass(module = "lmplex._core", frozen, get_all)]
pub struct StreamChunk {
    text: String,
    token_ids: Vec<u32>,
    logprobs: Option<Vec<TokenLogprobs>>,
    finish_reason: Option<&'static str>,
    usage: Option<Usage>,
}

#[pymethods]
impl StreamChunk {
    fn __repr__(&self) -> String {
        format!("StreamChunk(text={:?}, finish_reason={:?})", self.text, self.finish_reason)
    }
}

impl From<lmplex_core::StreamChunk> for StreamChunk {
    fn from(c: lmplex_core::StreamChunk) -> Self {
        Self {
            text: c.text,
            token_ids: c.token_ids,
            logprobs: logprobs(c.logprobs),
            finish_reason: c.finish_reason.map(|f| f.as_str()),
            usage: c.usage.map(Into::into),
        }
    }
}
