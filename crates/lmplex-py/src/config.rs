//! Python classes for configuration: ``ModelConfig`` and ``Tenant``, thin mirrors of the
//! `lmplex_core` types (keyword arguments go through their serde derives).
//!
//! Invariant: a ``ModelConfig`` or ``Tenant`` that exists in Python has passed the core's
//! `validate()`; bad values raise ``InvalidRequest`` at construction. A tenant's API key is
//! never shown by ``repr``.

use crate::errors::{invalid, to_py};
use crate::kwargs::{from_kwargs, repr_changed};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// A core configuration type the Python classes here wrap: read from keywords, then checked.
trait CoreConfig: DeserializeOwned + Serialize {
    /// The Python class name, for error messages.
    const CLASS: &'static str;
    fn validate(&self) -> lmplex_core::Result<()>;
}

impl CoreConfig for lmplex_core::ModelConfig {
    const CLASS: &'static str = "ModelConfig";
    fn validate(&self) -> lmplex_core::Result<()> {
        lmplex_core::ModelConfig::validate(self)
    }
}

impl CoreConfig for lmplex_core::TenantConfig {
    const CLASS: &'static str = "Tenant";
    fn validate(&self) -> lmplex_core::Result<()> {
        lmplex_core::TenantConfig::validate(self)
    }
}

/// `T` from keyword `fields` (plus the positional `first`), validated.
fn build<T: CoreConfig>(
    py: Python<'_>,
    first: Option<(&str, String)>,
    fields: Option<&Bound<'_, PyDict>>,
) -> PyResult<T> {
    let inner: T = from_kwargs(py, T::CLASS, first, fields)?;
    inner.validate().map_err(to_py)?;
    Ok(inner)
}

/// Every field of `value` by name, as a dict.
fn fields_dict<'py, T: Serialize>(py: Python<'py>, value: &T) -> PyResult<Bound<'py, PyAny>> {
    pythonize::pythonize(py, value).map_err(|e| invalid(e.to_string()))
}

/// One model to serve: ``ModelConfig(model_id, **fields)``.
///
/// ``model_id`` is a local HF folder, a ``.gguf`` file or a known alias. The keyword fields and
/// their defaults are ``lmplex_core::ModelConfig``'s (docs/config.md lists them); the server's TOML
/// ``[[models]]`` entries take the same keys. A bad value raises ``InvalidRequest`` naming the
/// field; an unknown keyword raises ``TypeError``.
#[pyclass(module = "lmplex._core", frozen, eq)]
#[derive(Clone, PartialEq)]
pub struct ModelConfig {
    pub(crate) inner: lmplex_core::ModelConfig,
}

#[pymethods]
impl ModelConfig {
    #[new]
    #[pyo3(signature = (model_id, **fields))]
    fn new(py: Python<'_>, model_id: String, fields: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        Ok(Self { inner: build(py, Some(("model_id", model_id)), fields)? })
    }

    /// A ``ModelConfig`` from a dict of its fields (what :meth:`to_dict` returns).
    #[staticmethod]
    fn from_dict(fields: &Bound<'_, PyDict>) -> PyResult<Self> {
        Ok(Self { inner: build(fields.py(), None, Some(fields))? })
    }

