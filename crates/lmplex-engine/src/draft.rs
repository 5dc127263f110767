//! The draft model of speculative decoding's `draft` method: a smaller model with the target's
//! tokenizer, on the CPU, with a KV pool of its own, drafting greedily before each step for the
//! requests the scheduler lists (`Scheduler::draft_requests`); its tokens go back as
//! `Proposal`s (`Scheduler::set_proposals`).
//!
//! A proposal for `n` tokens costs `n` batched passes: the first feeds each request's tokens the
//! draft has not seen (its whole prompt the first time, then the tokens verified since) and
//! picks the first draft; each next pass feeds the previous draft.
//!
//! Invariants:
//! - A draft is only a guess: the engine verifies every drafted token, so nothing here can
//!   change a request's output, only how many tokens a step yields.
//! - A request's state holds `written`, the tokens whose K/V are in its blocks at positions
//!   `0..written.len()`; before a pass it is cut to its common prefix with the request's tokens
//!   (rejected drafts are recomputed over, never read).
//! - The state of a request not listed in a step (finished, preempted, waiting) is dropped and
//!   its blocks freed; it is rebuilt from the tokens if the request drafts again. A request
//!   listed with nothing to draft keeps its state, and catches up when it drafts again.
//! - A drafted token the target's vocabulary does not hold ends that request's draft, and a
//!   request drafts nothing past the draft model's context.

use lmplex_core::{Error, ModelConfig, Result, TokenId};
use lmplex_kv::manager::ReqId;
use lmplex_model::{ForwardBatch, KvCache, LogitsSelect, Model, SeqChunk, Tokenizer};
use lmplex_sched::{DraftRequest, Proposal};
use std::collections::{HashMap, HashSet};

/// llama.cpp's `SPEC_VOCAB_MAX_SIZE_DIFFERENCE`: vocabularies may differ by padding only.
const MAX_VOCAB_DIFFERENCE: usize = 128;

#[derive(Default)]
struct DraftSeq {
    blocks: Vec<u32>,
    written: Vec<TokenId>,
}

pub(crate) struct DraftModel {
    model: Model,
    kv: KvCache,
    block_size: usize,
    free: Vec<u32>,
    seqs: HashMap<ReqId, DraftSeq>,
    /// The target's vocabulary size: a drafted id at or past it ends a draft.
    target_vocab: usize,
    /// Mean seconds of the last `propose`'s passes of at most two tokens a row (not a prompt's).
    last_pass_s: Option<f64>,
}

/// The draft model `config.speculative` asks for, if any, with as many KV blocks as the
/// target's pool (`num_blocks`); on the CPU only, for now.
pub(crate) fn load(
    config: &ModelConfig,
    runtime: &crate::report::RuntimeInfo,
    target: &Tokenizer,
    target_vocab: usize,
    num_blocks: usize,
) -> Result<Option<DraftModel>> {
    let Some(path) = config.speculative.as_ref().and_then(|s| s.model.as_deref()) else { return Ok(None) };
    if runtime.device != "cpu" {
        return Err(Error::invalid(
            "speculative: a draft model runs beside a target on the CPU backend only, for now; use method \"ngram\" \
             or device=\"cpu\"",
        ));
    }
    DraftModel::load(config, path, target, target_vocab, num_blocks, crate::sizing::BLOCK_SIZE).map(Some)
}

