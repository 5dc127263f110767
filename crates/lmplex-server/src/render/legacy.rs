//! The completions endpoint's choice bodies: `text` (after the echoed prompt), OpenAI's legacy
//! `logprobs` lists, and vLLM's `prompt_logprobs`.
//!
//! Invariants: legacy `top_logprobs` hold the top alternatives asked for and always the
//! sampled token (up to `logprobs + 1` entries, as OpenAI's); with `echo` the prompt's tokens
//! come first, the first one with a `null` logprob; `text_offset` counts characters (Unicode
//! scalar values, as OpenAI and vLLM count them) from the start of the choice's text, across
//! chunks.

use super::{finish_name, Choice};
use crate::api::Extras;
use lmplex_core::TokenLogprobs;
use serde_json::{json, Map, Value};

/// The legacy lists, built token by token.
struct Lists {
    tokens: Vec<String>,
    token_logprobs: Vec<Option<f32>>,
    top_logprobs: Vec<Value>,
    text_offset: Vec<usize>,
    at: usize,
}

impl Lists {
    fn new(offset: usize) -> Self {
        Self {
            tokens: Vec::new(),
            token_logprobs: Vec::new(),
            top_logprobs: Vec::new(),
            text_offset: Vec::new(),
            at: offset,
        }
    }

    fn push(&mut self, token: &str, logprob: Option<f32>, top: Value) {
        self.text_offset.push(self.at);
        self.at += token.chars().count();
        self.tokens.push(token.to_string());
        self.token_logprobs.push(logprob);
        self.top_logprobs.push(top);
    }

    /// A token with its logprob and at most `k` alternatives, plus itself.
    fn push_token(&mut self, t: &TokenLogprobs, k: usize) {
        let mut top: Map<String, Value> = t.top.iter().take(k).map(|a| (a.token.clone(), json!(a.logprob))).collect();
        top.entry(t.token.clone()).or_insert(json!(t.logprob));
        self.push(&t.token, Some(t.logprob), Value::Object(top));
    }

    fn json(self) -> Value {
        json!({
            "tokens": self.tokens, "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs, "text_offset": self.text_offset,
        })
    }
}

/// vLLM's `prompt_logprobs`: per prompt token (`null` first), its id's and each alternative's
/// `{"logprob", "rank", "decoded_token"}`, keyed by token id (the token's own `rank` is known
/// only when it is among the alternatives).
pub(super) fn vllm_prompt_logprobs(p: &[Option<TokenLogprobs>], k: usize) -> Value {
    let entry = |t: &TokenLogprobs| {
        let mut m = Map::new();
        for (rank, a) in t.top.iter().take(k).enumerate() {
            m.insert(a.token_id.to_string(), json!({"logprob": a.logprob, "rank": rank + 1, "decoded_token": a.token}));
        }
        m.entry(t.token_id.to_string())
            .or_insert(json!({"logprob": t.logprob, "rank": null, "decoded_token": t.token}));
        Value::Object(m)
    };
    json!(p.iter().map(|e| e.as_ref().map_or(Value::Null, entry)).collect::<Vec<_>>())
}

/// One completions choice (whole, or one streamed chunk of it, whose earlier chunks hold
/// `offset` bytes of text); `c.echo` is set on the whole choice or its first chunk.
pub(super) fn choice(index: usize, c: &Choice, x: &Extras, offset: usize) -> Value {
    let mut text = String::new();
    let mut lists = Lists::new(offset);
    if let Some((prompt_text, first_token)) = &c.echo {
        text.push_str(prompt_text);
        if let (Some(k), Some(p)) = (x.logprobs, &c.prompt_logprobs) {
            for e in p {
                match e {
                    Some(t) => lists.push_token(t, k),
                    None => lists.push(first_token, None, Value::Null),
                }
            }
        }
    }
    text.push_str(&c.text);
    if let Some(k) = x.logprobs {
        for t in c.logprobs.iter().flatten() {
            lists.push_token(t, k);
        }
    }
    let logprobs = if x.logprobs.is_some() { lists.json() } else { Value::Null };
    let mut v = json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": c.finish.map(finish_name)});
    // vLLM's key, `null` unless asked for.
    v["prompt_logprobs"] = match (x.prompt_logprobs, &c.prompt_logprobs) {
        (Some(k), Some(p)) => vllm_prompt_logprobs(p, k),
        _ => Value::Null,
    };
    v
}
