//! Anthropic's Messages body (`POST /v1/messages`, `/v1/messages/count_tokens`): `system`,
//! `messages` of text, `image` (base64 or URL), `tool_use` and `tool_result` blocks, `tools` with an `input_schema`,
//! `tool_choice`, `stop_sequences`, sampling; and how it becomes the engine's chat messages,
//! `Tools` and sampling.
//!
//! Invariants: every message becomes one chat turn, except that a user message's
//! `tool_result` blocks become `tool` turns (one per block, in order, before the message's
//! text) and an assistant message's `tool_use` blocks become that turn's tool calls; a user
//! message's `image` blocks become image parts (a text model refuses them); content lmplex
//! cannot show a model (documents, thinking) is a 400 that names its block;
//! a field this module does not name is ignored, as Anthropic's API does for unknown fields.

use super::{Common, StopInput};
use crate::error::ApiError;
use crate::media::{image_bytes, Fetched};
use lmplex_core::{FunctionDef, SamplingParams, Tool, ToolCall, ToolChoice, Tools};
use lmplex_engine::{ChatMessage, ContentPart};
use serde::Deserialize;
use serde_json::{Map, Value};

/// The body of `POST /v1/messages` (build it with [`MessagesRequest::parse`]); `count_tokens`
/// takes the same body without `max_tokens`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct MessagesRequest {
    /// `model`: a served model, or routed (`lmplex:auto`, `tier:NAME`).
    #[serde(default, deserialize_with = "super::null_as_empty")]
    pub model: String,
    /// `messages`: alternating `user` and `assistant` turns.
    #[schema(min_items = 1)]
    pub messages: Vec<AnthropicMessage>,
    /// `system`: a string or a list of text blocks, put first as a system turn.
    pub system: Option<Value>,
    /// `max_tokens`: most tokens generated, >= 1 (required by `/v1/messages`).
    #[serde(default, deserialize_with = "super::whole_number")]
    #[schema(minimum = 1)]
    pub max_tokens: Option<i64>,
    /// `stop_sequences`: strings that end the output (not included in it).
    pub stop_sequences: Option<Vec<String>>,
    /// `temperature`, in [0, 1] at Anthropic; default 1.
    pub temperature: Option<f32>,
    /// `top_p`; default 1 (off).
    pub top_p: Option<f32>,
    /// `top_k`; default off.
    #[serde(default, deserialize_with = "super::whole_number")]
    pub top_k: Option<i64>,
    /// `tools`: `{"name", "description", "input_schema"}` each.
    pub tools: Option<Vec<Value>>,
    /// `tool_choice`: `{"type": "auto" | "any" | "tool" | "none", "name", "disable_parallel_tool_use"}`.
    pub tool_choice: Option<Value>,
    /// `metadata`: accepted (`user_id`); nothing is kept.
    pub metadata: Option<Map<String, Value>>,
    /// `thinking`: `{"type": "enabled", "budget_tokens": N}` or `{"type": "disabled"}`, a
    /// reasoning model's switch (the template's `enable_thinking`; the budget is not enforced).
    pub thinking: Option<Value>,
    /// `stream`: answer with the Messages stream events.
    pub stream: Option<bool>,
    /// lmplex's routing object (`docs/routing.md`).
    pub lmplex: Option<lmplex_core::Route>,
    /// The shared sampling fields, built from the ones above by `parse`.
    #[serde(skip)]
    pub common: Common,
    /// The images fetched for `url` image sources (`crate::media`); not a field of the body.
    #[serde(skip)]
    pub images: Fetched,
}

/// One turn of `messages`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct AnthropicMessage {
    /// `user` or `assistant`.
    #[schema(pattern = "^(user|assistant)$")]
    pub role: String,
    /// A string, or a list of content blocks.
    pub content: Value,
}

/// An `image` block's bytes: its `source` is `{"type": "base64", "media_type": "image/...",
/// "data": ...}`, or `{"type": "url", "url": ...}` with the URL's image fetched into `images`.
fn image_block(
    source: Option<&Value>,
    images: &Fetched,
    at: &dyn Fn(String) -> ApiError,
) -> Result<std::sync::Arc<[u8]>, ApiError> {
    let s = source.and_then(Value::as_object).ok_or_else(|| at("an image block needs its `source` object".into()))?;
    let get = |k: &str| s.get(k).and_then(Value::as_str);
    match get("type") {
        Some("base64") => {
            let media = get("media_type").unwrap_or("image/png");
            let data = get("data").ok_or_else(|| at("a base64 image source needs a string `data`".into()))?;
            image_bytes(&format!("data:{media};base64,{data}"), images).map_err(|e| at(format!("image: {e}")))
        }
        Some("url") => {
            let url = get("url").ok_or_else(|| at("a url image source needs a string `url`".into()))?;
            image_bytes(url, images).map_err(|e| at(format!("image: {e}")))
        }
        other => Err(at(format!("an image source's type must be 'base64' or 'url', got {other:?}"))),
    }
}

