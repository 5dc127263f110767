//! Python prompts and parameters into engine `Request`s: the one place a Python value is
//! classified as a prompt or a batch of prompts, and `CallArgs`, a call's options as the one
//! value that crosses into the PyO3 methods.
//!
//! A prompt is a `str` (sent as is, no chat template), a non-empty list of message dicts
//! (rendered with the model's chat template) or a non-empty list of token ids (sent as they
//! are, like vLLM's `TokensPrompt`). A list whose items are all mappings, or all ints, is *one*
//! prompt; a list of strings, message lists or token-id lists is a batch. A numpy integer array
//! is token ids too: one prompt when 1-D, a batch of its rows when 2-D (`ndarray_ids`).
//!
//! Invariant: anything else, an empty batch included, is `InvalidRequest` naming what was
//! wrong and where, raised before the engine sees the request.

use crate::errors::invalid;
use crate::types::SamplingParams;
use lmplex_core::TokenId;
use lmplex_engine::{ChatMessage, Prompt, Request};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyDict, PyInt, PyMapping, PyString};

const WHAT: &str = "a prompt is a str, a non-empty list of message dicts or a non-empty list of token ids";

/// One `{"role": ..., "content": ...}` dict (OpenAI's shape: `content` may be `None` beside
/// an assistant's `tool_calls`; a tool's answer names its `tool_call_id`).
fn message(item: &Bound<'_, PyAny>) -> PyResult<ChatMessage> {
    let d = item.cast::<PyMapping>().map_err(|_| invalid("each message must be a dict with 'role' and 'content'"))?;
    let get = |k: &str| d.get_item(k).ok().filter(|v| !v.is_none());
    let text = |k: &str| -> PyResult<Option<String>> {
        get(k)
            .map(|v| v.extract::<String>().map_err(|_| invalid(format!("message '{k}' must be a string: {item}"))))
            .transpose()
    };
    let tool_calls: Vec<lmplex_core::ToolCall> = match get("tool_calls") {
        None => Vec::new(),
        Some(v) => pythonize::depythonize(&v).map_err(|e| invalid(format!("message 'tool_calls': {e}: {item}")))?,
    };
    let role = text("role")?.ok_or_else(|| invalid(format!("message is missing 'role': {item}")))?;
    if let Some(parts) = get("content").map(|c| crate::images::parts(&c)).transpose()?.flatten() {
        let m = ChatMessage::with_parts(role, parts);
        return Ok(ChatMessage { tool_calls, tool_call_id: text("tool_call_id")?, name: text("name")?, ..m });
    }
    let content = text("content")?;
    if content.is_none() && tool_calls.is_empty() && d.get_item("content").is_err() {
        return Err(invalid(format!("message is missing 'content': {item}")));
    }
    Ok(ChatMessage {
        role,
        content: content.unwrap_or_default(),
        tool_calls,
        tool_call_id: text("tool_call_id")?,
        name: text("name")?,
        parts: Vec::new(),
    })
}

/// The tools offered from OpenAI's three parameters: `tools` (a list of
/// `{"type": "function", "function": {...}}` dicts), `tool_choice` (`"none"`, `"auto"`, the
/// default, `"required"` or `{"type": "function", "function": {"name": ...}}`) and
/// `parallel_tool_calls` (default true); the engine checks them against the model at submit.
fn tools(
    tools: Option<&Bound<'_, PyAny>>,
    tool_choice: Option<&Bound<'_, PyAny>>,
    parallel_tool_calls: Option<bool>,
) -> PyResult<Option<lmplex_core::Tools>> {
    let choice = tool_choice.filter(|c| !c.is_none());
    let Some(tools) = tools.filter(|t| !t.is_none() && !t.len().is_ok_and(|n| n == 0)) else {
        let named = choice.and_then(|c| c.extract::<String>().ok());
        if choice.is_some() && !matches!(named.as_deref(), Some("none" | "auto")) {
            return Err(invalid("tool_choice needs tools"));
        }
        return Ok(None);
    };
    let d = PyDict::new(tools.py());
    d.set_item("tools", tools)?;
    match choice {
        Some(c) => d.set_item("tool_choice", c)?,
        None => d.set_item("tool_choice", "auto")?,
    }
    d.set_item("parallel_tool_calls", parallel_tool_calls.unwrap_or(true))?;
    pythonize::depythonize(d.as_any()).map(Some).map_err(|e| invalid(format!("tools: {e}")))
}

/// One call's options, converted once: ``CallArgs(prompts, params=None, priority=None,
/// cache_salt=None, tenant=None, tools=None, tool_choice=None, parallel_tool_calls=None,
/// lora=None)`` with the meanings of ``lmplex.Engine.generate``. Streaming calls take exactly one prompt.
#[pyclass(module = "lmplex._core", frozen)]
pub struct CallArgs {
    pub(crate) requests: Vec<Request>,
}

