//! Sampling parameters (vLLM / OpenAI names) and their validation.
//!
//! `SamplingParams` is the one type for this concept: the Rust API takes it as is and Python's
//! `lmplex.SamplingParams` wraps it, its keywords deserialized by the same serde derive (the
//! OpenAI server maps its own request fields onto it).
//!
//! Invariant: `validate()` is the only gate; the sampler assumes validated values
//! (finite, `temperature >= 0`, `0 < top_p <= 1`, `0 <= min_p < 1`, `max_tokens >= 1`).
//! Defaults live in `Default` only; an unknown key is an error naming it.

use crate::{Error, Result, TokenId};
use serde::{Deserialize, Serialize};

/// How to pick tokens: vLLM's and OpenAI's names and meanings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SamplingParams {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 means no top-k cut.
    pub top_k: usize,
    /// Nucleus sampling: keep the most likely tokens whose probabilities sum to `top_p`.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one.
    pub min_p: f32,
    /// Multiplicative penalty on tokens seen in prompt or output (1.0 = off), as in vLLM/HF.
    pub repetition_penalty: f32,
    /// Subtracted once from tokens present in the output (OpenAI).
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the output (OpenAI).
    pub frequency_penalty: f32,
    /// Seed of this request's own generator; `None` draws one.
    pub seed: Option<u64>,
    /// Strings that end the output (not included in it).
    pub stop: Vec<String>,
    /// Token ids that end the output, besides EOS.
    pub stop_token_ids: Vec<TokenId>,
    /// Keep generating past EOS (for benchmarks).
    pub ignore_eos: bool,
    /// vLLM's `min_tokens`: no EOS, stop token or stop string ends the output before this many
    /// tokens (`max_tokens` still does).
    pub min_tokens: usize,
    /// Number of top alternatives to report per generated token; `None` reports nothing.
    pub logprobs: Option<usize>,
    /// Number of top alternatives to report per prompt token (vLLM's `prompt_logprobs`); `None`
    /// reports nothing. Such a request reads nothing from the prefix cache: every prompt
    /// position is computed.
    pub prompt_logprobs: Option<usize>,
    /// Leave special tokens out of the output text.
    pub skip_special_tokens: bool,
    /// Constrain the output to a JSON schema, a regex, a choice or a grammar (vLLM's
    /// `structured_outputs`).
    pub structured_outputs: Option<StructuredOutput>,
    /// Added to a token's logit before sampling, in [-100, 100] (OpenAI's `logit_bias`:
    /// -100 bans a token, 100 all but forces it); reported logprobs stay the model's.
    pub logit_bias: std::collections::BTreeMap<TokenId, f32>,
}

/// What the output must match; compiled to a token mask by the engine (llguidance). Written
/// as vLLM writes it: `{"json": "..."}`, `"json_object"`, `{"regex": ...}`, `{"choice": [...]}`,
/// `{"grammar": ...}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StructuredOutput {
    /// A JSON schema, as JSON text.
    #[serde(rename = "json")]
    JsonSchema(String),
    /// Any JSON object (OpenAI's `{"type": "json_object"}`).
    JsonObject,
    /// A regular expression the whole output must match (Rust `regex` syntax).
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A context-free grammar in llguidance's Lark dialect.
    Grammar(String),
}

impl StructuredOutput {
    /// The kind's name as vLLM spells it (`json`, `json_object`, `regex`, `choice`, `grammar`).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::JsonSchema(_) => "json",
            Self::JsonObject => "json_object",
            Self::Regex(_) => "regex",
            Self::Choice(_) => "choice",
            Self::Grammar(_) => "grammar",
        }
    }

    fn validate(&self) -> Result<()> {
        let empty = match self {
            Self::JsonSchema(s) | Self::Regex(s) | Self::Grammar(s) => s.trim().is_empty(),
            Self::JsonObject => false,
            Self::Choice(c) => c.is_empty() || c.iter().any(String::is_empty),
        };
        if empty {
            return Err(Error::invalid(format!(
                "structured output '{}' is empty (a choice needs at least one non-empty string)",
                self.kind()
            )));
        }
        Ok(())
    }
}

