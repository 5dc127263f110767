//! What the generation endpoints ask the engine for: `GenerationRequest`, the one view of a
//! completions, chat or responses body that the submit path needs (the model named, the shared
//! sampling fields, and the checked prompts), and `Samples`, the engine requests it becomes.
//!
//! Invariant: `prepare` makes every check that needs no engine, so what reaches
//! `Engine::submit_all` is well-formed; the engine checks what needs the model.

use crate::api::{self, ChatRequest, CompletionRequest, ResponsesRequest};
use crate::error::ApiError;
use lmplex_core::{SamplingParams, Tools};
use lmplex_engine::{Prompt, Request, Tenant};

/// What the generation endpoints share: the model asked for, and what to run on it.
pub(crate) trait GenerationRequest: Send + 'static {
    /// The `model` field, empty when left out.
    fn model(&self) -> &str;
    /// The sampling fields shared by every endpoint.
    fn common(&self) -> &api::Common;
    /// The prompts, sampling parameters and tools, checked (`max_model_len` of the chosen model).
    fn prepare(&self, max_model_len: usize) -> Result<Samples, ApiError>;
    /// What a completions call adds to its choices (`echo`, `best_of`, ...); chat has none.
    fn extras(&self) -> Result<api::Extras, ApiError> {
        Ok(api::Extras { best_of: self.common().n()?, ..Default::default() })
    }
}

impl GenerationRequest for CompletionRequest {
    fn model(&self) -> &str {
        &self.model
    }
    fn common(&self) -> &api::Common {
        &self.common
    }
    fn prepare(&self, _: usize) -> Result<Samples, ApiError> {
        let n = CompletionRequest::extras(self)?.best_of;
        Ok(Samples { prompts: self.prompts()?, params: self.sampling()?, tools: None, n })
    }
    fn extras(&self) -> Result<api::Extras, ApiError> {
        CompletionRequest::extras(self)
    }
}

impl GenerationRequest for ChatRequest {
    fn model(&self) -> &str {
        &self.model
    }
    fn common(&self) -> &api::Common {
        &self.common
    }
    fn prepare(&self, max_model_len: usize) -> Result<Samples, ApiError> {
        let prompts = vec![Prompt::Messages(self.messages()?)];
        Ok(Samples { prompts, params: self.sampling(max_model_len)?, tools: self.tools()?, n: self.common.n()? })
    }
    fn extras(&self) -> Result<api::Extras, ApiError> {
        let prompt_logprobs = api::logprobs_count(self.prompt_logprobs, "prompt_logprobs")?;
        Ok(api::Extras { best_of: self.common.n()?, prompt_logprobs, ..Default::default() })
    }
}

impl GenerationRequest for ResponsesRequest {
    fn model(&self) -> &str {
        &self.model
    }
    fn common(&self) -> &api::Common {
        &self.common
    }
    fn prepare(&self, max_model_len: usize) -> Result<Samples, ApiError> {
        let prompts = vec![Prompt::Messages(self.messages()?)];
        Ok(Samples { prompts, params: self.sampling(max_model_len)?, tools: self.tools()?, n: 1 })
    }
}

/// What one call generates: `n` samples of each prompt. Choice `k` is sample `k % n` of prompt
/// `k / n`; with a seed, sample `i` uses `seed + i` (as vLLM does), so each is reproducible alone.
pub(crate) struct Samples {
    pub prompts: Vec<Prompt>,
    pub params: SamplingParams,
    pub tools: Option<Tools>,
    pub n: usize,
}

impl Samples {
    /// One engine request per sample, for `tenant`.
    pub fn requests(self, tenant: &Tenant) -> Vec<Request> {
        let Samples { prompts, params, tools, n } = self;
        let tenant = (!tenant.name().is_empty()).then(|| tenant.name().to_string());
        prompts
            .into_iter()
            .flat_map(|prompt| (0..n).map(move |i| (prompt.clone(), i)))
            .map(|(prompt, i)| {
                let mut p = params.clone();
                p.seed = p.seed.map(|s| s.wrapping_add(i as u64));
                Request { tenant: tenant.clone(), tools: tools.clone(), ..Request::new(prompt, p) }
            })
            .collect()
    }
}
