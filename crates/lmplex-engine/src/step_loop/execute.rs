//! The `execute` phase of a step (see `core`'s header): one forward pass over the scheduled
//! chunks (under the device's turn, which on the CPU it may give to another model's step
//! between layers), then each sampling request's token, picked by the runner (`execute_picked`, on the
//! device for CUDA) when no request needs its logits row on the host, else sampled here.
//!
//! Speculative verification (`verify`): a decode chunk with drafted tokens has a logits row per
//! token; row `j` is sampled exactly as plain decoding samples that position (the same sampler
//! state, penalties, guide, seeded draw by position), and the next row is read only while the
//! token picked equals the draft there. A drafted token is kept only when it *is* the token
//! plain decoding picks, which is stricter than rejection sampling: the output is the same
//! tokens, logprobs included, not just the same distribution.
//!
//! Invariant: both ways pick the same token from the same logits (`lmplex_model::sample::pick`), so
//! which one a step takes never changes a request's output.

use super::{EngineCore, StepFailure};
use crate::runner;
use crate::sequence::Sequence;
use lmplex_core::{Error, Result, TokenId};
use lmplex_kv::manager::ReqId;
use lmplex_model::sample::pick::Pick;
use lmplex_sched::{SchedulerOutput, Turn};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Time since `t` that the pass ran, not counting what it spent giving the device way.
pub(super) fn running_time(t: Instant, turn: Option<&Turn>) -> Duration {
    t.elapsed().saturating_sub(turn.map_or(Duration::ZERO, Turn::gave_way))
}

/// What sampling produced this step.
#[derive(Default)]
pub(super) struct Sampled {
    /// The new tokens of each request that sampled: one, or after drafts the accepted drafts
    /// and the token after them.
    pub(super) tokens: HashMap<ReqId, Vec<TokenId>>,
    /// Requests that ended this step (a stop, a length limit, or their own failure).
    pub(super) finished: Vec<ReqId>,
    /// Of `finished`, those that failed (their structured-output guide), with the error.
    pub(super) failed: Vec<(ReqId, Error)>,
    /// Of `finished`, those that only scored their prompt (`max_tokens` 0): no token.
    pub(super) scored: Vec<ReqId>,
    /// Tokens drafted and verified this step, and of those the accepted.
    pub(super) drafted: usize,
    pub(super) accepted: usize,
}

impl Sampled {
    /// Notes what appending tokens to `seq` (request `id`, `from` tokens long before) gave.
    fn note(&mut self, id: ReqId, seq: &Sequence, from: usize, appended: Result<()>) {
        match appended {
            Ok(()) => {
                self.tokens.insert(id, seq.output_ids[from..].to_vec());
                if seq.is_finished() {
                    self.finished.push(id);
                }
            }
            // This request's own failure (its structured-output guide): it alone ends.
            Err(e) => {
                self.finished.push(id);
                self.failed.push((id, e));
            }
        }
    }
}