fn bad_message(i: usize, what: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_param("messages", format!("messages[{i}]: {what}"))
}

/// The text of `system` or of a `tool_result`'s content: a string or a list of text blocks.
fn text_of(v: &Value, at: &dyn Fn(String) -> ApiError) -> Result<String, ApiError> {
    match v {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut s = String::new();
            for b in blocks {
                match (b.get("type").and_then(Value::as_str), b.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => s.push_str(t),
                    (Some("text"), None) => return Err(at("a text block needs a string `text`".into())),
                    (kind, _) => {
                        return Err(at(format!(
                            "blocks of type '{}' are not supported here (text only)",
                            kind.unwrap_or("")
                        )))
                    }
                }
            }
            Ok(s)
        }
        _ => Err(at("content must be a string or a list of blocks".into())),
    }
}

impl MessagesRequest {
    /// Parses a body; `max_tokens` is required when `generating` (not for `count_tokens`).
    pub fn parse(body: &[u8], generating: bool) -> Result<Self, ApiError> {
        let mut r: Self = super::parse(body)?;
        match r.max_tokens {
            None if generating => return Err(ApiError::invalid_param("max_tokens", "max_tokens: Field required")),
            Some(n) if n < 1 => {
                return Err(ApiError::invalid_param("max_tokens", format!("max_tokens must be at least 1, got {n}")))
            }
            _ => {}
        }
        if r.messages.is_empty() {
            return Err(ApiError::invalid_param("messages", "messages must not be empty"));
        }
        let stop = r.stop_sequences.clone().filter(|s| !s.is_empty()).map(StopInput::Many);
        r.common = Common {
            temperature: r.temperature,
            top_p: r.top_p,
            top_k: r.top_k,
            stop,
            stream: r.stream,
            lmplex: r.lmplex,
            ..Common::default()
        };
        Ok(r)
    }

    /// The conversation as chat messages: `system` first.
    pub fn messages(&self) -> Result<Vec<ChatMessage>, ApiError> {
        let mut out = Vec::new();
        if let Some(system) = &self.system {
            let text = text_of(system, &|e| ApiError::invalid_param("system", format!("system: {e}")))?;
            out.push(ChatMessage::new("system", text));
        }
        for (i, m) in self.messages.iter().enumerate() {
            if m.role != "user" && m.role != "assistant" {
                return Err(bad_message(i, format!("role must be 'user' or 'assistant', got '{}'", m.role)));
            }
            let blocks = match &m.content {
                Value::String(s) => {
                    out.push(ChatMessage::new(m.role.as_str(), s.as_str()));
                    continue;
                }
                Value::Array(blocks) => blocks,
                _ => return Err(bad_message(i, "content must be a string or a list of blocks")),
            };
            let mut turn = ChatMessage::new(m.role.as_str(), "");
            // The turn's text and images in order, for a vision-language model's template.
            let mut parts = Vec::new();
            for (j, b) in blocks.iter().enumerate() {
                let at = |what: String| bad_message(i, format!("content[{j}]: {what}"));
                let o = b.as_object().ok_or_else(|| at("a content block must be an object".into()))?;
                let field =
                    |key: &str| o.get(key).and_then(Value::as_str).ok_or_else(|| at(format!("needs a string `{key}`")));
                let kind = o.get("type").and_then(Value::as_str).unwrap_or("");
                match (kind, m.role.as_str()) {
                    ("text", _) => {
                        turn.content.push_str(field("text")?);
                        parts.push(ContentPart::Text(field("text")?.to_string()));
                    }
                    ("image", "user") => {
                        parts.push(ContentPart::Image(image_block(o.get("source"), &self.images, &at)?))
                    }
                    ("tool_use", "assistant") => {
                        let input = o.get("input").cloned().unwrap_or(Value::Object(Map::new()));
                        turn.tool_calls.push(ToolCall::new(field("id")?, field("name")?, input.to_string()));
                    }
                    ("tool_result", "user") => {
                        let mut text = text_of(o.get("content").unwrap_or(&Value::Null), &at)?;
                        if o.get("is_error").and_then(Value::as_bool) == Some(true) {
                            text = format!("Error: {text}");
                        }
                        let id = field("tool_use_id")?.to_string();
                        out.push(ChatMessage { tool_call_id: Some(id), ..ChatMessage::new("tool", text) });
                    }
                    // Earlier reasoning is not shown to the model again (as the templates do).
                    ("thinking" | "redacted_thinking", "assistant") => {}
                    ("tool_use" | "tool_result", role) => {
                        return Err(at(format!("a {kind} block cannot be in a {role} message")))
                    }
                    _ => {
                        return Err(at(format!(
                            "content blocks of type '{kind}' are not supported (text, image and tools)"
                        )))
                    }
                }
            }
            if parts.iter().any(|p| matches!(p, ContentPart::Image(_))) {
                turn = ChatMessage { tool_calls: turn.tool_calls, ..ChatMessage::with_parts(m.role.as_str(), parts) };
            }
            if !turn.content.is_empty() || !turn.tool_calls.is_empty() || !turn.parts.is_empty() {
                out.push(turn);
            }
        }
        Ok(out)
    }

