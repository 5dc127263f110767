//! Python classes for parameters and results; thin mirrors of the `lmplex_core` types.
//!
//! Invariant: a `SamplingParams` that exists in Python has passed the core's
//! `validate()`; bad values raise `InvalidRequest` at construction.

use crate::errors::{invalid, to_py};
use crate::kwargs::{from_kwargs, repr_changed};
use crate::structured::StructuredOutputsParams;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use pyo3::IntoPyObjectExt;

/// How to pick tokens: ``SamplingParams(**fields)``, vLLM's names and defaults.
///
/// The defaults give plain sampling at temperature 1.0; ``temperature=0`` is greedy. The fields are
/// ``lmplex_core::SamplingParams``'s (docs/python.md lists them). ``stop`` may be one string or a list;
/// ``structured_outputs`` is a :class:`StructuredOutputsParams`. A bad value raises ``InvalidRequest``
/// naming the field; an unknown keyword ``TypeError``.
#[pyclass(module = "lmplex._core", frozen, eq)]
#[derive(Clone, PartialEq)]
pub struct SamplingParams {
    pub(crate) inner: lmplex_core::SamplingParams,
}

#[pymethods]
impl SamplingParams {
    #[new]
    #[pyo3(signature = (**fields))]
    fn new(py: Python<'_>, fields: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let fields = fields.map_or_else(|| Ok(PyDict::new(py)), |f| f.copy())?;
        let structured = match fields.get_item("structured_outputs")? {
            Some(s) if !s.is_none() => Some(
                s.extract::<StructuredOutputsParams>()
                    .map_err(|_| invalid("structured_outputs must be a StructuredOutputsParams"))?
                    .inner,
            ),
            _ => None,
        };
        fields.del_item("structured_outputs").ok();
        if fields.get_item("logit_bias")?.is_some_and(|b| b.is_none()) {
            fields.del_item("logit_bias")?;
        }
        if let Some(stop) = fields.get_item("stop")?.filter(|s| s.is_instance_of::<PyString>()) {
            fields.set_item("stop", vec![stop])?;
        }
        let mut inner: lmplex_core::SamplingParams = from_kwargs(py, "SamplingParams", None, Some(&fields))?;
        inner.structured_outputs = structured;
        inner.validate().map_err(to_py)?;
        Ok(Self { inner })
    }

    /// A ``SamplingParams`` from a dict of its fields (what :meth:`to_dict` returns).
    #[staticmethod]
    fn from_dict(fields: &Bound<'_, PyDict>) -> PyResult<Self> {
        let inner: lmplex_core::SamplingParams = from_kwargs(fields.py(), "SamplingParams", None, Some(fields))?;
        inner.validate().map_err(to_py)?;
        Ok(Self { inner })
    }

    /// Every field by name (``structured_outputs`` as vLLM writes it: ``{"json": ...}``,
    /// ``"json_object"``, ``{"regex": ...}``, ...).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        pythonize::pythonize(py, &self.inner).map_err(|e| invalid(e.to_string()))
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyAny>,))> {
        Ok((slf.getattr("from_dict")?, (slf.get().to_dict(slf.py())?,)))
    }

    /// The fields that differ from their defaults.
    fn __repr__(&self) -> PyResult<String> {
        repr_changed("SamplingParams", &self.inner, &lmplex_core::SamplingParams::default(), &[])
    }

    /// Most tokens to generate.
    #[getter]
    fn max_tokens(&self) -> usize {
        self.inner.max_tokens
    }
    /// 0 is greedy.
    #[getter]
    fn temperature(&self) -> f32 {
        self.inner.temperature
    }
    /// Keep the k likeliest tokens; 0 keeps all.
    #[getter]
    fn top_k(&self) -> usize {
        self.inner.top_k
    }
    /// Nucleus sampling mass.
    #[getter]
    fn top_p(&self) -> f32 {
        self.inner.top_p
    }
    /// Drop tokens below ``min_p`` times the top probability.
    #[getter]
    fn min_p(&self) -> f32 {
        self.inner.min_p
    }
    /// Multiplicative penalty on seen tokens; 1.0 is none.
    #[getter]
    fn repetition_penalty(&self) -> f32 {
        self.inner.repetition_penalty
    }
    /// OpenAI's presence penalty.
    #[getter]
    fn presence_penalty(&self) -> f32 {
        self.inner.presence_penalty
    }
    /// OpenAI's frequency penalty.
    #[getter]
    fn frequency_penalty(&self) -> f32 {
        self.inner.frequency_penalty
    }
    /// This request's own seed; ``None`` draws one.
    #[getter]
    fn seed(&self) -> Option<u64> {
        self.inner.seed
    }
    /// Strings that end the reply (not included in it).
    #[getter]
    fn stop(&self) -> Vec<String> {
        self.inner.stop.clone()
    }
    /// Token ids that end the reply.
    #[getter]
    fn stop_token_ids(&self) -> Vec<u32> {
        self.inner.stop_token_ids.clone()
    }
    /// Keep going past end-of-sequence tokens.
    #[getter]
    fn ignore_eos(&self) -> bool {
        self.inner.ignore_eos
    }
    /// How many top alternatives to report per token; ``None`` reports nothing.
    #[getter]
    fn logprobs(&self) -> Option<usize> {
        self.inner.logprobs
    }
    /// No end-of-sequence token, stop token or stop string ends the reply before this many tokens.
    #[getter]
    fn min_tokens(&self) -> usize {
        self.inner.min_tokens
    }
    /// How many top alternatives to report per prompt token; ``None`` reports nothing. With
    /// ``max_tokens=0`` the request only scores its prompt.
    #[getter]
    fn prompt_logprobs(&self) -> Option<usize> {
        self.inner.prompt_logprobs
    }
    /// Leave special tokens out of the text.
    #[getter]
    fn skip_special_tokens(&self) -> bool {
        self.inner.skip_special_tokens
    }
    /// Token id -> bias added to its logit before sampling.
    #[getter]
    fn logit_bias(&self) -> std::collections::BTreeMap<u32, f32> {
        self.inner.logit_bias.clone()
    }
    /// The constraint the reply must match, if any.
    #[getter]
    fn structured_outputs(&self) -> Option<StructuredOutputsParams> {
        self.inner.structured_outputs.clone().map(|inner| StructuredOutputsParams { inner })
    }
}

