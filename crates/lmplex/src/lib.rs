//! # lmplex
//!
//! A lightweight LLM inference runtime: GGUF and Hugging Face checkpoints, a paged KV cache with
//! prefix caching, continuous batching with bit-identical results whatever the batch, several
//! models in one memory budget ([`ModelHost`]) and an OpenAI-compatible server
//! ([`server`], feature `server`, on by default).
//!
//! This crate is the Rust API: it re-exports the types of the `lmplex-*` crates a user needs, so
//! a project depends on `lmplex` alone. Model ids here are paths (a `.gguf` file or a Hugging
//! Face folder); the Python package adds aliases and fetching.
//!
//! ## Generate
//!
//! Every request to an [`Engine`] joins one continuous batch; [`Engine::generate`] runs a batch
//! to completion and returns one [`RequestOutput`] per request, in order.
//!
//! ```
//! use lmplex::{Engine, ModelConfig, Prompt, Request, SamplingParams};
//! # let dir = tempfile::tempdir()?;
//! # lmplex::testing::write_tiny_checkpoint(dir.path(), lmplex::testing::Family::Llama)?;
//! # let path = dir.path();
//! // `path`: a .gguf file or a Hugging Face folder.
//! let mut config = ModelConfig::new(path.to_string_lossy());
//! config.max_model_len = Some(512);
//! let engine = Engine::new(config)?;
//!
//! let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) };
//! let out = engine.generate(&[Request::new(Prompt::Text("t5 t6 t7".into()), params)])?;
//! assert_eq!(out[0].token_ids.len(), 8);
//! assert_eq!(out[0].usage.completion_tokens, 8);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Stream
//!
//! [`Engine::stream`] returns a [`Stream`]: a blocking iterator of [`StreamChunk`]s, each with the
//! text and token ids new since the previous one. Dropping it early aborts the request.
//!
//! ```
//! # use lmplex::{Engine, ModelConfig, Prompt, Request, SamplingParams};
//! # let dir = tempfile::tempdir()?;
//! # lmplex::testing::write_tiny_checkpoint(dir.path(), lmplex::testing::Family::Qwen2)?;
//! # let engine = Engine::new(ModelConfig::new(dir.path().to_string_lossy()))?;
//! let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(6) };
//! let mut ids = Vec::new();
//! for chunk in engine.stream(&Request::new(Prompt::TokenIds(vec![5, 6, 7]), params.clone()))? {
//!     ids.extend(chunk?.token_ids);
//! }
//! // Streamed or not, alone or batched: the same tokens.
//! assert_eq!(ids, engine.generate(&[Request::new(Prompt::TokenIds(vec![5, 6, 7]), params)])?[0].token_ids);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Several models in one budget
//!
//! A [`ModelHost`] plans each model from its checkpoint's headers before loading it and refuses
//! one that does not fit with a [`Error::Capacity`] that gives the numbers.
//!
//! ```
//! # use lmplex::{ModelConfig, ModelHost};
//! # let dir = tempfile::tempdir()?;
//! # lmplex::testing::write_tiny_checkpoint(dir.path(), lmplex::testing::Family::Llama)?;
//! # let path = dir.path();
//! let host = ModelHost::new(Some(64 << 20)); // 64 MiB for everything
//! let config = |name: &str| ModelConfig {
//!     served_model_name: Some(name.into()),
//!     max_model_len: Some(256),
//!     ..ModelConfig::new(path.to_string_lossy())
//! };
//! host.load(config("a"))?;
//! host.load(config("b"))?;
//! assert_eq!(host.names(), ["a", "b"]);
//! let too_big = ModelConfig { kv_cache_bytes: Some(1 << 30), ..config("c") };
//! assert!(matches!(host.load(too_big), Err(lmplex::Error::Capacity(_))));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Serve
//!
//! `examples/serve.rs` runs the OpenAI-compatible server on a checkpoint
//! (`cargo run --release -p lmplex --example serve -- MODEL_PATH`); [`server::ServerConfig`] also
//! reads the TOML file `lmplex serve --config` takes.

#![warn(missing_docs)]

pub use lmplex_core::{
    DType, DeviceKind, Error, FinishReason, KvCacheDtype, Logprob, ModelConfig, Pooling, PoolingParams, PreemptionMode,
    RequestOutput, Result, SamplingParams, SchedulingPolicy, StopReason, StreamChunk, StructuredOutput, Task, TokenId,
    TokenLogprobs, Usage,
};
pub use lmplex_engine::{ChatMessage, Engine, EnginePlan, ModelHost, ModelState, Prompt, Request, Stream};

/// The OpenAI-compatible HTTP server: [`server::ServerConfig`] (the TOML of `lmplex serve`),
/// [`server::run`] (blocking, until SIGTERM or Ctrl-C) and [`server::serve`] (async).
#[cfg(feature = "server")]
pub mod server {
    pub use lmplex_server::{run, serve, shutdown_signal, ServerConfig};
}

/// Tiny random checkpoints (an HF folder with a word-level tokenizer) for tests and examples.
pub mod testing {
    pub use lmplex_model::testing::{write_tiny_checkpoint, Family};
}
