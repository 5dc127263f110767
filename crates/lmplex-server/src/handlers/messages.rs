//! `POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic's Messages API over the
//! chat path. The body becomes chat messages and tools (`api::MessagesRequest`), runs through
//! the same submit path as chat (auth, routing, its `url` image sources fetched once the call is
//! authorized: `media`, quotas, the engine), and the chunks become content blocks (`Blocks`),
//! answered whole or as the Messages stream events. `count_tokens` fetches no image: it checks
//! each URL as a fetch would and counts the template's image marker (`media`).
//!
//! Invariants: the key is read from `x-api-key` or `Authorization: Bearer`, as everywhere;
//! every error is in Anthropic's shape (`ApiError::into_anthropic`), counted once; a stream is
//! `message_start`, `ping`, each block's `content_block_start`, deltas and
//! `content_block_stop`, then `message_delta` (the stop reason and output tokens) and
//! `message_stop`, or an `error` event when the engine fails mid-way; a client that goes away
//! drops the request, which the engine then aborts. A reasoning model's reasoning is a
//! `thinking` block before the others (its `signature` empty: lmplex signs nothing).

use crate::api::MessagesRequest;
use crate::caller::caller;
use crate::error::ApiError;
use crate::media::{check_images, ImageLimit};
use crate::outcomes::{count_error, Running, Tracker};
use crate::replies::InputTokens;
use crate::replies::{AnthropicErrorBody, AnthropicMessageReply, SseEvent};
use crate::reply::{add_headers, sse_response};
use crate::state::AppState;
use crate::submit::{named_engine, submit};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use lmplex_core::{FinishReason, StopReason, StreamChunk, ToolCall};
use lmplex_engine::RequestHandle;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

/// Counts a failed request and answers it in Anthropic's shape.
fn fail(st: &AppState, model: &str, tenant: &str, e: ApiError) -> Response {
    count_error(st, model, tenant, &e);
    e.into_anthropic()
}

/// The handler: authenticate, parse, submit one request, answer whole or streamed.
#[utoipa::path(post, path = "/v1/messages", tag = "anthropic", request_body = MessagesRequest, responses(
    (status = 200, description = "The message, or its server-sent events with `stream`",
        content((AnthropicMessageReply = "application/json"), (SseEvent = "text/event-stream"))),
    (status = "4XX", description = "An error in Anthropic's shape", body = AnthropicErrorBody),
    (status = "5XX", description = "An error in Anthropic's shape", body = AnthropicErrorBody),
))]
pub(crate) async fn create(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    let start = Instant::now();
    let tenant = match caller(&st, &headers) {
        Ok(t) => t,
        Err(e) => return fail(&st, "", "", e),
    };
    let mut req = match MessagesRequest::parse(&body, true) {
        Ok(r) => r,
        Err(e) => return fail(&st, "", tenant.name(), e),
    };
    let (call, handle) = match submit(&st, &mut req, tenant.clone(), start).await {
        Ok((call, handles)) => match handles.into_iter().next() {
            Some(h) => (call, h),
            None => return fail(&st, &call.model, tenant.name(), ApiError::invalid("the request made no prompt")),
        },
        Err((model, e)) => return fail(&st, &model, tenant.name(), e),
    };
    let id = st.new_id("msg_");
    tracing::debug!(model = %call.model, message_id = %id, "generating");
    let mut r =
        if req.common.stream() { sse(st.clone(), &call, id, handle) } else { whole(&st, &call, id, handle).await };
    add_headers(&mut r, &call);
    r
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens"}`, the prompt as a call would run it on
/// the named model (no quota is charged and nothing runs).
#[utoipa::path(post, path = "/v1/messages/count_tokens", tag = "anthropic", request_body = MessagesRequest, responses(
    (status = 200, body = InputTokens),
    (status = "4XX", description = "An error in Anthropic's shape", body = AnthropicErrorBody),
    (status = "5XX", description = "An error in Anthropic's shape", body = AnthropicErrorBody),
))]
pub(crate) async fn count_tokens(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    let tenant = match caller(&st, &headers) {
        Ok(t) => t,
        Err(e) => return fail(&st, "", "", e),
    };
    let mut req = match MessagesRequest::parse(&body, false) {
        Ok(r) => r,
        Err(e) => return fail(&st, "", tenant.name(), e),
    };
    let what = "/v1/messages/count_tokens";
    let (model, engine) = match named_engine(&st, &tenant, &req.model, what).await {
        Ok(found) => found,
        Err((m, e)) => return fail(&st, &m, tenant.name(), e),
    };
    let limit = ImageLimit { most: engine.config().limit_mm_per_prompt.image, of: format!("the model '{model}'") };
    if let Err(e) = check_images(&st.media, &mut req, &limit) {
        return fail(&st, &model, tenant.name(), e);
    }
    match req.count_tokens(engine.tokenizer()) {
        Ok(n) => Json(InputTokens { input_tokens: n }).into_response(),
        Err(e) => fail(&st, &model, tenant.name(), e),
    }
}

