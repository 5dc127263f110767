//! The policy's order over requests (`rank`), what the first waiting request may take from
//! running ones that rank after it (`preempt_for_waiting`): a slot, and budget; and the
//! step's token budget while requests wait (`step_budget`), and which waiting request may not
//! join yet because a running one with a deadline would then miss it (`joining_breaks_a_deadline`)
//! or because `max_loras` other adapters run (`waits_for_adapter`); and when a model with nothing
//! running starts nothing because another model's deadlines guard the device (`held_by_device`).
//!
//! Invariants: `rank` and `outranks` agree, so a request preempted for a waiting one ranks
//! after it and cannot take the slot straight back; a `Reserve` only shrinks prefill chunks,
//! never a decode token; nothing here changes what a request computes, only when.

use super::{Scheduler, SchedulerOutput};
use crate::config::{Policy, SHORT_PROMPT};
use lmplex_core::Result;
use lmplex_kv::manager::ReqId;
use std::collections::{HashMap, HashSet};
use std::time::Instant;

/// A request's place in the policy's order (`Scheduler::rank`): priority, the tenant's
/// counter bits and whether it runs something (`Fair`), no deadline, arrival, id.
pub(super) type Rank = (i32, u64, bool, bool, Instant, ReqId);

/// Budget a step keeps for the first waiting request (`preempt_for_waiting`).
pub(super) struct Reserve {
    /// Running requests ranked after it: their prefill chunks leave `tokens` of the budget.
    pub after: HashSet<ReqId>,
    /// Tokens its next chunk may need (its prefix-cache hit is not known yet).
    pub tokens: usize,
}

impl Scheduler {
    /// The step's token budget: `max_num_batched_tokens`, capped by the measured `StepCost`
    /// (its rule) while a request waits and another runs, or while another model on the device
    /// has requests, but with room beside the running requests for the `first` waiting
    /// request's chunk when it is at most `SHORT_PROMPT` tokens; never 0.
    pub(super) fn step_budget(&self, first: Option<&Reserve>) -> usize {
        let max = self.cfg.max_num_batched_tokens;
        let waits = !self.waiting.is_empty() && !self.running.is_empty();
        match self.step_cost {
            Some(c) if waits || self.vtc.seat().others_busy() => {
                let short = first.map(|r| r.tokens).filter(|&n| n <= SHORT_PROMPT);
                let room = short.map_or(0, |n| self.running.len() + n);
                c.token_budget(self.running.len()).max(room).clamp(1, max)
            }
            _ => max,
        }
    }

    /// Whether admitting waiting `w` now would make a running request that ranks before it miss
    /// its deadline: one on track at the present batch that would not be with one more request.
    /// On track: the prompt tokens the batch has still to compute (prefill chunks, its own and
    /// those of requests admitted this step included) and then its output tokens left, at most,
    /// each a step of the measured `StepCost`; one more request adds a row to every step and its
    /// prompt to compute. Never without a measured step cost.
    pub(super) fn joining_breaks_a_deadline(&self, w: ReqId, now: Instant, running: &HashMap<&str, usize>) -> bool {
        let Some(c) = self.step_cost else { return false };
        let w_rank = self.rank(w, running);
        let to_compute = |id: &ReqId| {
            let r = &self.requests[id];
            r.num_tokens().saturating_sub(r.num_computed_tokens) as f64 * c.s_per_token
        };
        let prefill_s = self.running.iter().map(to_compute).sum::<f64>();
        let joined_prefill_s = prefill_s + to_compute(&w);
        let b = self.running.len() as f64;
        let step = |batch: f64| c.base_s + c.s_per_token * batch;
        self.running.iter().any(|&id| {
            let r = &self.requests[&id];
            let Some(deadline) = r.deadline else { return false };
            let slack = deadline.saturating_duration_since(now).as_secs_f64();
            let left = r.max_num_tokens.saturating_sub(r.num_tokens()) as f64;
            self.rank(id, running) < w_rank
                && prefill_s + left * step(b) <= slack
                && joined_prefill_s + left * step(b + 1.0) > slack
        })
    }

    /// Until when this model, with nothing running, must not start anything: another model on
    /// the device guards its deadlines (`ledger`'s device guard). `None` when it may.
    pub(super) fn held_by_device(&self, now: Instant) -> Option<Instant> {
        if !self.running.is_empty() || self.waiting.is_empty() {
            return None;
        }
        self.vtc.seat().guarded_by_others(now)
    }

