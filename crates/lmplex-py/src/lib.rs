//! `lmplex._core`: the PyO3 module behind the `lmplex` Python package.
//!
//! Invariants: arguments are extracted and validated under the GIL, the work runs inside
//! `py.detach` (GIL released); every `lmplex_core::Error` becomes its own Python exception
//! class (`ModelLoadError`, `InvalidRequest`, `CapacityError`, `RateLimited`, `LmplexError`), never a panic.
//! `python/lmplex/_core.pyi` describes this module and `mypy.stubtest` keeps the two equal.
//! Rust's `tracing` events reach Python's `logging` (loggers named after the Rust module, e.g.
//! `lmplex_server::request_id`; under the `lmplex_` prefix), through `tracing`'s `log` records and
//! pyo3-log; no tracing subscriber is installed here.

mod aio;
mod config;
mod engine;
mod errors;
mod export;
mod host;
mod images;
mod kernels;
mod kwargs;
mod prompts;
mod route;
mod serve;
mod structured;
mod types;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("DEFAULT_MAX_NUM_BATCHED_TOKENS", lmplex_core::DEFAULT_MAX_NUM_BATCHED_TOKENS)?;
    // Another extension may have installed a `log` logger already; then ours stays off.
    let _ = pyo3_log::try_init();
    errors::register(m)?;
    m.add_class::<types::SamplingParams>()?;
    m.add_class::<structured::StructuredOutputsParams>()?;
    m.add_class::<config::ModelConfig>()?;
    m.add_class::<config::Tenant>()?;
    m.add_class::<route::Route>()?;
    m.add_class::<route::TierSet>()?;
    m.add_class::<types::Logprob>()?;
    m.add_class::<types::TokenLogprobs>()?;
    m.add_class::<types::Usage>()?;
    m.add_class::<types::RequestOutput>()?;
    m.add_class::<types::StreamChunk>()?;
    m.add_class::<prompts::CallArgs>()?;
    m.add_class::<engine::StreamIterator>()?;
    m.add_class::<aio::AsyncStreamIterator>()?;
    m.add_class::<engine::Engine>()?;
    m.add_class::<host::ModelHost>()?;
    m.add_function(wrap_pyfunction!(export::export_gguf_to_hf, m)?)?;
    m.add_function(wrap_pyfunction!(export::quantize_gguf, m)?)?;
    m.add_function(wrap_pyfunction!(serve::serve, m)?)?;
    m.add_function(wrap_pyfunction!(serve::start_server, m)?)?;
    m.add_function(wrap_pyfunction!(serve::usage_report, m)?)?;
    m.add_class::<serve::ServerThread>()?;
    m.add_function(wrap_pyfunction!(kernels::compile_kernels, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::gpu_model_report, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::write_llama_shape, m)?)?;
    m.add_function(wrap_pyfunction!(aio::drain_async, m)?)?;
    Ok(())
}
