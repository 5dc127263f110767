//! One request's state while it runs: its tokens, sampler, detokenizer, stop checks and what
//! has been streamed so far.
//!
//! Token bookkeeping for the KV cache (`num_computed_tokens`, blocks) lives in the scheduler's
//! `Request`; this type owns what the scheduler must not see: text, sampling and stops.
//!
//! Invariants: once `finish` is set no token is appended; with a guide (structured output)
//! every sampled token is one the guide allowed, and the request ends when the guide is complete; streamed text never contains a stop string nor the start of one that might still
//! complete (up to `max_stop_len - 1` bytes are held back until the request ends); a reasoning
//! model's chat reply streams its reasoning apart from its answer, and a guide constrains only
//! the answer (`think_gate`); with tools, streamed text is the answer's content around the
//! calls, and a call is streamed once complete.

use crate::tenants::{Admission, Tenant};
use lmplex_core::{FinishReason, Result, SamplingParams, StopReason, StreamChunk, TokenId, TokenLogprobs, Usage};
use lmplex_model::reasoning::ThinkGate;
use lmplex_model::sample::pick::Pick;
use lmplex_model::{Guide, IncrementalDecoder, ReasoningStream, Sampled, Sampler, Tokenizer, ToolStream};
use lmplex_route::Prediction;
use std::sync::Arc;
use std::time::Duration;

pub struct Sequence {
    pub prompt: String,
    pub prompt_ids: Vec<TokenId>,
    pub output_ids: Vec<TokenId>,
    /// Scheduling inputs carried to the step loop (see `Request`).
    pub priority: i32,
    pub cache_salt: Option<String>,
    /// The LoRA adapter it runs under (`None`: the base), resolved at admission.
    pub lora: Option<Arc<lmplex_model::lora::LoraAdapter>>,
    /// Its images' features, spliced at their placeholder tokens in every pass over them.
    pub embeds: Option<Arc<lmplex_model::InputEmbeds>>,
    /// Its images while they wait for the vision tower (the step loop's `Encoding`), which
    /// then sets `embeds`.
    pub images: Option<Arc<crate::vision::PromptImages>>,
    /// Whose request it is; `None` is the default tenant (no quotas, weight 1).
    pub tenant: Option<Arc<Tenant>>,
    /// The call's quota reservation, told this sequence's usage when it is dropped.
    pub admission: Option<Arc<Admission>>,
    /// The call's latency budget: its deadline in the scheduler is its arrival plus this.
    pub max_latency: Option<Duration>,
    /// Whether it was ever scheduled (a request dropped before that used no prompt tokens).
    pub started: bool,
    /// Most tokens (prompt + output) this sequence may reach.
    pub max_len: usize,
    sampler: Sampler,
    /// The structured-output constraint, if the request has one.
    pub guide: Option<Guide>,
    /// For a request with tools: parses tool calls out of the text as it is streamed.
    pub tools: Option<ToolStream>,
    /// For a reasoning model's chat reply: splits the reasoning from the answer.
    pub reasoning: Option<ReasoningStream>,
    /// With `reasoning` (and both tags single tokens): where the reply stands, token by token,
    /// which holds a guide back while the reply reasons and counts `reasoning_tokens`.
    pub think_gate: Option<ThinkGate>,
    reasoning_tokens: usize,
    decoder: IncrementalDecoder,
    text: String,
    logprobs: Option<Vec<TokenLogprobs>>,
    /// With `prompt_logprobs`: the logprobs of the prompt positions computed so far (`None`
    /// for position 0), taken by the first chunk (a prompt recomputed later is not recorded).
    prompt_logprobs: Option<Vec<Option<TokenLogprobs>>>,
    eos_ids: Vec<TokenId>,
    max_stop_len: usize,
    pub finish: Option<(FinishReason, Option<StopReason>)>,
    streamed_text: usize,
    streamed_tokens: usize,
    /// For a request submitted through the host: the router's prediction, whose uncalibrated
    /// figures its measured latency calibrates (`crate::signals`).
    pub predicted: Option<Prediction>,
    /// Prompt tokens the prefix cache held when it was first scheduled.
    pub cached_tokens: usize,
    /// With prefix caching on, its block size: the prompt's full blocks are cached once
    /// computed (`Usage::cache_created_tokens`).
    pub cache_block: Option<usize>,
    /// An embedding request (`Task::Embed`): its prompt's pooling state and how its vector is
    /// shaped; it generates nothing and ends with its vector (`finish_pooling`).
    pub pooling: Option<(lmplex_model::Pooler, lmplex_core::PoolingParams)>,
    embedding: Option<Vec<f32>>,
}

