//! The front of an `Engine`: a call prepared on the caller's thread (each request checked,
//! rendered and tokenized once, then turned into one step-loop `Sequence` per sample: a
//! `Prepared`), admitted against its tenant's quotas, and sent with a place in the bounded
//! queue.
//!
//! Invariants: every refusal (a bad request, a prompt past `max_model_len`, a request that
//! could never fit the KV pool, a tenant's quota) happens here, before anything is queued; a
//! call's requests are admitted once per tenant, together; preparing looks no tenant up (the
//! `Call` carries it); a `Prepared` runs only on the engine that prepared it.

use super::{tools, Engine, Prompt, Request, CHAT_ROLES};
use crate::call::Call;
use crate::handle::{Aborter, Command, NewRequest, RequestHandle};
use crate::sequence::Sequence;
use crate::sizing::BLOCK_SIZE;
use crate::stats::QueueSlot;
use crate::tenants::Tenant;
use crate::vision::{Images, PromptImages};
use lmplex_core::{Error, Result, SamplingParams, TokenId, Tools};
use lmplex_model::lora::LoraAdapter;
use lmplex_model::reasoning::ThinkGate;
use lmplex_model::GuidedFactory;
use lmplex_route::{Prediction, Work};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A call as one engine will run it: one checked, tokenized `Sequence` per sample, not yet
/// admitted nor queued (`Engine::prepare`, then `Engine::submit_prepared`).
pub struct Prepared {
    /// The engine that prepared it (`Engine::serial`).
    engine: u64,
    pub(super) seqs: Vec<Sequence>,
}

impl Prepared {
    /// Most tokens its samples may generate on this engine, together: each sample's
    /// `max_tokens`, capped by what this model's context leaves after its prompt (so a call
    /// shaped for a longer context is predicted and charged as this model will run it).
    pub fn max_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.max_len - s.prompt_ids.len()).sum()
    }
    /// Each sequence carries the router's prediction for the loop to calibrate against.
    pub(crate) fn set_prediction(&mut self, predicted: Prediction) {
        self.seqs.iter_mut().for_each(|s| s.predicted = Some(predicted));
    }
}

/// A prompt as this engine renders it: its text, token ids and the tools it shows the model,
/// and its images' features with the salt that keys their cached K/V.
struct Rendered<'a> {
    text: String,
    ids: Vec<TokenId>,
    offered: Option<&'a Tools>,
    images: Option<(Arc<PromptImages>, String)>,
}

impl Engine {
    /// `call` checked, rendered and tokenized: each request once, however many samples it has.
    /// A latency budget in the call's route becomes each sequence's deadline in the scheduler.
    pub fn prepare(&self, call: &Call) -> Result<Prepared> {
        self.prepare_under(call, None)
    }

    /// `prepare`, every request run under the LoRA adapter `lora` (one this engine serves)
    /// when given, else under its own `Request::lora`: a call to an adapter by its model name.
    pub fn prepare_under(&self, call: &Call, lora: Option<&str>) -> Result<Prepared> {
        let reqs = call.requests().iter().map(|r| (r, call.tenant()));
        let mut p = self.prepare_for(reqs, call.samples(), lora)?;
        let budget = call.route().max_latency_ms.map(|ms| Duration::from_secs_f64(ms.max(0.0) / 1e3));
        p.seqs.iter_mut().for_each(|s| s.max_latency = budget);
        Ok(p)
    }

    /// `prepare` for requests that name their tenants (`Request.tenant`, each name looked up
    /// once), one sample each: `submit_all` and `generate`.
    pub fn prepare_requests(&self, reqs: &[Request]) -> Result<Prepared> {
        let mut found: Vec<(Option<&str>, Arc<Tenant>)> = Vec::new();
        let mut tenants = Vec::with_capacity(reqs.len());
        for r in reqs {
            let name = r.tenant.as_deref();
            let t = match found.iter().find(|(n, _)| *n == name) {
                Some((_, t)) => t.clone(),
                None => {
                    let t = self.tenants.get(name)?;
                    found.push((name, t.clone()));
                    t
                }
            };
            tenants.push(t);
        }
        self.prepare_for(reqs.iter().zip(&tenants), 1, None)
    }