#[pymethods]
impl CallArgs {
    #[new]
    #[pyo3(signature = (prompts, params=None, priority=None, cache_salt=None, tenant=None, tools=None, tool_choice=None, parallel_tool_calls=None, lora=None, chat_template_kwargs=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        prompts: &Bound<'_, PyAny>,
        params: Option<&Bound<'_, PyAny>>,
        priority: Option<&Bound<'_, PyAny>>,
        cache_salt: Option<String>,
        tenant: Option<String>,
        tools: Option<&Bound<'_, PyAny>>,
        tool_choice: Option<&Bound<'_, PyAny>>,
        parallel_tool_calls: Option<bool>,
        lora: Option<String>,
        chat_template_kwargs: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let tools = self::tools(tools, tool_choice, parallel_tool_calls)?;
        let kwargs: lmplex_model::chat::ChatTemplateKwargs = match chat_template_kwargs {
            Some(d) if !d.is_none() => pythonize::depythonize(d)
                .map_err(|e| invalid(format!("chat_template_kwargs must be a dict with string keys: {e}")))?,
            _ => Default::default(),
        };
        let prompts = batch(prompts)?;
        let n = prompts.len();
        // One request per prompt; one cache salt and tenant for all (the call is one admission
        // of that tenant).
        let requests = prompts
            .into_iter()
            .zip(params_each(params, n)?)
            .zip(priority_each(priority, n)?)
            .map(|((prompt, params), priority)| Request {
                prompt,
                params,
                priority,
                cache_salt: cache_salt.clone(),
                tenant: tenant.clone(),
                tools: tools.clone(),
                lora: lora.clone(),
                chat_template_kwargs: kwargs.clone(),
                pooling: None,
            })
            .collect();
        Ok(Self { requests })
    }
}

impl CallArgs {
    /// The one request of a streaming call (`what` names it in the error).
    pub(crate) fn one(&self, what: &str) -> PyResult<Request> {
        match &self.requests[..] {
            [one] => Ok(one.clone()),
            many => Err(invalid(format!("{what} takes one prompt, got {}", many.len()))),
        }
    }
}

/// The items of a list-like value (not a str, bytes or mapping), or `None`.
fn items<'py>(v: &Bound<'py, PyAny>) -> Option<Vec<Bound<'py, PyAny>>> {
    if v.is_instance_of::<PyString>()
        || v.is_instance_of::<PyBytes>()
        || v.is_instance_of::<PyByteArray>()
        || v.cast::<PyMapping>().is_ok()
    {
        return None;
    }
    v.try_iter().ok()?.collect::<PyResult<Vec<_>>>().ok()
}

fn is_token_id(v: &Bound<'_, PyAny>) -> bool {
    v.is_instance_of::<PyInt>() && !v.is_instance_of::<PyBool>()
}