/// The reply's content blocks as they are built: the reasoning and text so far, the tool calls.
struct Blocks {
    thinking: String,
    text: String,
    calls: Vec<ToolCall>,
    /// The last chunk's finish and stop reasons, and its output token count.
    finish: Option<(FinishReason, Option<StopReason>)>,
    output_tokens: usize,
    /// The last chunk's usage.
    usage: Option<lmplex_core::Usage>,
}

impl Blocks {
    fn new() -> Self {
        let (thinking, text, calls) = (String::new(), String::new(), Vec::new());
        Self { thinking, text, calls, finish: None, output_tokens: 0, usage: None }
    }

    fn add(&mut self, c: &StreamChunk) {
        self.thinking.push_str(&c.reasoning);
        self.text.push_str(&c.text);
        self.calls.extend(c.tool_calls.iter().cloned());
        self.output_tokens += c.token_ids.len();
        if let Some(f) = c.finish_reason {
            self.finish = Some((f, c.stop_reason.clone()));
        }
        if let Some(u) = c.usage {
            self.output_tokens = u.completion_tokens;
            self.usage = Some(u);
        }
    }

    /// Anthropic's `usage` at the end: `input_tokens` are the prompt tokens neither read from
    /// the prefix cache nor written to it, so the three input counts add up to the prompt.
    fn usage(&self, prompt_tokens: usize) -> Value {
        let u = self.usage.unwrap_or(lmplex_core::Usage { prompt_tokens, ..Default::default() });
        let (read, created) = (u.cached_tokens, u.cache_created_tokens);
        json!({
            "input_tokens": u.prompt_tokens.saturating_sub(read + created),
            "output_tokens": self.output_tokens,
            "cache_read_input_tokens": read,
            "cache_creation_input_tokens": created,
        })
    }

    /// `stop_reason` and `stop_sequence`, Anthropic's way.
    fn stop(&self) -> (&'static str, Option<String>) {
        match &self.finish {
            Some((FinishReason::ToolCalls, _)) => ("tool_use", None),
            Some((FinishReason::Length, _)) => ("max_tokens", None),
            Some((_, Some(StopReason::String(s)))) => ("stop_sequence", Some(s.clone())),
            _ => ("end_turn", None),
        }
    }
}

/// A tool call as a `tool_use` block (its arguments parsed back into the `input` object).
fn tool_use(call: &ToolCall) -> Value {
    let input: Value = serde_json::from_str(&call.function.arguments).unwrap_or_else(|_| json!({}));
    json!({"type": "tool_use", "id": call.id, "name": call.function.name, "input": input})
}

/// The message object: `content` empty until the end when `streaming`.
fn message(id: &str, model: &str, content: Vec<Value>, stop: (Option<&str>, Option<String>), usage: Value) -> Value {
    json!({
        "id": id, "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": stop.0, "stop_sequence": stop.1, "usage": usage,
    })
}

/// Collects every chunk into one message.
async fn whole(st: &Arc<AppState>, call: &Running, id: String, mut h: RequestHandle) -> Response {
    let mut tracker = Tracker::new(st, call);
    let mut b = Blocks::new();
    let input_tokens = h.num_prompt_tokens();
    while let Some(c) = h.next().await {
        match c {
            Ok(c) => {
                tracker.chunk(&c);
                b.add(&c);
            }
            Err(e) => {
                tracker.counted(); // counted once, by `fail`
                return fail(st, &call.model, call.tenant.name(), e.into());
            }
        }
    }
    let mut content = Vec::new();
    if !b.thinking.is_empty() {
        content.push(json!({"type": "thinking", "thinking": b.thinking, "signature": ""}));
    }
    if !b.text.is_empty() || b.calls.is_empty() {
        content.push(json!({"type": "text", "text": b.text}));
    }
    content.extend(b.calls.iter().map(tool_use));
    let (reason, sequence) = b.stop();
    let usage = b.usage(input_tokens);
    Json(message(&id, &call.model, content, (Some(reason), sequence), usage)).into_response()
}

