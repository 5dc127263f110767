//! Python exception classes and the mapping from `lmplex_core::Error`.
//!
//! The classes are defined in Python source at import time because `InvalidRequest` derives
//! from both `LmplexError` and `ValueError`, which PyO3's `create_exception!` cannot express.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

const SOURCE: &std::ffi::CStr = c"
class LmplexError(Exception):
    \"\"\"Base class of every lmplex error.\"\"\"
    __module__ = 'lmplex._core'

class ModelLoadError(LmplexError):
    \"\"\"A checkpoint could not be loaded: missing or corrupt file, unknown architecture, unsupported quant.\"\"\"
    __module__ = 'lmplex._core'

class InvalidRequest(LmplexError, ValueError):
    \"\"\"A request or parameter is invalid: prompt too long, bad sampling parameters, bad messages.\"\"\"
    __module__ = 'lmplex._core'

class CapacityError(LmplexError):
    \"\"\"The engine cannot take the request now: queue full or not enough memory.\"\"\"
    __module__ = 'lmplex._core'

class RateLimited(CapacityError):
    \"\"\"A tenant's quota refuses the request now; retry after ``retry_after`` seconds.

    ``limit`` names the quota: ``requests``, ``tokens``, ``concurrency`` or ``cost``.
    \"\"\"
    __module__ = 'lmplex._core'

    def __init__(self, message: str, retry_after: float = 0.0, limit: str = 'requests') -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.limit = limit

class BudgetUnsatisfiable(LmplexError):
    \"\"\"No model can serve the request within its ``max_latency_ms`` or ``max_cost`` (routing).\"\"\"
    __module__ = 'lmplex._core'
";

static CLASSES: PyOnceLock<[Py<PyType>; 6]> = PyOnceLock::new();

fn classes(py: Python<'_>) -> PyResult<&[Py<PyType>; 6]> {
    CLASSES.get_or_try_init(py, || {
        let m = PyModule::from_code(py, SOURCE, c"lmplex/_errors.py", c"lmplex._errors")?;
        let get = |name: &str| -> PyResult<Py<PyType>> { Ok(m.getattr(name)?.cast_into::<PyType>()?.unbind()) };
        Ok([
            get("LmplexError")?,
            get("ModelLoadError")?,
            get("InvalidRequest")?,
            get("CapacityError")?,
            get("RateLimited")?,
            get("BudgetUnsatisfiable")?,
        ])
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    for c in classes(py)? {
        let c = c.bind(py);
        m.add(c.name()?, c)?;
    }
    Ok(())
}

/// Converts a core error into its Python exception.
pub fn to_py(e: lmplex_core::Error) -> PyErr {
    use lmplex_core::Error::*;
    Python::attach(|py| {
        let c = match classes(py) {
            Ok(c) => c,
            Err(err) => return err,
        };
        let idx = match &e {
            ModelLoad(_) => 1,
            InvalidRequest(_) | ContextLengthExceeded(_) => 2,
            Capacity(_) | Unavailable(_) => 3,
            RateLimited(r) => {
                let limit = match r.kind {
                    lmplex_core::LimitKind::Requests => "requests",
                    lmplex_core::LimitKind::Tokens => "tokens",
                    lmplex_core::LimitKind::Concurrency => "concurrency",
                    lmplex_core::LimitKind::Cost => "cost",
                };
                return match c[4].bind(py).call1((e.to_string(), r.retry_after_s, limit)) {
                    Ok(instance) => PyErr::from_value(instance),
                    Err(err) => err,
                };
            }
            BudgetUnsatisfiable(_) => 5,
            Internal(_) => 0,
        };
        PyErr::from_type(c[idx].bind(py).clone(), e.to_string())
    })
}

/// An `InvalidRequest` with `msg`.
pub fn invalid(msg: impl Into<String>) -> PyErr {
    to_py(lmplex_core::Error::InvalidRequest(msg.into()))
}
