//! What a request gives back: finished outputs and stream chunks.
//!
//! Invariant: concatenating the `text` and `token_ids` of a request's stream chunks gives the
//! `text` and `token_ids` of its `RequestOutput`; `usage` is set on the last chunk only.

use crate::TokenId;

/// Why generation ended (OpenAI's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS, a stop token id or a stop string.
    Stop,
    /// `max_tokens` or `max_model_len` reached.
    Length,
    /// Aborted by the caller (`Engine::abort`) before it finished (vLLM's name).
    Abort,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
        }
    }
}

/// What matched when `finish_reason` is `Stop` (vLLM's `stop_reason`); `None` means EOS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    Eos,
    TokenId(TokenId),
    String(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

impl Usage {
    pub fn total_tokens(&self) -> usize {
        self.prompt_tokens + self.completion_tokens
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Logprob {
    pub token_id: TokenId,
    pub token: String,
    pub logprob: f32,
}

/// The sampled token's logprob plus the top-n alternatives, most likely first.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub token_id: TokenId,
    pub token: String,
    pub logprob: f32,
    pub top: Vec<Logprob>,
}

#[derive(Debug, Clone)]
pub struct RequestOutput {
    pub prompt: String,
    pub text: String,
    pub token_ids: Vec<TokenId>,
    pub finish_reason: FinishReason,
    pub stop_reason: Option<StopReason>,
    pub usage: Usage,
    pub logprobs: Option<Vec<TokenLogprobs>>,
}

/// New text and tokens since the previous chunk of the same request.
#[derive(Debug, Clone, Default)]
pub struct StreamChunk {
    pub text: String,
    pub token_ids: Vec<TokenId>,
    pub logprobs: Option<Vec<TokenLogprobs>>,
    pub finish_reason: Option<FinishReason>,
    pub stop_reason: Option<StopReason>,
    pub usage: Option<Usage>,
}