/// Sends the stream's events into the response body's channel.
struct Emitter {
    tx: tokio::sync::mpsc::Sender<Event>,
    /// The open `thinking` or `text` block: its index and type; and the next block's index.
    open: Option<(usize, &'static str)>,
    next: usize,
}

impl Emitter {
    /// Sends one event named by its `type`; false when the client has gone.
    async fn send(&self, v: Value) -> bool {
        let kind = v["type"].as_str().unwrap_or("message").to_string();
        self.tx.send(Event::default().event(kind).data(v.to_string())).await.is_ok()
    }

    /// Closes the open block, if any (a `thinking` block gets its empty `signature` first).
    async fn close(&mut self) -> bool {
        match self.open.take() {
            Some((index, kind)) => {
                let signed = kind != "thinking" || {
                    let delta = json!({"type": "signature_delta", "signature": ""});
                    self.send(json!({"type": "content_block_delta", "index": index, "delta": delta})).await
                };
                signed && self.send(json!({"type": "content_block_stop", "index": index})).await
            }
            None => true,
        }
    }

    /// The open block of type `kind` (`thinking` or `text`), opened after closing another one.
    async fn block(&mut self, kind: &'static str) -> Option<usize> {
        if let Some((i, k)) = self.open {
            if k == kind {
                return Some(i);
            }
        }
        if !self.close().await {
            return None;
        }
        let i = self.next;
        self.next += 1;
        self.open = Some((i, kind));
        let block = if kind == "thinking" {
            json!({"type": "thinking", "thinking": "", "signature": ""})
        } else {
            json!({"type": "text", "text": ""})
        };
        self.send(json!({"type": "content_block_start", "index": i, "content_block": block})).await.then_some(i)
    }

    /// The chunk's reasoning and text (each in its open block) and its tool calls (one block each).
    async fn chunk(&mut self, c: &StreamChunk) -> bool {
        for (kind, text, delta_kind, field) in
            [("thinking", &c.reasoning, "thinking_delta", "thinking"), ("text", &c.text, "text_delta", "text")]
        {
            if text.is_empty() {
                continue;
            }
            let Some(index) = self.block(kind).await else { return false };
            let delta = json!({"type": delta_kind, field: text});
            if !self.send(json!({"type": "content_block_delta", "index": index, "delta": delta})).await {
                return false;
            }
        }
        for call in &c.tool_calls {
            let (i, mut block) = (self.next, tool_use(call));
            self.next += 1;
            block["input"] = json!({});
            let delta = json!({"type": "input_json_delta", "partial_json": call.function.arguments});
            let ok = self.close().await
                && self.send(json!({"type": "content_block_start", "index": i, "content_block": block})).await
                && self.send(json!({"type": "content_block_delta", "index": i, "delta": delta})).await
                && self.send(json!({"type": "content_block_stop", "index": i})).await;
            if !ok {
                return false;
            }
        }
        true
    }
}

/// Streams the message as the Messages API's server-sent events.
fn sse(st: Arc<AppState>, call: &Running, id: String, mut h: RequestHandle) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(64);
    let mut tracker = Tracker::new(&st, call);
    let (model, tenant) = (call.model.clone(), call.tenant.name().to_string());
    let input_tokens = h.num_prompt_tokens();
    tokio::spawn(async move {
        let mut em = Emitter { tx, open: None, next: 0 };
        let usage = json!({"input_tokens": input_tokens, "output_tokens": 0});
        let start = message(&id, &model, Vec::new(), (None, None), usage);
        if !(em.send(json!({"type": "message_start", "message": start})).await
            && em.send(json!({"type": "ping"})).await)
        {
            return;
        }
        let mut b = Blocks::new();
        while let Some(c) = h.next().await {
            match c {
                Ok(c) => {
                    tracker.chunk(&c);
                    b.add(&c);
                    if !em.chunk(&c).await {
                        return; // client gone: dropping `h` aborts the request
                    }
                }
                Err(e) => {
                    let e = ApiError::from(e);
                    count_error(&st, &model, &tenant, &e);
                    tracker.counted();
                    em.send(json!({"type": "error", "error": {"type": "api_error", "message": e.message}})).await;
                    return;
                }
            }
        }
        if b.text.is_empty() && b.calls.is_empty() && em.block("text").await.is_none() {
            return; // an empty answer still has its (empty) text block, as in the whole message
        }
        let (reason, sequence) = b.stop();
        let delta = json!({"stop_reason": reason, "stop_sequence": sequence});
        let _ = em.close().await
            && em.send(json!({"type": "message_delta", "delta": delta, "usage": b.usage(input_tokens)})).await
            && em.send(json!({"type": "message_stop"})).await;
    });
    sse_response(rx)
}
