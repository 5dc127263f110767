//! The drafting pass of a step (speculative decoding, `crate::spec`), after admission: a
//! scheduled decode of a request at its last known token may carry tokens drafted after it.
//!
//! Each candidate drafted token, request `i`'s `j`-th, is worth `p_i^j` expected tokens (`p_i`
//! its `Acceptance::rate`). Taken best first, the step keeps the number of them that gives it
//! the most expected tokens a second: the step's time with `R` generated rows is the measured
//! `RowCosts` of `R` rows plus its prompt rows at the `StepCost`'s price per token, so where one
//! more row costs nearly its share of the step (a large batch) few or none are kept, and where a
//! step is mostly its fixed part (batch 1) all are. Within the step's token budget, the
//! request's `max_num_tokens` and the pool. So that a cost measured once cannot shut drafts out
//! for good, every `EXPLORE_EVERY`-th step drafts one token more than pays (measuring the larger
//! pass again). Row counts never run are priced optimistically (`RowCosts::cost`), so they
//! are tried once and then known.
//!
//! Proposals come from prompt lookup, or from a draft model the engine runs before the step:
//! `draft_requests` lists the running requests that may draft and how many tokens each is worth
//! drafting, `set_proposals` hands the drafts in, and the pass takes a request's proposal only
//! if it continues the request's current length (any left are dropped). A draft model's pass
//! costs time whether or not its tokens are kept, so once a pass and the step's rows are
//! measured (`observe_draft_pass`, `RowCosts`), a request drafts the `n` (0 included) that
//! gives the most expected tokens a second, `(rows + p + ... + p^n) / (T(rows + n) + n * pass)`
//! for `rows` running requests. A request whose tokens the draft model has not seen (a new
//! request's prompt, or every token after its state was dropped) must first be fed them: that
//! catch-up, `u` tokens at the measured seconds a token of the draft's catch-up passes
//! (`observe_draft_catch_up`; until measured, the target's own price of a prompt token), is
//! spread over the steps the request has left, `(max_num_tokens - tokens) / (1 + p + ... +
//! p^n)`, and added to each step's time for `n > 0`. Before a pass is measured, one request
//! drafts, up to the first token whose chance of being reached falls under a quarter
//! (`Acceptance::draft_len`), and the others wait for its figures. Every `EXPLORE_EVERY`-th
//! call explores: each request that would draft nothing asks for one token if drafting could pay
//! at all (were every token accepted, catch-up included), so its rate and the pass cost stay
//! measured, in one pass for all; and each that would draft asks for none, so the pass without
//! drafts is measured again (a stale figure for it, say from a cold first step, would otherwise
//! keep requests drafting where plain decoding is faster). The scheduler mirrors which tokens the draft model holds (`seen`): a
//! listed request that drafts holds all its tokens after the call, one listed with nothing to
//! draft keeps what it held, and an unlisted one holds nothing (the engine passes every list,
//! empty ones too, so the draft model drops the same states).
//!
//! Invariant: drafts change no token: the engine keeps a drafted token only where it is plain
//! decoding's pick, and `update` frees the blocks of the rest.

use super::{Scheduler, SchedulerOutput};
use crate::spec::{DraftRequest, Drafter, Proposal};
use crate::SchedulerRequest;
use lmplex_core::{Result, TokenId};
use lmplex_kv::manager::ReqId;
use std::collections::HashMap;

/// Steps with a request that could draft between two that draft one token more than pays.
const EXPLORE_EVERY: usize = 16;

/// What the scheduler knows of a draft model (`Drafter::Model`; see the module).
#[derive(Debug, Default)]
pub(super) struct DraftModelState {
    /// Its tokens for this step (`set_proposals`), taken by the drafting pass.
    proposals: HashMap<ReqId, Proposal>,
    /// Seconds of one pass of at most two tokens a row, as measured (`observe_draft_pass`).
    pass_s: Option<f64>,
    /// Seconds a token of a catch-up pass, as measured (`observe_draft_catch_up`).
    catch_up_s: Option<f64>,
    /// Tokens of each request it holds after the last `draft_requests` call.
    seen: HashMap<ReqId, usize>,
    /// Calls of `draft_requests` (its exploration schedule).
    steps: usize,
}

