//! The completions endpoint's body: prompts as text or token ids, legacy `logprobs`, `echo`,
//! `suffix` (fill in the middle), `best_of`, and vLLM's `prompt_logprobs`.
//!
//! Invariants: `echo` with `max_tokens: 0` only scores the prompts (what lm-evaluation-harness
//! sends for log-likelihoods); whatever needs the prompt's logprobs asks the engine for them
//! (`SamplingParams::prompt_logprobs`, the most alternatives any field wants); `best_of`
//! samples are generated with logprobs, so the `n` likeliest can be chosen, and are never
//! streamed.

use super::{logprobs_count, Common, MAX_N};
use crate::error::ApiError;
use lmplex_core::{SamplingParams, TokenId};
use lmplex_engine::Prompt;
use serde::Deserialize;

/// The completions `prompt`: one or several texts, or one or several token-id lists.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum PromptInput {
    /// One prompt as text.
    Text(String),
    /// Several text prompts, each generated separately (a batch).
    Texts(Vec<String>),
    /// One prompt as token ids, passed to the model untokenized.
    Ids(Vec<TokenId>),
    /// Several token-id prompts, each generated separately.
    IdLists(Vec<Vec<TokenId>>),
}

/// The body of `POST /v1/completions`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct CompletionRequest {
    /// `model`: the served model name to run (its `served_name`, as `/v1/models` lists it),
    /// `lmplex:auto` or `tier:NAME`; may be left out when the server serves one model.
    #[serde(default, deserialize_with = "super::null_as_empty")]
    pub model: String,
    /// `prompt`: the text(s) or token ids to continue; must not be empty.
    pub prompt: PromptInput,
    /// `logprobs`: each token's logprob plus this many top alternatives (0 to `MAX_LOGPROBS`).
    #[serde(default, deserialize_with = "super::whole_number")]
    #[schema(minimum = 0, maximum = 20)]
    pub logprobs: Option<i64>,
    /// `echo`: each choice starts with its prompt (and the prompt's logprobs with `logprobs`).
    pub echo: Option<bool>,
    /// `best_of`: samples generated per prompt (`n` to `MAX_N`); the `n` with the highest
    /// summed logprob are returned. Not with `stream`.
    #[serde(default, deserialize_with = "super::whole_number")]
    #[schema(minimum = 1, maximum = 128)]
    pub best_of: Option<i64>,
    /// `suffix`: the text after the completion, for a fill-in-the-middle model.
    pub suffix: Option<String>,
    /// vLLM's `prompt_logprobs`: each prompt token's logprob and this many alternatives.
    #[serde(default, deserialize_with = "super::whole_number")]
    #[schema(minimum = 0, maximum = 20)]
    pub prompt_logprobs: Option<i64>,
    /// The sampling fields shared with chat.
    #[serde(flatten)]
    pub common: Common,
}

/// What a completions call adds to its choices beyond the engine's output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Extras {
    /// `echo`: choices start with the prompt.
    pub echo: bool,
    /// Samples generated per prompt; the `n` likeliest are kept (`n` when `best_of` is unset).
    pub best_of: usize,
    /// The alternatives per token the client asked for (`logprobs`), if it asked.
    pub logprobs: Option<usize>,
    /// vLLM's `prompt_logprobs`: report them, with this many alternatives.
    pub prompt_logprobs: Option<usize>,
}

impl CompletionRequest {
    /// The prompts to generate from, one per text or token-id list; an empty list is a 400.
    /// With `suffix`, each text prompt becomes a fill-in-the-middle prompt.
    pub fn prompts(&self) -> Result<Vec<Prompt>, ApiError> {
        let text = |t: &String| match &self.suffix {
            Some(s) => Prompt::Infill { prefix: t.clone(), suffix: s.clone() },
            None => Prompt::Text(t.clone()),
        };
        let prompts: Vec<Prompt> = match &self.prompt {
            PromptInput::Text(t) => vec![text(t)],
            PromptInput::Texts(v) => v.iter().map(text).collect(),
            PromptInput::Ids(_) | PromptInput::IdLists(_) if self.suffix.is_some() => {
                return Err(ApiError::invalid_param("suffix", "suffix needs a text prompt, not token ids"))
            }
            PromptInput::Ids(ids) => vec![Prompt::TokenIds(ids.clone())],
            PromptInput::IdLists(v) => v.iter().cloned().map(Prompt::TokenIds).collect(),
        };
        if prompts.is_empty() {
            return Err(ApiError::invalid_param("prompt", "prompt must not be empty"));
        }
        Ok(prompts)
    }

    /// The completion-only options, checked against `n` and `stream`.
    pub fn extras(&self) -> Result<Extras, ApiError> {
        let n = self.common.n()?;
        let best_of = match self.best_of {
            None => n,
            Some(b) if (n as i64..=MAX_N as i64).contains(&b) => b as usize,
            Some(b) => {
                let e = format!("best_of must be between n ({n}) and {MAX_N}, got {b}");
                return Err(ApiError::invalid_param("best_of", e));
            }
        };
        if best_of > n && self.common.stream() {
            return Err(ApiError::invalid_param("best_of", "best_of greater than n cannot be streamed"));
        }
        Ok(Extras {
            echo: self.echo == Some(true),
            best_of,
            logprobs: logprobs_count(self.logprobs, "logprobs")?,
            prompt_logprobs: logprobs_count(self.prompt_logprobs, "prompt_logprobs")?,
        })
    }

    /// The engine's sampling parameters (16 tokens by default); `max_tokens: 0` only with `echo`.
    pub fn sampling(&self) -> Result<SamplingParams, ApiError> {
        let x = self.extras()?;
        let scoring = x.echo && self.common.max_tokens == Some(0);
        let mut p = self.common.sampling(scoring.then_some(1), 16)?;
        if scoring {
            p.max_tokens = 0;
        }
        p.logprobs = x.logprobs;
        if x.best_of > self.common.n()? {
            p.logprobs.get_or_insert(0); // the samples are ranked by their logprob
        }
        // The prompt's logprobs: for `echo` with `logprobs` (or to score it), and vLLM's field.
        let echoed = x.echo.then_some(x.logprobs.unwrap_or(0)).filter(|_| scoring || x.logprobs.is_some());
        p.prompt_logprobs = echoed.max(x.prompt_logprobs);
        Ok(p)
    }
}
