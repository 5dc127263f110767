//! What the generation endpoints ask the engine for: `GenerationRequest`, the one view of a
//! completions, chat, responses or messages body that the submit path needs (the model named, the shared
//! sampling fields, and the checked prompts), and `Samples`, the engine `Call` it becomes.
//!
//! Invariant: `prepare` makes every check that needs no engine, so what reaches
//! `ModelHost::submit` is well-formed; the engine checks what needs the model.

use super::{logprobs_count, ChatRequest, Common, CompletionRequest, Extras, MessagesRequest, ResponsesRequest};
use crate::error::ApiError;
use lmplex_core::{Route, SamplingParams, Tools};
use lmplex_engine::{Call, ChatTemplateKwargs, Prompt, Request, Tenant};
use std::sync::Arc;

/// What the generation endpoints share: the model asked for, and what to run on it.
pub(crate) trait GenerationRequest: Send + 'static {
    /// The `model` field, empty when left out.
    fn model(&self) -> &str;
    /// The sampling fields shared by every endpoint.
    fn common(&self) -> &Common;
    /// The prompts, sampling parameters and tools, checked (`max_model_len` of the chosen model).
    fn prepare(&self, max_model_len: usize) -> Result<Samples, ApiError>;
    /// What a completions call adds to its choices (`echo`, `best_of`, ...); chat has none.
    fn extras(&self) -> Result<Extras, ApiError> {
        Ok(Extras { best_of: self.common().n()?, ..Default::default() })
    }
}

impl GenerationRequest for CompletionRequest {
    fn model(&self) -> &str {
        &self.model
    }
    fn common(&self) -> &Common {
        &self.common
    }
    fn prepare(&self, _: usize) -> Result<Samples, ApiError> {
        let n = CompletionRequest::extras(self)?.best_of;
        Ok(Samples {
            prompts: self.prompts()?,
            params: self.sampling()?,
            tools: None,
            n,
            chat_template_kwargs: Default::default(),
        })
    }
    fn extras(&self) -> Result<Extras, ApiError> {
        CompletionRequest::extras(self)
    }
}

impl GenerationRequest for ChatRequest {
    fn model(&self) -> &str {
        &self.model
    }
    fn common(&self) -> &Common {
        &self.common
    }
    fn prepare(&self, max_model_len: usize) -> Result<Samples, ApiError> {
        let prompts = vec![Prompt::Messages(self.messages()?)];
        let (params, tools, n) = (self.sampling(max_model_len)?, self.tools()?, self.common.n()?);
        Ok(Samples {
            prompts,
            params,
            tools,
            n,
            chat_template_kwargs: self.chat_template_kwargs.clone().unwrap_or_default(),
        })
    }
    fn extras(&self) -> Result<Extras, ApiError> {
        let prompt_logprobs = logprobs_count(self.prompt_logprobs, "prompt_logprobs")?;
        Ok(Extras { best_of: self.common.n()?, prompt_logprobs, ..Default::default() })
    }
}

impl GenerationRequest for ResponsesRequest {
    fn model(&self) -> &str {
        &self.model
    }
    fn common(&self) -> &Common {
        &self.common
    }
    fn prepare(&self, max_model_len: usize) -> Result<Samples, ApiError> {
        let prompts = vec![Prompt::Messages(self.messages()?)];
        let (params, tools) = (self.sampling(max_model_len)?, self.tools()?);
        Ok(Samples { prompts, params, tools, n: 1, chat_template_kwargs: Default::default() })
    }
}

impl GenerationRequest for MessagesRequest {
    fn model(&self) -> &str {
        &self.model
    }
    fn common(&self) -> &Common {
        &self.common
    }
    fn prepare(&self, max_model_len: usize) -> Result<Samples, ApiError> {
        let prompts = vec![Prompt::Messages(self.messages()?)];
        let (params, tools) = (self.sampling(max_model_len)?, self.tools()?);
        Ok(Samples { prompts, params, tools, n: 1, chat_template_kwargs: self.chat_template_kwargs()? })
    }
}

/// What one call generates: `n` samples of each prompt (choice `k` is sample `k % n` of prompt
/// `k / n`; `Call` gives each sample its seed).
pub(crate) struct Samples {
    pub prompts: Vec<Prompt>,
    pub params: SamplingParams,
    pub tools: Option<Tools>,
    pub n: usize,
    pub chat_template_kwargs: ChatTemplateKwargs,
}

impl Samples {
    /// The engine call for `tenant` under `route` (its unset fields from the tenant's default).
    pub fn call(self, tenant: Arc<Tenant>, route: &Route) -> lmplex_core::Result<Call> {
        let Samples { prompts, params, tools, n, chat_template_kwargs } = self;
        let requests = prompts
            .into_iter()
            .map(|prompt| Request {
                tools: tools.clone(),
                chat_template_kwargs: chat_template_kwargs.clone(),
                ..Request::new(prompt, params.clone())
            })
            .collect();
        Ok(Call::new(tenant, route, requests)?.with_samples(n))
    }
}
