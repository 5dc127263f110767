//! The responses endpoint's body (`POST /v1/responses`): `input` as text or as items
//! (messages, function calls and their outputs), `instructions`, flat function tools,
//! `text.format`; and how it becomes the engine's chat messages, `Tools` and sampling.
//!
//! Invariants: a `previous_response_id`'s conversation (found by the handler, `crate::stored`)
//! comes before the input, and its `instructions` do not carry over (OpenAI's rule);
//! `item_reference` inputs and `background` are a 400 that says so; every input item becomes
//! one chat message, except that function calls join the assistant turn before them (as chat
//! templates expect one assistant turn with its calls); a field this module does not name is
//! ignored, as the chat endpoint does.

use super::{logprobs_count, Common, JsonSchemaFormat, ResponseFormat};
use crate::error::ApiError;
use crate::media::{image_bytes, Fetched};
use lmplex_core::{FunctionDef, SamplingParams, Tool, ToolCall, ToolChoice, Tools};
use lmplex_engine::{ChatMessage, ContentPart};
use serde::Deserialize;
use serde_json::{Map, Value};

/// The `include` value that asks for the output text's logprobs.
pub const INCLUDE_LOGPROBS: &str = "message.output_text.logprobs";

/// The responses `input`: a user message as text, or a list of input items.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum ResponsesInput {
    /// One user message.
    Text(String),
    /// Messages, `function_call` and `function_call_output` items, in conversation order.
    Items(Vec<Value>),
}

/// `text`: the output's format.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct TextConfig {
    /// `format`: `{"type": "text"}`, `{"type": "json_object"}` or
    /// `{"type": "json_schema", "name", "schema", "strict"}`.
    pub format: Option<TextFormat>,
}

/// `text.format`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct TextFormat {
    /// `text`, `json_object` or `json_schema`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The schema's name (`json_schema`).
    pub name: Option<String>,
    /// The JSON schema the output must match (`json_schema`).
    pub schema: Option<Value>,
}

/// The body of `POST /v1/responses` (build it with [`ResponsesRequest::parse`]).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct ResponsesRequest {
    /// `model`, as for chat; may be left out when the server serves one model.
    #[serde(default, deserialize_with = "super::null_as_empty")]
    pub model: String,
    /// `input`: the conversation.
    pub input: ResponsesInput,
    /// `instructions`: a system message put before the input.
    pub instructions: Option<String>,
    /// `max_output_tokens`: most tokens generated, >= 1; by default up to the context's end.
    #[serde(default, deserialize_with = "super::whole_number")]
    #[schema(minimum = 1)]
    pub max_output_tokens: Option<i64>,
    /// `tools`: function tools, `{"type": "function", "name", "description", "parameters"}`.
    pub tools: Option<Vec<Value>>,
    /// `tool_choice`: `none`, `auto`, `required` or `{"type": "function", "name": ...}`.
    pub tool_choice: Option<Value>,
    /// `parallel_tool_calls`: whether one reply may hold several calls (default true).
    pub parallel_tool_calls: Option<bool>,
    /// `text`: the output format.
    pub text: Option<TextConfig>,
    /// `previous_response_id`: continue that stored response's conversation.
    pub previous_response_id: Option<String>,
    /// `store`: keep the response (default true) for `GET /v1/responses/{id}` and follow-ups.
    pub store: Option<bool>,
    /// `background`: only `false` is accepted.
    pub background: Option<bool>,
    /// `metadata`: echoed in the response.
    pub metadata: Option<Map<String, Value>>,
    /// `user`: echoed in the response.
    pub user: Option<String>,
    /// `include`: `message.output_text.logprobs` asks for logprobs; other values are ignored.
    pub include: Option<Vec<String>>,
    /// `top_logprobs`: alternatives per token (0 to `MAX_LOGPROBS`) when logprobs are included.
    #[serde(default, deserialize_with = "super::whole_number")]
    #[schema(minimum = 0, maximum = 20)]
    pub top_logprobs: Option<i64>,
    /// `truncation`: only `disabled` (the default) is accepted.
    pub truncation: Option<String>,
    /// `temperature`, default 1.
    pub temperature: Option<f32>,
    /// `top_p`, default 1.
    pub top_p: Option<f32>,
    /// vLLM's `top_k`.
    #[serde(default, deserialize_with = "super::whole_number")]
    pub top_k: Option<i64>,
    /// vLLM's `min_p`.
    pub min_p: Option<f32>,
    /// `seed` (an lmplex and vLLM extra here); -1 draws one.
    #[serde(default, deserialize_with = "super::whole_number")]
    pub seed: Option<i64>,
    /// vLLM's `repetition_penalty`.
    pub repetition_penalty: Option<f32>,
    /// `stream`: answer with the Responses stream events.
    pub stream: Option<bool>,
    /// lmplex's routing object (`docs/routing.md`).
    pub lmplex: Option<lmplex_core::Route>,
    /// The shared sampling fields, built from the ones above by `parse`.
    #[serde(skip)]
    pub common: Common,
    /// The conversation of `previous_response_id`, set by the handler that found it.
    #[serde(skip)]
    pub history: Vec<ChatMessage>,
    /// The images fetched for `input_image` parts' `http(s)` URLs (`crate::media`).
    #[serde(skip)]
    pub images: Fetched,
}

