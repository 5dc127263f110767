//! The chat endpoint's body: messages (text parts, assistant `tool_calls`, tool answers), the
//! tools offered, and how they become the engine's chat messages and `Tools`.
//!
//! Invariant: every check whose answer needs no model is made here, with the parameter named;
//! what needs the model (template, schema compilation, tool-message pairing) is the engine's.

use super::{logprobs_count, Common};
use crate::error::ApiError;
use crate::media::{image_bytes, Fetched};
use lmplex_core::{SamplingParams, Tool, ToolCall, ToolChoice, Tools};
use lmplex_engine::ChatMessage;
use serde::Deserialize;

/// A chat message's `content`: a string or a list of content parts.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum ContentInput {
    /// Plain text content.
    Text(String),
    /// Content parts: `text`, and `image_url` for a vision-language model, in order.
    Parts(Vec<ContentPart>),
}

/// One part of a message's content list.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct ContentPart {
    /// The part's `type`: `"text"` or `"image_url"`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The part's text (required for a `text` part).
    pub text: Option<String>,
    /// An `image_url` part's image (required for one).
    pub image_url: Option<ImageUrl>,
}

/// An `image_url` part's image: a `data:` URL (`data:image/png;base64,...`), or an `http(s)` URL
/// of a host in the server's `allowed_media_domains` (fetched before the request runs).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct ImageUrl {
    /// The image as a `data:` URL, or a URL to fetch.
    pub url: String,
    /// OpenAI's `detail`; accepted and not read (the model's processor sets the resolution).
    pub detail: Option<String>,
}

/// One entry of a chat request's `messages`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct MessageInput {
    /// `role`: `system`, `developer`, `user`, `assistant` or `tool` (the engine refuses others).
    #[schema(pattern = "^(system|developer|user|assistant|tool)$")]
    pub role: String,
    /// `content`; absent or `null` reads as empty text.
    pub content: Option<ContentInput>,
    /// An assistant message's `tool_calls`, passed back to the template.
    pub tool_calls: Option<Vec<ToolCall>>,
    /// A tool message's `tool_call_id`: the call it answers.
    pub tool_call_id: Option<String>,
    /// A tool (or user) message's `name`.
    pub name: Option<String>,
}

/// The body of `POST /v1/chat/completions`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct ChatRequest {
    /// `model`: the served model name to run (its `served_name`, as `/v1/models` lists it),
    /// `lmplex:auto` or `tier:NAME`; may be left out when the server serves one model.
    #[serde(default, deserialize_with = "super::null_as_empty")]
    pub model: String,
    /// `messages`: the conversation, rendered with the model's chat template; must not be empty.
    #[schema(min_items = 1)]
    pub messages: Vec<MessageInput>,
    /// `max_completion_tokens`: OpenAI's newer name for `max_tokens`; wins when both are given.
    #[serde(default, deserialize_with = "super::whole_number")]
    #[schema(minimum = 0)]
    pub max_completion_tokens: Option<i64>,
    /// `logprobs`: report each generated token's logprob.
    pub logprobs: Option<bool>,
    /// `top_logprobs`: alternatives per token (0 to `MAX_LOGPROBS`); needs `logprobs: true`.
    #[serde(default, deserialize_with = "super::whole_number")]
    #[schema(minimum = 0, maximum = 20)]
    pub top_logprobs: Option<i64>,
    /// `tools`: functions the model may call (`docs/tools.md`).
    pub tools: Option<Vec<Tool>>,
    /// `tool_choice`: `none`, `auto` (the default with tools), `required` or a named function.
    pub tool_choice: Option<serde_json::Value>,
    /// `parallel_tool_calls`: whether one reply may hold several calls (default true).
    pub parallel_tool_calls: Option<bool>,
    /// vLLM's `prompt_logprobs`: the rendered prompt's logprobs, this many alternatives each.
    #[serde(default, deserialize_with = "super::whole_number")]
    #[schema(minimum = 0, maximum = 20)]
    pub prompt_logprobs: Option<i64>,
    /// vLLM's `chat_template_kwargs`: more variables for the chat template, e.g.
    /// `{"enable_thinking": false}` (Qwen3).
    #[schema(value_type = Option<Object>)]
    pub chat_template_kwargs: Option<lmplex_engine::ChatTemplateKwargs>,
    /// The sampling fields shared with completions.
    #[serde(flatten)]
    pub common: Common,
    /// The images fetched for `image_url` parts' `http(s)` URLs (`crate::media`); not a field
    /// of the body.
    #[serde(skip)]
    pub images: Fetched,
}

