//! The Python `Engine` and its stream iterator.
//!
//! Invariant: prompts and parameters are converted under the GIL; generation runs with the GIL
//! released; a `StreamIterator` dropped (or closed) early aborts its request, which frees its
//! KV blocks at the engine's next step. The async twins live in `aio`.

use crate::config::{ModelConfig, Tenant};
use crate::errors::{invalid, to_py};
use crate::prompts::{self, CallArgs};
use crate::types::{RequestOutput, StreamChunk};
use lmplex_engine::Request;
use pyo3::prelude::*;
use std::sync::{Arc, Mutex};

/// One loaded model. ``path`` is the resolved checkpoint (a ``.gguf`` file or an HF folder).
#[pyclass(module = "lmplex._core", frozen)]
pub struct Engine {
    pub(crate) inner: Arc<lmplex_engine::Engine>,
    config: ModelConfig,
}

/// The registry of `list` with their usage in `usage_store` (`memory` or `sqlite:PATH`; default
/// memory), opened now.
pub(crate) fn tenants_in(
    list: Vec<lmplex_core::TenantConfig>,
    usage_store: Option<&str>,
) -> PyResult<lmplex_engine::Tenants> {
    let spec =
        lmplex_engine::UsageStoreSpec::parse(usage_store.unwrap_or("memory"), None, lmplex_engine::DEFAULT_LEASE_S);
    spec.and_then(|s| lmplex_engine::Tenants::new(list)?.with_store(&s, false)).map_err(to_py)
}

#[pymethods]
impl Engine {
    #[new]
    #[pyo3(signature = (config, path, tenants=None, usage_store=None))]
    fn new(
        py: Python<'_>,
        config: ModelConfig,
        path: String,
        tenants: Option<Vec<Tenant>>,
        usage_store: Option<String>,
    ) -> PyResult<Self> {
        let core = config.inner.clone().at(path);
        let list = tenants.unwrap_or_default().into_iter().map(|t| t.inner).collect();
        let tenants = Arc::new(tenants_in(list, usage_store.as_deref())?);
        let inner = py.detach(|| lmplex_engine::Engine::with_tenants(core, tenants)).map_err(to_py)?;
        Ok(Self { inner: Arc::new(inner), config })
    }

    /// Runs a call's prompts to completion as one batch.
    fn generate(&self, py: Python<'_>, call: &CallArgs) -> PyResult<Vec<RequestOutput>> {
        let (inner, reqs) = (self.inner.clone(), call.requests.clone());
        let name = inner.config().served_name().to_string();
        let outs = py.detach(move || inner.generate(&reqs)).map_err(to_py)?;
        outs.into_iter().map(|o| RequestOutput::new(py, o, Some(name.clone()))).collect()
    }

    /// Streams a call's one prompt.
    fn stream(&self, py: Python<'_>, call: &CallArgs) -> PyResult<StreamIterator> {
        let (inner, req) = (self.inner.clone(), call.one("stream")?);
        let model = inner.config().served_name().to_string();
        let s = py.detach(move || inner.stream(&req)).map_err(to_py)?;
        Ok(StreamIterator::new(s, model))
    }

