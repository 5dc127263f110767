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
pub fn fake_step(s: &mut Scheduler, out: &SchedulerOutput) -> HashMap<ReqId, Vec<u32>> {
    fake_step_with(s, out, next_token)
}

/// `fake_step` with the model `next`: a chunk with drafts keeps each drafted token while it
/// equals `next` of the tokens before it, as the engine's verification does. Returns each
/// sampled request's new tokens.
pub fn fake_step_with(
    s: &mut Scheduler,
    out: &SchedulerOutput,
    next: impl Fn(&[u32]) -> u32,
) -> HashMap<ReqId, Vec<u32>> {
    let mut sampled = HashMap::new();
    let mut finished = Vec::new();
    for r in &out.scheduled {
        let req = s.request(r.id).unwrap();
        let known = r.token_ids.len() - r.num_draft_tokens;
        assert_eq!(&req.all_token_ids[r.num_computed_tokens..][..known], &r.token_ids[..known]);
        assert!(r.block_table.len() * BS >= r.num_computed_tokens + r.token_ids.len());
        if r.sample {
            let mut seq = req.all_token_ids.clone();
            let mut new = Vec::new();
            for j in 0..=r.num_draft_tokens {
                let t = next(&seq);
                seq.push(t);
                new.push(t);
                if seq.len() >= req.max_num_tokens || r.draft_token_ids().get(j) != Some(&t) {
                    break;
                }
            }
            if seq.len() >= req.max_num_tokens {
                finished.push(r.id);
            }
            sampled.insert(r.id, new);
        }
    }
    s.update(out, &sampled, &finished).unwrap();
    sampled
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

/// A fake KV memory: each slot holds a hash of the sequence up to its token (what real K/V
/// depend on). Every step copies the swap pairs (out, then in) as the runner does, checks that
/// each chunk's computed positions hold the right values, then writes the chunk's.
pub struct FakeKv {
    hot: Vec<Option<u64>>,
    warm: Vec<Option<u64>>,
}

impl FakeKv {
    pub fn new(hot_blocks: usize, warm_blocks: usize) -> Self {
        Self { hot: vec![None; hot_blocks * BS], warm: vec![None; warm_blocks * BS] }
    }

    pub fn step(&mut self, s: &mut Scheduler, out: &SchedulerOutput) -> HashMap<ReqId, Vec<u32>> {
        self.step_with(s, out, next_token)
    }

    /// `step` with the model `next` (`fake_step_with`); drafted positions are written too,
    /// so K/V a rejected draft left behind would be caught if it were ever read.
    pub fn step_with(
        &mut self,
        s: &mut Scheduler,
        out: &SchedulerOutput,
        next: impl Fn(&[u32]) -> u32,
    ) -> HashMap<ReqId, Vec<u32>> {
        assert!(out.blocks_to_swap_out.is_empty() || out.blocks_to_swap_in.is_empty());
        for &(h, w) in &out.blocks_to_swap_out {
            let (h, w) = (h as usize * BS, w as usize * BS);
            self.warm[w..w + BS].copy_from_slice(&self.hot[h..h + BS]);
        }
        for &(w, h) in &out.blocks_to_swap_in {
            let (h, w) = (h as usize * BS, w as usize * BS);
            self.hot[h..h + BS].copy_from_slice(&self.warm[w..w + BS]);
        }
        for r in &out.scheduled {
            let known = &s.request(r.id).unwrap().all_token_ids[..r.num_computed_tokens];
            let mut h = 0u64;
            for (pos, &t) in known.iter().chain(&r.token_ids).enumerate() {
                h = h.wrapping_mul(0x100000001b3).wrapping_add(t as u64 + 1);
                let slot = r.block_table[pos / BS] as usize * BS + pos % BS;
                if pos < r.num_computed_tokens {
                    assert_eq!(self.hot[slot], Some(h), "request {} position {pos}: stale K/V", r.id);
                } else {
                    self.hot[slot] = Some(h);
                }
            }
        }
        fake_step_with(s, out, next)
    }
}
