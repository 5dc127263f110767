//! The route handlers, one file per group of endpoints: `generate` (completions and chat),
//! `responses`, `messages` (Anthropic's, and its token count), `embeddings`, `models`, `lora` (adapters
//! loaded and unloaded at run time), `tokenize` (and detokenize), `usage` and `ops` (health,
//! readiness, metrics).

pub(crate) mod embeddings;
pub(crate) mod generate;
pub(crate) mod lora;
pub(crate) mod messages;
pub(crate) mod models;
pub(crate) mod ops;
pub(crate) mod responses;
pub(crate) mod tokenize;
pub(crate) mod usage;