    /// Every field by name, defaults included (``None`` where unset).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        fields_dict(py, &self.inner)
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyAny>,))> {
        Ok((slf.getattr("from_dict")?, (slf.get().to_dict(slf.py())?,)))
    }

    /// The model id and every field that differs from its default.
    fn __repr__(&self) -> PyResult<String> {
        repr_changed("ModelConfig", &self.inner, &lmplex_core::ModelConfig::default(), &["model_id"])
    }

    /// Local HF folder, ``.gguf`` file or known alias.
    #[getter]
    fn model_id(&self) -> &str {
        &self.inner.model_id
    }
    /// The name clients ask for; ``None`` means ``model_id``.
    #[getter]
    fn served_model_name(&self) -> Option<&str> {
        self.inner.served_model_name.as_deref()
    }
    /// Hub revision (branch, tag or commit) of a Hub id; ``None`` is the default branch.
    #[getter]
    fn revision(&self) -> Option<&str> {
        self.inner.revision.as_deref()
    }
    /// Longest prompt plus completion; ``None`` means the checkpoint's context length.
    #[getter]
    fn max_model_len(&self) -> Option<usize> {
        self.inner.max_model_len
    }
    /// Most sequences run together in one step.
    #[getter]
    fn max_model_concurrency(&self) -> usize {
        self.inner.max_model_concurrency
    }
    /// Batch window in ms; 0 runs a step at once.
    #[getter]
    fn model_batch_execute_timeout_ms(&self) -> u64 {
        self.inner.model_batch_execute_timeout_ms
    }
    /// Activation and dense-weight dtype (``auto``, ``float32``, ``float16``, ``bfloat16``).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.inner.dtype.as_str()
    }
    /// ``auto``, ``cpu``, ``cuda`` (device 0) or ``cuda:N``.
    #[getter]
    fn device(&self) -> String {
        self.inner.device.to_string()
    }
    /// KV cache element type (``auto``, ``float32``, ``float16``).
    #[getter]
    fn kv_cache_dtype(&self) -> &'static str {
        self.inner.kv_cache_dtype.as_str()
    }
    /// KV pool size in bytes; ``None`` sizes it from the limits.
    #[getter]
    fn kv_cache_bytes(&self) -> Option<usize> {
        self.inner.kv_cache_bytes
    }
    /// Most tokens in one forward pass; ``None`` means 2048.
    #[getter]
    fn max_num_batched_tokens(&self) -> Option<usize> {
        self.inner.max_num_batched_tokens
    }
    /// Most requests waiting for their first step.
    #[getter]
    fn max_queue_len(&self) -> usize {
        self.inner.max_queue_len
    }
    /// Reuse the KV blocks of earlier prompts that share a prefix.
    #[getter]
    fn enable_prefix_caching(&self) -> bool {
        self.inner.enable_prefix_caching
    }
    /// ``fcfs``, ``priority`` or ``fair``; ``None`` is ``fair`` with tenants, else ``fcfs``.
    #[getter]
    fn scheduling_policy(&self) -> Option<&'static str> {
        self.inner.scheduling_policy.map(|p| p.as_str())
    }
    /// Swap space for preempted requests, in bytes; ``None`` is as large as the pool, 0 is off.
    #[getter]
    fn kv_swap_bytes(&self) -> Option<usize> {
        self.inner.kv_swap_bytes
    }
    /// ``auto``, ``swap`` or ``recompute``.
    #[getter]
    fn preemption_mode(&self) -> &'static str {
        self.inner.preemption_mode.as_str()
    }
    /// On CUDA, never replay captured graphs for decode steps.
    #[getter]
    fn enforce_eager(&self) -> bool {
        self.inner.enforce_eager
    }
    /// Seconds idle before a host unloads the model; ``None`` keeps it.
    #[getter]
    fn keep_alive_s(&self) -> Option<f64> {
        self.inner.keep_alive_s
    }
    /// What a million prompt tokens cost (tenants' ``max_cost_per_day`` uses it).
    #[getter]
    fn price_per_million_input_tokens(&self) -> f64 {
        self.inner.price_per_million_input_tokens
    }
    /// What a million generated tokens cost.
    #[getter]
    fn price_per_million_output_tokens(&self) -> f64 {
        self.inner.price_per_million_output_tokens
    }
    /// How good the model is for routing by tier (higher is better).
    #[getter]
    fn quality(&self) -> f64 {
        self.inner.quality
    }
    /// ``hermes``, ``llama3_json`` or ``mistral``; ``None`` reads the chat template.
    #[getter]
    fn tool_call_parser(&self) -> Option<&'static str> {
        self.inner.tool_call_parser.map(|p| p.as_str())
    }
    /// ``think`` or ``none``; ``None`` reads the chat template (``think`` when it writes
    /// ``<think>``).
    #[getter]
    fn reasoning_parser(&self) -> Option<&'static str> {
        self.inner.reasoning_parser.map(|p| p.as_str())
    }
    /// LoRA adapters served on this model: served name -> PEFT folder or Hub id.
    #[getter]
    fn lora_modules(&self) -> std::collections::BTreeMap<String, String> {
        self.inner.lora_modules.clone()
    }
    /// Most adapters held in memory at once.
    #[getter]
    fn max_loras(&self) -> usize {
        self.inner.max_loras
    }
    /// Highest rank an adapter may have.
    #[getter]
    fn max_lora_rank(&self) -> usize {
        self.inner.max_lora_rank
    }
    /// What the model serves: ``"generate"`` or ``"embed"``.
    #[getter]
    fn task(&self) -> &'static str {
        self.inner.task.as_str()
    }
    /// How an embedding model pools (``"last"`` or ``"mean"``); ``None`` reads a
    /// sentence-transformers folder's pooling, else ``"last"``.
    #[getter]
    fn pooling(&self) -> Option<&'static str> {
        self.inner.pooling.map(|p| p.as_str())
    }
    /// Speculative decoding settings (vLLM's ``speculative_config``: ``method``,
    /// ``num_speculative_tokens``, ``prompt_lookup_min``, ``prompt_lookup_max``, ``model``) as a dict, or
    /// ``None`` (one token a step).
    #[getter]
    fn speculative<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.inner.speculative.as_ref().map(|s| fields_dict(py, s)).transpose()
    }
    /// Most images one prompt may hold (vLLM's ``limit_mm_per_prompt``), as ``{"image": n}``;
    /// 0 loads no vision tower.
    #[getter]
    fn limit_mm_per_prompt<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        fields_dict(py, &self.inner.limit_mm_per_prompt)
    }
    /// A llama.cpp multimodal projector file (llama-server's ``--mmproj``): the vision tower and
    /// image preprocessing of a GGUF text model; ``None`` reads them from an HF folder.
    #[getter]
    fn mmproj(&self) -> Option<&str> {
        self.inner.mmproj.as_deref()
    }
}

