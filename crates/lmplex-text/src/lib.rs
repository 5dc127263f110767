//! lmplex-text: text in and out of a model, with no model inside.
//!
//! - `tokenizer`: [`Tokenizer`], text <-> token ids, the chat template and the special-token
//!   facts of a checkpoint (GGUF metadata or an HF folder), and [`IncrementalDecoder`].
//! - `gguf_tokenizer`: a `tokenizers::Tokenizer` built from GGUF metadata (`tokenizer.ggml.*`);
//!   `hf_vocab`: the inverse, an HF tokenizer folder as that metadata.
//! - `chat`: Jinja chat templates rendered as transformers does ([`ChatMessage`]).
//! - `tool_parser`: tool calls out of the streamed text, per format ([`ToolStream`]);
//!   `tool_grammar`: the llguidance grammar that makes a model's tool calls follow the tools'
//!   schemas.
//! - `guided`: structured output, a request's constraint compiled by llguidance into a
//!   [`Guide`] that masks each logits row ([`GuidedFactory`], one per model).
//!
//! Invariants: this crate knows no architecture, weights or kernels: it depends on
//! lmplex-core and the text libraries (tokenizers, minijinja, llguidance), never on
//! lmplex-model or lmplex-cpu (lmplex-model depends on it and re-exports its modules). It
//! reads GGUF metadata through candle's `gguf_file`, never tensors. `encode(text, true)` adds
//! BOS only when the checkpoint asks for it, never twice; a chat template is compiled once at
//! load; a guide depends only on its own request's tokens, so constrained requests stay
//! bit-exact whatever else is in the batch.

#![warn(missing_docs)]

pub mod chat;
pub mod gguf_tokenizer;
pub mod guided;
pub mod hf_vocab;
pub mod reasoning;
pub mod tokenizer;
pub mod tool_grammar;
pub mod tool_parser;

pub use chat::{ChatMessage, ContentPart};
pub use guided::{Guide, GuidedFactory};
pub use reasoning::ReasoningStream;
pub use tokenizer::{IncrementalDecoder, Tokenizer};
pub use tool_parser::ToolStream;
