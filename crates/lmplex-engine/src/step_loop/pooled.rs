//! The `execute` phase of an embedding model's step (`Task::Embed`): one forward pass that
//! stops at the final norm (no head, no sampling), each chunk's rows added to its request's
//! pooling state, and each request whose chunk reached its prompt's end finished with its
//! vector.
//!
//! Invariant: a chunk brings every row of its positions for mean pooling (the step loop reads
//! no prefix cache for it) and its last row when it ends the prompt, as `runner::forward_batch`
//! selects them from the scheduler's `all_logits` and `sample`; so the vector, pooled in
//! position order (`Pooler`), depends on the prompt alone.

use super::execute::{running_time, Sampled};
use super::{EngineCore, StepFailure};
use crate::runner;
use lmplex_core::Error;
use lmplex_sched::{SchedulerOutput, Turn};
use std::time::Instant;

impl EngineCore {
    /// One forward pass to the final hidden states, pooled per request; see the module docs.
    pub(super) fn execute_pooled(
        &mut self,
        out: &SchedulerOutput,
        turn: Option<&Turn>,
    ) -> std::result::Result<Sampled, StepFailure> {
        let fail = |e| StepFailure::of_batch(out, e);
        let t = Instant::now();
        let give_way = || turn.map_or((), Turn::give_way);
        let active = &self.active;
        let batch = runner::forward_batch(out, |id| active.get(&id).map(|a| &a.seq));
        let rows = self.runner.forward_hidden(&batch, &give_way).map_err(fail)?;
        let elapsed = running_time(t, turn);
        let hidden = if batch.num_logit_rows() == 0 { 1 } else { rows.len() / batch.num_logit_rows() };
        let mut sampled = Sampled::default();
        let mut at = 0;
        for s in &out.scheduled {
            let n = if s.all_logits { s.token_ids.len() } else { usize::from(s.sample) };
            let chunk =
                rows.get(at * hidden..(at + n) * hidden).ok_or_else(|| fail(Error::internal("missing rows")))?;
            at += n;
            let a = self.active.get_mut(&s.id).ok_or_else(|| fail(Error::internal("unknown request")))?;
            let (pooler, _) =
                a.seq.pooling.as_mut().ok_or_else(|| fail(Error::internal("a request that pools none")))?;
            let start = s.num_computed_tokens + s.token_ids.len() - n;
            pooler.add(start, chunk);
            if s.sample {
                a.seq.finish_pooling();
                sampled.finished.push(s.id);
                sampled.scored.push(s.id);
            }
        }
        self.measure_forward(out, elapsed);
        Ok(sampled)
    }
}