fn str_field<'a>(o: &'a Map<String, Value>, key: &str, at: &str) -> Result<&'a str, ApiError> {
    o.get(key).and_then(Value::as_str).ok_or_else(|| bad_input(at, format!("needs a string `{key}`")))
}

fn bad_input(at: &str, what: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_param("input", format!("{at}: {what}"))
}

/// The text of a content given as a string or as a list of text parts.
fn content_text(v: Option<&Value>, at: &str) -> Result<String, ApiError> {
    let parts = content_parts(v, at, &Fetched::default())?;
    if parts.iter().any(|p| matches!(p, ContentPart::Image(_))) {
        return Err(bad_input(at, "an image is not supported here (text only)"));
    }
    Ok(ChatMessage::with_parts("", parts).content)
}

/// A message's content as parts: text, and `input_image` parts whose `image_url` is a `data:` URL
/// or an `http(s)` URL fetched into `images`.
fn content_parts(v: Option<&Value>, at: &str, images: &Fetched) -> Result<Vec<ContentPart>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![ContentPart::Text(s.clone())]),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|p| {
                let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
                match (kind, p.get("text").and_then(Value::as_str), p.get("image_url").and_then(Value::as_str)) {
                    ("input_text" | "output_text" | "text", Some(t), _) => Ok(ContentPart::Text(t.to_string())),
                    ("input_image", _, Some(url)) => image_bytes(url, images)
                        .map(ContentPart::Image)
                        .map_err(|e| bad_input(at, format!("input_image: {e}"))),
                    ("input_image", _, _) => Err(bad_input(
                        at,
                        "an input_image needs its image_url: a data: URL or an http(s) URL (file ids are not read)",
                    )),
                    _ => {
                        Err(bad_input(at, format!("content parts of type '{kind}' are not supported (text or images)")))
                    }
                }
            })
            .collect(),
        Some(_) => Err(bad_input(at, "content must be a string or a list of parts")),
    }
}

impl ResponsesRequest {
    /// Parses a body; what lmplex does not do is a 400 that names it.
    pub fn parse(body: &[u8]) -> Result<Self, ApiError> {
        let mut r: Self = super::parse(body)?;
        if r.background == Some(true) {
            return Err(ApiError::invalid_param("background", "background responses are not supported"));
        }
        if let Some(t) = r.truncation.as_deref().filter(|t| *t != "disabled") {
            return Err(ApiError::invalid_param(
                "truncation",
                format!("only truncation 'disabled' is supported, got '{t}'"),
            ));
        }
        if let Some(n) = r.max_output_tokens.filter(|n| *n < 1) {
            return Err(ApiError::invalid_param(
                "max_output_tokens",
                format!("max_output_tokens must be at least 1, got {n}"),
            ));
        }
        r.common = Common {
            temperature: r.temperature,
            top_p: r.top_p,
            top_k: r.top_k,
            min_p: r.min_p,
            seed: r.seed,
            repetition_penalty: r.repetition_penalty,
            stream: r.stream,
            lmplex: r.lmplex,
            response_format: r.response_format()?,
            ..Common::default()
        };
        Ok(r)
    }