impl DraftModel {
    /// Loads the draft model `config.speculative.model` names (a local path by now) on the CPU
    /// with `num_blocks` KV blocks of `block_size`; refuses one whose tokenizer is not the
    /// target's (`target`, `target_vocab` ids).
    pub fn load(
        config: &ModelConfig,
        path: &str,
        target: &Tokenizer,
        target_vocab: usize,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Self> {
        // Up to the target's `max_model_len` where the draft's context reaches that far; a
        // shorter draft context only ends drafting early (`propose`).
        let mut ckpt = lmplex_model::open(std::path::Path::new(path), None)?;
        ckpt.max_positions = ckpt.max_positions.min(config.max_model_len.unwrap_or(usize::MAX));
        ckpt.src.set_dtype(config.dtype);
        let kv_dtype = crate::sizing::cpu_kv_dtype(config, ckpt.kv_dtype);
        let loaded = ckpt.into_cpu()?;
        same_tokenizer(target, &loaded.tokenizer, path)?;
        let model = loaded.model;
        let kv = model.new_kv_cache(num_blocks, block_size, kv_dtype)?;
        let free = (0..num_blocks as u32).rev().collect();
        Ok(Self { model, kv, block_size, free, seqs: HashMap::new(), target_vocab, last_pass_s: None })
    }

    /// Bytes of the draft model's weights and KV pool.
    pub fn bytes(&self) -> usize {
        self.model.weight_bytes() + self.model.other_bytes() + self.kv.total_bytes()
    }

    /// Mean seconds of the last `propose`'s passes that fed at most two tokens a request (a
    /// prompt's catch-up pass says little about the next).
    pub fn last_pass_s(&self) -> Option<f64> {
        self.last_pass_s
    }

    /// Up to `n` greedy draft tokens after each listed request's `tokens` (see the module).
    pub fn propose(&mut self, requests: &[DraftRequest<'_>]) -> Result<HashMap<ReqId, Proposal>> {
        let listed: HashSet<ReqId> = requests.iter().map(|r| r.id).collect();
        let free = &mut self.free;
        self.seqs.retain(|id, s| {
            let keep = listed.contains(id);
            if !keep {
                free.append(&mut s.blocks);
            }
            keep
        });
        // Each request's next token to feed: cut its state to what still holds, find blocks.
        let mut live: Vec<(ReqId, usize, usize)> = Vec::new(); // (id, first position fed, n)
        let max_positions = self.model.max_positions();
        for &DraftRequest { id, tokens, n, .. } in requests {
            // Positions `0..len + n - 1` must fit the draft's context.
            let n = n.min((max_positions + 1).saturating_sub(tokens.len()));
            if n == 0 || tokens.is_empty() {
                continue;
            }
            let s = self.seqs.entry(id).or_default();
            let keep = s.written.iter().zip(tokens).take_while(|(a, b)| a == b).count().min(tokens.len() - 1);
            s.written.truncate(keep);
            // Positions 0..len + n - 1 hold K/V by the end (the last draft's is never needed).
            let need = (tokens.len() + n - 1).div_ceil(self.block_size);
            while s.blocks.len() < need {
                match self.free.pop() {
                    Some(b) => s.blocks.push(b),
                    None => break,
                }
            }
            if s.blocks.len() >= need {
                live.push((id, keep, n));
            }
        }
        let mut drafts: HashMap<ReqId, Vec<TokenId>> = HashMap::new();
        let mut timed = Vec::new();
        let by_id: HashMap<ReqId, &DraftRequest<'_>> = requests.iter().map(|r| (r.id, r)).collect();
        for j in 0..live.iter().map(|l| l.2).max().unwrap_or(0) {
            // The rows of pass `j`: the unseen tokens (j == 0), else the previous draft.
            let mut rows: Vec<(ReqId, Vec<TokenId>, usize)> = Vec::new();
            for &(id, keep, n) in &live {
                let tokens = by_id[&id].tokens;
                let d = drafts.get(&id).map_or(&[][..], Vec::as_slice);
                match j {
                    0 => rows.push((id, tokens[keep..].to_vec(), keep)),
                    _ if j < n && d.len() == j => rows.push((id, vec![d[j - 1]], tokens.len() + j - 1)),
                    _ => {}
                }
            }
            if rows.is_empty() {
                break;
            }
            let target_vocab = self.target_vocab;
            let Self { model, kv, seqs, .. } = self;
            let seqs_ref = &*seqs;
            let batch = ForwardBatch {
                seqs: rows
                    .iter()
                    .map(|(id, ids, start)| SeqChunk {
                        token_ids: ids,
                        start_pos: *start,
                        block_table: &seqs_ref[id].blocks,
                        logits: LogitsSelect::Last,
                        // Generated tokens take the decode kernels, as in the draft's own decoding.
                        num_prompt_tokens: by_id[id].num_prompt_tokens,
                        lora: None,
                        embeds: None,
                    })
                    .collect(),
            };
            let t0 = std::time::Instant::now();
            let logits = model.forward_logits(&batch, kv)?;
            if batch.seqs.iter().all(|c| c.token_ids.len() <= 2) {
                timed.push(t0.elapsed().as_secs_f64());
            }
            drop(batch);
            let vocab = model.args.vocab_size;
            if logits.len() != rows.len() * vocab {
                return Err(Error::internal("the draft model returned an unexpected number of logits"));
            }
            for ((id, ids, _), row) in rows.into_iter().zip(logits.chunks_exact(vocab)) {
                let Some(s) = seqs.get_mut(&id) else {
                    return Err(Error::internal("the draft model lost a listed request's state"));
                };
                s.written.extend_from_slice(&ids);
                let pick = argmax(row);
                if (pick as usize) < target_vocab {
                    drafts.entry(id).or_default().push(pick);
                }
            }
        }
        self.last_pass_s = (!timed.is_empty()).then(|| timed.iter().sum::<f64>() / timed.len() as f64);
        Ok(drafts.into_iter().map(|(id, tokens)| (id, Proposal { at: by_id[&id].tokens.len(), tokens })).collect())
    }
}

/// The lowest id of the largest logit (greedy decoding's tie rule).
fn argmax(row: &[f32]) -> TokenId {
    let mut best = 0;
    for (i, x) in row.iter().enumerate() {
        if x.total_cmp(&row[best]).is_gt() {
            best = i;
        }
    }
    best as TokenId
}

/// Refuses a draft tokenizer that is not the target's: vocabularies of sizes within
/// `MAX_VOCAB_DIFFERENCE`, the same text for every id both hold, the same BOS.
fn same_tokenizer(target: &Tokenizer, draft: &Tokenizer, path: &str) -> Result<()> {
    let (t, d) = (target.vocab_size(), draft.vocab_size());
    let refuse = |why: String| {
        Err(Error::invalid(format!(
            "speculative: the draft model {path} does not share the target's tokenizer ({why}); a draft model must \
             use the same vocabulary"
        )))
    };
    if t.abs_diff(d) > MAX_VOCAB_DIFFERENCE {
        return refuse(format!("{d} tokens against {t}"));
    }
    if target.bos_token_id != draft.bos_token_id {
        return refuse(format!("BOS {:?} against {:?}", draft.bos_token_id, target.bos_token_id));
    }
    for id in 0..t.min(d) as u32 {
        let (a, b) = (target.hf().id_to_token(id), draft.hf().id_to_token(id));
        if a != b {
            return refuse(format!("token {id} is {b:?} against {a:?}"));
        }
    }
    Ok(())
}
