//! lmplex-engine: requests in, outputs and token streams out, over one loaded model.
//!
//! Data flow: `Request` (prompt + `SamplingParams`) -> validation and tokenization ->
//! `Sequence` -> `Runner::step` (one `Model::forward` over all running sequences) -> sampler
//! and stop checks -> `RequestOutput` or `StreamChunk`s.

mod engine;
mod sequence;

pub use engine::{Engine, Prompt, Request, Stream};
pub use lmplex_model::ChatMessage;
