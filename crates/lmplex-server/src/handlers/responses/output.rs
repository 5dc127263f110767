//! The Responses API's JSON: the response object (`Head`) and its output items as the
//! engine's chunks arrive (`Output`), with the stream events that build them. Pure functions
//! of the chunks; no I/O.
//!
//! Invariants: one `Output` makes both the streamed events and the whole reply, so the events
//! build exactly the non-streamed output; text opens a `message` item that stays open until a
//! tool call or the end closes it; each tool call is one `function_call` item, sent whole
//! (added, its arguments in one delta, done); a reasoning model's reasoning is one `reasoning`
//! item (its text in one `reasoning_text` part) before the others, closed when anything else
//! starts; a reply with neither text nor calls still has one (empty) message, so `output_text`
//! reads `""`; items are numbered by their output index.

use crate::api::ResponsesRequest;
use crate::render::token_logprob;
use lmplex_core::{FinishReason, StreamChunk, ToolCall, Usage};
use lmplex_engine::ChatMessage;
use serde_json::{json, Value};

/// What every response object of one call shares: the id and the request's settings.
pub struct Head {
    /// `resp_...`, the same in every event.
    pub id: String,
    base: Value,
}

impl Head {
    /// The response object's fixed fields for `req` run on `model`.
    /// `store` says whether it is kept (`crate::stored`).
    pub fn new(id: String, created_at: u64, model: &str, req: &ResponsesRequest, store: bool) -> Self {
        let format = req.text.as_ref().and_then(|t| t.format.as_ref()).map_or(json!({"type": "text"}), |f| {
            let mut v = json!({"type": f.kind});
            if let Some(s) = &f.schema {
                v["name"] = json!(f.name);
                v["schema"] = s.clone();
            }
            v
        });
        let base = json!({
            "id": id, "object": "response", "created_at": created_at, "model": model,
            "error": null, "incomplete_details": null,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "tools": req.tools.clone().unwrap_or_default(),
            "tool_choice": req.tool_choice.clone().unwrap_or_else(|| json!("auto")),
            "parallel_tool_calls": req.parallel_tool_calls.unwrap_or(true),
            "temperature": req.temperature.unwrap_or(1.0), "top_p": req.top_p.unwrap_or(1.0),
            "top_logprobs": req.top_logprobs, "text": {"format": format},
            "metadata": req.metadata.clone().unwrap_or_default(), "user": req.user,
            "store": store, "previous_response_id": req.previous_response_id, "reasoning": null,
            "truncation": "disabled",
            "output": [], "usage": null,
        });
        Self { id, base }
    }

    /// The response object with `status` (`in_progress`, `completed`, `incomplete`, `failed`).
    pub fn object(&self, status: &str, out: Option<&Output>) -> Value {
        let mut v = self.base.clone();
        v["status"] = json!(status);
        if let Some(out) = out {
            v["output"] = json!(out.items);
            v["usage"] = usage_json(out.usage);
            if status == "incomplete" {
                v["incomplete_details"] = json!({"reason": "max_output_tokens"});
            }
        }
        v
    }

    /// The final response object: `completed`, or `incomplete` when `max_output_tokens` cut it.
    pub fn done(&self, out: &Output) -> Value {
        self.object(out.status(), Some(out))
    }
}

fn usage_json(u: Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "total_tokens": u.total_tokens(),
    })
}

/// The message item being written.
struct Open {
    id: String,
    text: String,
    logprobs: Vec<Value>,
}

/// One response's output items, built from the engine's chunks.
pub struct Output {
    /// The response id's suffix, which item ids carry.
    tag: String,
    /// The finished items.
    items: Vec<Value>,
    open: Option<Open>,
    /// The reasoning item being written: its id and text.
    reasoning: Option<(String, String)>,
    /// The reply as one assistant turn: its text and calls (what a follow-up continues).
    reply: ChatMessage,
    finish: Option<FinishReason>,
    usage: Usage,
}

fn message_item(id: &str, status: &str, content: Vec<Value>) -> Value {
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

fn text_part(text: &str, logprobs: &[Value]) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs})
}

fn reasoning_item(id: &str, status: &str, text: &str) -> Value {
    let content = if text.is_empty() { json!([]) } else { json!([{"type": "reasoning_text", "text": text}]) };
    json!({"type": "reasoning", "id": id, "status": status, "summary": [], "content": content})
}

fn call_item(id: &str, status: &str, call: &ToolCall, arguments: &str) -> Value {
    json!({
        "type": "function_call", "id": id, "call_id": call.id, "name": call.function.name,
        "arguments": arguments, "status": status,
    })
}

impl Output {
    /// An empty output for the response `response_id`.
    pub fn new(response_id: &str) -> Self {
        let tag = response_id.trim_start_matches("resp_").to_string();
        let reply = ChatMessage::new("assistant", "");
        Self { tag, items: Vec::new(), open: None, reasoning: None, reply, finish: None, usage: Usage::default() }
    }