/// A numpy array of integers as token ids: `Some(rows)` (one row for a 1-D array), `None`
/// when `v` is not a numpy array. Any integer dtype; a negative or too-large id, a float
/// array or an array of another rank is `InvalidRequest`.
fn ndarray_ids(v: &Bound<'_, PyAny>) -> PyResult<Option<Vec<Vec<TokenId>>>> {
    use numpy::{PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
    // Only a value of numpy's own types is asked (asking loads numpy's C API, which numpy
    // being imported guarantees).
    if !v.get_type().module().is_ok_and(|m| m == "numpy") {
        return Ok(None);
    }
    let Ok(arr) = v.cast::<PyUntypedArray>() else { return Ok(None) };
    let (ndim, shape) = (arr.ndim(), arr.shape().to_vec());
    if !(1..=2).contains(&ndim) || shape.contains(&0) {
        return Err(invalid(format!("a token-id array must be 1-D or 2-D and non-empty, got shape {shape:?}")));
    }
    macro_rules! ids {
        ($($t:ty),*) => {$(
            if let Ok(a) = v.cast::<PyArrayDyn<$t>>() {
                let flat: Vec<TokenId> = a
                    .readonly()
                    .as_array()
                    .iter()
                    .map(|&x| TokenId::try_from(x).map_err(|_| invalid(format!("token id {x} is not a valid token id"))))
                    .collect::<PyResult<_>>()?;
                let width = shape[ndim - 1];
                return Ok(Some(flat.chunks(width).map(<[TokenId]>::to_vec).collect()));
            }
        )*};
    }
    ids!(i64, i32, u32, u64, i16, u16, i8, u8);
    Err(invalid(format!("a token-id array must hold integers, got dtype {}", arr.dtype())))
}

/// `items` as one prompt when they are all messages or all token ids.
fn whole(items: &[Bound<'_, PyAny>]) -> PyResult<Option<Prompt>> {
    if items.is_empty() {
        return Ok(None);
    }
    if items.iter().all(|i| i.cast::<PyMapping>().is_ok()) {
        return Ok(Some(Prompt::Messages(items.iter().map(message).collect::<PyResult<_>>()?)));
    }
    if items.iter().all(is_token_id) {
        let ids = items
            .iter()
            .map(|i| i.extract::<TokenId>().map_err(|_| invalid(format!("token id {i} is not a valid token id"))))
            .collect::<PyResult<_>>()?;
        return Ok(Some(Prompt::TokenIds(ids)));
    }
    Ok(None)
}

/// One prompt or a batch of them, as a list of prompts (never empty).
pub fn batch(v: &Bound<'_, PyAny>) -> PyResult<Vec<Prompt>> {
    if let Ok(s) = v.cast::<PyString>() {
        return Ok(vec![Prompt::Text(s.to_string())]);
    }
    if let Some(rows) = ndarray_ids(v)? {
        return Ok(rows.into_iter().map(Prompt::TokenIds).collect());
    }
    let Some(list) = items(v) else {
        return Err(invalid(format!("{WHAT}, got {}", v.get_type().name()?)));
    };
    if list.is_empty() {
        return Err(invalid(format!("no prompt given: {WHAT}, or a non-empty list of them")));
    }
    if let Some(one) = whole(&list)? {
        return Ok(vec![one]);
    }
    list.iter()
        .enumerate()
        .map(|(i, item)| {
            if let Ok(s) = item.cast::<PyString>() {
                return Ok(Prompt::Text(s.to_string()));
            }
            match ndarray_ids(item)? {
                Some(mut rows) if rows.len() == 1 => return Ok(Prompt::TokenIds(rows.remove(0))),
                Some(_) => return Err(invalid(format!("prompt {i}: a token-id array in a batch must be 1-D"))),
                None => {}
            }
            let one = match items(item) {
                Some(inner) => whole(&inner)?,
                None => None,
            };
            one.ok_or_else(|| {
                let kind = item.get_type().name().map(|n| n.to_string()).unwrap_or_default();
                invalid(format!("prompt {i} is not a prompt ({WHAT}; got {kind}); a list mixing these is not allowed"))
            })
        })
        .collect()
}

/// A list of chat messages (for `apply_chat_template`).
pub fn messages(v: &Bound<'_, PyAny>) -> PyResult<Vec<ChatMessage>> {
    match items(v).map(|i| whole(&i)).transpose()?.flatten() {
        Some(Prompt::Messages(m)) => Ok(m),
        _ => Err(invalid("expected a non-empty list of message dicts with 'role' and 'content'")),
    }
}

/// `n` values from one value for all or a list of one each.
fn each<T: Clone>(v: Vec<T>, one: Option<T>, n: usize, what: &str) -> PyResult<Vec<T>> {
    if let Some(x) = one {
        return Ok(vec![x; n]);
    }
    if v.len() != n {
        return Err(invalid(format!("got {} {what} for {n} prompts", v.len())));
    }
    Ok(v)
}

/// `n` sampling parameters from one `SamplingParams` for all (default: `SamplingParams()`) or a
/// list of one each.
fn params_each(params: Option<&Bound<'_, PyAny>>, n: usize) -> PyResult<Vec<lmplex_core::SamplingParams>> {
    Ok(match params.filter(|p| !p.is_none()) {
        None => vec![lmplex_core::SamplingParams::default(); n],
        Some(p) => match p.extract::<SamplingParams>() {
            Ok(one) => vec![one.to_core(); n],
            Err(_) => {
                let v: Vec<SamplingParams> =
                    p.extract().map_err(|_| invalid("params must be a SamplingParams or a list of them"))?;
                each(v.iter().map(SamplingParams::to_core).collect(), None, n, "SamplingParams")?
            }
        },
    })
}

/// `n` priorities from one int for all (default 0) or a list of one each.
fn priority_each(priority: Option<&Bound<'_, PyAny>>, n: usize) -> PyResult<Vec<i32>> {
    Ok(match priority.filter(|p| !p.is_none()) {
        None => vec![0; n],
        Some(p) => {
            let one = p.extract::<i32>().ok();
            let v = match one {
                Some(_) => Vec::new(),
                None => p.extract().map_err(|_| invalid("priority must be an int or a list of ints"))?,
            };
            each(v, one, n, "priorities")?
        }
    })
}
