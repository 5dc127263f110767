//! `SpeculativeConfig`: how a model decodes speculatively (vLLM's `speculative_config`, with
//! its names), resolved once at load into what the scheduler's proposer needs.
//!
//! Invariants: a validated config has `1 <= num_speculative_tokens <= MAX_SPECULATIVE_TOKENS`;
//! `ngram` has `1 <= prompt_lookup_min <= prompt_lookup_max` and no `model`; `draft` has a
//! `model` (a local path once the edge resolved it, `ModelConfig::at`'s rule) and no lookup
//! sizes. Speculation never changes a token (`docs/speculative.md`), so these settings trade
//! speed only.

use crate::{Error, Result};
use serde::{Deserialize, Serialize};

/// Most tokens one step may draft for one sequence.
pub const MAX_SPECULATIVE_TOKENS: usize = 16;

/// Where drafted tokens come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpeculativeMethod {
    /// Prompt lookup: the tokens that followed the latest earlier occurrence of the sequence's
    /// last n tokens (vLLM's `ngram`, llama.cpp's lookup decoding).
    Ngram,
    /// A smaller model with the same tokenizer drafts greedily (vLLM's `draft_model`, llama.cpp's
    /// `--model-draft`).
    Draft,
}

/// Speculative decoding settings of one model (`ModelConfig::speculative`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeculativeConfig {
    /// Where drafts come from.
    pub method: SpeculativeMethod,
    /// Most tokens drafted per sequence and step (the adaptive length stays at or below it).
    pub num_speculative_tokens: usize,
    /// Shortest suffix an n-gram match may have; unset, `prompt_lookup_max` (vLLM's rule), or 5
    /// when both are unset.
    #[serde(default)]
    pub prompt_lookup_min: Option<usize>,
    /// Longest suffix tried first; unset, `prompt_lookup_min`, or 5 when both are unset.
    #[serde(default)]
    pub prompt_lookup_max: Option<usize>,
    /// The draft model (`draft` only): a path, fetched alias or Hub id, as `model_id` takes.
    #[serde(default)]
    pub model: Option<String>,
}

impl SpeculativeConfig {
    /// Prompt lookup drafting up to `k` tokens, n-grams of vLLM's default sizes.
    pub fn ngram(k: usize) -> Self {
        Self {
            method: SpeculativeMethod::Ngram,
            num_speculative_tokens: k,
            prompt_lookup_min: None,
            prompt_lookup_max: None,
            model: None,
        }
    }

    /// Drafting up to `k` tokens with the model at `model`.
    pub fn draft(model: impl Into<String>, k: usize) -> Self {
        Self { method: SpeculativeMethod::Draft, model: Some(model.into()), ..Self::ngram(k) }
    }

    /// `(prompt_lookup_min, prompt_lookup_max)` with vLLM's defaults filled in.
    pub fn lookup_range(&self) -> (usize, usize) {
        match (self.prompt_lookup_min, self.prompt_lookup_max) {
            (None, None) => (5, 5),
            (Some(a), None) => (a, a),
            (None, Some(b)) => (b, b),
            (Some(a), Some(b)) => (a, b),
        }
    }

    /// Checks the ranges (see the module's invariants); errors name the field.
    pub fn validate(&self) -> Result<()> {
        let k = self.num_speculative_tokens;
        if !(1..=MAX_SPECULATIVE_TOKENS).contains(&k) {
            return Err(Error::invalid(format!(
                "speculative.num_speculative_tokens must be between 1 and {MAX_SPECULATIVE_TOKENS}, got {k}"
            )));
        }
        if self.method == SpeculativeMethod::Draft {
            if self.model.as_deref().is_none_or(str::is_empty) {
                return Err(Error::invalid("speculative: method \"draft\" needs a \"model\" (the draft model's id)"));
            }
            if self.prompt_lookup_min.is_some() || self.prompt_lookup_max.is_some() {
                return Err(Error::invalid(
                    "speculative: prompt_lookup_min and prompt_lookup_max are for method \"ngram\", not \"draft\"",
                ));
            }
            return Ok(());
        }
        if self.model.is_some() {
            return Err(Error::invalid(
                "speculative: \"model\" is for method \"draft\"; method \"ngram\" drafts from the sequence itself",
            ));
        }
        let (a, b) = self.lookup_range();
        if a == 0 || a > b {
            return Err(Error::invalid(format!(
                "speculative: need 1 <= prompt_lookup_min <= prompt_lookup_max, got {a} and {b}"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllm_json_and_fills_the_lookup_range() {
        let c: SpeculativeConfig =
            serde_json::from_str(r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}"#)
                .unwrap();
        assert_eq!((c.num_speculative_tokens, c.lookup_range()), (4, (3, 3)));
        assert_eq!(SpeculativeConfig::ngram(2).lookup_range(), (5, 5));
        let both =
            SpeculativeConfig { prompt_lookup_min: Some(1), prompt_lookup_max: Some(4), ..SpeculativeConfig::ngram(2) };
        assert_eq!(both.lookup_range(), (1, 4));
        both.validate().unwrap();
    }

    #[test]
    fn bad_values_name_the_field() {
        let e = SpeculativeConfig::ngram(0).validate().unwrap_err().to_string();
        assert!(e.contains("num_speculative_tokens") && e.contains("got 0"), "{e}");
        let bad =
            SpeculativeConfig { prompt_lookup_min: Some(4), prompt_lookup_max: Some(2), ..SpeculativeConfig::ngram(2) };
        assert!(bad.validate().unwrap_err().to_string().contains("prompt_lookup_min"));
        let e = serde_json::from_str::<SpeculativeConfig>(r#"{"method": "eagle", "num_speculative_tokens": 2}"#);
        assert!(e.unwrap_err().to_string().contains("unknown variant `eagle`, expected `ngram` or `draft`"));
    }

    #[test]
    fn a_draft_needs_its_model_and_no_lookup_sizes() {
        let c: SpeculativeConfig =
            serde_json::from_str(r#"{"method": "draft", "model": "m", "num_speculative_tokens": 3}"#).unwrap();
        assert_eq!(c, SpeculativeConfig::draft("m", 3));
        c.validate().unwrap();
        let e = SpeculativeConfig { model: None, ..c.clone() }.validate().unwrap_err().to_string();
        assert!(e.contains("needs a \"model\""), "{e}");
        let e = SpeculativeConfig { prompt_lookup_max: Some(3), ..c }.validate().unwrap_err().to_string();
        assert!(e.contains("for method \"ngram\""), "{e}");
        let e = SpeculativeConfig { model: Some("m".into()), ..SpeculativeConfig::ngram(2) }.validate().unwrap_err();
        assert!(e.to_string().contains("for method \"draft\""), "{e}");
    }
}
