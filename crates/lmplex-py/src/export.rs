//! Checkpoint conversions: `export_gguf_to_hf` (a GGUF written out as a Hugging Face folder)
//! and `quantize_gguf` (a GGUF rewritten in another file type, as `llama-quantize` does).
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

/// Rewrite the GGUF file ``src`` as ``out`` in the file type ``file_type`` (``"q8_0"``,
/// ``"q4_0"``, ``"q4_k_m"``, ``"q5_k_m"``, ``"q6_k"``, ``"f16"``, ``"bf16"`` or ``"f32"``),
/// with llama.cpp's per-tensor types; ``out`` appears only once complete. Returns each tensor's
/// ``(name, type, bytes)`` in file order.
#[pyfunction]
pub fn quantize_gguf(
    py: Python<'_>,
    src: String,
    out: String,
    file_type: &str,
) -> PyResult<Vec<(String, String, usize)>> {
    use lmplex_model::quantize::FileType;
    let Some(ft) = FileType::from_name(file_type) else {
        let known: Vec<&str> = FileType::ALL.iter().map(|(n, _)| *n).collect();
        return Err(invalid(format!("unknown quantization type {file_type:?}; known: {}", known.join(", "))));
    };
    let done = py
        .detach(|| lmplex_model::quantize::quantize_gguf(std::path::Path::new(&src), std::path::Path::new(&out), ft))
        .map_err(to_py)?;
    Ok(done.tensors.into_iter().map(|t| (t.name, t.dtype, t.bytes)).collect())
}