/// Folds `secs` into a measured figure (a moving average).
fn fold(figure: &mut Option<f64>, secs: f64) {
    if secs.is_finite() && secs > 0.0 {
        let d = figure.get_or_insert(secs);
        *d += 0.2 * (secs - *d);
    }
}

/// A scheduled decode that may draft: its index in the step, its proposal, its acceptance rate.
struct Candidate {
    index: usize,
    proposal: Vec<TokenId>,
    rate: f64,
    take: usize,
}

/// Tokens `r` may still draft: its room before `max_num_tokens`, none while its prompt or a
/// recomputation is pending (only a request at its last token drafts).
fn draft_room(r: &SchedulerRequest) -> usize {
    let at_last = r.num_computed_tokens + 1 == r.num_tokens() && r.num_tokens() > r.num_prompt_tokens;
    if at_last {
        r.max_num_tokens.saturating_sub(r.num_tokens() + 1)
    } else {
        0
    }
}

impl Scheduler {
    /// With a draft model (`Drafter::Model`): the running requests that may draft this step,
    /// each with its tokens and how many are worth drafting for it (0: none this step, but the
    /// draft model keeps what it holds of the request, to catch up when it drafts again).
    pub fn draft_requests(&mut self) -> Vec<DraftRequest<'_>> {
        let Some(Drafter::Model { num_speculative_tokens: k }) = self.cfg.speculative else { return Vec::new() };
        self.draft.steps += 1;
        let explore = self.draft.steps.is_multiple_of(EXPLORE_EVERY);
        let rows = self.running.len();
        let catch_up_s = self.draft.catch_up_s.unwrap_or_else(|| self.seconds_per_token());
        // The `n` of `0..=most` with the most expected tokens a second at acceptance rate `p`,
        // for a request with `unseen` tokens to catch up and `left` tokens to go.
        let best = |p: f64, most: usize, pass: f64, unseen: usize, left: usize| {
            let rate = |n: usize| {
                let drafted = (1..=n).map(|j| p.powi(j as i32)).sum::<f64>();
                let steps = (left as f64 / (1.0 + drafted)).max(1.0);
                let catch_up = if n == 0 { 0.0 } else { unseen.saturating_sub(2) as f64 * catch_up_s / steps };
                let time = |t: f64| t + n as f64 * pass + catch_up;
                self.row_costs.cost(rows + n).map_or(0.0, |t| (rows as f64 + drafted) / time(t))
            };
            (0..=most).max_by(|&a, &b| rate(a).total_cmp(&rate(b)).then(b.cmp(&a))).unwrap_or(0)
        };
        let mut asked = Vec::new(); // (id, n)
        let mut unmeasured_turn = true;
        for id in &self.running {
            let r = &self.requests[id];
            let most = draft_room(r).min(k);
            if most == 0 {
                continue;
            }
            let unseen = r.num_tokens() - self.draft.seen.get(id).copied().unwrap_or(0).min(r.num_tokens());
            let left = r.max_num_tokens.saturating_sub(r.num_tokens());
            let n = match (self.draft.pass_s, self.row_costs.cost(rows)) {
                // Explore the other way: one token where none pays but could were every token
                // accepted; none where some pay, so the pass without drafts is measured again.
                (Some(pass), Some(_)) => match best(r.acceptance.rate(), most, pass, unseen, left) {
                    0 if explore && best(1.0, most, pass, unseen, left) > 0 => 1,
                    _ if explore => 0,
                    n => n,
                },
                _ if std::mem::take(&mut unmeasured_turn) => r.acceptance.draft_len(most),
                _ => 0,
            };
            asked.push((*id, n));
        }
        let held = std::mem::take(&mut self.draft.seen);
        for &(id, n) in &asked {
            let now = if n > 0 { self.requests[&id].num_tokens() } else { held.get(&id).copied().unwrap_or(0) };
            self.draft.seen.insert(id, now);
        }
        let this = &*self;
        asked
            .into_iter()
            .map(|(id, n)| {
                let r = &this.requests[&id];
                DraftRequest { id, tokens: &r.all_token_ids, num_prompt_tokens: r.num_prompt_tokens, n }
            })
            .collect()
    }

    /// One pass of the draft model took `secs`, measured by the engine (see the module).
    pub fn observe_draft_pass(&mut self, secs: f64) {
        fold(&mut self.draft.pass_s, secs);
    }

    /// The draft model's catch-up passes took `secs` a token, measured by the engine (see the
    /// module).
    pub fn observe_draft_catch_up(&mut self, secs: f64) {
        fold(&mut self.draft.catch_up_s, secs);
    }

    /// A draft model's tokens for the next step (see `draft_requests`).
    pub fn set_proposals(&mut self, proposals: HashMap<ReqId, Proposal>) {
        self.draft.proposals = proposals;
    }

    /// Adds drafted tokens to the step's decodes (see the module), each taking one token of
    /// `budget`.
    pub(super) fn add_drafts(&mut self, out: &mut SchedulerOutput, budget: &mut usize) -> Result<()> {
        let Some(drafter) = self.cfg.speculative else { return Ok(()) };
        let mut proposals = std::mem::take(&mut self.draft.proposals);
        let (mut prompt_rows, mut rows, mut tokens) = (0, 0, 0.0);
        let mut cands = Vec::new();
        for (index, s) in out.scheduled.iter().enumerate() {
            let p = s.num_prompt_tokens.saturating_sub(s.num_computed_tokens).min(s.token_ids.len());
            prompt_rows += p;
            rows += s.token_ids.len() - p;
            tokens += f64::from(u8::from(s.sample));
            let r = &self.requests[&s.id];
            let room = draft_room(r).min(drafter.num_speculative_tokens());
            if !s.sample || s.token_ids.len() != 1 || room == 0 {
                continue;
            }
            let proposal = match drafter {
                Drafter::Ngram(p) => p.propose(&r.all_token_ids, room),
                Drafter::Model { .. } => match proposals.remove(&s.id) {
                    Some(Proposal { at, mut tokens }) if at == r.num_tokens() => {
                        tokens.truncate(room);
                        tokens
                    }
                    _ => Vec::new(),
                },
            };
            if !proposal.is_empty() {
                cands.push(Candidate { index, proposal, rate: r.acceptance.rate(), take: 0 });
            }
        }
        let fixed = prompt_rows as f64 * self.step_cost.map_or(0.0, |c| c.s_per_token);
        let time = |rows: usize| self.row_costs.cost(rows).map(|c| fixed + c);
        let worth = |c: &Candidate| c.rate.powi(c.take as i32 + 1);
        // Every `EXPLORE_EVERY` steps with candidates, one drafted token more than pays, so the
        // cost of a larger pass is measured again (a stale figure cannot shut drafts out).
        self.steps_since_explore += usize::from(!cands.is_empty());
        let explore = self.steps_since_explore >= EXPLORE_EVERY;
        if explore {
            self.steps_since_explore = 0;
        }
        // Best first; keep the prefix of additions with the most expected tokens a second.
        let (mut order, mut best_n) = (Vec::new(), 0);
        let mut best_rate = time(rows).map_or(0.0, |t| tokens / t);
        let mut added = 0.0;
        while order.len() < *budget {
            let Some(i) = (0..cands.len())
                .filter(|&i| cands[i].take < cands[i].proposal.len())
                .max_by(|&a, &b| worth(&cands[a]).total_cmp(&worth(&cands[b])))
            else {
                break;
            };
            added += worth(&cands[i]);
            cands[i].take += 1;
            order.push(i);
            let rate = time(rows + order.len()).map_or(f64::INFINITY, |t| (tokens + added) / t);
            if rate > best_rate {
                (best_rate, best_n) = (rate, order.len());
            }
        }
        if explore {
            best_n = (best_n + 1).min(order.len());
        }
        for &i in &order[best_n..] {
            cands[i].take -= 1;
        }
        *budget -= best_n;
        for c in cands.into_iter().filter(|c| c.take > 0) {
            let s = &mut out.scheduled[c.index];
            if self.kv.allocate_slots(s.id, s.num_computed_tokens, 1 + c.take, &[])?.is_none() {
                *budget += c.take; // the pool is short: this one decodes without drafts
                continue;
            }
            s.block_table = self.kv.block_table(s.id).to_vec();
            s.token_ids.extend_from_slice(&c.proposal[..c.take]);
            s.num_draft_tokens = c.take;
        }
        Ok(())
    }
}
