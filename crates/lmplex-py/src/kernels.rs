//! `compile_kernels`: every CUDA kernel compiled by NVRTC for one arch, through the disk cache;
//! `gpu_model_report`: the GPU path's device-free figures (`lmplex_cuda::profile`).
//!
//! Needs NVRTC and the CUDA headers (pip's `nvidia-cuda-nvrtc` and `nvidia-cuda-runtime`, or a
//! CUDA toolkit), not a GPU. Invariant: a missing NVRTC is an `InvalidRequest` naming where it
//! looked, never a panic inside cudarc.

use crate::errors::{invalid, to_py};
use lmplex_kernels::{all_kernels, CudaPaths, KernelCache};
use pyo3::prelude::*;
use std::path::PathBuf;

/// Compile every kernel for ``sm_{arch}`` (e.g. 80, 90) with the NVRTC found under ``roots``
/// (folders holding ``lib/`` and ``include/``; then ``LMPLEX_CUDA_HOME``, ``CUDA_HOME``,
/// ``CUDA_PATH``, ``/usr/local/cuda``), caching CUBINs in ``cache_dir``. Returns one
/// ``(kernel, cubin_path, cubin_bytes, from_cache)`` per kernel.
#[pyfunction]
#[pyo3(signature = (roots, arch, cache_dir))]
pub fn compile_kernels(
    py: Python<'_>,
    roots: Vec<String>,
    arch: u32,
    cache_dir: String,
) -> PyResult<Vec<(String, String, usize, bool)>> {
    if !(50..=200).contains(&arch) {
        return Err(invalid(format!("arch must be a compute capability like 80 or 90, got {arch}")));
    }
    let roots: Vec<PathBuf> = roots.into_iter().map(PathBuf::from).collect();
    let paths = CudaPaths::find(&roots).ok_or_else(|| {
        invalid(format!(
            "CUDA: no NVRTC with CUDA headers under {roots:?}, LMPLEX_CUDA_HOME, CUDA_HOME, CUDA_PATH or \
             /usr/local/cuda (pip install nvidia-cuda-nvrtc nvidia-cuda-runtime)"
        ))
    })?;
    py.detach(|| {
        paths.preload()?;
        let cache = KernelCache::new(PathBuf::from(cache_dir), paths.include_dir.clone());
        all_kernels()
            .iter()
            .map(|k| {
                let (cubin, hit) = cache.get(k, arch)?;
                let path = cache.path(k, arch)?.display().to_string();
                Ok((k.name.to_string(), path, cubin.len(), hit))
            })
            .collect::<lmplex_core::Result<Vec<_>>>()
    })
    .map_err(to_py)
}

/// The GPU path's device-free figures as JSON text (`lmplex_cuda::profile::report`): per Llama
/// shape, the real launch sequence of decode and prefill steps on the counting executor, its
/// bytes against the step's minimum, and a modeled H100 time. Needs no GPU and no CUDA library.
#[pyfunction]
pub fn gpu_model_report(py: Python<'_>) -> PyResult<String> {
    py.detach(lmplex_cuda::profile::report).map(|v| v.to_string()).map_err(to_py)
}

/// Writes a checkpoint of the Llama shape ``shape`` (``llama-3.2-1b`` or ``llama-3-8b``) into the
/// folder ``path``: its config, a word-level tokenizer and zero weights in a sparse file that costs
/// no disk (``lmplex_cuda::profile::shape``). For the counting executor; shapes only.
#[pyfunction]
pub fn write_llama_shape(py: Python<'_>, path: String, shape: String) -> PyResult<()> {
    let s = lmplex_cuda::profile::shape_named(&shape)
        .ok_or_else(|| invalid(format!("no Llama shape {shape:?}: llama-3.2-1b or llama-3-8b")))?;
    py.detach(|| s.write(std::path::Path::new(&path), s.num_hidden_layers)).map_err(to_py)
}
