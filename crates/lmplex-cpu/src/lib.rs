//! lmplex-cpu: the CPU kernels of the forward pass, on plain f32 buffers and packed weights.
//!
//! - `qmatmul`: quantized weights (GGUF blocks repacked at load, [`qmatmul::QWeight`]) times
//!   f32 activations, the decode and prompt kernels, and the f32 dot products.
//! - `dense`: dense f32, bf16 or f16 weights times f32 activations ([`dense::DenseWeight`]).
//! - `attention`: causal attention of query rows over one sequence's paged keys and values
//!   (online softmax over fixed chunks of keys).
//! - `rowops`: row-wise RMSNorm, SiLU-times-up, residual and bias adds.
//! - `lora`: LoRA adapters' low-rank deltas, row by row (`lora::LowRank`).
//! - `thread_team`: the threads the parallel loops run on (`parallel_for`, `Cells`).
//! - `kv_elem`: the KV cache's element types (f32, f16) the attention kernel reads.
//! - `testing`: seeded inputs for the benchmarks and timing examples.
//!
//! Invariants:
//! - Kernels know no model: this crate depends on lmplex-core (errors) and numeric crates
//!   (candle's quantized blocks, half, rayon), never on lmplex-model or lmplex-text. Shapes,
//!   block tables and buffers come in as plain arguments; which weights, layers or
//!   architectures they belong to is the caller's (lmplex-model's) business.
//! - Batch invariance: every output row depends only on its own input row (and, for
//!   attention, its own sequence's keys and values), with a reduction order fixed by the
//!   shapes alone, so a row's result is bit-identical whatever else is in the batch and
//!   whichever thread ran it (the engine's determinism guarantee rests on it).
//! - The kernel family (AVX-512, AVX2 or portable, `qmatmul::Isa`) is chosen once per
//!   process, never per batch; families may differ only in the last bits.

#![warn(missing_docs)]

pub mod aligned;
mod amx;
pub mod attention;
pub mod dense;
pub mod kv_elem;
pub mod lora;
pub mod qmatmul;
pub mod rowops;
pub mod testing;
pub mod thread_team;
