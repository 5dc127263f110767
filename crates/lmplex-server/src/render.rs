//! OpenAI response JSON: whole completions, stream chunks and logprobs, for the completions and
//! the chat endpoints. Pure functions of the engine's chunks; no I/O.
//!
//! Invariant: a streamed response's chunks concatenate to the non-streamed one (same text,
//! same tool calls, same logprobs, same finish reason); usage counts come from the engine's
//! last chunk.

use lmplex_core::{FinishReason, StreamChunk, TokenLogprobs, ToolCall, Usage};
use serde_json::{json, Value};

/// OpenAI's `finish_reason`: `abort` never reaches a client that is still reading, so it reads
/// as `stop`.
pub fn finish_name(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Length => "length",
        FinishReason::Stop | FinishReason::Abort => "stop",
        FinishReason::ToolCalls => "tool_calls",
    }
}

/// Which endpoint a response answers: it picks the JSON shapes, object names and id prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `/v1/completions`: `text_completion` objects, choices with `text`.
    Completion,
    /// `/v1/chat/completions`: `chat.completion(.chunk)` objects, with `message` or `delta`.
    Chat,
}

impl Kind {
    /// The response id's prefix: `cmpl` or `chatcmpl`.
    pub fn id_prefix(self) -> &'static str {
        match self {
            Kind::Completion => "cmpl",
            Kind::Chat => "chatcmpl",
        }
    }
}

/// What every object of one response shares.
pub struct Head {
    /// The response id (`cmpl-...` or `chatcmpl-...`), the same in every chunk.
    pub id: String,
    /// `created`: Unix time in seconds.
    pub created: u64,
    /// The served model name, as the client asked for it.
    pub model: String,
    /// Which endpoint's shapes to write.
    pub kind: Kind,
    /// `system_fingerprint`: the engine version and the model (`Engine::system_fingerprint`).
    pub system_fingerprint: String,
}

/// One choice's chunks, accumulated.
#[derive(Default)]
pub struct Choice {
    /// The text so far.
    pub text: String,
    /// Every token's logprobs so far; `None` when the request asked for none.
    pub logprobs: Option<Vec<TokenLogprobs>>,
    /// The finish reason, once the last chunk has come.
    pub finish: Option<FinishReason>,
    /// The token counts, from the last chunk.
    pub usage: Usage,
    /// The tool calls so far.
    pub tool_calls: Vec<ToolCall>,
}

impl Choice {
    /// Adds one chunk: appends its text and logprobs, keeps its finish reason and usage if set.
    pub fn add(&mut self, c: &StreamChunk) {
        self.text.push_str(&c.text);
        self.tool_calls.extend(c.tool_calls.iter().cloned());
        if let Some(lp) = &c.logprobs {
            self.logprobs.get_or_insert_with(Vec::new).extend(lp.iter().cloned());
        }
        if c.finish_reason.is_some() {
            self.finish = c.finish_reason;
        }
        if let Some(u) = c.usage {
            self.usage = u;
        }
    }
}

