//! Virtual Token Counters (Sheng et al., "Fairness in Serving Large Language Models", OSDI
//! 2024): per-tenant weighted service, which the `fair` policy admits and preempts by.
//!
//! A tenant's counter grows by the service its requests receive, divided by its weight: each
//! prompt token computed counts 1, each generated token 2. Tokens found in the prefix cache
//! and tokens recomputed after a preemption are not charged (the tenant did not ask for that
//! work). A tenant is *backlogged* while it has a request waiting or running; a tenant that
//! becomes backlogged again is lifted to the smallest counter of the backlogged tenants, so
//! idle time never banks credit (the paper's rule, which bounds any two backlogged tenants'
//! service difference and keeps each within 2x of its ideal share).
//!
//! Invariants: counters are finite, >= 0 and never decrease; `backlog[t]` is the number of
//! the scheduler's requests of tenant `t`, and a tenant with none is absent from it.

use crate::request::{SchedulerRequest, TenantShare};
use lmplex_kv::manager::ReqId;
use std::collections::HashMap;
use std::sync::Arc;

/// Weight of a generated token against a computed prompt token.
pub const OUTPUT_TOKEN_WEIGHT: f64 = 2.0;

/// Every tenant's counter and backlog, and how far each request's prompt was charged.
#[derive(Debug, Default)]
pub struct VirtualTokenCounters {
    counters: HashMap<Arc<str>, f64>,
    backlog: HashMap<Arc<str>, usize>,
    /// Prompt tokens already charged per request (its prompt's computed high-water mark).
    charged: HashMap<ReqId, usize>,
}

impl VirtualTokenCounters {
    /// Tenant `name`'s counter (0 for one never seen).
    pub fn counter(&self, name: &str) -> f64 {
        self.counters.get(name).copied().unwrap_or(0.0)
    }

    /// A request joined the scheduler: its tenant, if it was not backlogged, is lifted to the
    /// smallest counter of the backlogged tenants.
    pub fn arrive(&mut self, r: &SchedulerRequest) {
        let name = &r.tenant.name;
        if !self.backlog.contains_key(name) {
            let floor = self.backlog.keys().map(|t| self.counter(t)).min_by(f64::total_cmp);
            let c = self.counters.entry(name.clone()).or_insert(0.0);
            if let Some(floor) = floor {
                *c = c.max(floor);
            }
        }
        *self.backlog.entry(name.clone()).or_insert(0) += 1;
        self.charged.insert(r.id, 0);
    }

    /// A request left the scheduler (finished or aborted).
    pub fn leave(&mut self, r: &SchedulerRequest) {
        self.charged.remove(&r.id);
        if let Some(n) = self.backlog.get_mut(&r.tenant.name) {
            *n -= 1;
            if *n == 0 {
                self.backlog.remove(&r.tenant.name);
            }
        }
    }

    /// Charges a computed chunk `[start, end)` of `r` and, when it was `sampled`, one
    /// generated token.
    pub fn charge(&mut self, r: &SchedulerRequest, start: usize, end: usize, sampled: bool) {
        let hw = self.charged.entry(r.id).or_insert(0);
        let prompt_end = end.min(r.num_prompt_tokens);
        let new_prompt = prompt_end.saturating_sub(start.max(*hw));
        *hw = (*hw).max(prompt_end);
        let service = new_prompt as f64 + if sampled { OUTPUT_TOKEN_WEIGHT } else { 0.0 };
        if service > 0.0 {
            let TenantShare { name, weight } = &r.tenant;
            *self.counters.entry(name.clone()).or_insert(0.0) += service / weight;
        }
    }
}
