//! The async API: `Engine.agenerate` (an awaitable) and `Engine.astream` (an async iterator),
//! through pyo3-async-runtimes on its tokio runtime.
//!
//! Invariants: no future holds the GIL while it waits; Python objects are built only once a
//! result is ready (`Python::attach`); an `AsyncStreamIterator` that is closed or garbage
//! collected before its last chunk aborts its request, as the sync iterator does.
//!
//! Exit: pyo3-async-runtimes hands each result to the event loop from a tokio blocking thread
//! (`call_soon_threadsafe`, then dropping its Python objects). The loop can wake and the program
//! reach `Py_FinalizeEx` while that thread still waits for the GIL to finish; it then runs during
//! finalization and the process aborts or segfaults (seen about one exit in ten after a batch of
//! `agenerate` calls; PyO3/pyo3-async-runtimes#40). So the Python side calls `drain_async` at exit:
//! it gives up the GIL for a grace period (blocking threads are not in tokio's stable metrics, so
//! this is a wait, not a count) and then until the runtime has no live task, or a timeout passes.

use crate::errors::to_py;
use crate::types::{RequestOutput, StreamChunk};
use lmplex_engine::{Engine, Request, RequestHandle};
use pyo3::exceptions::PyStopAsyncIteration;
use pyo3::prelude::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// Without the GIL: waits `GRACE`, then up to `timeout_s` until the async runtime has no live
/// task; returns how many are still alive (0 when drained). Called at exit after any async call.
#[pyfunction]
pub(crate) fn drain_async(py: Python<'_>, timeout_s: f64) -> usize {
    const GRACE: Duration = Duration::from_millis(20);
    let rt = pyo3_async_runtimes::tokio::get_runtime();
    let deadline = Instant::now() + Duration::from_secs_f64(timeout_s.clamp(0.0, 60.0));
    py.detach(|| loop {
        std::thread::sleep(GRACE);
        let alive = rt.metrics().num_alive_tasks();
        if alive == 0 || Instant::now() >= deadline {
            return alive;
        }
    })
}

/// Validates and tokenizes now (so bad input raises at the call), then runs the batch.
pub(crate) fn agenerate<'py>(py: Python<'py>, engine: Arc<Engine>, reqs: Vec<Request>) -> PyResult<Bound<'py, PyAny>> {
    let batch = {
        let engine = engine.clone();
        py.detach(move || engine.batch(engine.prepare_requests(&reqs)?)).map_err(to_py)?
    };
    pyo3_async_runtimes::tokio::future_into_py(py, async move {
        let outs = engine.generate_async(batch).await.map_err(to_py)?;
        let name = engine.config().served_name().to_string();
        Python::attach(|py| {
            outs.into_iter().map(|o| RequestOutput::new(py, o, Some(name.clone()))).collect::<PyResult<Vec<_>>>()
        })
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
