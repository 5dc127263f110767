//! Keyword arguments to and from the core's serde types, so a Python class over a core struct
//! lists no fields of its own: a field added to the core struct is a keyword at once.
//!
//! A keyword given as `None` takes the field's default (as Python APIs do). Invariant: a bad
//! keyword is a Python error naming it, never a panic: an unknown one is a
//! `TypeError` (as for any Python function), a negative number where the field is unsigned says
//! ">= 0", any other bad value is `InvalidRequest` with the field's name and serde's reason.

use crate::errors::invalid;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Deserializes `T` from `fields` (plus `first`, a positional argument, under its name).
pub fn from_kwargs<T: DeserializeOwned>(
    py: Python<'_>,
    what: &str,
    first: Option<(&str, String)>,
    fields: Option<&Bound<'_, PyDict>>,
) -> PyResult<T> {
    let dict = fields.map_or_else(|| Ok(PyDict::new(py)), |f| f.copy())?;
    if let Some((name, value)) = first {
        if dict.contains(name)? {
            return Err(PyTypeError::new_err(format!("{what}() got multiple values for argument '{name}'")));
        }
        dict.set_item(name, value)?;
    }
    let unset: Vec<Bound<'_, PyAny>> = dict.iter().filter(|(_, v)| v.is_none()).map(|(k, _)| k).collect();
    for k in unset {
        dict.del_item(k)?;
    }
    let mut de = pythonize::Depythonizer::from_object(dict.as_any());
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let field = e.path().to_string();
        let reason = e.inner().to_string();
        if let Some(rest) = reason.strip_prefix("unknown field ") {
            return PyTypeError::new_err(format!("{what}() got an unknown keyword argument {rest}"));
        }
        let negative = dict
            .get_item(&field)
            .ok()
            .flatten()
            .and_then(|v| v.cast::<PyInt>().ok().and_then(|i| i.extract::<i64>().ok()))
            .filter(|v| *v < 0);
        match negative {
            Some(v) => invalid(format!("{field} must be >= 0, got {v}")),
            None if field == "." || reason.contains(&field) => invalid(format!("{what}: {reason}")),
            None => invalid(format!("{what}: {field}: {reason}")),
        }
    })
}

/// `Name(key=value, ...)` with the `always` keys and every field whose value differs from
/// `default`'s, values written as Python writes them.
pub fn repr_changed<T: Serialize>(name: &str, value: &T, default: &T, always: &[&str]) -> PyResult<String> {
    Python::attach(|py| {
        let to_dict = |v: &T| -> PyResult<Bound<'_, PyDict>> {
            let obj = pythonize::pythonize(py, v).map_err(|e| invalid(e.to_string()))?;
            Ok(obj.cast_into::<PyDict>()?)
        };
        let (now, base) = (to_dict(value)?, to_dict(default)?);
        let mut parts = Vec::new();
        for (k, v) in now.iter() {
            let key: String = k.extract()?;
            let changed = match base.get_item(&key)? {
                Some(d) => !v.eq(d)?,
                None => true,
            };
            if changed || always.contains(&key.as_str()) {
                parts.push(format!("{key}={}", v.repr()?));
            }
        }
        Ok(format!("{name}({})", parts.join(", ")))
    })
}