impl EngineCore {
    /// One forward pass over every scheduled chunk, then sampling and stop checks for the
    /// requests whose chunk reached their last token.
    pub(super) fn execute(
        &mut self,
        out: &SchedulerOutput,
        turn: Option<&Turn>,
    ) -> std::result::Result<Sampled, StepFailure> {
        if out.scheduled.iter().any(|s| self.active.get(&s.id).is_some_and(|a| a.seq.pooling.is_some())) {
            return self.execute_pooled(out, turn); // an embedding model's step
        }
        let fail = |e| StepFailure::of_batch(out, e);
        let mut picks = Vec::new();
        let picked = out.scheduled.iter().all(|s| {
            let pick = || self.active.get(&s.id).filter(|a| a.seq.sampler_params().max_tokens > 0)?.seq.pick();
            !s.all_logits && s.num_draft_tokens == 0 && (!s.sample || pick().map(|p| picks.push(p)).is_some())
        });
        if picked && !picks.is_empty() {
            return self.execute_picked(out, &picks, turn);
        }
        let t = Instant::now();
        let give_way = || turn.map_or((), Turn::give_way);
        let active = &self.active;
        let batch = runner::forward_batch(out, |id| active.get(&id).map(|a| &a.seq));
        let logits = self.runner.forward(&batch, &give_way).map_err(fail)?;
        let elapsed = running_time(t, turn);
        let mut sampled = Sampled::default();
        let mut rows = logits.chunks_exact(self.vocab_size);
        for s in &out.scheduled {
            // A chunk's rows: all of them for a prompt-logprobs chunk, else the last if it samples.
            let missing = || fail(Error::internal("missing logits row"));
            let row = if s.num_draft_tokens > 0 {
                let chunk: Vec<&[f32]> = rows.by_ref().take(s.token_ids.len()).collect();
                if chunk.len() != s.token_ids.len() {
                    return Err(missing());
                }
                let a = self.active.get_mut(&s.id).ok_or_else(|| fail(Error::internal("unknown request")))?;
                let from = a.seq.output_ids.len();
                let (appended, accepted) = verify(&mut a.seq, &self.tokenizer, &chunk, s.draft_token_ids());
                sampled.drafted += s.num_draft_tokens;
                sampled.accepted += accepted;
                sampled.note(s.id, &a.seq, from, appended);
                continue;
            } else if s.all_logits {
                let chunk: Vec<&[f32]> = rows.by_ref().take(s.token_ids.len()).collect();
                let row = *chunk.last().filter(|_| chunk.len() == s.token_ids.len()).ok_or_else(missing)?;
                let a = self.active.get_mut(&s.id).ok_or_else(|| fail(Error::internal("unknown request")))?;
                a.seq.add_prompt_logprobs(&self.tokenizer, s.num_computed_tokens, &chunk);
                row
            } else if s.sample {
                rows.next().ok_or_else(missing)?
            } else {
                continue;
            };
            if !s.sample {
                continue;
            }
            let a = self.active.get_mut(&s.id).ok_or_else(|| fail(Error::internal("unknown request")))?;
            if a.seq.sampler_params().max_tokens == 0 {
                a.seq.finish_scoring();
                sampled.finished.push(s.id);
                sampled.scored.push(s.id);
                continue;
            }
            let from = a.seq.output_ids.len();
            let appended = a.seq.append_from_logits(&self.tokenizer, row);
            sampled.note(s.id, &a.seq, from, appended);
        }
        drop(logits);
        self.measure_forward(out, elapsed);
        Ok(sampled)
    }

    /// `execute` for a step whose every sampling request's pick needs only its logits row
    /// (`Sequence::pick`: `picks`, in order) and that scores no prompt: the runner picks the
    /// tokens (on CUDA on the device, so only the ids cross to the host), the same tokens the
    /// sampler would pick from the logits.
    fn execute_picked(
        &mut self,
        out: &SchedulerOutput,
        picks: &[Pick],
        turn: Option<&Turn>,
    ) -> std::result::Result<Sampled, StepFailure> {
        let fail = |e| StepFailure::of_batch(out, e);
        let t = Instant::now();
        let give_way = || turn.map_or((), Turn::give_way);
        let active = &self.active;
        let batch = runner::forward_batch(out, |id| active.get(&id).map(|a| &a.seq));
        let ids = self.runner.forward_pick(&batch, picks, &give_way).map_err(fail)?;
        self.measure_forward(out, running_time(t, turn));
        let mut sampled = Sampled::default();
        let mut ids = ids.into_iter();
        for s in out.scheduled.iter().filter(|s| s.sample) {
            let id = ids.next().ok_or_else(|| fail(Error::internal("missing picked row")))?;
            let a = self.active.get_mut(&s.id).ok_or_else(|| fail(Error::internal("unknown request")))?;
            let from = a.seq.output_ids.len();
            let appended = a.seq.append_picked(&self.tokenizer, id);
            sampled.note(s.id, &a.seq, from, appended);
        }
        Ok(sampled)
    }
}

/// Samples `seq` from a drafted chunk's `rows` as plain decoding would, one position after
/// another, while the token picked equals the draft there: the result of the appends, and how
/// many drafts were accepted. It stops at the first mismatch (that row's token is the one
/// kept after the accepted drafts), when the sequence ends, or after the last row.
fn verify(
    seq: &mut Sequence,
    tok: &lmplex_model::Tokenizer,
    rows: &[&[f32]],
    drafts: &[TokenId],
) -> (Result<()>, usize) {
    let mut accepted = 0;
    for (j, row) in rows.iter().enumerate() {
        if let Err(e) = seq.append_from_logits(tok, row) {
            return (Err(e), accepted);
        }
        let picked = seq.output_ids.last().copied();
        if drafts.get(j).copied() != picked {
            break;
        }
        accepted += 1;
        if seq.is_finished() {
            break;
        }
    }
    (Ok(()), accepted)
}
