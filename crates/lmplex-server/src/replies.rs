//! The JSON reply bodies the server answers, as types: each handler serializes one of these,
//! and the OpenAPI document (`crate::openapi`) takes its response schemas from the same types,
//! so a reply and its schema cannot drift apart.
//!
//! Invariants: a field OpenAI (or vLLM, or Anthropic) writes as `null` is an `Option` without
//! `skip_serializing_if`; a field they leave out when unset carries one. `object` and `type`
//! tags are `&'static str` constants. Bodies still built as free JSON (the Responses API's
//! and the Messages API's objects, the completions choices) are described here by
//! schema-only types with the fields every such body has; the schema tests check the rest.

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

/// Every error the OpenAI-shaped routes answer: `{"error": {...}}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// What failed.
    pub error: ErrorDetail,
}

/// The inside of [`ErrorBody`].
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// For people.
    pub message: String,
    /// `invalid_request_error`, `rate_limit_error`, `service_unavailable`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// The request field at fault.
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, `context_length_exceeded`, ...).
    pub code: Option<String>,
}

/// Anthropic's error shape (`/v1/messages`): `{"type": "error", "error": {"type", "message"}}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct AnthropicErrorBody {
    /// Always `error`.
    #[serde(rename = "type")]
    #[schema(value_type = String)]
    pub kind: &'static str,
    /// What failed.
    pub error: AnthropicErrorDetail,
}

/// The inside of [`AnthropicErrorBody`].
#[derive(Debug, Serialize, ToSchema)]
pub struct AnthropicErrorDetail {
    /// `invalid_request_error`, `not_found_error`, `rate_limit_error`, ...
    #[serde(rename = "type")]
    #[schema(value_type = String)]
    pub kind: &'static str,
    /// For people.
    pub message: String,
}

/// `GET /health`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// Always `ok`.
    #[schema(value_type = String)]
    pub status: &'static str,
}

/// `GET /ready`: `ready` (200), or `loading`, `draining`, `usage store unavailable` (503).
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct Readiness {
    /// `ready`, `loading`, `draining` or `usage store unavailable`.
    #[schema(value_type = String)]
    pub status: &'static str,
    /// The served models, once ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// The usage store's kind (`memory`, `sqlite`, `redis`), once ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_store: Option<String>,
    /// Why the usage store does not answer, when it fails open.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_store_error: Option<String>,
    /// Why the usage store does not answer, when that makes the server unready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `true` while the server serves without metering (the store failed open).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unmetered: Option<bool>,
}

/// One entry of `GET /v1/models`, or `GET /v1/models/{id}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelCard {
    /// The name to call it by: a served model, a LoRA adapter or a routed name.
    pub id: String,
    /// Always `model`.
    #[schema(value_type = String)]
    pub object: &'static str,
    /// Unix time in seconds.
    pub created: u64,
    /// Always `lmplex`.
    #[schema(value_type = String)]
    pub owned_by: &'static str,
    /// A LoRA adapter's base model (vLLM's `parent`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The context length, for a served model or adapter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<usize>,
}

/// `GET /v1/models`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelList {
    /// Always `list`.
    #[schema(value_type = String)]
    pub object: &'static str,
    /// The models the caller may use.
    pub data: Vec<ModelCard>,
}

/// `POST /tokenize` (vLLM's).
#[derive(Debug, Serialize, ToSchema)]
pub struct Tokenized {
    /// How many tokens.
    pub count: usize,
    /// The model's context length.
    pub max_model_len: usize,
    /// The token ids.
    pub tokens: Vec<u32>,
    /// Each token's text, when `return_token_strs` asked for them.
    pub token_strs: Option<Vec<String>>,
}

/// `POST /detokenize` (vLLM's).
#[derive(Debug, Serialize, ToSchema)]
pub struct Detokenized {
    /// The text of the tokens.
    pub prompt: String,
}

/// `POST /v1/messages/count_tokens` (Anthropic's).
#[derive(Debug, Serialize, ToSchema)]
pub struct InputTokens {
    /// The prompt's length in tokens.
    pub input_tokens: usize,
}

/// One vector of `POST /v1/embeddings`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Embedding {
    /// Always `embedding`.
    #[schema(value_type = String)]
    pub object: &'static str,
    /// The input's position.
    pub index: usize,
    /// The vector: numbers, or base64 of little-endian f32 (`encoding_format: base64`).
    #[schema(value_type = EmbeddingVector)]
    pub embedding: Value,
}