    /// `completed`, or `incomplete` when the output hit `max_output_tokens`.
    pub fn status(&self) -> &'static str {
        if self.finish == Some(FinishReason::Length) {
            "incomplete"
        } else {
            "completed"
        }
    }

    /// Adds one chunk; pushes the stream events it makes (without `sequence_number`) to `ev`.
    pub fn add(&mut self, c: &StreamChunk, ev: &mut Vec<Value>) {
        if !c.reasoning.is_empty() {
            let index = self.items.len();
            let tag = &self.tag;
            let (id, text) = self.reasoning.get_or_insert_with(|| {
                let id = format!("rs_{tag}_{index}");
                let item = reasoning_item(&id, "in_progress", "");
                ev.push(json!({"type": "response.output_item.added", "output_index": index, "item": item}));
                (id, String::new())
            });
            text.push_str(&c.reasoning);
            ev.push(json!({
                "type": "response.reasoning_text.delta", "item_id": id, "output_index": index,
                "content_index": 0, "delta": c.reasoning,
            }));
        }
        if !c.text.is_empty() || !c.tool_calls.is_empty() || c.finish_reason.is_some() {
            self.close_reasoning(ev);
        }
        self.reply.content.push_str(&c.text);
        self.reply.tool_calls.extend(c.tool_calls.iter().cloned());
        if !c.text.is_empty() {
            let lps: Vec<Value> = c.logprobs.iter().flatten().map(|t| json!(token_logprob(t))).collect();
            let index = self.items.len();
            let m = self.open(ev);
            m.text.push_str(&c.text);
            m.logprobs.extend(lps.iter().cloned());
            ev.push(json!({
                "type": "response.output_text.delta", "item_id": m.id, "output_index": index,
                "content_index": 0, "delta": c.text, "logprobs": lps,
            }));
        }
        for call in &c.tool_calls {
            self.close("completed", ev);
            let index = self.items.len();
            let id = format!("fc_{}_{index}", self.tag);
            let args = &call.function.arguments;
            ev.push(json!({"type": "response.output_item.added", "output_index": index, "item": call_item(&id, "in_progress", call, "")}));
            ev.push(json!({"type": "response.function_call_arguments.delta", "item_id": id, "output_index": index, "delta": args}));
            ev.push(json!({
                "type": "response.function_call_arguments.done", "item_id": id, "output_index": index,
                "name": call.function.name, "arguments": args,
            }));
            let item = call_item(&id, "completed", call, args);
            ev.push(json!({"type": "response.output_item.done", "output_index": index, "item": item}));
            self.items.push(item);
        }
        if c.finish_reason.is_some() {
            self.finish = c.finish_reason;
        }
        if let Some(u) = c.usage {
            self.usage = u;
        }
    }

    /// The reply as one assistant turn (text and tool calls; no reasoning, which chat templates
    /// leave out of earlier turns).
    pub fn reply(&self) -> ChatMessage {
        self.reply.clone()
    }

    /// Closes the output after the last chunk (an empty reply gets one empty message).
    pub fn finish(&mut self, ev: &mut Vec<Value>) {
        self.close_reasoning(ev);
        if self.items.iter().all(|i| i["type"] == "reasoning") {
            self.open(ev);
        }
        let status = if self.status() == "incomplete" { "incomplete" } else { "completed" };
        self.close(status, ev);
    }

    /// Closes the reasoning item, if one is open.
    fn close_reasoning(&mut self, ev: &mut Vec<Value>) {
        let Some((id, text)) = self.reasoning.take() else { return };
        let index = self.items.len();
        ev.push(json!({
            "type": "response.reasoning_text.done", "item_id": id, "output_index": index,
            "content_index": 0, "text": text,
        }));
        let item = reasoning_item(&id, "completed", &text);
        ev.push(json!({"type": "response.output_item.done", "output_index": index, "item": item}));
        self.items.push(item);
    }

    /// The open message, opened (item and text part added) if none is.
    fn open(&mut self, ev: &mut Vec<Value>) -> &mut Open {
        let index = self.items.len();
        let tag = &self.tag;
        self.open.get_or_insert_with(|| {
            let id = format!("msg_{tag}_{index}");
            ev.push(json!({"type": "response.output_item.added", "output_index": index, "item": message_item(&id, "in_progress", vec![])}));
            ev.push(json!({
                "type": "response.content_part.added", "item_id": id, "output_index": index,
                "content_index": 0, "part": text_part("", &[]),
            }));
            Open { id, text: String::new(), logprobs: Vec::new() }
        })
    }

    /// Closes the open message, if any, as `status`.
    fn close(&mut self, status: &str, ev: &mut Vec<Value>) {
        let Some(m) = self.open.take() else { return };
        let index = self.items.len();
        let part = text_part(&m.text, &m.logprobs);
        ev.push(json!({
            "type": "response.output_text.done", "item_id": m.id, "output_index": index,
            "content_index": 0, "text": m.text, "logprobs": m.logprobs,
        }));
        ev.push(json!({
            "type": "response.content_part.done", "item_id": m.id, "output_index": index,
            "content_index": 0, "part": part,
        }));
        let item = message_item(&m.id, status, vec![part]);
        ev.push(json!({"type": "response.output_item.done", "output_index": index, "item": item}));
        self.items.push(item);
    }
}