/// One tenant of a shared engine or server: ``Tenant(name, **fields)``.
///
/// The fields and defaults are ``lmplex_core::TenantConfig``'s (docs/tenants.md lists them); the
/// server TOML's ``[[tenants]]`` entries take the same keys. A bad value raises
/// ``InvalidRequest`` naming the field; an unknown keyword ``TypeError``.
#[pyclass(module = "lmplex._core", frozen, eq)]
#[derive(Clone, PartialEq)]
pub struct Tenant {
    pub(crate) inner: lmplex_core::TenantConfig,
}

#[pymethods]
impl Tenant {
    #[new]
    #[pyo3(signature = (name, **fields))]
    fn new(py: Python<'_>, name: String, fields: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let fields = crate::route::route_as_dict(fields)?;
        Ok(Self { inner: build(py, Some(("name", name)), fields.as_ref())? })
    }

    /// A ``Tenant`` from a dict of its fields (what :meth:`to_dict` returns).
    #[staticmethod]
    fn from_dict(fields: &Bound<'_, PyDict>) -> PyResult<Self> {
        Ok(Self { inner: build(fields.py(), None, Some(fields))? })
    }

    /// Every field by name, defaults included (``None`` where unset); the key too.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        fields_dict(py, &self.inner)
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyAny>,))> {
        Ok((slf.getattr("from_dict")?, (slf.get().to_dict(slf.py())?,)))
    }

    /// The name and every field that differs from its default, the key as ``'<redacted>'``.
    fn __repr__(&self) -> PyResult<String> {
        let mut shown = self.inner.clone();
        shown.api_key = shown.api_key.map(|_| "<redacted>".into());
        repr_changed("Tenant", &shown, &lmplex_core::TenantConfig::default(), &["name"])
    }

    /// The tenant's name (metrics' ``tenant`` label, the default cache salt).
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }
    /// The default route of the tenant's calls, or ``None``.
    #[getter]
    fn route(&self) -> Option<crate::route::Route> {
        self.inner.route.map(|inner| crate::route::Route { inner })
    }
    /// Whether an API key (or its SHA-256) is set; the key itself is not readable back.
    #[getter]
    fn has_api_key(&self) -> bool {
        self.inner.api_key.is_some() || self.inner.api_key_sha256.is_some()
    }
    /// Share of the engine under the ``fair`` policy.
    #[getter]
    fn weight(&self) -> f64 {
        self.inner.weight
    }
    /// The served model names the tenant may use; ``None`` is all.
    #[getter]
    fn models(&self) -> Option<Vec<String>> {
        self.inner.models.clone()
    }
    /// Default priority of its requests (lower runs first).
    #[getter]
    fn priority(&self) -> i32 {
        self.inner.priority
    }
    /// Most requests per window.
    #[getter]
    fn requests_per_minute(&self) -> Option<u64> {
        self.inner.requests_per_minute
    }
    /// Most tokens (prompt plus ``max_tokens``, unused given back) per window.
    #[getter]
    fn tokens_per_minute(&self) -> Option<u64> {
        self.inner.tokens_per_minute
    }
    /// Most requests in flight.
    #[getter]
    fn max_concurrency(&self) -> Option<u64> {
        self.inner.max_concurrency
    }
    /// Most money per UTC day at the models' prices.
    #[getter]
    fn max_cost_per_day(&self) -> Option<f64> {
        self.inner.max_cost_per_day
    }
    /// Prefix-cache salt; ``None`` keeps the tenant's cache to itself.
    #[getter]
    fn cache_salt(&self) -> Option<&str> {
        self.inner.cache_salt.as_deref()
    }
    /// Length of the rate-limit window in seconds.
    #[getter]
    fn quota_window_s(&self) -> f64 {
        self.inner.quota_window_s
    }
}
