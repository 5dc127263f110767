//! `export_gguf_to_hf`: a GGUF checkpoint written out as a Hugging Face folder.
//!
//! Invariant: arguments are checked under the GIL, the dequantization and writing run with it
//! released; every failure is a typed exception (`InvalidRequest`, `ModelLoadError`).

use crate::errors::{invalid, to_py};
use pyo3::prelude::*;

/// Dequantize the GGUF file ``gguf`` into the Hugging Face folder ``out`` (``config.json``,
/// safetensors shards of at most ``max_shard_bytes`` with their index, ``tokenizer.json``,
/// ``tokenizer_config.json`` with the chat template, ``generation_config.json``); ``dtype`` is
/// ``"bfloat16"``, ``"float16"`` or ``"float32"``. Returns the paths written.
#[pyfunction]
#[pyo3(signature = (gguf, out, dtype="bfloat16", max_shard_bytes=5_000_000_000))]
pub fn export_gguf_to_hf(
    py: Python<'_>,
    gguf: String,
    out: String,
    dtype: &str,
    max_shard_bytes: usize,
) -> PyResult<Vec<String>> {
    let dt = lmplex_model::export::dtype_from_name(dtype).map_err(to_py)?;
    if max_shard_bytes == 0 {
        return Err(invalid("max_shard_bytes must be positive"));
    }
    let done = py
        .detach(|| {
            lmplex_model::export::gguf_to_hf(
                std::path::Path::new(&gguf),
                std::path::Path::new(&out),
                dt,
                max_shard_bytes,
            )
        })
        .map_err(to_py)?;
    Ok(done.files.iter().map(|p| p.display().to_string()).collect())
}