/// Most alternatives a request may ask for (OpenAI allows 20).
pub const MAX_LOGPROBS: usize = 20;

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            max_tokens: 256,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            min_tokens: 0,
            logprobs: None,
            prompt_logprobs: None,
            skip_special_tokens: true,
            structured_outputs: None,
            logit_bias: std::collections::BTreeMap::new(),
        }
    }
}

impl SamplingParams {
    /// Greedy decoding for `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> Self {
        Self { max_tokens, temperature: 0.0, ..Self::default() }
    }

    /// Whether the most likely token is always taken.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    /// Checks every rule the types do not (ranges, non-empty stops and constraints).
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::invalid(msg));
        if self.max_tokens == 0 && self.prompt_logprobs.is_none() {
            return bad("max_tokens must be at least 1, got 0 (0 only with prompt_logprobs: scoring the prompt)".into());
        }
        if self.min_tokens > self.max_tokens {
            return bad(format!("min_tokens ({}) must not exceed max_tokens ({})", self.min_tokens, self.max_tokens));
        }
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad(format!("temperature must be >= 0, got {}", self.temperature));
        }
        if !self.top_p.is_finite() || self.top_p <= 0.0 || self.top_p > 1.0 {
            return bad(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !self.min_p.is_finite() || !(0.0..1.0).contains(&self.min_p) {
            return bad(format!("min_p must be in [0, 1), got {}", self.min_p));
        }
        if !self.repetition_penalty.is_finite() || self.repetition_penalty <= 0.0 {
            return bad(format!("repetition_penalty must be > 0, got {}", self.repetition_penalty));
        }
        for (name, v) in [("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)] {
            if !v.is_finite() || !(-2.0..=2.0).contains(&v) {
                return bad(format!("{name} must be in [-2, 2], got {v}"));
            }
        }
        for (name, n) in [("logprobs", self.logprobs), ("prompt_logprobs", self.prompt_logprobs)] {
            if let Some(n) = n.filter(|&n| n > MAX_LOGPROBS) {
                return bad(format!("{name} must be at most {MAX_LOGPROBS}, got {n}"));
            }
        }
        if self.stop.iter().any(|s| s.is_empty()) {
            return bad("stop strings must not be empty".into());
        }
        if let Some(s) = &self.structured_outputs {
            s.validate()?;
        }
        if let Some((t, b)) = self.logit_bias.iter().find(|(_, b)| !b.is_finite() || !(-100.0..=100.0).contains(*b)) {
            return bad(format!("logit_bias of token {t} must be in [-100, 100], got {b}"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_are_named() {
        SamplingParams::default().validate().unwrap();
        let cases: Vec<(SamplingParams, &str)> = vec![
            (SamplingParams { temperature: -1.0, ..Default::default() }, "temperature"),
            (SamplingParams { top_p: 0.0, ..Default::default() }, "top_p"),
            (SamplingParams { top_p: 1.5, ..Default::default() }, "top_p"),
            (SamplingParams { min_p: 1.0, ..Default::default() }, "min_p"),
            (SamplingParams { max_tokens: 0, ..Default::default() }, "max_tokens"),
            (SamplingParams { logprobs: Some(21), ..Default::default() }, "logprobs"),
            (SamplingParams { presence_penalty: 3.0, ..Default::default() }, "presence_penalty"),
            (SamplingParams { stop: vec![String::new()], ..Default::default() }, "stop"),
            (
                SamplingParams { structured_outputs: Some(StructuredOutput::Choice(vec![])), ..Default::default() },
                "choice",
            ),
        ];
        for (p, name) in cases {
            match p.validate() {
                Err(Error::InvalidRequest(m)) => assert!(m.contains(name), "{m}"),
                other => panic!("expected InvalidRequest for {name}, got {other:?}"),
            }
        }
    }
}