    fn response_format(&self) -> Result<Option<ResponseFormat>, ApiError> {
        let Some(f) = self.text.as_ref().and_then(|t| t.format.as_ref()) else { return Ok(None) };
        if !["text", "json_object", "json_schema"].contains(&f.kind.as_str()) {
            let e = format!("text.format type must be text, json_object or json_schema, got '{}'", f.kind);
            return Err(ApiError::invalid_param("text", e));
        }
        if f.kind == "json_schema" && f.schema.is_none() {
            return Err(ApiError::invalid_param("text", "text.format json_schema needs a schema"));
        }
        let json_schema =
            f.schema.clone().map(|schema| JsonSchemaFormat { name: f.name.clone(), schema: Some(schema) });
        Ok(Some(ResponseFormat { kind: f.kind.clone(), json_schema }))
    }

    /// Whether the reply should carry the output text's logprobs.
    pub fn wants_logprobs(&self) -> bool {
        self.include.iter().flatten().any(|i| i == INCLUDE_LOGPROBS)
    }

    /// The conversation as chat messages: `instructions` first, as a system message, then
    /// `turns`.
    pub fn messages(&self) -> Result<Vec<ChatMessage>, ApiError> {
        let mut out: Vec<ChatMessage> =
            self.instructions.iter().map(|i| ChatMessage::new("system", i.as_str())).collect();
        out.extend(self.turns()?);
        Ok(out)
    }

    /// The previous response's conversation, then the input as chat messages: what a stored
    /// response keeps, with its reply.
    pub fn turns(&self) -> Result<Vec<ChatMessage>, ApiError> {
        let mut out = self.history.clone();
        let items = match &self.input {
            ResponsesInput::Text(t) => {
                out.push(ChatMessage::new("user", t.as_str()));
                return Ok(out);
            }
            ResponsesInput::Items(items) if items.is_empty() => {
                return Err(ApiError::invalid_param("input", "input must not be empty"))
            }
            ResponsesInput::Items(items) => items,
        };
        for (i, item) in items.iter().enumerate() {
            let at = format!("input[{i}]");
            let o = item.as_object().ok_or_else(|| bad_input(&at, "an input item must be an object"))?;
            match o.get("type").and_then(Value::as_str).unwrap_or("message") {
                "message" => {
                    let role = str_field(o, "role", &at)?;
                    out.push(ChatMessage::with_parts(role, content_parts(o.get("content"), &at, &self.images)?));
                }
                "function_call" => {
                    let (id, name) = (str_field(o, "call_id", &at)?, str_field(o, "name", &at)?);
                    let call = ToolCall::new(id, name, str_field(o, "arguments", &at)?);
                    match out.last_mut() {
                        Some(m) if m.role == "assistant" => m.tool_calls.push(call),
                        _ => out.push(ChatMessage { tool_calls: vec![call], ..ChatMessage::new("assistant", "") }),
                    }
                }
                "function_call_output" => {
                    let id = str_field(o, "call_id", &at)?;
                    let text = content_text(o.get("output"), &at)?;
                    out.push(ChatMessage { tool_call_id: Some(id.to_string()), ..ChatMessage::new("tool", text) });
                }
                // A reasoning item carries nothing a chat template takes.
                "reasoning" => {}
                "item_reference" => {
                    return Err(bad_input(
                        &at,
                        "item references are not supported: send the item itself, or previous_response_id",
                    ))
                }
                other => return Err(bad_input(&at, format!("input items of type '{other}' are not supported"))),
            }
        }
        Ok(out)
    }