    /// ``generate`` as an awaitable.
    fn agenerate<'py>(&self, py: Python<'py>, call: &CallArgs) -> PyResult<Bound<'py, PyAny>> {
        crate::aio::agenerate(py, self.inner.clone(), call.requests.clone())
    }

    /// ``stream`` as an async iterator.
    fn astream(&self, py: Python<'_>, call: &CallArgs) -> PyResult<crate::aio::AsyncStreamIterator> {
        let (inner, req) = (self.inner.clone(), call.one("astream")?);
        let s = py.detach(move || inner.stream(&req)).map_err(to_py)?;
        Ok(crate::aio::AsyncStreamIterator::new(s))
    }

    /// Reads the PEFT adapter folder ``path`` and serves it as ``name`` (replacing an adapter
    /// of that name); ``ModelLoadError`` when it cannot be read, and nothing changes.
    fn load_lora_adapter(&self, py: Python<'_>, name: &str, path: &str) -> PyResult<()> {
        let inner = self.inner.clone();
        py.detach(move || inner.lora().load(name, std::path::Path::new(path))).map_err(to_py)
    }

    /// Stops serving the adapter ``name``; running requests finish under it.
    fn unload_lora_adapter(&self, name: &str) -> PyResult<()> {
        self.inner.lora().unload(name).map_err(to_py)
    }

    /// The served adapters' names, sorted.
    fn lora_adapters(&self) -> Vec<String> {
        self.inner.lora().names()
    }

    fn abort(&self, request_id: u64) {
        self.inner.abort(request_id);
    }

    /// Tenant ``name``'s totals and quota windows now (``lmplex.Engine.tenant_usage`` wraps it).
    fn tenant_usage<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let t = self.inner.tenants().get(Some(name)).map_err(to_py)?;
        let (u, q) = (t.usage().map_err(to_py)?, t.status().map_err(to_py)?);
        let d = pythonize::pythonize(py, &u).map_err(|e| invalid(e.to_string()))?;
        let window = |l: Option<lmplex_core::LimitStatus>| l.map(|l| (l.limit, l.remaining, l.reset_s));
        d.set_item("requests_window", window(q.requests))?;
        d.set_item("tokens_window", window(q.tokens))?;
        Ok(d)
    }

    /// The engine's counters now, by their Rust names (``StatsSnapshot``).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        pythonize::pythonize(py, &self.inner.stats().snapshot()).map_err(|e| invalid(e.to_string()))
    }

    /// Each prompt's log-probabilities, one float32 array per prompt: element `i` is
    /// `log p(token_i | tokens before it)`, element 0 NaN (nothing before it). The prompts run
    /// as one batch of scoring requests (`max_tokens=0`, `prompt_logprobs=0`); the arrays are
    /// moved into numpy, not copied per element.
    #[pyo3(signature = (prompts, cache_salt=None, tenant=None))]
    fn score<'py>(
        &self,
        py: Python<'py>,
        prompts: &Bound<'py, PyAny>,
        cache_salt: Option<String>,
        tenant: Option<String>,
    ) -> PyResult<Vec<Bound<'py, numpy::PyArray1<f32>>>> {
        let params = lmplex_core::SamplingParams { max_tokens: 0, prompt_logprobs: Some(0), ..Default::default() };
        let reqs: Vec<Request> = prompts::batch(prompts)?
            .into_iter()
            .map(|prompt| Request {
                prompt,
                params: params.clone(),
                priority: 0,
                cache_salt: cache_salt.clone(),
                tenant: tenant.clone(),
                tools: None,
                lora: None,
                chat_template_kwargs: Default::default(),
                pooling: None,
            })
            .collect();
        let inner = self.inner.clone();
        let outs = py.detach(move || inner.generate(&reqs)).map_err(to_py)?;
        Ok(outs
            .into_iter()
            .map(|o| {
                let lps = o.prompt_logprobs.unwrap_or_default();
                let v: Vec<f32> = lps.iter().map(|t| t.as_ref().map_or(f32::NAN, |t| t.logprob)).collect();
                numpy::PyArray1::from_vec(py, v)
            })
            .collect())
    }

    /// Each prompt's embedding on an embedding model (`task="embed"`), one float32 array per
    /// prompt: its pooled final hidden state, truncated to `dimensions` and normalized when
    /// `normalize`. The prompts run as one batch; each vector depends on its prompt alone.
    #[pyo3(signature = (prompts, dimensions=None, normalize=true, cache_salt=None, tenant=None))]
    fn embed<'py>(
        &self,
        py: Python<'py>,
        prompts: &Bound<'py, PyAny>,
        dimensions: Option<usize>,
        normalize: bool,
        cache_salt: Option<String>,
        tenant: Option<String>,
    ) -> PyResult<Vec<Bound<'py, numpy::PyArray1<f32>>>> {
        let pooling = lmplex_core::PoolingParams { dimensions, normalize };
        let reqs: Vec<Request> = prompts::batch(prompts)?
            .into_iter()
            .map(|prompt| Request {
                cache_salt: cache_salt.clone(),
                tenant: tenant.clone(),
                pooling: Some(pooling.clone()),
                ..Request::new(prompt, lmplex_core::SamplingParams::greedy(0))
            })
            .collect();
        let inner = self.inner.clone();
        let outs = py.detach(move || inner.generate(&reqs)).map_err(to_py)?;
        Ok(outs.into_iter().map(|o| numpy::PyArray1::from_vec(py, o.embedding.unwrap_or_default())).collect())
    }

    #[pyo3(signature = (text, add_special_tokens=true))]
    fn tokenize(&self, py: Python<'_>, text: String, add_special_tokens: bool) -> PyResult<Vec<u32>> {
        py.detach(|| self.inner.tokenizer().encode(&text, add_special_tokens)).map_err(to_py)
    }

    #[pyo3(signature = (token_ids, skip_special_tokens=true))]
    fn detokenize(&self, py: Python<'_>, token_ids: Vec<u32>, skip_special_tokens: bool) -> PyResult<String> {
        let vocab = self.inner.tokenizer().vocab_size() as u32;
        if let Some(bad) = token_ids.iter().find(|&&t| t >= vocab) {
            return Err(invalid(format!("token id {bad} is outside the vocabulary (size {vocab})")));
        }
        py.detach(|| self.inner.tokenizer().decode(&token_ids, skip_special_tokens)).map_err(to_py)
    }

    #[pyo3(signature = (messages, add_generation_prompt=true))]
    fn apply_chat_template(&self, messages: &Bound<'_, PyAny>, add_generation_prompt: bool) -> PyResult<String> {
        let m = prompts::messages(messages)?;
        self.inner.tokenizer().apply_chat_template(&m, add_generation_prompt).map_err(to_py)
    }

    /// ``MemoryReport``'s fields as a dict (``lmplex.Engine.memory`` wraps it).
    fn memory<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        pythonize::pythonize(py, &self.inner.memory()).map_err(|e| invalid(e.to_string()))
    }

    /// ``ModelInfo``'s fields as a dict (``lmplex.Engine.info`` wraps it).
    #[getter]
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        pythonize::pythonize(py, self.inner.info()).map_err(|e| invalid(e.to_string()))
    }

    #[getter]
    fn max_model_len(&self) -> usize {
        self.inner.max_model_len()
    }

    #[getter]
    fn config(&self) -> ModelConfig {
        self.config.clone()
    }
}

