//! What a request gives back: finished outputs and stream chunks.
//!
//! Invariant: concatenating the `text`, `token_ids` and `tool_calls` of a request's stream
//! chunks gives those of its `RequestOutput`; `usage` is set on the last chunk only.

use crate::{TokenId, ToolCall};

/// Why generation ended (OpenAI's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS, a stop token id or a stop string.
    Stop,
    /// `max_tokens` or `max_model_len` reached.
    Length,
    /// Aborted by the caller (`Engine::abort`) before it finished (vLLM's name).
    Abort,
    /// Ended (as `Stop`) after the model called tools.
    ToolCalls,
}

impl FinishReason {
    /// OpenAI's spelling: `stop`, `length`, `abort` or `tool_calls`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
            Self::ToolCalls => "tool_calls",
        }
    }
}

/// What matched when `finish_reason` is `Stop` (vLLM's `stop_reason`); `None` means EOS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// The model's end-of-sequence token.
    Eos,
    /// One of `stop_token_ids`.
    TokenId(TokenId),
    /// One of the `stop` strings.
    String(String),
}

/// Token counts of a request (OpenAI's `usage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Of the prompt tokens, those found in the prefix cache (not computed again).
    pub cached_tokens: usize,
    /// Of the prompt tokens, those this request computed that the prefix cache now keeps for
    /// later requests (its full blocks past the cached ones; 0 with prefix caching off):
    /// Anthropic's `cache_creation_input_tokens`.
    pub cache_created_tokens: usize,
    /// Of the tokens generated, those of a reasoning model's reasoning (its `<think>` block,
    /// tags included; counted where both tags are single tokens).
    pub reasoning_tokens: usize,
}

impl Usage {
    /// `prompt_tokens + completion_tokens`.
    pub fn total_tokens(&self) -> usize {
        self.prompt_tokens + self.completion_tokens
    }
}

/// One candidate token and its log-probability.
#[derive(Debug, Clone, PartialEq)]
pub struct Logprob {
    /// The token's id.
    pub token_id: TokenId,
    /// The token's text.
    pub token: String,
    /// Its natural-log probability.
    pub logprob: f32,
}

/// The sampled token's logprob plus the top-n alternatives, most likely first.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    /// The sampled token's id.
    pub token_id: TokenId,
    /// The sampled token's text.
    pub token: String,
    /// The sampled token's log-probability.
    pub logprob: f32,
    /// The most likely alternatives at this step, most likely first.
    pub top: Vec<Logprob>,
}

/// The finished result of one request.
#[derive(Debug, Clone)]
pub struct RequestOutput {
    /// The prompt as text (rendered by the chat template for messages).
    pub prompt: String,
    /// The generated text (the answer, after any reasoning, for a model that reasons).
    pub text: String,
    /// A reasoning model's reasoning (chat prompts; `ModelConfig::reasoning_parser`), apart
    /// from `text`; empty otherwise.
    pub reasoning: String,
    /// The generated token ids.
    pub token_ids: Vec<TokenId>,
    /// Why generation ended.
    pub finish_reason: FinishReason,
    /// What matched, when `finish_reason` is `Stop`.
    pub stop_reason: Option<StopReason>,
    /// Token counts.
    pub usage: Usage,
    /// Per-token log-probabilities, when asked for.
    pub logprobs: Option<Vec<TokenLogprobs>>,
    /// The tool calls parsed from the output (a request with tools); `text` is then what is
    /// left: the content around the calls.
    pub tool_calls: Vec<ToolCall>,
    /// Each prompt token's log-probability given the tokens before it (`None` for the first),
    /// when `SamplingParams::prompt_logprobs` asks for them.
    pub prompt_logprobs: Option<Vec<Option<TokenLogprobs>>>,
    /// An embedding request's vector (`PoolingParams`); `None` for generation.
    pub embedding: Option<Vec<f32>>,
}

/// New text and tokens since the previous chunk of the same request.
#[derive(Debug, Clone, Default)]
pub struct StreamChunk {
    /// Text new since the previous chunk.
    pub text: String,
    /// Reasoning new since the previous chunk (as `RequestOutput::reasoning`).
    pub reasoning: String,
    /// Token ids new since the previous chunk.
    pub token_ids: Vec<TokenId>,
    /// Their log-probabilities, when asked for.
    pub logprobs: Option<Vec<TokenLogprobs>>,
    /// Set on the last chunk.
    pub finish_reason: Option<FinishReason>,
    /// What matched, on the last chunk of a `Stop`.
    pub stop_reason: Option<StopReason>,
    /// Token counts, on the last chunk.
    pub usage: Option<Usage>,
    /// Seconds the request waited before its first step, on its first chunk.
    pub queue_time_s: Option<f64>,
    /// Tool calls completed in this chunk (their text is not in `text`).
    pub tool_calls: Vec<ToolCall>,
    /// The prompt's logprobs (as `RequestOutput::prompt_logprobs`), on the first chunk.
    pub prompt_logprobs: Option<Vec<Option<TokenLogprobs>>>,
    /// An embedding request's vector, on its last chunk.
    pub embedding: Option<Vec<f32>>,
}