    /// The request's own `input` as Responses items, oldest first, each with an id (its own, or
    /// a new one): a text is one user message; a message's string content becomes one
    /// `input_text` part (`output_text` for the assistant's). Call after `turns` has checked it.
    pub fn input_items(&self, new_id: impl Fn(&str) -> String) -> Vec<Value> {
        let message = |role: &str, text: &str| {
            let kind = if role == "assistant" { "output_text" } else { "input_text" };
            serde_json::json!({"type": "message", "role": role, "content": [{"type": kind, "text": text}]})
        };
        let items = match &self.input {
            ResponsesInput::Text(t) => vec![message("user", t)],
            ResponsesInput::Items(items) => items
                .iter()
                .map(|item| match item.get("type").and_then(Value::as_str).unwrap_or("message") {
                    "message" => match (item.get("role").and_then(Value::as_str), item.get("content")) {
                        (Some(role), Some(Value::String(text))) => {
                            let mut m = message(role, text);
                            if let Some(id) = item.get("id") {
                                m["id"] = id.clone();
                            }
                            m
                        }
                        _ => {
                            let mut m = item.clone();
                            m["type"] = "message".into();
                            m
                        }
                    },
                    _ => item.clone(),
                })
                .collect(),
        };
        items
            .into_iter()
            .map(|mut item| {
                if item.get("id").and_then(Value::as_str).is_none() {
                    let prefix = match item["type"].as_str() {
                        Some("function_call") => "fc",
                        Some("function_call_output") => "fco",
                        Some("reasoning") => "rs",
                        _ => "msg",
                    };
                    item["id"] = new_id(prefix).into();
                }
                if item["type"] == "message" && item.get("status").is_none() {
                    item["status"] = "completed".into();
                }
                item
            })
            .collect()
    }

    /// The function tools, checked; `None` when none are offered.
    pub fn tools(&self) -> Result<Option<Tools>, ApiError> {
        let choice = match &self.tool_choice {
            None | Some(Value::Null) => None,
            Some(Value::Object(o))
                if o.get("type").and_then(Value::as_str) == Some("function") && o.contains_key("name") =>
            {
                let name = o
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::invalid_param("tool_choice", "tool_choice's `name` must be a string"))?;
                Some(ToolChoice::Function(name.to_string()))
            }
            Some(v) => {
                Some(ToolChoice::from_json(v).map_err(|e| ApiError::invalid_param("tool_choice", e.to_string()))?)
            }
        };
        let tools = self.tools.iter().flatten().enumerate().map(|(i, t)| function_tool(i, t));
        super::offered_tools(tools.collect::<Result<_, _>>()?, choice, self.parallel_tool_calls)
    }

    /// Sampling parameters; with no `max_output_tokens`, generation may run to `max_model_len`.
    pub fn sampling(&self, max_model_len: usize) -> Result<SamplingParams, ApiError> {
        let mut p = self.common.sampling(self.max_output_tokens, max_model_len)?;
        if self.wants_logprobs() {
            p.logprobs = Some(logprobs_count(self.top_logprobs, "top_logprobs")?.unwrap_or(0));
        }
        Ok(p)
    }
}

/// A Responses function tool (`{"type": "function", "name", ...}`, flat) as the engine's `Tool`.
fn function_tool(i: usize, t: &Value) -> Result<Tool, ApiError> {
    let bad = |what: String| ApiError::invalid_param("tools", format!("tools[{i}]: {what}"));
    let o = t.as_object().ok_or_else(|| bad("a tool must be an object".into()))?;
    match o.get("type").and_then(Value::as_str) {
        Some("function") => {}
        Some(other) => return Err(bad(format!("tools of type '{other}' are not supported (function only)"))),
        None => return Err(bad("a tool needs a `type`".into())),
    }
    // The chat shape (`function: {...}`) is accepted too.
    let f = o.get("function").and_then(Value::as_object).unwrap_or(o);
    let name =
        f.get("name").and_then(Value::as_str).ok_or_else(|| bad("a function tool needs a string `name`".into()))?;
    let function = FunctionDef {
        name: name.to_string(),
        description: f.get("description").and_then(Value::as_str).map(str::to_string),
        parameters: f.get("parameters").filter(|p| !p.is_null()).cloned(),
        strict: f.get("strict").and_then(Value::as_bool),
    };
    Ok(Tool { kind: "function".into(), function })
}
