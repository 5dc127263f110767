//! What the scheduler tests share: a scheduler, requests, and a fake model step.

#![allow(dead_code)] // each test file uses its own subset

use lmplex_kv::manager::ReqId;
use lmplex_kv::KvCacheManager;
use lmplex_sched::{Scheduler, SchedulerConfig, SchedulerOutput, SchedulerRequest};
use std::collections::HashMap;
use std::time::Instant;

/// Tokens per KV block.
pub const BS: usize = 16;

pub fn create_scheduler(num_blocks: usize, max_num_seqs: usize, budget: usize) -> Scheduler {
    let cfg = SchedulerConfig { max_num_seqs, max_num_batched_tokens: budget, ..Default::default() };
    Scheduler::new(cfg, KvCacheManager::new(num_blocks, BS, true))
}

pub fn create_request(id: ReqId, prompt_len: usize, max_out: usize, t: Instant) -> SchedulerRequest {
    let prompt = (0..prompt_len as u32).map(|i| (id as u32 * 7919 + i) % 30_000).collect();
    SchedulerRequest::new(id, prompt, prompt_len + max_out, t)
}

/// The fake model's next token after `tokens` (depends on the whole sequence).
pub fn next_token(tokens: &[u32]) -> u32 {
    tokens.iter().fold(17u32, |h, &t| h.wrapping_mul(31).wrapping_add(t)) % 30_000
}

/// Runs one step's fake forward: checks the chunk, samples, finishes requests at max length.
pub fn fake_step(s: &mut Scheduler, out: &SchedulerOutput) {
    let mut sampled = HashMap::new();
    let mut finished = Vec::new();
    for r in &out.scheduled {
        let req = s.request(r.id).unwrap();
        assert_eq!(&req.all_token_ids[r.num_computed_tokens..][..r.token_ids.len()], &r.token_ids[..]);
        assert!(r.block_table.len() * BS >= r.num_computed_tokens + r.token_ids.len());
        if r.sample {
            sampled.insert(r.id, next_token(&req.all_token_ids));
            if req.num_tokens() + 1 >= req.max_num_tokens {
                finished.push(r.id);
            }
        }
    }
    s.update(out, &sampled, &finished).unwrap();
}

/// Runs `s` to the end with `fake_step`; the ids in the order they were first scheduled.
pub fn admission_order(s: &mut Scheduler, t: Instant) -> Vec<ReqId> {
    let mut order = Vec::new();
    while s.has_unfinished() {
        let out = s.schedule(t).unwrap();
        for r in &out.scheduled {
            if !order.contains(&r.id) {
                order.push(r.id);
            }
        }
        fake_step(s, &out);
    }
    order
}
