//! `StructuredOutputsParams` (vLLM's name): what a request's output must match.
//!
//! Invariant: an instance holds exactly one constraint, already in the core's form (a schema is
//! JSON text); a schema given as a dict or a pydantic model class is serialized here, once.

use crate::errors::invalid;
use lmplex_core::StructuredOutput;
use pyo3::prelude::*;

/// Constrain the output: ``json`` (a JSON schema as a dict, JSON text or a pydantic model class),
/// ``json_object`` (any JSON object), ``regex``, ``choice`` (one of these strings) or
/// ``grammar`` (llguidance's Lark dialect). Exactly one.
#[pyclass(module = "lmplex._core", frozen)]
#[derive(Clone)]
pub struct StructuredOutputsParams {
    pub inner: StructuredOutput,
}

#[pymethods]
impl StructuredOutputsParams {
    #[new]
    #[pyo3(signature = (*, json=None, json_object=false, regex=None, choice=None, grammar=None))]
    fn new(
        json: Option<&Bound<'_, PyAny>>,
        json_object: bool,
        regex: Option<String>,
        choice: Option<Vec<String>>,
        grammar: Option<String>,
    ) -> PyResult<Self> {
        let mut kinds = Vec::new();
        if let Some(j) = json {
            kinds.push(StructuredOutput::JsonSchema(schema_text(j)?));
        }
        if json_object {
            kinds.push(StructuredOutput::JsonObject);
        }
        kinds.extend(regex.map(StructuredOutput::Regex));
        kinds.extend(choice.map(StructuredOutput::Choice));
        kinds.extend(grammar.map(StructuredOutput::Grammar));
        if kinds.len() != 1 {
            return Err(invalid(format!(
                "StructuredOutputsParams takes exactly one of json, json_object, regex, choice, grammar; got {}",
                kinds.len()
            )));
        }
        let inner = kinds.pop().expect("one kind");
        // The core's own check (non-empty); schemas compile when a request uses them.
        lmplex_core::SamplingParams { structured_outputs: Some(inner.clone()), ..Default::default() }
            .validate()
            .map_err(crate::errors::to_py)?;
        Ok(Self { inner })
    }

    /// The kind: ``json``, ``json_object``, ``regex``, ``choice`` or ``grammar``.
    #[getter]
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    /// The constraint's text: the schema as JSON, the regex, the grammar, or the choices as a JSON list.
    #[getter]
    fn value(&self) -> String {
        match &self.inner {
            StructuredOutput::JsonSchema(s) | StructuredOutput::Regex(s) | StructuredOutput::Grammar(s) => s.clone(),
            StructuredOutput::JsonObject => "{\"type\": \"object\"}".into(),
            StructuredOutput::Choice(c) => format!("{c:?}"),
        }
    }

    fn __repr__(&self) -> String {
        format!("StructuredOutputsParams({}={:?})", self.inner.kind(), self.value())
    }
}

/// A JSON schema as text, from text, a dict, or a pydantic model class.
fn schema_text(j: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(s) = j.extract::<String>() {
        return Ok(s);
    }
    let py = j.py();
    let value = if j.hasattr("model_json_schema")? { j.call_method0("model_json_schema")? } else { j.clone() };
    py.import("json")?
        .call_method1("dumps", (value,))
        .and_then(|s| s.extract::<String>())
        .map_err(|e| invalid(format!("json must be a JSON schema (dict, str or pydantic model class): {e}")))
}
