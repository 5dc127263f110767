//! The draft model of speculative decoding's `draft` method: a smaller model with the target's
//! tokenizer, on the target's device (the CPU, or the target's CUDA device), with a KV pool of
//! its own, drafting greedily before each step for the requests the scheduler lists
//! (`Scheduler::draft_requests`); its tokens go back as `Proposal`s (`Scheduler::set_proposals`).
//!
//! A proposal for `n` tokens costs `n` batched passes: the first feeds each request's tokens the
//! draft has not seen (its whole prompt the first time, then the tokens verified since) and
//! picks the first draft; each next pass feeds the previous draft. The first pass is cut into
//! chunks of at most `max_num_batched_tokens` tokens in all (the CUDA backend's workspace holds
//! no more), and only a request's last chunk picks.
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

use crate::placement::{place_model, Placement};
use crate::runner::Runner;
use lmplex_core::{Error, ModelConfig, Result, TokenId};
use lmplex_cuda::LiveBytes;
use lmplex_kv::manager::ReqId;
use lmplex_model::sample::pick::Pick;
use lmplex_model::{ForwardBatch, LogitsSelect, SeqChunk, Tokenizer};
use lmplex_sched::{DraftRequest, Proposal};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Fewest tokens a catch-up pass feeds for its time to say what a token costs (a smaller pass
/// is mostly its fixed part).
const CATCH_UP_TIMED_TOKENS: usize = 64;

/// The times of one `propose`'s passes.
#[derive(Default)]
struct Timed {
    /// Passes of at most two tokens a row.
    passes: Vec<f64>,
    /// Seconds and tokens of the others (catch-up passes).
    catch_up: (f64, usize),
}

/// llama.cpp's `SPEC_VOCAB_MAX_SIZE_DIFFERENCE`: vocabularies may differ by padding only.
const MAX_VOCAB_DIFFERENCE: usize = 128;

#[derive(Default)]
struct DraftSeq {
    blocks: Vec<u32>,
    written: Vec<TokenId>,
}

pub(crate) struct DraftModel {
    runner: Runner,
    block_size: usize,
    free: Vec<u32>,
    seqs: HashMap<ReqId, DraftSeq>,
    /// The draft's context: positions past it are never fed.
    max_positions: usize,
    /// Most tokens one pass feeds (the target's `max_num_batched_tokens`).
    max_pass_tokens: usize,
    /// The target's vocabulary size: a drafted id at or past it ends a draft.
    target_vocab: usize,
    /// Bytes of its weights and KV pool.
    bytes: usize,
    /// On CUDA, its step buffers and graphs as they change.
    live: Option<Arc<LiveBytes>>,
    /// Mean seconds of the last `propose`'s passes of at most two tokens a row (not a prompt's).
    last_pass_s: Option<f64>,
    /// Seconds a token of the last `propose`'s catch-up passes (a row of more than two tokens,
    /// `CATCH_UP_TIMED_TOKENS` in all at least).
    last_catch_up_s: Option<f64>,
}

/// The draft model `config.speculative` asks for, if any, on the target's device with as many
/// KV blocks as the target's pool (`num_blocks`).
pub(crate) fn load(
    config: &ModelConfig,
    target: &Tokenizer,
    target_vocab: usize,
    num_blocks: usize,
) -> Result<Option<DraftModel>> {
    let Some(path) = config.speculative.as_ref().and_then(|s| s.model.as_deref()) else { return Ok(None) };
    DraftModel::load(config, path, target, target_vocab, num_blocks, crate::sizing::BLOCK_SIZE).map(Some)
}

impl DraftModel {
    /// Loads the draft model `config.speculative.model` names (a local path by now) on the
    /// target's device (`config`'s placement) with `num_blocks` KV blocks of `block_size`;
    /// refuses one whose tokenizer is not the target's (`target`, `target_vocab` ids).
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
        let max_positions = ckpt.max_positions;
        let (runner, tokenizer, bytes) = match place_model(config) {
            Placement::Cpu => {
                ckpt.src.set_dtype(config.dtype);
                let kv_dtype = crate::sizing::cpu_kv_dtype(config, ckpt.kv_dtype);
                let loaded = ckpt.into_cpu()?;
                let model = loaded.model;
                let kv = model.new_kv_cache(num_blocks, block_size, kv_dtype)?;
                let warm = model.new_kv_cache(0, block_size, kv_dtype)?;
                let bytes = model.weight_bytes() + model.other_bytes() + kv.total_bytes();
                (Runner::Cpu { model: Arc::new(model), kv, warm }, loaded.tokenizer, bytes)
            }
            Placement::Cuda(ordinal) => {
                let dt = lmplex_cuda::Dt::from_config(config.dtype);
                let sizing = crate::sizing::draft_cuda_sizing(config, num_blocks, block_size);
                let model = lmplex_cuda::CudaModel::load(crate::runner::open_gpu(ordinal)?, &ckpt, dt, sizing)?;
                let bytes = model.weight_bytes() + model.kv.bytes();
                (Runner::Cuda(Box::new(model)), ckpt.tokenizer, bytes)
            }
        };
        same_tokenizer(target, &tokenizer, path)?;
        let live = match &runner {
            Runner::Cuda(m) => Some(m.live_bytes()),
            Runner::Cpu { .. } => None,
        };
        let free = (0..num_blocks as u32).rev().collect();
        let max_pass_tokens = config.batched_tokens();
        Ok(Self {
            runner,
            block_size,
            free,
            seqs: HashMap::new(),
            max_positions,
            max_pass_tokens,
            target_vocab,
            bytes,
            live,
            last_pass_s: None,
            last_catch_up_s: None,
        })
    }

    /// Bytes of the draft model's weights and KV pool, and on CUDA the counters of its step
    /// buffers and graphs as they change (`LiveBytes`, read by `Engine::memory`).
    pub fn memory(&self) -> (usize, Option<Arc<LiveBytes>>) {
        (self.bytes, self.live.clone())
    }

    /// Mean seconds of the last `propose`'s passes that fed at most two tokens a request (a
    /// prompt's catch-up pass says little about the next).
    pub fn last_pass_s(&self) -> Option<f64> {
        self.last_pass_s
    }

    /// Seconds a token of the last `propose`'s passes that fed a request more than two tokens
    /// (its catch-up: a prompt, or the tokens since its state was dropped), `CATCH_UP_TIMED_TOKENS`
    /// in all at least.
    pub fn last_catch_up_s(&self) -> Option<f64> {
        self.last_catch_up_s
    }

    /// Up to `n` greedy draft tokens after each listed request's `tokens` (see the module);
    /// the state of every request not listed is dropped, so an empty list drops them all.
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
        for &DraftRequest { id, tokens, n, .. } in requests {
            // Positions `0..len + n - 1` must fit the draft's context.
            let n = n.min((self.max_positions + 1).saturating_sub(tokens.len()));
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
        let by_id: HashMap<ReqId, &DraftRequest<'_>> = requests.iter().map(|r| (r.id, r)).collect();
        let mut drafts: HashMap<ReqId, Vec<TokenId>> = HashMap::new();
        let mut timed = Timed::default();
        // The first pass's rows, `(id, tokens, start, picks)`, cut into passes of at most
        // `max_pass_tokens` tokens; a request picks in the pass that feeds its last token.
        let mut rows: Vec<(ReqId, Vec<TokenId>, usize, bool)> = Vec::new();
        let mut fed = 0;
        for &(id, keep, _) in &live {
            let tokens = by_id[&id].tokens;
            let mut at = keep;
            while at < tokens.len() {
                if fed == self.max_pass_tokens {
                    self.pass(&mut rows, &by_id, &mut drafts, &mut timed)?;
                    fed = 0;
                }
                let end = tokens.len().min(at + self.max_pass_tokens - fed);
                rows.push((id, tokens[at..end].to_vec(), at, end == tokens.len()));
                (fed, at) = (fed + end - at, end);
            }
        }
        self.pass(&mut rows, &by_id, &mut drafts, &mut timed)?;
        for j in 1..live.iter().map(|l| l.2).max().unwrap_or(0) {
            // Pass `j` feeds each request's previous draft.
            for &(id, _, n) in &live {
                let d = drafts.get(&id).map_or(&[][..], Vec::as_slice);
                if j < n && d.len() == j {
                    rows.push((id, vec![d[j - 1]], by_id[&id].tokens.len() + j - 1, true));
                }
            }
            if rows.is_empty() {
                break;
            }
            self.pass(&mut rows, &by_id, &mut drafts, &mut timed)?;
        }
        self.last_pass_s =
            (!timed.passes.is_empty()).then(|| timed.passes.iter().sum::<f64>() / timed.passes.len() as f64);
        self.last_catch_up_s = (timed.catch_up.1 > 0).then(|| timed.catch_up.0 / timed.catch_up.1 as f64);
        Ok(drafts.into_iter().map(|(id, tokens)| (id, Proposal { at: by_id[&id].tokens.len(), tokens })).collect())
    }

    /// One forward pass over `rows` (drained): each row's tokens join its request's state, and
    /// a row that picks adds the greedy token to its request's draft (within the target's
    /// vocabulary). The pass is timed into `timed`.
    fn pass(
        &mut self,
        rows: &mut Vec<(ReqId, Vec<TokenId>, usize, bool)>,
        by_id: &HashMap<ReqId, &DraftRequest<'_>>,
        drafts: &mut HashMap<ReqId, Vec<TokenId>>,
        timed: &mut Timed,
    ) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let Self { runner, seqs, target_vocab, .. } = self;
        let seqs_ref = &*seqs;
        let batch = ForwardBatch {
            seqs: rows
                .iter()
                .map(|(id, ids, start, picks)| SeqChunk {
                    token_ids: ids,
                    start_pos: *start,
                    block_table: &seqs_ref[id].blocks,
                    logits: if *picks { LogitsSelect::Last } else { LogitsSelect::None },
                    // Generated tokens take the decode kernels, as in the draft's own decoding.
                    num_prompt_tokens: by_id[id].num_prompt_tokens,
                    lora: None,
                    embeds: None,
                })
                .collect(),
        };
        let picks = vec![Pick::greedy(); rows.iter().filter(|r| r.3).count()];
        let t0 = std::time::Instant::now();
        let ids = runner.forward_pick(&batch, &picks, &|| ())?;
        let (secs, fed) = (t0.elapsed().as_secs_f64(), batch.seqs.iter().map(|c| c.token_ids.len()).sum::<usize>());
        if batch.seqs.iter().all(|c| c.token_ids.len() <= 2) {
            timed.passes.push(secs);
        } else if fed >= CATCH_UP_TIMED_TOKENS {
            timed.catch_up.0 += secs;
            timed.catch_up.1 += fed;
        }
        drop(batch);
        if ids.len() != picks.len() {
            return Err(Error::internal("the draft model returned an unexpected number of tokens"));
        }
        let mut ids = ids.into_iter();
        for (id, tokens, _, picks) in rows.drain(..) {
            let Some(s) = seqs.get_mut(&id) else {
                return Err(Error::internal("the draft model lost a listed request's state"));
            };
            s.written.extend_from_slice(&tokens);
            if !picks {
                continue;
            }
            let Some(pick) = ids.next() else { continue };
            if (pick as usize) < *target_vocab {
                drafts.entry(id).or_default().push(pick);
            }
        }
        Ok(())
    }
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