    fn prepare_for<'a>(
        &self,
        reqs: impl Iterator<Item = (&'a Request, &'a Arc<Tenant>)>,
        samples: usize,
        lora: Option<&str>,
    ) -> Result<Prepared> {
        let mut seqs = Vec::new();
        for (req, tenant) in reqs {
            let r = self.render(req)?;
            let lora = lora.or(req.lora.as_deref()).map(|name| self.lora.acquire(name)).transpose()?;
            let salt = match (cache_salt(tenant, req, lora.as_deref()), &r.images) {
                (salt, Some((_, images))) => Some(format!("{}\u{2}{images}", salt.unwrap_or_default())),
                (salt, None) => salt,
            };
            for i in 0..samples {
                let mut params = req.params.clone();
                params.seed = params.seed.map(|s| s.wrapping_add(i as u64));
                let mut seq = self.sequence(req, params, tenant, salt.clone(), &r)?;
                seq.lora = lora.clone();
                if let Some((images, _)) = &r.images {
                    match images.embeds() {
                        Some(e) => seq.embeds = Some(e),
                        None => seq.images = Some(images.clone()),
                    }
                }
                seqs.push(seq);
            }
        }
        Ok(Prepared { engine: self.serial, seqs })
    }

    /// A prompt's token ids, validated against `max_model_len`, and the tools it shows the
    /// model (checked); counted in `num_prompt_renders`.
    fn render<'a>(&self, req: &'a Request) -> Result<Rendered<'a>> {
        self.renders.fetch_add(1, Ordering::Relaxed);
        self.check_task(req)?;
        if req.pooling.is_none() {
            req.params.validate()?; // an embedding request's are not read
        }
        let offered = self.offered_tools(req)?;
        if let Some(t) = req.params.logit_bias.keys().find(|&&t| t as usize >= self.vocab_size) {
            return Err(Error::invalid(format!(
                "logit_bias names token {t}, outside the vocabulary (size {})",
                self.vocab_size
            )));
        }
        self.check_prompt_bytes(&req.prompt)?;
        let mut images = None;
        let (text, ids) = match &req.prompt {
            Prompt::Text(t) => (t.clone(), self.tokenizer.encode(t, true)?),
            Prompt::Messages(m) => {
                if let Some(bad) = m.iter().find(|m| !CHAT_ROLES.contains(&m.role.as_str())) {
                    return Err(Error::invalid(format!(
                        "unknown message role '{}': expected one of {}",
                        bad.role,
                        CHAT_ROLES.join(", ")
                    )));
                }
                tools::check_tool_messages(m)?;
                let parts: Vec<_> = m.iter().flat_map(|m| m.images()).collect();
                let vision = match (&self.images, parts.is_empty()) {
                    (_, true) => None,
                    (Images::Vision(v), false) => Some(v),
                    (Images::Refused(why), false) => {
                        return Err(Error::invalid(format!("the model '{}' {why}", self.config.served_name())))
                    }
                };
                let tools = offered.map_or(&[][..], |t| &t.tools[..]);
                let t = self.tokenizer.apply_chat_template_with(m, tools, true, &req.chat_template_kwargs)?;
                if let Some(vision) = vision {
                    let mut e = vision.expand(&t, &parts)?;
                    let ids = self.tokenizer.encode(&e.text, false)?;
                    let (text, salt) = (std::mem::take(&mut e.text), std::mem::take(&mut e.salt));
                    images = Some((Arc::new(PromptImages::new(vision, &ids, e)?), salt));
                    (text, ids)
                } else {
                    let ids = self.tokenizer.encode(&t, false)?;
                    (t, ids)
                }
            }
            Prompt::TokenIds(ids) => {
                let vocab = self.vocab_size;
                if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                    return Err(Error::invalid(format!(
                        "prompt token id {bad} is outside the vocabulary (size {vocab})"
                    )));
                }
                (self.tokenizer.decode(ids, false)?, ids.clone())
            }
            Prompt::Infill { prefix, suffix } => {
                let ids = self.tokenizer.infill(prefix, suffix)?;
                (self.tokenizer.decode(&ids, false)?, ids)
            }
        };
        if ids.is_empty() {
            return Err(Error::invalid("the prompt is empty"));
        }
        if ids.len() >= self.max_model_len {
            return Err(Error::ContextLengthExceeded(format!(
                "the prompt has {} tokens but max_model_len is {}: shorten it or raise max_model_len",
                ids.len(),
                self.max_model_len
            )));
        }
        Ok(Rendered { text, ids, offered, images })
    }

    /// Refuses a text too long for `max_model_len` tokens whatever it says, before tokenizing it
    /// (a huge body costs no tokenizer time).
    fn check_prompt_bytes(&self, prompt: &Prompt) -> Result<()> {
        let bytes = match prompt {
            Prompt::Text(t) => t.len(),
            Prompt::Messages(m) => m.iter().map(|m| m.content.len()).sum(),
            Prompt::TokenIds(_) => 0,
            Prompt::Infill { prefix, suffix } => prefix.len() + suffix.len(),
        };
        if bytes <= self.max_prompt_bytes {
            return Ok(());
        }
        Err(Error::ContextLengthExceeded(format!(
            "the prompt has {bytes} bytes of text, more than {} tokens (max_model_len) can hold: shorten it",
            self.max_model_len
        )))
    }

    /// Refuses a generation request on an embedding model and an embedding request on a
    /// generating one, and checks an embedding's `dimensions`.
    fn check_task(&self, req: &Request) -> Result<()> {
        let name = self.config.served_name();
        match (self.pooling, &req.pooling) {
            (Some(_), None) => Err(Error::invalid(format!(
                "the model '{name}' is an embedding model (task = \"embed\"): it serves embeddings, not generation"
            ))),
            (None, Some(_)) => Err(Error::invalid(format!(
                "the model '{name}' does not serve embeddings: load it with task = \"embed\""
            ))),
            (Some(_), Some(p)) => {
                if req.tools.is_some() || req.lora.is_some() {
                    return Err(Error::invalid("an embedding request takes no tools and no LoRA adapter"));
                }
                p.validate(self.hidden_size)
            }
            (None, None) => Ok(()),
        }
    }

    /// One sample of a rendered request as the step loop's `Sequence`: its tenant, tokens,
    /// guide and tools, checked against the KV pool it must fit.
    fn sequence(
        &self,
        req: &Request,
        params: SamplingParams,
        tenant: &Arc<Tenant>,
        cache_salt: Option<String>,
        r: &Rendered<'_>,
    ) -> Result<Sequence> {
        let eos = &self.tokenizer.eos_token_ids;
        // An embedding request generates nothing: it ends once its prompt is pooled.
        let params = if req.pooling.is_some() { SamplingParams::greedy(0) } else { params };
        let mut seq = Sequence::new(r.text.clone(), r.ids.clone(), params, eos, self.max_model_len);
        if let (Some(mode), Some(p)) = (self.pooling, &req.pooling) {
            seq.pooling = Some((lmplex_model::Pooler::new(mode, self.hidden_size), p.clone()));
        }
        seq.priority = if req.priority != 0 { req.priority } else { tenant.config().priority };
        seq.cache_salt = cache_salt;
        seq.cache_block = self.config.enable_prefix_caching.then_some(BLOCK_SIZE);
        seq.tenant = (!tenant.name().is_empty()).then(|| tenant.clone());
        let factory = || self.guided.get_or_init(|| GuidedFactory::new(&self.tokenizer, self.vocab_size));
        if let Some(s) = &req.params.structured_outputs {
            seq.guide = Some(factory().as_ref().map_err(Clone::clone)?.guide(s)?);
        }
        if let Some(t) = r.offered {
            self.tool_sequence(&mut seq, t, factory().as_ref().map_err(Clone::clone)?)?;
        }
        if let (Some(tokens), Prompt::Messages(_)) = (self.reasoning, &req.prompt) {
            let inside = lmplex_model::reasoning::prompt_opens_reasoning(&r.text);
            seq.reasoning = Some(lmplex_model::ReasoningStream::new(inside));
            seq.think_gate = tokens.map(|(open, close)| ThinkGate::new(open, close, inside));
        }
        let need = seq.max_len.div_ceil(BLOCK_SIZE);
        if need > self.sizing.num_blocks {
            return Err(Error::invalid(format!(
                "the request may reach {} tokens ({need} KV blocks) but the KV pool holds {} blocks of \
                 {BLOCK_SIZE} tokens: lower max_tokens or raise kv_cache_bytes",
                seq.max_len, self.sizing.num_blocks
            )));
        }
        Ok(seq)
    }

    /// Takes one place in the bounded queue for `seq`, or says it is full (`Capacity`).
    pub(super) fn reserve(&self, seq: &Sequence) -> Result<QueueSlot> {
        let prompt = seq.prompt_ids.len();
        let work = Work::one(prompt, seq.max_len - prompt);
        self.stats.num_queued.try_reserve(self.config.max_queue_len, work, seq.max_latency.is_some())
    }

    /// Sends sequences with their queue places to the step loop in one command, so they join
    /// it in the same turn: their prefills batch together, and so do their images' tower pass.
    /// Their places are given back if the loop has stopped.
    pub(super) fn send(&self, seqs: Vec<(Sequence, QueueSlot)>) -> Result<Vec<RequestHandle>> {
        let mut handles = Vec::with_capacity(seqs.len());
        let mut news = Vec::with_capacity(seqs.len());
        for (seq, slot) in seqs {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            handles.push(RequestHandle {
                id,
                prompt: seq.prompt.clone(),
                prompt_token_ids: seq.prompt_ids.clone(),
                rx,
                aborter: Aborter::new(id, self.cmd.clone()),
                done: false,
            });
            news.push(NewRequest { id, seq, arrival: Instant::now(), tx, slot });
        }
        if self.cmd.send(Command::Add(news)).is_err() {
            return Err(Error::internal("the engine's step loop has stopped; reload the model"));
        }
        Ok(handles)
    }

    /// Admits a prepared call (once per tenant) and queues it; its chunks arrive on the
    /// returned handles, in sequence order (dropping one aborts its request). `InvalidRequest`
    /// for a `Prepared` of another engine, `RateLimited` when a tenant's quota refuses it,
    /// `Capacity` when `max_queue_len` requests already wait; a refusal queues nothing.
    pub fn submit_prepared(&self, p: Prepared) -> Result<Vec<RequestHandle>> {
        let seqs = self.admitted(p)?;
        let mut slotted = Vec::with_capacity(seqs.len());
        for seq in seqs {
            let slot = self.reserve(&seq)?; // dropping `slotted` gives the places taken back
            slotted.push((seq, slot));
        }
        self.send(slotted)
    }

    /// The sequences of `p`, admitted (one admission per tenant; the default tenant has none).
    pub(super) fn admitted(&self, p: Prepared) -> Result<Vec<Sequence>> {
        if p.engine != self.serial {
            return Err(Error::invalid(format!(
                "this call was prepared by another model than '{}'",
                self.config.served_name()
            )));
        }
        let mut seqs = p.seqs;
        self.admit(&mut seqs)?;
        Ok(seqs)
    }

    /// Admits each tenant's sequences of one call against its quotas, once per tenant (the
    /// default tenant has none); the admission rides on every sequence.
    fn admit(&self, seqs: &mut [Sequence]) -> Result<()> {
        let mut tenants: Vec<Arc<Tenant>> = Vec::new();
        for t in seqs.iter().filter_map(|s| s.tenant.as_ref()) {
            if !tenants.iter().any(|k| Arc::ptr_eq(k, t)) {
                tenants.push(t.clone());
            }
        }
        for tenant in tenants {
            let mine = |s: &&mut Sequence| s.tenant.as_ref().is_some_and(|t| Arc::ptr_eq(t, &tenant));
            let (mut prompt, mut new) = (0, 0);
            for s in seqs.iter_mut().filter(mine) {
                prompt += s.prompt_ids.len();
                new += s.max_len - s.prompt_ids.len();
            }
            let a = Arc::new(tenant.admit(&self.config, prompt as u64, new as u64)?);
            seqs.iter_mut().filter(mine).for_each(|s| s.admission = Some(a.clone()));
        }
        Ok(())
    }
}

/// The prefix-cache salt of `req` for `tenant` under `lora`: the tenant's and the request's,
/// joined, behind the adapter's id (K/V computed under an adapter serve only that adapter).
fn cache_salt(tenant: &Tenant, req: &Request, lora: Option<&LoraAdapter>) -> Option<String> {
    let salt = match (tenant.salt(), &req.cache_salt) {
        (Some(t), Some(r)) => Some(format!("{t}\u{0}{r}")),
        (Some(t), None) => Some(t.to_string()),
        (None, r) => r.clone(),
    };
    match lora {
        Some(a) => Some(format!("lora#{}\u{1}{}", a.id(), salt.unwrap_or_default())),
        None => salt,
    }
}
