//! `Engine`: one loaded model answering requests, synchronously.
//!
//! Each call (`generate`, `stream`) builds a `Runner` with a KV cache sized for its own
//! requests (`max_model_concurrency` sequences at most, each up to its `max_len`), so calls
//! from several threads never share mutable state. The step is nano-vllm's: pick the running
//! sequences, one forward over all of them (prefills and decodes alike, each bringing
//! `num_computed_tokens` up to its length), then sample and check stops per sequence.
//! The shared block pool, the scheduler and the async engine task replace `Runner` in the
//! paged-KV work; this type keeps its public methods.
//!
//! Invariants: a request's tokens depend only on its prompt, parameters and seed (every kernel
//! computes a row from that row alone); every block taken from the free list returns to it
//! when its sequence finishes or its stream is dropped.

use crate::sequence::Sequence;
use lmplex_core::{Error, ModelConfig, RequestOutput, Result, SamplingParams, StreamChunk, TokenId};
use lmplex_model::{ChatMessage, ForwardBatch, KvCache, LoadedModel, LogitsSelect, Model, SeqChunk, Tokenizer};
use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const BLOCK_SIZE: usize = 16;

/// A prompt: plain text (tokenized with the model's special-token rules), chat messages
/// (rendered by the chat template) or token ids (sent as they are, like vLLM's `TokensPrompt`).
#[derive(Debug, Clone)]
pub enum Prompt {
    Text(String),
    Messages(Vec<ChatMessage>),
    TokenIds(Vec<TokenId>),
}

#[derive(Debug, Clone)]
pub struct Request {
    pub prompt: Prompt,
    pub params: SamplingParams,
}

pub struct Engine {
    model: Model,
    tokenizer: Tokenizer,
    config: ModelConfig,
    max_model_len: usize,
    info: BTreeMap<String, String>,
    /// KV bytes held by runs in progress (for `memory()`).
    kv_bytes_in_use: Arc<AtomicUsize>,
}

impl Engine {
    pub fn new(config: ModelConfig, path: &Path) -> Result<Self> {
        config.validate()?;
        if config.device == lmplex_core::DeviceKind::Cuda {
            return Err(Error::invalid("device='cuda' is not available yet: this build runs on the CPU"));
        }
        let LoadedModel { model, tokenizer, mut info } = lmplex_model::load(path, config.max_model_len)?;
        let a = &model.args;
        for (k, v) in [
            ("architecture", a.arch.name().to_string()),
            ("num_parameters", a.num_parameters().to_string()),
            ("num_hidden_layers", a.num_hidden_layers.to_string()),
            ("hidden_size", a.hidden_size.to_string()),
            ("num_attention_heads", a.num_attention_heads.to_string()),
            ("num_key_value_heads", a.num_key_value_heads.to_string()),
            ("head_dim", a.head_dim.to_string()),
            ("vocab_size", a.vocab_size.to_string()),
            ("context_length", a.max_position_embeddings.to_string()),
            ("max_model_len", model.max_positions().to_string()),
            ("device", "cpu".to_string()),
            ("compute_dtype", "float32".to_string()),
            ("has_chat_template", tokenizer.has_chat_template().to_string()),
        ] {
            info.insert(k.to_string(), v);
        }
        Ok(Self {
            max_model_len: model.max_positions(),
            model,
            tokenizer,
            config,
            info,
            kv_bytes_in_use: Arc::new(AtomicUsize::new(0)),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }
    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
    pub fn info(&self) -> &BTreeMap<String, String> {
        &self.info
    }

    /// Bytes by category: `weights`, `kv_cache` (held by running calls), `total`.
    pub fn memory(&self) -> BTreeMap<String, usize> {
        let w = self.model.weight_bytes();
        let kv = self.kv_bytes_in_use.load(Ordering::Relaxed);
        BTreeMap::from([("weights".into(), w), ("kv_cache".into(), kv), ("total".into(), w + kv)])
    }

    /// Token ids of a prompt, validated against `max_model_len`.
    fn prepare(&self, req: &Request) -> Result<(String, Vec<TokenId>)> {
        req.params.validate()?;
        let (text, ids) = match &req.prompt {
            Prompt::Text(t) => (t.clone(), self.tokenizer.encode(t, true)?),
            Prompt::Messages(m) => {
                if let Some(bad) = m.iter().find(|m| m.role.trim().is_empty()) {
                    return Err(Error::invalid(format!("message with empty role: {bad:?}")));
                }
                let t = self.tokenizer.apply_chat_template(m, true)?;
                let ids = self.tokenizer.encode(&t, false)?;
                (t, ids)
            }
            Prompt::TokenIds(ids) => {
                let vocab = self.model.args.vocab_size;
                if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                    return Err(Error::invalid(format!(
                        "prompt token id {bad} is outside the vocabulary (size {vocab})"
                    )));
                }
                (self.tokenizer.decode(ids, false)?, ids.clone())
            }
        };
        if ids.is_empty() {
            return Err(Error::invalid("the prompt is empty"));
        }
        if ids.len() >= self.max_model_len {
            return Err(Error::invalid(format!(
                "the prompt has {} tokens but max_model_len is {}: shorten it or raise max_model_len",
                ids.len(),
                self.max_model_len
            )));
        }
        Ok((text, ids))
    }

    fn sequence(&self, req: &Request) -> Result<Sequence> {
        let (text, ids) = self.prepare(req)?;
        Ok(Sequence::new(text, ids, req.params.clone(), &self.tokenizer.eos_token_ids, self.max_model_len))
    }

    /// Runs every request to completion as one continuous batch; outputs in request order.
    pub fn generate(&self, reqs: &[Request]) -> Result<Vec<RequestOutput>> {
        let seqs: Vec<Sequence> = reqs.iter().map(|r| self.sequence(r)).collect::<Result<_>>()?;
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        let mut runner = Runner::new(self, &seqs);
        let mut waiting: VecDeque<(usize, Sequence)> = seqs.into_iter().enumerate().collect();
        let mut running: Vec<(usize, Sequence)> = Vec::new();
        let mut done: Vec<Option<RequestOutput>> = (0..waiting.len()).map(|_| None).collect();
        while !waiting.is_empty() || !running.is_empty() {
            while running.len() < self.config.max_model_concurrency {
                let Some((i, mut s)) = waiting.pop_front() else { break };
                runner.admit(&mut s)?;
                running.push((i, s));
            }
            let mut refs: Vec<&mut Sequence> = running.iter_mut().map(|(_, s)| s).collect();
            runner.step(self, &mut refs)?;
            let mut still = Vec::with_capacity(running.len());
            for (i, mut s) in running.drain(..) {
                if s.is_finished() {
                    runner.release(&mut s);
                    done[i] = Some(s.into_output());
                } else {
                    still.push((i, s));
                }
            }
            running = still;
        }
        done.into_iter().map(|o| o.ok_or_else(|| Error::internal("request lost"))).collect()
    }

    /// A request whose output arrives chunk by chunk; each `next()` runs one step.
    pub fn stream(self: &Arc<Self>, req: &Request) -> Result<Stream> {
        let mut seq = self.sequence(req)?;
        let mut runner = Runner::new(self, std::slice::from_ref(&seq));
        runner.admit(&mut seq)?;
        Ok(Stream { engine: self.clone(), runner, seq: Some(seq) })
    }
}

/// One call's KV cache and its free blocks.
struct Runner {
    kv: KvCache,
    free: Vec<u32>,
    bytes: usize,
    counter: Arc<AtomicUsize>,
}

impl Runner {
    fn new(engine: &Engine, seqs: &[Sequence]) -> Self {
        let per_seq = seqs.iter().map(|s| s.max_len.div_ceil(BLOCK_SIZE)).max().unwrap_or(1);
        let n = seqs.len().min(engine.config.max_model_concurrency).max(1) * per_seq;
        let kv = engine.model.new_kv_cache(n, BLOCK_SIZE);
        let bytes = kv.total_bytes();
        engine.kv_bytes_in_use.fetch_add(bytes, Ordering::Relaxed);
        Self { kv, free: (0..n as u32).rev().collect(), bytes, counter: engine.kv_bytes_in_use.clone() }
    }