impl SamplingParams {
    /// The core parameters, validated at construction.
    pub fn to_core(&self) -> lmplex_core::SamplingParams {
        self.inner.clone()
    }
}

/// One candidate token at a step and its log-probability.
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

/// The prompt's logprobs: `None` where a position has none (the first).
fn prompt_logprobs(v: Option<Vec<Option<lmplex_core::TokenLogprobs>>>) -> Option<Vec<Option<TokenLogprobs>>> {
    v.map(|v| v.into_iter().map(|t| logprobs(t.map(|t| vec![t])).and_then(|mut l| l.pop())).collect())
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

/// Token counts of a request: prompt, completion and their total.
#[pyclass(module = "lmplex._core", frozen, get_all)]
#[derive(Clone)]
pub struct Usage {
    prompt_tokens: usize,
    completion_tokens: usize,
    total_tokens: usize,
    cached_tokens: usize,
    reasoning_tokens: usize,
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
        Self {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.total_tokens(),
            cached_tokens: u.cached_tokens,
            reasoning_tokens: u.reasoning_tokens,
        }
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

/// Tool calls, read from Python as a list of OpenAI-shaped dicts (`{"id", "type": "function",
/// "function": {"name", "arguments"}}`), which go back into a chat as an assistant message's
/// `tool_calls` unchanged.
pub struct ToolCalls(Vec<lmplex_core::ToolCall>);

impl<'py> IntoPyObject<'py> for &ToolCalls {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;
    fn into_pyobject(self, py: Python<'py>) -> PyResult<Self::Output> {
        pythonize::pythonize(py, &self.0).map_err(|e| crate::errors::invalid(e.to_string()))
    }
}

/// The finished result of one request.
#[pyclass(module = "lmplex._core", frozen, get_all)]
pub struct RequestOutput {
    prompt: String,
    text: String,
    reasoning: Option<String>,
    token_ids: Vec<u32>,
    finish_reason: &'static str,
    stop_reason: Py<PyAny>,
    usage: Usage,
    logprobs: Option<Vec<TokenLogprobs>>,
    prompt_logprobs: Option<Vec<Option<TokenLogprobs>>>,
    model: Option<String>,
    tool_calls: ToolCalls,
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
    /// `o` from the served model `model`.
    pub fn new(py: Python<'_>, o: lmplex_core::RequestOutput, model: Option<String>) -> PyResult<Self> {
        Ok(Self {
            prompt: o.prompt,
            text: o.text,
            reasoning: (!o.reasoning.is_empty()).then_some(o.reasoning),
            token_ids: o.token_ids,
            finish_reason: o.finish_reason.as_str(),
            stop_reason: stop_reason(py, o.stop_reason)?,
            usage: o.usage.into(),
            logprobs: logprobs(o.logprobs),
            prompt_logprobs: prompt_logprobs(o.prompt_logprobs),
            model,
            tool_calls: ToolCalls(o.tool_calls),
        })
    }
}

/// A piece of a streamed reply: text and token ids new since the previous chunk.
#[pyclass(module = "lmplex._core", frozen, get_all)]
pub struct StreamChunk {
    text: String,
    reasoning: Option<String>,
    token_ids: Vec<u32>,
    logprobs: Option<Vec<TokenLogprobs>>,
    prompt_logprobs: Option<Vec<Option<TokenLogprobs>>>,
    finish_reason: Option<&'static str>,
    usage: Option<Usage>,
    tool_calls: ToolCalls,
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
            reasoning: (!c.reasoning.is_empty()).then_some(c.reasoning),
            token_ids: c.token_ids,
            logprobs: logprobs(c.logprobs),
            prompt_logprobs: prompt_logprobs(c.prompt_logprobs),
            finish_reason: c.finish_reason.map(|f| f.as_str()),
            usage: c.usage.map(Into::into),
            tool_calls: ToolCalls(c.tool_calls),
        }
    }
}