    /// How many requests each tenant has running.
    pub(super) fn running_tenants(&self) -> HashMap<&str, usize> {
        let mut n: HashMap<&str, usize> = HashMap::new();
        for id in &self.running {
            *n.entry(&self.requests[id].tenant.name).or_default() += 1;
        }
        n
    }

    /// Rank for preemption and admission: smaller goes first, larger is preempted first.
    /// Under `Fair`, at equal counters a tenant with nothing `running` goes first. Then, in
    /// every policy, a request with a deadline before one without, then arrival. (Not earliest
    /// deadline first: a call is accepted on a prediction made when it arrives, which a later
    /// call with an earlier deadline going first would break.)
    pub(super) fn rank(&self, id: ReqId, running: &HashMap<&str, usize>) -> Rank {
        let r = &self.requests[&id];
        let (p, served, serving) = match self.cfg.policy {
            Policy::Fcfs => (0, 0, false),
            Policy::Priority => (r.priority, 0, false),
            // Counters are finite and >= 0, where the bits of an f64 order as its value.
            Policy::Fair => {
                let name = &*r.tenant.name;
                (r.priority, self.vtc.counter(name).to_bits(), running.contains_key(name))
            }
        };
        (p, served, serving, r.deadline.is_none(), r.arrival, id)
    }

    /// Makes room for the first waiting request under `Priority` and `Fair`: with every slot
    /// taken, preempts the running request it outranks (`outranks`), if any. When a slot is
    /// then free, returns what running requests ranked after it owe it: the running ids and
    /// the tokens of its next chunk, which their prefill chunks leave in the step's budget.
    pub(super) fn preempt_for_waiting(&mut self, out: &mut SchedulerOutput) -> Result<Option<Reserve>> {
        if self.cfg.policy == Policy::Fcfs || self.waiting.is_empty() {
            return Ok(None); // the common decode-only step builds nothing
        }
        let running = self.running_tenants();
        let loras = self.running_loras();
        let first = self
            .waiting
            .iter()
            .filter(|&&id| !self.waits_for_adapter(id, &loras))
            .min_by_key(|&&id| self.rank(id, &running));
        let Some(&first) = first else { return Ok(None) };
        if self.running.len() >= self.cfg.max_num_seqs {
            let victim = self
                .running
                .iter()
                .copied()
                .filter(|&v| self.outranks(first, v, &running))
                .max_by_key(|&v| self.rank(v, &running));
            let Some(v) = victim else { return Ok(None) };
            drop(running);
            self.preempt(v, out)?;
        }
        let running = self.running_tenants();
        let first_rank = self.rank(first, &running);
        let after = self.running.iter().copied().filter(|&v| self.rank(v, &running) > first_rank).collect();
        let r = &self.requests[&first];
        Ok(Some(Reserve { after, tokens: r.num_tokens() - r.num_computed_tokens }))
    }

    /// The LoRA adapters of the running requests.
    pub(super) fn running_loras(&self) -> HashSet<u64> {
        self.running.iter().filter_map(|id| self.requests[id].lora).collect()
    }

    /// Whether waiting `w` must wait for an adapter to end: it runs under a LoRA adapter none of
    /// `loras` (the running ones) is, and `max_loras` already run.
    pub(super) fn waits_for_adapter(&self, w: ReqId, loras: &HashSet<u64>) -> bool {
        self.requests[&w].lora.is_some_and(|a| !loras.contains(&a) && loras.len() >= self.cfg.max_loras)
    }

    /// Whether waiting `w` may take running `v`'s slot: `v` has a strictly lower priority
    /// (`Priority`, `Fair`) or, under `Fair` at equal priority, `w`'s tenant runs nothing
    /// while `v`'s tenant runs two or more and has a counter at least as large. The victim's
    /// tenant keeps a slot and ranks after `w`, so the victim cannot take the slot straight back.
    fn outranks(&self, w: ReqId, v: ReqId, running: &HashMap<&str, usize>) -> bool {
        let (w, v) = (&self.requests[&w], &self.requests[&v]);
        if w.priority != v.priority || self.cfg.policy != Policy::Fair {
            return w.priority < v.priority;
        }
        let (wt, vt) = (&*w.tenant.name, &*v.tenant.name);
        !running.contains_key(wt)
            && running.get(vt).is_some_and(|&n| n >= 2)
            && self.vtc.counter(wt) <= self.vtc.counter(vt)
    }
}