impl Sequence {
    pub fn new(
        prompt: String,
        prompt_ids: Vec<TokenId>,
        params: SamplingParams,
        eos_ids: &[TokenId],
        max_model_len: usize,
    ) -> Self {
        let max_len = (prompt_ids.len() + params.max_tokens).min(max_model_len);
        let max_stop_len = params.stop.iter().map(String::len).max().unwrap_or(0);
        Self {
            decoder: IncrementalDecoder::new(params.skip_special_tokens),
            logprobs: params.logprobs.map(|_| Vec::new()),
            prompt_logprobs: params.prompt_logprobs.map(|_| vec![None]),
            eos_ids: if params.ignore_eos { Vec::new() } else { eos_ids.to_vec() },
            sampler: Sampler::new(params, &prompt_ids).with_eos(eos_ids),
            guide: None,
            tools: None,
            reasoning: None,
            think_gate: None,
            reasoning_tokens: 0,
            prompt,
            prompt_ids,
            output_ids: Vec::new(),
            priority: 0,
            cache_salt: None,
            lora: None,
            embeds: None,
            images: None,
            tenant: None,
            admission: None,
            max_latency: None,
            started: false,
            max_len,
            text: String::new(),
            max_stop_len,
            finish: None,
            predicted: None,
            cached_tokens: 0,
            cache_block: None,
            streamed_text: 0,
            streamed_tokens: 0,
            pooling: None,
            embedding: None,
        }
    }

    pub fn num_tokens(&self) -> usize {
        self.prompt_ids.len() + self.output_ids.len()
    }

    pub fn is_finished(&self) -> bool {
        self.finish.is_some()
    }

    pub fn sampler_params(&self) -> &SamplingParams {
        self.sampler.params()
    }

    /// Records the prompt logprobs a chunk's rows give: row `j` of a chunk starting at `start`
    /// predicts the token at `start + j + 1`. Positions already recorded (a chunk computed again
    /// after a preemption) are skipped, so each is recorded once, in order.
    pub fn add_prompt_logprobs(&mut self, tok: &Tokenizer, start: usize, rows: &[&[f32]]) {
        let (Some(lps), Some(n)) = (&mut self.prompt_logprobs, self.sampler.params().prompt_logprobs) else {
            return;
        };
        for (j, row) in rows.iter().enumerate() {
            let pos = start + j + 1;
            if pos != lps.len() || pos >= self.prompt_ids.len() {
                continue;
            }
            lps.push(Some(token_logprobs(
                tok,
                self.prompt_ids[pos],
                lmplex_model::logprobs_of(row, self.prompt_ids[pos], n),
            )));
        }
    }

    /// Ends a request that only scored its prompt (`max_tokens` 0).
    pub fn finish_scoring(&mut self) {
        self.finish = Some((FinishReason::Length, None));
    }

    /// Ends an embedding request whose every prompt position was pooled: its vector goes out
    /// with its last chunk (finish reason `stop`, as vLLM's pooling outputs).
    pub fn finish_pooling(&mut self) {
        if let Some((pooler, params)) = &self.pooling {
            self.embedding = Some(params.apply(pooler.pooled()));
        }
        self.finish = Some((FinishReason::Stop, None));
    }

    /// Samples from `logits` (among the tokens the guide allows) and applies every stop rule.
    /// An error concerns this request only.
    /// This step's pick when it needs only the logits row (no structured output, and the
    /// sampler's `pick`): the runner may make it, on the device for CUDA.
    pub fn pick(&self) -> Option<Pick> {
        if self.guide.is_some() && !self.think_gate.is_some_and(|g| g.waits()) {
            return None;
        }
        self.sampler.pick()
    }

    /// Appends the token the runner picked with `pick`'s edits and draw: the same as
    /// `append_from_logits` on those logits.
    pub fn append_picked(&mut self, tok: &Tokenizer, token_id: TokenId) -> Result<()> {
        let s = self.sampler.record(token_id);
        self.append(tok, s)
    }

    pub fn append_from_logits(&mut self, tok: &Tokenizer, logits: &[f32]) -> Result<()> {
        let Some(guide) = &mut self.guide else {
            let s = self.sampler.sample(logits);
            return self.append(tok, s);
        };
        if self.think_gate.is_some_and(|g| g.waits()) {
            let s = self.sampler.sample(logits);
            return self.append(tok, s);
        }
        let mut mask = guide.mask()?;
        if let Some(open) = self.think_gate.and_then(|g| g.also_allowed()) {
            mask.allow_token(open);
        }
        let s = self.sampler.sample_allowed(logits, Some(&mask));
        let answer = self.think_gate.is_none_or(|g| g.takes(s.token_id));
        if answer {
            guide.advance(s.token_id)?;
        }
        let complete = answer && guide.is_finished();
        self.append(tok, s)?;
        if complete && self.finish.is_none() {
            // The constraint allows nothing more: end as EOS would.
            self.text.push_str(&self.decoder.flush(tok)?);
            self.finish = Some((FinishReason::Stop, Some(StopReason::Eos)));
        }
        Ok(())
    }