    /// The tools, checked; `None` when none are offered.
    pub fn tools(&self) -> Result<Option<Tools>, ApiError> {
        let bad = |what: String| ApiError::invalid_param("tool_choice", what);
        let (choice, parallel) = match &self.tool_choice {
            None | Some(Value::Null) => (None, None),
            Some(Value::Object(o)) => {
                let parallel = o.get("disable_parallel_tool_use").and_then(Value::as_bool).map(|d| !d);
                let choice = match o.get("type").and_then(Value::as_str) {
                    Some("auto") => ToolChoice::Auto,
                    Some("any") => ToolChoice::Required,
                    Some("none") => ToolChoice::None,
                    Some("tool") => match o.get("name").and_then(Value::as_str) {
                        Some(name) => ToolChoice::Function(name.to_string()),
                        None => return Err(bad("tool_choice of type 'tool' needs a string `name`".into())),
                    },
                    other => {
                        let e = format!("tool_choice type must be auto, any, tool or none, got {other:?}");
                        return Err(bad(e));
                    }
                };
                (Some(choice), parallel)
            }
            Some(_) => return Err(bad("tool_choice must be an object".into())),
        };
        let tools = self.tools.iter().flatten().enumerate().map(|(i, t)| tool(i, t));
        super::offered_tools(tools.collect::<Result<_, _>>()?, choice, parallel)
    }

    /// The chat template's variables `thinking` sets: `enable_thinking`, or none.
    pub fn chat_template_kwargs(&self) -> Result<lmplex_engine::ChatTemplateKwargs, ApiError> {
        let mut kwargs = lmplex_engine::ChatTemplateKwargs::new();
        let on = match self.thinking.as_ref().map(|t| t.get("type").and_then(Value::as_str)) {
            None => return Ok(kwargs),
            Some(Some("enabled")) => true,
            Some(Some("disabled")) => false,
            Some(other) => {
                let e = format!("thinking type must be 'enabled' or 'disabled', got {other:?}");
                return Err(ApiError::invalid_param("thinking", e));
            }
        };
        kwargs.insert("enable_thinking".into(), Value::Bool(on));
        Ok(kwargs)
    }

    /// Sampling parameters (`/v1/messages` requires `max_tokens`; the context's end otherwise).
    pub fn sampling(&self, max_model_len: usize) -> Result<SamplingParams, ApiError> {
        self.common.sampling(self.max_tokens, max_model_len)
    }

    /// The prompt's token count on `tokenizer`, as a call would run it (`count_tokens`).
    pub fn count_tokens(&self, tokenizer: &lmplex_engine::Tokenizer) -> Result<usize, ApiError> {
        // `tool_choice: none` hides the tools from the model, as the engine does.
        let shown = self.tools()?.filter(|t| t.tool_choice != ToolChoice::None);
        let tools: Vec<Tool> = shown.map(|t| t.tools).unwrap_or_default();
        let text =
            tokenizer.apply_chat_template_with(&self.messages()?, &tools, true, &self.chat_template_kwargs()?)?;
        Ok(tokenizer.encode(&text, false)?.len())
    }
}

/// An Anthropic tool (`{"name", "description", "input_schema"}`) as the engine's `Tool`.
fn tool(i: usize, t: &Value) -> Result<Tool, ApiError> {
    let bad = |what: String| ApiError::invalid_param("tools", format!("tools[{i}]: {what}"));
    let o = t.as_object().ok_or_else(|| bad("a tool must be an object".into()))?;
    if let Some(kind) = o.get("type").and_then(Value::as_str).filter(|k| *k != "custom") {
        return Err(bad(format!("tools of type '{kind}' are not supported (client tools only)")));
    }
    let name = o.get("name").and_then(Value::as_str).ok_or_else(|| bad("a tool needs a string `name`".into()))?;
    let schema = o
        .get("input_schema")
        .filter(|s| s.is_object())
        .ok_or_else(|| bad("a tool needs an `input_schema` object".into()))?;
    let function = FunctionDef {
        name: name.to_string(),
        description: o.get("description").and_then(Value::as_str).map(str::to_string),
        parameters: Some(schema.clone()),
        strict: None,
    };
    Ok(Tool { kind: "function".into(), function })
}