/// The chunks of one streamed request (``Engine.stream``, ``ModelHost.stream``); closing or
/// dropping it aborts the request.
#[pyclass(module = "lmplex._core")]
pub struct StreamIterator {
    id: u64,
    model: String,
    /// Reaches the request while another thread waits in `__next__` holding `inner`.
    aborter: lmplex_engine::Aborter,
    inner: Mutex<Option<lmplex_engine::Stream>>,
}

impl StreamIterator {
    /// The chunks of `s`, a request of served model `model`.
    pub(crate) fn new(s: lmplex_engine::Stream, model: String) -> Self {
        Self { id: s.id(), model, aborter: s.aborter(), inner: Mutex::new(Some(s)) }
    }
}

#[pymethods]
impl StreamIterator {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[getter]
    fn request_id(&self) -> u64 {
        self.id
    }

    /// The served model that runs the request (for a routed call, the one chosen).
    #[getter]
    fn model(&self) -> &str {
        &self.model
    }

    /// Aborts the request (if unfinished) and frees its KV blocks; iteration then stops. Safe
    /// from another thread while one iterates: the abort ends that thread's wait first.
    fn close(&self, py: Python<'_>) {
        self.aborter.abort();
        py.detach(|| self.inner.lock().unwrap_or_else(|p| p.into_inner()).take());
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<StreamChunk>> {
        let next = py.detach(|| {
            let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let item = guard.as_mut().and_then(Iterator::next);
            if item.is_none() {
                *guard = None; // finished: free the KV memory now
            }
            item
        });
        match next {
            None => Ok(None),
            Some(Ok(c)) => Ok(Some(c.into())),
            Some(Err(e)) => Err(to_py(e)),
        }
    }
}