/// `messages` as the engine's chat messages, text parts joined, images from their `data:` URLs or
/// from `images` (fetched); no message or a bad part is a 400 naming `messages`.
pub(super) fn chat_messages(messages: &[MessageInput], images: &Fetched) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid_param("messages", "messages must not be empty"));
    }
    messages
        .iter()
        .map(|m| {
            let base = match &m.content {
                None => ChatMessage::new(m.role.clone(), ""),
                Some(ContentInput::Text(t)) => ChatMessage::new(m.role.clone(), t.clone()),
                Some(ContentInput::Parts(parts)) => {
                    let parts = parts.iter().map(|p| content_part(p, images)).collect::<Result<Vec<_>, _>>()?;
                    ChatMessage::with_parts(m.role.clone(), parts)
                }
            };
            Ok(ChatMessage {
                tool_calls: m.tool_calls.clone().unwrap_or_default(),
                tool_call_id: m.tool_call_id.clone(),
                name: m.name.clone(),
                ..base
            })
        })
        .collect()
}

/// One content part as the engine's: text, or an image's bytes (`media::image_bytes`).
fn content_part(p: &ContentPart, images: &Fetched) -> Result<lmplex_engine::ContentPart, ApiError> {
    let bad = |what: String| ApiError::invalid_param("messages", what);
    match (p.kind.as_str(), &p.text, &p.image_url) {
        ("text", Some(t), _) => Ok(lmplex_engine::ContentPart::Text(t.clone())),
        ("text", None, _) => Err(bad("a content part of type 'text' needs its `text` field".into())),
        ("image_url", _, Some(u)) => image_bytes(&u.url, images)
            .map(lmplex_engine::ContentPart::Image)
            .map_err(|e| bad(format!("image_url: {e}"))),
        ("image_url", _, None) => Err(bad("a content part of type 'image_url' needs its `image_url` field".into())),
        (kind, _, _) => Err(bad(format!("content part of type '{kind}' is not supported (text or image_url)"))),
    }
}

impl ChatRequest {
    /// The messages as the engine's chat messages (`chat_messages`).
    pub fn messages(&self) -> Result<Vec<ChatMessage>, ApiError> {
        chat_messages(&self.messages, &self.images)
    }

    /// The request's tools, checked; `None` when it offers none.
    pub fn tools(&self) -> Result<Option<Tools>, ApiError> {
        let choice = match &self.tool_choice {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => {
                Some(ToolChoice::from_json(v).map_err(|e| ApiError::invalid_param("tool_choice", e.to_string()))?)
            }
        };
        // Checked by the engine at submit (its errors name `tools`, `tool_choice`, `messages`).
        super::offered_tools(self.tools.clone().unwrap_or_default(), choice, self.parallel_tool_calls)
    }

    /// Sampling parameters; with no `max_tokens`, generation may run to `max_model_len`.
    pub fn sampling(&self, max_model_len: usize) -> Result<SamplingParams, ApiError> {
        let mut p = self.common.sampling(self.max_completion_tokens, max_model_len)?;
        if self.logprobs == Some(true) {
            p.logprobs = Some(logprobs_count(self.top_logprobs, "top_logprobs")?.unwrap_or(0));
        } else if self.top_logprobs.is_some() {
            return Err(ApiError::invalid_param("top_logprobs", "top_logprobs needs logprobs=true"));
        }
        p.prompt_logprobs = logprobs_count(self.prompt_logprobs, "prompt_logprobs")?;
        Ok(p)
    }
}
