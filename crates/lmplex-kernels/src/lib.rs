//! lmplex-kernels: the CUDA kernels of the GPU backend, as CUDA C compiled at run time.
//!
//! Data flow: [`sources`] lists every kernel (its `.cu` text, prefixed by `prelude.cuh`, and the
//! `extern "C"` functions it defines); [`libs`] finds NVRTC and the CUDA headers (pip's
//! `nvidia/cu13`, `LMPLEX_CUDA_HOME`, `CUDA_HOME`, `/usr/local/cuda`) and preloads them by full
//! path; [`nvrtc`] compiles a kernel to a CUBIN for one arch, cached in memory and on disk.
//!
//! Invariants: nothing CUDA is needed to build or import this crate (cudarc loads libraries
//! dynamically); no cudarc function is called before its library is known to be loadable, so a
//! missing library is an error value, never a panic; a cached CUBIN is keyed by the source, the
//! options, the arch and the NVRTC version, so a stale binary is never used.

pub mod cpu;
pub mod libs;
pub mod limits;
pub mod nvrtc;
pub mod sources;

pub use cpu::{CpuKernels, Order};
pub use libs::CudaPaths;
pub use limits::check_launch;
pub use nvrtc::{compile, KernelCache};
pub use sources::{all as all_kernels, KernelSource};
