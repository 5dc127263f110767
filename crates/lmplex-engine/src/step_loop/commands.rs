//! The step loop's side of the `Command`s the front sends: new requests join the scheduler, or
//! first wait for the vision tower (`encoding.rs`); aborted requests, and those whose callers
//! are gone, leave wherever they are.
//!
//! Invariants: a request is in at most one of the encoding queue and `active`; one in `active`
//! is known to the scheduler; leaving either gives back its queue place if it still holds one.

use super::{Active, EngineCore};
use crate::handle::{Command, NewRequest};
use lmplex_kv::manager::ReqId;
use lmplex_sched::SchedulerRequest;

impl EngineCore {
    pub(super) fn handle(&mut self, c: Command) {
        match c {
            Command::Add(news) => {
                for r in news {
                    match r.seq.images {
                        Some(_) => self.encoding.push(r),
                        None => self.add(r),
                    }
                }
            }
            Command::Abort(id) => {
                // The caller may still read the stream (an abort by id): end it properly.
                let abort = (lmplex_core::FinishReason::Abort, None);
                if let Some(mut r) = self.encoding.take(id) {
                    r.seq.finish = Some(abort.clone());
                    let _ = r.tx.send(Ok(r.seq.take_chunk()));
                } else if let Some(a) = self.active.get_mut(&id) {
                    a.seq.finish = Some(abort);
                    let _ = a.tx.send(Ok(a.seq.take_chunk()));
                }
                self.remove(id);
            }
        }
    }

    /// Hands a request to the scheduler (or, refused, sends the caller why).
    pub(super) fn add(&mut self, r: NewRequest) {
        let NewRequest { id, seq, arrival, tx, slot } = r;
        let mut req = SchedulerRequest::new(id, seq.prompt_ids.clone(), seq.max_len, arrival);
        req.priority = seq.priority;
        req.deadline = seq.max_latency.map(|d| arrival + d);
        req.cache_salt = seq.cache_salt.clone();
        req.tenant = seq.tenant.as_ref().map(|t| t.share().clone()).unwrap_or_default();
        // Mean pooling reads every prompt position's state, as prompt logprobs read
        // every position's logits: neither reads the prefix cache.
        let mean = seq.pooling.as_ref().is_some_and(|(p, _)| p.mode() == lmplex_core::Pooling::Mean);
        req.all_prompt_logits = seq.sampler_params().prompt_logprobs.is_some() || mean;
        req.lora = seq.lora.as_ref().map(|a| a.id());
        req.unsplit_spans = seq.embeds.as_ref().map(|e| e.blocks()).unwrap_or_default();
        match self.sched.add_request(req) {
            Ok(()) => {
                let a = Active::new(seq, tx, slot, arrival);
                self.active.insert(id, a);
            }
            Err(e) => {
                // Refused: its queue place is free before the caller hears.
                drop(slot);
                let _ = tx.send(Err(e));
            }
        }
    }

    pub(super) fn remove(&mut self, id: ReqId) {
        // Dropping `Active` gives back its queue slot if it was never scheduled.
        if self.active.remove(&id).is_some() {
            // The request is known to the scheduler whenever it is active.
            let _ = self.sched.abort(id);
        }
    }

    pub(super) fn drop_closed(&mut self) {
        self.encoding.drop_closed();
        let closed: Vec<ReqId> = self.active.iter().filter(|(_, a)| a.tx.is_closed()).map(|(&id, _)| id).collect();
        for id in closed {
            self.remove(id);
        }
    }
}