    fn append(&mut self, tok: &Tokenizer, s: Sampled) -> Result<()> {
        let id = s.token_id;
        self.output_ids.push(id);
        if let Some(g) = &mut self.think_gate {
            if !g.record(id) {
                self.reasoning_tokens += 1;
            }
        }
        if let Some(lp) = &mut self.logprobs {
            lp.push(token_logprobs(tok, id, (s.logprob, s.top)));
        }
        // Nothing but the length ends the output before `min_tokens` (the sampler holds back
        // the ending tokens; stop strings are not looked for).
        let may_stop = self.output_ids.len() >= self.sampler.params().min_tokens;
        if may_stop && self.eos_ids.contains(&id) {
            self.text.push_str(&self.decoder.flush(tok)?);
            self.finish = Some((FinishReason::Stop, Some(StopReason::Eos)));
            return Ok(());
        }
        if may_stop && self.sampler.params().stop_token_ids.contains(&id) {
            self.text.push_str(&self.decoder.flush(tok)?);
            self.finish = Some((FinishReason::Stop, Some(StopReason::TokenId(id))));
            return Ok(());
        }
        let before = self.text.len();
        self.text.push_str(&self.decoder.step(tok, id)?);
        if may_stop && self.max_stop_len > 0 && self.text.len() > before {
            // Only a match that ends in the new text can be new.
            let mut from = before.saturating_sub(self.max_stop_len - 1);
            while !self.text.is_char_boundary(from) {
                from -= 1;
            }
            let hit = self
                .sampler
                .params()
                .stop
                .iter()
                .filter_map(|s| self.text[from..].find(s.as_str()).map(|i| (from + i, s)))
                .min_by_key(|(i, _)| *i);
            if let Some((i, s)) = hit {
                let s = s.clone();
                self.text.truncate(i);
                self.finish = Some((FinishReason::Stop, Some(StopReason::String(s))));
                return Ok(());
            }
        }
        if self.output_ids.len() >= self.sampler.params().max_tokens || self.num_tokens() >= self.max_len {
            self.text.push_str(&self.decoder.flush(tok)?);
            self.finish = Some((FinishReason::Length, None));
        }
        Ok(())
    }

    pub fn usage(&self) -> Usage {
        let full = self.cache_block.map_or(0, |b| self.prompt_ids.len() / b * b);
        Usage {
            prompt_tokens: self.prompt_ids.len(),
            completion_tokens: self.output_ids.len(),
            cached_tokens: self.cached_tokens,
            reasoning_tokens: self.reasoning_tokens,
            cache_created_tokens: full.saturating_sub(self.cached_tokens),
        }
    }

    /// Text and tokens not streamed yet; holds back a possible stop-string prefix while running.
    pub fn take_chunk(&mut self) -> StreamChunk {
        let mut end = self.text.len();
        if self.finish.is_none() && self.max_stop_len > 1 {
            end = end.saturating_sub(self.max_stop_len - 1).max(self.streamed_text);
            while !self.text.is_char_boundary(end) {
                end -= 1;
            }
        }
        let mut text = self.text[self.streamed_text..end].to_string();
        self.streamed_text = end;
        let mut reasoning = String::new();
        if let Some(r) = &mut self.reasoning {
            let mut split = r.push(&text);
            if self.finish.is_some() {
                let last = r.finish();
                split.reasoning.push_str(&last.reasoning);
                split.content.push_str(&last.content);
            }
            (text, reasoning) = (split.content, split.reasoning);
        }
        let mut tool_calls = Vec::new();
        let mut finish_reason = self.finish.as_ref().map(|f| f.0);
        if let Some(p) = &mut self.tools {
            let mut parsed = p.push(&text);
            if self.finish.is_some() {
                let last = p.finish();
                parsed.content.push_str(&last.content);
                parsed.calls.extend(last.calls);
                if p.num_calls() > 0 && finish_reason == Some(FinishReason::Stop) {
                    finish_reason = Some(FinishReason::ToolCalls);
                }
            }
            (text, tool_calls) = (parsed.content, parsed.calls);
        }
        let prompt_logprobs = self.prompt_logprobs.take();
        let token_ids = self.output_ids[self.streamed_tokens..].to_vec();
        let logprobs = self.logprobs.as_ref().map(|l| l[self.streamed_tokens..].to_vec());
        self.streamed_tokens = self.output_ids.len();
        StreamChunk {
            text,
            reasoning,
            token_ids,
            logprobs,
            finish_reason,
            stop_reason: self.finish.as_ref().and_then(|f| f.1.clone()),
            usage: self.finish.as_ref().map(|_| self.usage()),
            queue_time_s: None,
            tool_calls,
            prompt_logprobs,
            embedding: self.embedding.take(),
        }
    }
}

/// A token's logprob entry from its (logprob, top alternatives).
fn token_logprobs(tok: &Tokenizer, id: TokenId, (logprob, top): (f32, Vec<(TokenId, f32)>)) -> TokenLogprobs {
    TokenLogprobs {
        token_id: id,
        token: tok.token_text(id),
        logprob,
        top: top
            .into_iter()
            .map(|(t, l)| lmplex_core::Logprob { token_id: t, token: tok.token_text(t), logprob: l })
            .collect(),
    }
}

impl Drop for Sequence {
    /// Tells the call's admission what this sequence used (it settles when the call's last
    /// sequence is gone).
    fn drop(&mut self) {
        if let Some(a) = &self.admission {
            let prompt_tokens = if self.started { self.prompt_ids.len() } else { 0 };
            a.record(Usage { prompt_tokens, ..self.usage() });
        }
    }
}
