//! lmplex-model: checkpoints in, logits and tokens out.
//!
//! Data flow: `loader::load(path)` reads a GGUF file or an HF folder into a [`Model`]
//! (weights, no KV state) and a [`Tokenizer`]; a runner owns a [`KvCache`], builds a
//! [`ForwardBatch`] of sequence chunks with block tables and calls `Model::forward`, then a
//! per-request [`Sampler`] picks tokens and an [`IncrementalDecoder`] turns them into text.
//!
//! Crates: text handling (tokenizers, chat templates, structured output) is lmplex-text's and
//! the CPU kernels (matmuls, attention, row operations, the thread team) are lmplex-cpu's;
//! this crate holds the model proper (arguments, loading, weights, KV cache layout, forward
//! pass, export, sampler) and depends on both, never the other way round. Their modules are
//! re-exported here under their old paths (`lmplex_model::tokenizer`, `lmplex_model::qmatmul`,
//! ...).

#![warn(missing_docs)]

pub mod args;
pub mod export;
pub mod input_embeds;
pub mod kv;
pub mod loader;
pub mod lora;
pub mod model;
pub mod ops;
pub mod pooling;
pub mod quantize;
pub mod rope;
pub mod sample;
pub mod testing;
pub mod vision;
pub mod weights;

pub use lmplex_cpu::{attention, dense, qmatmul, rowops, thread_team};
pub use lmplex_text::{chat, gguf_tokenizer, guided, reasoning, tokenizer, tool_grammar, tool_parser};

pub use args::{Arch, ModelArgs};
pub use chat::ChatMessage;
pub use guided::{Guide, GuidedFactory};
pub use input_embeds::InputEmbeds;
pub use kv::{ForwardBatch, KvCache, KvDtype, LogitsSelect, RowKinds, SeqChunk};
pub use loader::{auto_kv_dtype, load, open, plan, weight_source, Checkpoint, CheckpointInfo, LoadedModel, ModelPlan};
pub use model::Model;
pub use ops::inv_freq;
pub use pooling::Pooler;
pub use reasoning::ReasoningStream;
pub use sample::{logprobs_of, Sampled, Sampler};
pub use tokenizer::{IncrementalDecoder, Tokenizer};
pub use tool_parser::ToolStream;
pub use weights::WeightSource;
