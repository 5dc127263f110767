//! OpenAI response JSON: whole completions, stream chunks and logprobs, for the completions and
//! the chat endpoints. Pure functions of the engine's chunks; no I/O.
//!
//! Invariant: a streamed response's chunks concatenate to the non-streamed one (same text,
//! same tool calls, same logprobs, same finish reason); usage counts come from the engine's
//! last chunk.

mod legacy;

use crate::api::Extras;
use crate::replies::{
    AssistantMessage, ChatChoice, ChatCompletion, ChatLogprobs, Completion, CompletionTokensDetails, CompletionUsage,
    PromptTokensDetails, TokenLogprob, TopLogprob,
};
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
    /// A completions call's `echo`, `logprobs` and `prompt_logprobs` (default for chat).
    pub extras: Extras,
}

/// One choice's chunks, accumulated.
#[derive(Default)]
pub struct Choice {
    /// The text so far (the answer, for a reasoning model).
    pub text: String,
    /// A reasoning model's reasoning so far.
    pub reasoning: String,
    /// Every token's logprobs so far; `None` when the request asked for none.
    pub logprobs: Option<Vec<TokenLogprobs>>,
    /// The finish reason, once the last chunk has come.
    pub finish: Option<FinishReason>,
    /// The token counts, from the last chunk.
    pub usage: Usage,
    /// The tool calls so far.
    pub tool_calls: Vec<ToolCall>,
    /// The prompt's logprobs (from the first chunk), when the engine computed them.
    pub prompt_logprobs: Option<Vec<Option<TokenLogprobs>>>,
    /// For a completions `echo`: the prompt's text and its first token's text.
    pub echo: Option<(String, String)>,
}

impl Choice {
    /// Adds one chunk: appends its text and logprobs, keeps its finish reason and usage if set.
    pub fn add(&mut self, c: &StreamChunk) {
        if c.prompt_logprobs.is_some() {
            self.prompt_logprobs.clone_from(&c.prompt_logprobs);
        }
        self.text.push_str(&c.text);
        self.reasoning.push_str(&c.reasoning);
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

    /// One chunk as a choice of its own (what a stream event shows).
    pub fn of(c: &StreamChunk) -> Self {
        let mut one = Self::default();
        one.add(c);
        one
    }

    /// The summed logprob of the sampled tokens (`best_of` keeps the highest).
    pub fn cumulative_logprob(&self) -> f32 {
        self.logprobs.iter().flatten().map(|t| t.logprob).sum()
    }
}

/// OpenAI's `usage` object.
pub fn usage_json(u: Usage) -> Value {
    json!(completion_usage(u))
}

/// OpenAI's `usage` object, typed.
fn completion_usage(u: Usage) -> CompletionUsage {
    CompletionUsage {
        prompt_tokens: u.prompt_tokens,
        completion_tokens: u.completion_tokens,
        total_tokens: u.total_tokens(),
        prompt_tokens_details: PromptTokensDetails { cached_tokens: u.cached_tokens },
        completion_tokens_details: CompletionTokensDetails { reasoning_tokens: u.reasoning_tokens },
    }
}

/// One token's logprob entry, as chat and responses write it: its bytes and top alternatives.
pub fn token_logprob(t: &TokenLogprobs) -> TokenLogprob {
    TokenLogprob {
        token: t.token.clone(),
        logprob: t.logprob,
        bytes: t.token.as_bytes().to_vec(),
        top_logprobs: t
            .top
            .iter()
            .map(|a| TopLogprob { token: a.token.clone(), logprob: a.logprob, bytes: a.token.as_bytes().to_vec() })
            .collect(),
    }
}

/// Chat's logprobs: one entry per token.
fn chat_logprobs(lps: &[TokenLogprobs]) -> ChatLogprobs {
    ChatLogprobs { content: lps.iter().map(token_logprob).collect() }
}

impl Head {
    /// One choice of a whole (non-streamed) response.
    pub fn choice(&self, index: usize, c: &Choice) -> Value {
        match self.kind {
            Kind::Completion => legacy::choice(index, c, &self.extras, 0),
            Kind::Chat => {
                // OpenAI: `content` is null when the reply is only tool calls.
                let calls = !c.tool_calls.is_empty();
                let message = AssistantMessage {
                    role: "assistant",
                    content: (!calls || !c.text.is_empty()).then(|| c.text.clone()),
                    tool_calls: calls.then(|| c.tool_calls.clone()),
                    reasoning_content: (!c.reasoning.is_empty()).then(|| c.reasoning.clone()), // vLLM's field
                };
                let logprobs = c.logprobs.as_deref().map(chat_logprobs);
                let finish_reason = c.finish.map(|f| finish_name(f).to_string());
                json!(ChatChoice { index, message, logprobs, finish_reason })
            }
        }
    }

    /// vLLM's response-level `prompt_logprobs` of a chat call (from its first sample), when
    /// asked for.
    pub fn chat_prompt_logprobs(&self, first: &Choice) -> Option<Value> {
        let (k, p) = (self.extras.prompt_logprobs?, first.prompt_logprobs.as_ref()?);
        (self.kind == Kind::Chat).then(|| legacy::vllm_prompt_logprobs(p, k))
    }

    /// The whole (non-streamed) response: the choices, the call's summed usage and (chat
    /// only, vLLM's key, `null` unless asked for) the prompt's logprobs.
    pub fn response(&self, choices: Vec<Value>, usage: Usage, prompt_logprobs: Option<Value>) -> Value {
        let (id, created, model) = (self.id.clone(), self.created, self.model.clone());
        let (system_fingerprint, usage) = (self.system_fingerprint.clone(), completion_usage(usage));
        match self.kind {
            Kind::Completion => {
                let object = "text_completion";
                json!(Completion { id, object, created, model, system_fingerprint, choices, usage })
            }
            Kind::Chat => {
                let object = "chat.completion";
                json!(ChatCompletion {
                    id,
                    object,
                    created,
                    model,
                    system_fingerprint,
                    choices,
                    usage,
                    prompt_logprobs
                })
            }
        }
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

    /// A stream chunk of choice `index` (one engine chunk, `Choice::of`, with the `echo` on
    /// the first), whose earlier chunks hold `offset` characters of text and `num_calls` tool calls
    /// (each call comes whole, in one delta, with its index).
    pub fn chunk(&self, index: usize, c: &Choice, offset: usize, num_calls: usize) -> Value {
        let finish = c.finish.map(finish_name);
        let logprobs = c.logprobs.as_deref().map(chat_logprobs);
        let choice = match self.kind {
            Kind::Completion => legacy::choice(index, c, &self.extras, offset),
            Kind::Chat => {
                let quiet = finish.is_some() || !c.tool_calls.is_empty() || !c.reasoning.is_empty();
                let mut delta = if c.text.is_empty() && quiet { json!({}) } else { json!({"content": c.text}) };
                if !c.reasoning.is_empty() {
                    delta["reasoning_content"] = json!(c.reasoning);
                }
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