fn usage_json(u: Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens(),
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

/// Completions' logprobs: parallel lists, `text_offset` from the start of this piece of text.
fn completion_logprobs(lps: &[TokenLogprobs], offset: usize) -> Value {
    let mut at = offset;
    let mut offsets = Vec::with_capacity(lps.len());
    for t in lps {
        offsets.push(at);
        at += t.token.len();
    }
    json!({
        "tokens": lps.iter().map(|t| t.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": lps.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": lps.iter().map(|t| {
            t.top.iter().map(|a| (a.token.clone(), json!(a.logprob))).collect::<serde_json::Map<_, _>>()
        }).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

/// Chat's logprobs: one entry per token with its bytes and its top alternatives.
fn chat_logprobs(lps: &[TokenLogprobs]) -> Value {
    let content: Vec<Value> = lps
        .iter()
        .map(|t| {
            json!({
                "token": t.token,
                "logprob": t.logprob,
                "bytes": t.token.as_bytes(),
                "top_logprobs": t.top.iter().map(|a| json!({
                    "token": a.token, "logprob": a.logprob, "bytes": a.token.as_bytes()
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({"content": content})
}

impl Head {
    fn logprobs(&self, lps: Option<&[TokenLogprobs]>, offset: usize) -> Value {
        match (lps, self.kind) {
            (None, _) => Value::Null,
            (Some(l), Kind::Completion) => completion_logprobs(l, offset),
            (Some(l), Kind::Chat) => chat_logprobs(l),
        }
    }

    /// One choice of a whole (non-streamed) response.
    pub fn choice(&self, index: usize, c: &Choice) -> Value {
        let finish = c.finish.map(finish_name);
        let logprobs = self.logprobs(c.logprobs.as_deref(), 0);
        match self.kind {
            Kind::Completion => json!({"index": index, "text": c.text, "logprobs": logprobs, "finish_reason": finish}),
            Kind::Chat => {
                // OpenAI: `content` is null when the reply is only tool calls.
                let mut message = json!({"role": "assistant", "content": c.text});
                if !c.tool_calls.is_empty() {
                    if c.text.is_empty() {
                        message["content"] = Value::Null;
                    }
                    message["tool_calls"] = json!(c.tool_calls);
                }
                json!({"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish})
            }
        }
    }

    /// The whole (non-streamed) response: the choices and the call's summed usage.
    pub fn response(&self, choices: Vec<Value>, usage: Usage) -> Value {
        let object = match self.kind {
            Kind::Completion => "text_completion",
            Kind::Chat => "chat.completion",
        };
        json!({
            "id": self.id, "object": object, "created": self.created, "model": self.model,
            "system_fingerprint": self.system_fingerprint, "choices": choices, "usage": usage_json(usage),
        })
    }

    fn chunk_object(&self, choices: Vec<Value>) -> Value {
        let object = match self.kind {
            Kind::Completion => "text_completion",
            Kind::Chat => "chat.completion.chunk",
        };
        json!({
            "id": self.id, "object": object, "created": self.created, "model": self.model,
            "system_fingerprint": self.system_fingerprint, "choices": choices,
        })
    }

    /// Chat streams open each choice with the assistant's role.
    pub fn role_chunk(&self, index: usize) -> Value {
        let choice = json!({"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null});
        self.chunk_object(vec![choice])
    }

    /// A stream chunk of choice `index`, whose earlier chunks hold `offset` bytes of text and
    /// `num_calls` tool calls (each call comes whole, in one delta, with its index).
    pub fn chunk(&self, index: usize, c: &StreamChunk, offset: usize, num_calls: usize) -> Value {
        let finish = c.finish_reason.map(finish_name);
        let logprobs = self.logprobs(c.logprobs.as_deref(), offset);
        let choice = match self.kind {
            Kind::Completion => json!({"index": index, "text": c.text, "logprobs": logprobs, "finish_reason": finish}),
            Kind::Chat => {
                let mut delta = if c.text.is_empty() && (finish.is_some() || !c.tool_calls.is_empty()) {
                    json!({})
                } else {
                    json!({"content": c.text})
                };
                if !c.tool_calls.is_empty() {
                    let calls: Vec<Value> = c
                        .tool_calls
                        .iter()
                        .enumerate()
                        .map(|(k, t)| {
                            let mut call = json!(t);
                            call["index"] = json!(num_calls + k);
                            call
                        })
                        .collect();
                    delta["tool_calls"] = json!(calls);
                }
                json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            }
        };
        self.chunk_object(vec![choice])
    }

    /// The last chunk when `stream_options.include_usage` is set: no choices, the usage.
    pub fn usage_chunk(&self, usage: Usage) -> Value {
        let mut v = self.chunk_object(Vec::new());
        v["usage"] = usage_json(usage);
        v
    }
}
