//! Virtual Token Counters (Sheng et al., "Fairness in Serving Large Language Models", OSDI
//! 2024): per-tenant weighted service, which the `fair` policy admits and preempts by, kept in
//! the device's `DeviceLedger` so that every model on a device charges the same counters.
//!
//! A tenant's counter grows by the service its requests receive, divided by its weight, in
//! device time: each prompt token computed counts one token's cost, each generated token
//! `OUTPUT_TOKEN_WEIGHT`, at the model's measured seconds per token (`Scheduler::update`).
//! Tokens found in the prefix cache and tokens recomputed after a preemption are not charged
//! (the tenant did not ask for that work). A tenant is *backlogged* while it has a request
//! waiting or running on any model of the device; a tenant that becomes backlogged again is
//! lifted to the smallest counter of the backlogged tenants, so idle time never banks credit
//! (the paper's rule, which bounds any two backlogged tenants' service difference and keeps
//! each within 2x of its ideal share).
//!
//! Invariants: counters are finite, >= 0 and never decrease; every request of this scheduler
//! is in `charged` and counted in its seat's backlog from `arrive` to `leave`.

use crate::ledger::Seat;
use crate::request::{SchedulerRequest, TenantShare};
use lmplex_kv::manager::ReqId;
use std::collections::HashMap;

/// Weight of a generated token against a computed prompt token.
pub const OUTPUT_TOKEN_WEIGHT: f64 = 2.0;

/// One scheduler's side of the counters: its seat on the device's ledger, and how far each of
/// its requests' prompts was charged.
#[derive(Debug)]
pub struct VirtualTokenCounters {
    seat: Seat,
    /// Prompt tokens already charged per request (its prompt's computed high-water mark).
    charged: HashMap<ReqId, usize>,
}

impl Default for VirtualTokenCounters {
    /// Counters on a ledger of their own.
    fn default() -> Self {
        Self::on(Seat::alone())
    }
}

impl VirtualTokenCounters {
    /// Counters kept on `seat`'s ledger.
    pub fn on(seat: Seat) -> Self {
        Self { seat, charged: HashMap::new() }
    }

    /// The seat on the device's ledger.
    pub fn seat(&self) -> &Seat {
        &self.seat
    }

    /// Tenant `name`'s counter: device seconds served over its weight (0 for one never seen).
    pub fn counter(&self, name: &str) -> f64 {
        self.seat.counter(name)
    }

    /// A request joined the scheduler: its tenant, if it was not backlogged on the device, is
    /// lifted to the smallest counter of the backlogged tenants.
    pub fn arrive(&mut self, r: &SchedulerRequest) {
        self.seat.arrive(&r.tenant.name);
        self.charged.insert(r.id, 0);
    }

    /// A request left the scheduler (finished or aborted).
    pub fn leave(&mut self, r: &SchedulerRequest) {
        if self.charged.remove(&r.id).is_some() {
            self.seat.leave(&r.tenant.name);
        }
    }

    /// Charges a computed chunk `[start, end)` of `r` and the `generated` rows of it that
    /// sampled a generated token (a decode, and its verified drafts), at `s_per_token` seconds
    /// a token.
    pub fn charge(&mut self, r: &SchedulerRequest, start: usize, end: usize, generated: usize, s_per_token: f64) {
        let hw = self.charged.entry(r.id).or_insert(0);
        let prompt_end = end.min(r.num_prompt_tokens);
        let new_prompt = prompt_end.saturating_sub(start.max(*hw));
        *hw = (*hw).max(prompt_end);
        let tokens = new_prompt as f64 + generated as f64 * OUTPUT_TOKEN_WEIGHT;
        let TenantShare { name, weight } = &r.tenant;
        self.seat.charge(name, *weight, tokens * s_per_token);
    }
}
