//! lmplex-model: checkpoints in, logits and tokens out.
//!
//! Data flow: `loader::load(path)` reads a GGUF file or an HF folder into a [`Model`]
//! (weights, no KV state) and a [`Tokenizer`]; a runner owns a [`KvCache`], builds a
//! [`ForwardBatch`] of sequence chunks with block tables and calls `Model::forward`, then a
//! per-request [`Sampler`] picks tokens and an [`IncrementalDecoder`] turns them into text.

pub mod args;
pub mod attention;
pub mod chat;
pub mod dense;
pub mod export;
pub mod gguf_tokenizer;
pub mod guided;
pub mod kv;
pub mod loader;
pub mod model;
pub mod ops;
pub mod qmatmul;
pub mod rowops;
pub mod sampler;
pub mod team;
pub mod testing;
pub mod tokenizer;
pub mod weights;

pub use args::{Arch, ModelArgs};
pub use chat::ChatMessage;
pub use guided::{Guide, GuidedFactory};
pub use kv::{ForwardBatch, KvCache, KvDtype, LogitsSelect, RowKinds, SeqChunk};
pub use loader::{auto_kv_dtype, load, open, plan, Checkpoint, LoadedModel, ModelPlan};
pub use model::Model;
pub use ops::inv_freq;
pub use sampler::{Sampled, Sampler};
pub use tokenizer::{IncrementalDecoder, Tokenizer};
pub use weights::WeightSource;
