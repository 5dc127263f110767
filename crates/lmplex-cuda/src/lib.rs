//! lmplex-cuda: the GPU backend. The same model as the CPU backend (`lmplex_model::Model`), on
//! an NVIDIA device: weights and the paged KV pool in device memory (f32, f16 or bf16), the
//! kernels of `lmplex-kernels` compiled by NVRTC for the device's arch, cuBLAS for the GEMMs.
//!
//! Data flow: `lmplex_model::open(path)` gives a `Checkpoint`; [`Gpu::open`] finds CUDA and
//! loads the kernels; [`CudaModel::load`] uploads the weights and allocates the KV pool and step
//! buffers; the engine's step loop calls [`CudaModel::forward`] with a `ForwardBatch` and gets
//! the logits rows back, and swaps blocks with [`kv::DeviceKv`]'s warm tier.
//!
//! Invariants: nothing CUDA is needed to build or import this crate (cudarc loads every library
//! at run time) and no CUDA function is called before `Gpu::open` has checked its library is
//! present; a sequence's logits never depend on the rest of its batch (see `gpu` and `forward`).

pub mod counting;
pub mod device;
pub mod dtype;
pub mod emulated;
pub mod exec;
pub mod forward;
pub mod gpu;
pub mod hostexec;
pub mod kernel_check;
pub mod kernels;
pub mod kv;
pub mod lora;
pub mod mat;
pub mod meta;
pub mod profile;
pub mod quant;
pub mod staging;
pub mod weights;
pub mod workspace;

pub use device::{auto_choice, probe, DeviceFacts, VERIFIED_ARCHS};
pub use dtype::Dt;
pub use exec::GemmKind;
pub use forward::{CudaModel, LiveBytes};
pub use gpu::{Gpu, GEMM_ROWS};
pub use workspace::CudaSizing;
