//! The front of an `Engine`: a request checked and tokenized on the caller's thread, turned
//! into the step loop's `Sequence`, admitted against its tenant's quotas, and sent with a
//! place in the bounded queue.
//!
//! Invariants: every refusal (a bad request, a prompt past `max_model_len`, a request that
//! could never fit the KV pool, a tenant's quota) happens here, before anything is queued; a
//! call's requests are admitted once per tenant, together.

use super::{tools, Engine, Prompt, Request, CHAT_ROLES};
use crate::handle::{Aborter, Command, NewRequest, RequestHandle};
use crate::sequence::Sequence;
use crate::sizing::BLOCK_SIZE;
use crate::stats::QueueSlot;
use crate::tenants::Tenant;
use lmplex_core::{Error, Result, TokenId};
use lmplex_model::GuidedFactory;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

impl Engine {
    /// Token ids of a prompt, validated against `max_model_len`, and the tools it shows the
    /// model (checked).
    pub(super) fn tokenize_prompt<'a>(
        &self,
        req: &'a Request,
    ) -> Result<(String, Vec<TokenId>, Option<&'a lmplex_core::Tools>)> {
        req.params.validate()?;
        let offered = self.offered_tools(req)?;
        if let Some(t) = req.params.logit_bias.keys().find(|&&t| t as usize >= self.vocab_size) {
            return Err(Error::invalid(format!(
                "logit_bias names token {t}, outside the vocabulary (size {})",
                self.vocab_size
            )));
        }
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
                let tools = offered.map_or(&[][..], |t| &t.tools[..]);
                let t = self.tokenizer.apply_chat_template_with_tools(m, tools, true)?;
                let ids = self.tokenizer.encode(&t, false)?;
                (t, ids)
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
        Ok((text, ids, offered))
    }

    /// A request as the step loop's `Sequence`: its tenant, tokens, guide and tools, checked
    /// against the KV pool it must fit.
    pub(super) fn sequence(&self, req: &Request) -> Result<Sequence> {
        let tenant = self.tenants.get(req.tenant.as_deref())?;
        let (text, ids, offered) = self.tokenize_prompt(req)?;
        let mut seq = Sequence::new(text, ids, req.params.clone(), &self.tokenizer.eos_token_ids, self.max_model_len);
        seq.priority = if req.priority != 0 { req.priority } else { tenant.config().priority };
        seq.cache_salt = cache_salt(&tenant, req);
        seq.tenant = (!tenant.name().is_empty()).then_some(tenant);
        let factory = || self.guided.get_or_init(|| GuidedFactory::new(&self.tokenizer, self.vocab_size));
        if let Some(s) = &req.params.structured_outputs {
            seq.guide = Some(factory().as_ref().map_err(Clone::clone)?.guide(s)?);
        }
        if let Some(t) = offered {
            self.tool_sequence(&mut seq, t, factory().as_ref().map_err(Clone::clone)?)?;
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

    /// Takes one place in the bounded queue, or says it is full (`Capacity`).
    pub(super) fn reserve(&self) -> Result<QueueSlot> {
        self.stats.num_queued.try_reserve(self.config.max_queue_len)
    }

    /// Sends a sequence and its queue place to the step loop (the place is given back if the
    /// loop has stopped).
    pub(super) fn send(&self, seq: Sequence, slot: QueueSlot) -> Result<RequestHandle> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let handle = RequestHandle {
            id,
            prompt: seq.prompt.clone(),
            prompt_token_ids: seq.prompt_ids.clone(),
            rx,
            aborter: Aborter::new(id, self.cmd.clone()),
            done: false,
        };
        let new = NewRequest { id, seq, arrival: Instant::now(), tx, slot };
        if self.cmd.send(Command::Add(Box::new(new))).is_err() {
            return Err(Error::internal("the engine's step loop has stopped; reload the model"));
        }
        Ok(handle)
    }

    /// Admits each tenant's sequences of one call against its quotas, once per tenant (the
    /// default tenant has none); the admission rides on every sequence.
    pub(super) fn admit(&self, seqs: &mut [Sequence]) -> Result<()> {
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

/// The prefix-cache salt of `req` for `tenant`: the tenant's and the request's, joined.
pub(super) fn cache_salt(tenant: &Tenant, req: &Request) -> Option<String> {
    match (tenant.salt(), &req.cache_salt) {
        (Some(t), Some(r)) => Some(format!("{t}\u{0}{r}")),
        (Some(t), None) => Some(t.to_string()),
        (None, r) => r.clone(),
    }
}
