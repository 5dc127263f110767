//! The step loop's drafting hook: with speculative decoding's `draft` method, the draft model
//! proposes tokens for the requests the scheduler lets draft, before each step is scheduled.

use super::EngineCore;

impl EngineCore {
    /// With a draft model: its proposals for the requests that may draft this step. A failed
    /// pass only costs the step its drafts (logged once).
    pub(super) fn draft(&mut self) {
        let Some(draft) = &mut self.draft else { return };
        // Every list, empty ones too: the draft model drops the state of the requests not in
        // it, as the scheduler's mirror of what it holds assumes.
        let requests = self.sched.draft_requests();
        let r = draft.propose(&requests);
        match r {
            Ok(p) => {
                self.sched.set_proposals(p);
                if let Some(secs) = draft.last_pass_s() {
                    self.sched.observe_draft_pass(secs);
                }
                if let Some(secs) = draft.last_catch_up_s() {
                    self.sched.observe_draft_catch_up(secs);
                }
            }
            Err(e) if !self.draft_failed => {
                self.draft_failed = true;
                tracing::warn!(error = %e, "speculative: the draft model failed; steps go on without its drafts");
            }
            Err(_) => {}
        }
    }
}