/// An embedding as `encoding_format` asks for it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum EmbeddingVector {
    /// `float`.
    Float(Vec<f32>),
    /// `base64`.
    Base64(String),
}

/// The `usage` of `POST /v1/embeddings`.
#[derive(Debug, Serialize, ToSchema)]
pub struct EmbeddingUsage {
    /// The inputs' tokens.
    pub prompt_tokens: usize,
    /// The same.
    pub total_tokens: usize,
}

/// `POST /v1/embeddings`.
#[derive(Debug, Serialize, ToSchema)]
pub struct EmbeddingList {
    /// Always `list`.
    #[schema(value_type = String)]
    pub object: &'static str,
    /// One vector per input, in input order.
    pub data: Vec<Embedding>,
    /// The model that made them.
    pub model: String,
    /// The tokens used.
    pub usage: EmbeddingUsage,
}

/// `DELETE /v1/responses/{id}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Deleted {
    /// The deleted response's id.
    pub id: String,
    /// Always `response`.
    #[schema(value_type = String)]
    pub object: &'static str,
    /// Always `true`.
    pub deleted: bool,
}

/// One rate window of [`UsageReport`]'s limits.
#[derive(Debug, Serialize, ToSchema)]
pub struct Window {
    /// The window's limit.
    pub limit: u64,
    /// What is left of it.
    pub remaining: u64,
    /// Seconds until it refills.
    pub reset_seconds: f64,
}

/// The limits part of [`UsageReport`].
#[derive(Debug, Serialize, ToSchema)]
pub struct UsageLimits {
    /// Requests per window, when limited.
    pub requests: Option<Window>,
    /// Tokens per window, when limited.
    pub tokens: Option<Window>,
    /// Most calls in flight at once, when limited.
    pub max_concurrency: Option<u64>,
    /// Most cost per day, when limited.
    pub max_cost_per_day: Option<f64>,
    /// The rate windows' length.
    pub window_seconds: f64,
}

/// `GET /v1/usage`: the caller's totals and what its quotas have left.
#[derive(Debug, Serialize, ToSchema)]
pub struct UsageReport {
    /// Always `usage`.
    #[schema(value_type = String)]
    pub object: &'static str,
    /// The tenant's name (empty for the default tenant).
    pub tenant: String,
    /// Calls served.
    pub requests: u64,
    /// Prompt tokens charged.
    pub prompt_tokens: u64,
    /// Completion tokens charged.
    pub completion_tokens: u64,
    /// Both.
    pub total_tokens: u64,
    /// The cost charged, in the price table's unit.
    pub cost: f64,
    /// The cost charged today (UTC).
    pub cost_today: f64,
    /// Calls in flight now.
    pub in_flight: u64,
    /// The tenant's limits and what is left of them.
    pub limits: UsageLimits,
}

/// OpenAI's `usage` of completions and chat.
#[derive(Debug, Serialize, ToSchema)]
pub struct CompletionUsage {
    /// The prompt's tokens.
    pub prompt_tokens: usize,
    /// The generated tokens.
    pub completion_tokens: usize,
    /// Both.
    pub total_tokens: usize,
    /// The prompt tokens served from the prefix cache.
    pub prompt_tokens_details: PromptTokensDetails,
    /// The generated tokens that were reasoning.
    pub completion_tokens_details: CompletionTokensDetails,
}

/// [`CompletionUsage::prompt_tokens_details`].
#[derive(Debug, Serialize, ToSchema)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

/// [`CompletionUsage::completion_tokens_details`].
#[derive(Debug, Serialize, ToSchema)]
pub struct CompletionTokensDetails {
    /// Generated tokens that were reasoning.
    pub reasoning_tokens: usize,
}

/// One alternative of a [`TokenLogprob`].
#[derive(Debug, Serialize, ToSchema)]
pub struct TopLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
}

/// One generated token's logprob, as chat and responses write it.
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// The most likely alternatives, as many as `top_logprobs` asked for.
    pub top_logprobs: Vec<TopLogprob>,
}

/// Chat's `logprobs`: one entry per generated token.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChatLogprobs {
    /// The entries, in order.
    pub content: Vec<TokenLogprob>,
}

