//! `Scheduler::update`: a step's results applied to the requests: computed tokens, sampled
//! tokens, the accepted drafts' K/V kept and the rejected ones' blocks freed, the tenants'
//! service charged, and the requests the engine ended removed.
//!
//! Invariant: a request's computed tokens never include a rejected draft, so the prefix cache
//! only ever holds blocks of verified tokens.

use super::{Scheduler, SchedulerOutput};
use lmplex_core::{Error, Result, TokenId};
use lmplex_kv::manager::ReqId;
use std::collections::HashMap;

impl Scheduler {
    /// Applies a step: every scheduled chunk is computed, `sampled` holds the tokens of each
    /// request that was sampled (one, or with drafts the accepted drafts and the token after
    /// them), and `finished` lists requests the engine ended (stop, length, error); those are
    /// removed and their blocks freed. A request with drafts keeps the K/V of its accepted
    /// drafts only: the blocks past them are freed.
    pub fn update(
        &mut self,
        out: &SchedulerOutput,
        sampled: &HashMap<ReqId, Vec<TokenId>>,
        finished: &[ReqId],
    ) -> Result<()> {
        let s_per_token = self.seconds_per_token();
        for s in &out.scheduled {
            let Some(r) = self.requests.get_mut(&s.id) else { continue }; // aborted meanwhile
            let start = r.num_computed_tokens;
            let tokens = if s.sample && !finished.contains(&s.id) {
                let t = sampled
                    .get(&s.id)
                    .filter(|t| !t.is_empty() && t.len() <= 1 + s.num_draft_tokens)
                    .ok_or_else(|| Error::internal(format!("request {} was sampled but has no tokens", s.id)))?;
                t.as_slice()
            } else {
                &[]
            };
            // Drafts: the rows up to the last accepted one hold verified K/V.
            let computed = s.token_ids.len() - s.num_draft_tokens + tokens.len().saturating_sub(1);
            r.num_computed_tokens += computed;
            let generated = if s.sample && sampled.contains_key(&s.id) { 1 + s.num_draft_tokens } else { 0 };
            self.vtc.charge(r, start, start + s.token_ids.len(), generated, s_per_token);
            if s.num_draft_tokens > 0 && !tokens.is_empty() {
                r.acceptance.record(s.num_draft_tokens, tokens.len() - 1);
            }
            for &t in tokens {
                r.append_output_token(t);
            }
            if r.num_tokens() > r.max_num_tokens {
                return Err(Error::internal(format!("request {} ran past its {} tokens", s.id, r.max_num_tokens)));
            }
            if s.num_draft_tokens > 0 {
                self.kv.truncate(s.id, r.num_computed_tokens)?;
            }
            self.kv.cache_computed_blocks(s.id, &r.all_token_ids, r.num_computed_tokens);
        }
        for &id in finished {
            self.abort(id)?;
        }
        Ok(())
    }
}