    fn admit(&mut self, s: &mut Sequence) -> Result<()> {
        let need = s.max_len.div_ceil(BLOCK_SIZE);
        if self.free.len() < need {
            return Err(Error::internal("KV blocks exhausted"));
        }
        s.block_table = self.free.split_off(self.free.len() - need);
        Ok(())
    }

    fn release(&mut self, s: &mut Sequence) {
        self.free.append(&mut s.block_table);
    }

    /// One forward over every unfinished sequence, then one sampled token each.
    fn step(&mut self, engine: &Engine, seqs: &mut [&mut Sequence]) -> Result<()> {
        let chunks: Vec<Vec<TokenId>> = seqs.iter().map(|s| s.uncomputed()).collect();
        let batch = ForwardBatch {
            seqs: seqs
                .iter()
                .zip(&chunks)
                .map(|(s, c)| SeqChunk {
                    token_ids: c,
                    start_pos: s.num_computed_tokens,
                    block_table: &s.block_table,
                    logits: LogitsSelect::Last,
                })
                .collect(),
        };
        let logits = engine.model.forward(&batch, &mut self.kv)?;
        let logits = logits.to_vec2::<f32>().map_err(Error::internal)?;
        for ((s, c), row) in seqs.iter_mut().zip(&chunks).zip(&logits) {
            s.num_computed_tokens += c.len();
            s.append_from_logits(&engine.tokenizer, row)?;
        }
        Ok(())
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// Iterator of `StreamChunk`s for one request; dropping it frees its KV memory.
pub struct Stream {
    engine: Arc<Engine>,
    runner: Runner,
    seq: Option<Sequence>,
}

impl Iterator for Stream {
    type Item = Result<StreamChunk>;

    fn next(&mut self) -> Option<Self::Item> {
        let seq = self.seq.as_mut()?;
        loop {
            if let Err(e) = self.runner.step(&self.engine, &mut [&mut *seq]) {
                self.seq = None;
                return Some(Err(e));
            }
            let chunk = seq.take_chunk();
            if seq.is_finished() {
                self.seq = None;
                return Some(Ok(chunk));
            }
            if !chunk.text.is_empty() || !chunk.token_ids.is_empty() {
                return Some(Ok(chunk));
            }
        }
    }
}