/// The assistant's message of a chat choice.
#[derive(Debug, Serialize, ToSchema)]
pub struct AssistantMessage {
    /// Always `assistant`.
    #[schema(value_type = String)]
    pub role: &'static str,
    /// The text; `null` when the reply is only tool calls.
    pub content: Option<String>,
    /// The tool calls, when the model made any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<lmplex_core::ToolCall>>,
    /// A reasoning model's reasoning (vLLM's field).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

/// One choice of a chat completion.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChatChoice {
    /// Which sample (of `n`).
    pub index: usize,
    /// The reply.
    pub message: AssistantMessage,
    /// The tokens' logprobs, when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// `stop`, `length` or `tool_calls`.
    pub finish_reason: Option<String>,
}

/// One choice of a (legacy) completion.
#[derive(Debug, Serialize, ToSchema)]
pub struct CompletionChoice {
    /// Which sample (of `n`, for each prompt in order).
    pub index: usize,
    /// The text (with the prompt first, for `echo`).
    pub text: String,
    /// The legacy logprobs object (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`),
    /// when asked for.
    #[schema(value_type = Option<Object>)]
    pub logprobs: Option<Value>,
    /// `stop` or `length`.
    pub finish_reason: Option<String>,
}

/// `POST /v1/chat/completions` (not streamed).
#[derive(Debug, Serialize, ToSchema)]
pub struct ChatCompletion {
    /// `chatcmpl-...`.
    pub id: String,
    /// Always `chat.completion`.
    #[schema(value_type = String)]
    pub object: &'static str,
    /// Unix time in seconds.
    pub created: u64,
    /// The model, as the client named it.
    pub model: String,
    /// The engine version and the model.
    pub system_fingerprint: String,
    /// One per sample.
    #[schema(value_type = Vec<ChatChoice>)]
    pub choices: Vec<Value>,
    /// The call's tokens.
    pub usage: CompletionUsage,
    /// vLLM's prompt logprobs: `null` unless asked for, then per prompt token (`null` first)
    /// a map from token id to its logprob, rank and text.
    #[schema(value_type = Option<Vec<Option<Object>>>)]
    pub prompt_logprobs: Option<Value>,
}

/// `POST /v1/completions` (not streamed).
#[derive(Debug, Serialize, ToSchema)]
pub struct Completion {
    /// `cmpl-...`.
    pub id: String,
    /// Always `text_completion`.
    #[schema(value_type = String)]
    pub object: &'static str,
    /// Unix time in seconds.
    pub created: u64,
    /// The model, as the client named it.
    pub model: String,
    /// The engine version and the model.
    pub system_fingerprint: String,
    /// One per prompt and sample.
    #[schema(value_type = Vec<CompletionChoice>)]
    pub choices: Vec<Value>,
    /// The call's tokens.
    pub usage: CompletionUsage,
}

/// One server-sent event of a streamed reply (`text/event-stream`): its `data` is one JSON
/// chunk of the route's stream (or `[DONE]` for OpenAI's chat and completions).
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub struct SseEvent {
    /// The event's name: the Responses and Messages APIs name each event's type; absent
    /// for OpenAI's chat and completions.
    event: Option<String>,
    /// The event's JSON chunk, or `[DONE]`.
    data: String,
}

/// A Responses API response object (schema only: `handlers::responses` writes it).
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub struct ResponseObject {
    /// `resp_...`.
    id: String,
    /// Always `response`.
    object: String,
    /// Unix time in seconds.
    created_at: u64,
    /// `completed`, `incomplete`, `in_progress`, `failed`.
    status: String,
    /// The model.
    model: String,
    /// The output items: messages, reasoning, function calls.
    output: Vec<Value>,
    /// The call's tokens, once done.
    usage: Option<Value>,
}

/// One page of a stored response's input items (schema only).
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub struct InputItemList {
    /// Always `list`.
    object: String,
    /// The items.
    data: Vec<Value>,
    /// The first item's id.
    first_id: Option<String>,
    /// The last item's id.
    last_id: Option<String>,
    /// Whether more follow.
    has_more: bool,
}

/// An Anthropic Messages API message (schema only: `handlers::messages` writes it).
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub struct AnthropicMessageReply {
    /// `msg_...`.
    id: String,
    /// Always `message`.
    #[schema(rename = "type")]
    kind: String,
    /// Always `assistant`.
    role: String,
    /// The model.
    model: String,
    /// The content blocks: `text`, `thinking`, `tool_use`.
    content: Vec<Value>,
    /// `end_turn`, `max_tokens`, `stop_sequence`, `tool_use`.
    stop_reason: Option<String>,
    /// The stop sequence that ended it.
    stop_sequence: Option<String>,
    /// `input_tokens` and `output_tokens`.
    usage: Value,
}
