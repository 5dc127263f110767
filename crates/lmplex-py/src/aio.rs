//! The async API: `Engine.agenerate` (an awaitable) and `Engine.astream` (an async iterator),
//! through pyo3-async-runtimes on its tokio runtime.
//!
//! Invariants: no future holds the GIL while it waits; Python objects are built only once a
//! result is ready (`Python::attach`); an `AsyncStreamIterator` that is closed or garbage
//! collected before its last chunk aborts its request, as the sync iterator does.

use crate::errors::to_py;
use crate::types::{RequestOutput, StreamChunk};
use lmplex_engine::{Engine, Request, RequestHandle};
use pyo3::exceptions::PyStopAsyncIteration;
use pyo3::prelude::*;
use std::sync::Arc;
use tokio::sync::Mutex;

/// Validates and tokenizes now (so bad input raises at the call), then runs the batch.
pub(crate) fn agenerate<'py>(py: Python<'py>, engine: Arc<Engine>, reqs: Vec<Request>) -> PyResult<Bound<'py, PyAny>> {
    let batch = {
        let engine = engine.clone();
        py.detach(move || engine.prepare(&reqs)).map_err(to_py)?
    };
    pyo3_async_runtimes::tokio::future_into_py(py, async move {
        let outs = engine.generate_async(batch).await.map_err(to_py)?;
        Python::attach(|py| outs.into_iter().map(|o| RequestOutput::new(py, o)).collect::<PyResult<Vec<_>>>())
    })
}

/// Async iterator of one request's `StreamChunk`s.
#[pyclass(module = "lmplex._core")]
pub struct AsyncStreamIterator {
    id: u64,
    inner: Arc<Mutex<Option<RequestHandle>>>,
}

impl AsyncStreamIterator {
    pub(crate) fn new(h: RequestHandle) -> Self {
        Self { id: h.id(), inner: Arc::new(Mutex::new(Some(h))) }
    }
}

#[pymethods]
impl AsyncStreamIterator {
    fn __aiter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __anext__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let inner = self.inner.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let mut guard = inner.lock().await;
            let item = match guard.as_mut() {
                Some(h) => h.next().await,
                None => None,
            };
            match item {
                Some(Ok(c)) => Ok(StreamChunk::from(c)),
                Some(Err(e)) => {
                    *guard = None;
                    Err(to_py(e))
                }
                None => {
                    *guard = None; // finished: free the handle now
                    Err(PyStopAsyncIteration::new_err(()))
                }
            }
        })
    }

    #[getter]
    fn request_id(&self) -> u64 {
        self.id
    }

    /// Aborts the request (if unfinished) and frees its KV blocks; iteration then stops.
    fn aclose<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let inner = self.inner.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            inner.lock().await.take();
            Ok(())
        })
    }
}
