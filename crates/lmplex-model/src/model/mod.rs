//! The decoder-only transformer shared by every supported family, running on the CPU backend
//! over plain f32 row buffers: `qmatmul`/`dense` for the projections, `rowops` for norms,
//! activations and residuals, `ops` for rope and paged attention, all parallel loops on the
//! `team`. A layer is typed parts built once from `ModelArgs` (`attention.rs`; `mlp.rs` or
//! `moe.rs`; the norms below): the forward pass never asks which family it runs.
//!
//! Invariants: the model owns no KV state and no per-request state; `forward` reads a
//! `ForwardBatch` (any mix of prefill chunks and decode steps) and writes K/V only into the
//! slots the batch's block tables name. Every projection maps one token row to one output row,
//! so a row's value never depends on the other rows of the batch; quantized projections take
//! the prompt or the decode kernel by the row's kind (`RowKinds`: prompt or generated token),
//! which is the token's own property, and the head always takes the decode kernel.

mod attention;
mod mlp;
mod moe;

use crate::args::ModelArgs;
use crate::kv::{ForwardBatch, KvCache, KvDtype, LogitsSelect, RowKinds};
use crate::lora::{LoraModule, LoraRows};
use crate::ops::RopeTable;
use crate::rowops;
use crate::weights::{Linear, Matrix, WeightSource};
use attention::Attention;
use candle_core::{Device, Tensor};
use lmplex_core::{Error, Result};
use mlp::Mlp;
use moe::Moe;

/// A layer's RMSNorm weights (the family's offset already added). Llama-style layers have
/// `input` and `pre_feedforward` (HF's `post_attention_layernorm`); Gemma 2/3 also normalize
/// the attention and MLP outputs before the residual adds.
struct Norms {
    input: Vec<f32>,
    post_attention: Option<Vec<f32>>,
    pre_feedforward: Vec<f32>,
    post_feedforward: Option<Vec<f32>>,
}

impl Norms {
    fn size_in_bytes(&self) -> usize {
        let opt = |n: &Option<Vec<f32>>| n.as_ref().map_or(0, Vec::len);
        (self.input.len() + self.pre_feedforward.len() + opt(&self.post_attention) + opt(&self.post_feedforward)) * 4
    }
}

/// A layer's MLP: dense, or routed experts.
enum Ffn {
    Dense(Mlp),
    Moe(Moe),
}

impl Ffn {
    /// `lora`'s deltas apply to a dense MLP only (`lora_modules` lists no expert).
    fn forward(&self, h: &[f32], n: usize, kinds: &RowKinds, layer: usize, lora: &LoraRows) -> Vec<f32> {
        match self {
            Self::Dense(m) => m.forward(h, n, kinds, layer, lora),
            Self::Moe(m) => m.forward(h, n, kinds),
        }
    }

    fn size_in_bytes(&self) -> usize {
        match self {
            Self::Dense(m) => m.size_in_bytes(),
            Self::Moe(m) => m.size_in_bytes(),
        }
    }
}

struct Layer {
    norms: Norms,
    attn: Attention,
    mlp: Ffn,
}

/// A loaded decoder-only transformer (weights and rope tables) on the CPU backend.
pub struct Model {
    /// The architecture it was built from.
    pub args: ModelArgs,
    embed_tokens: Matrix,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    lm_head: Linear,
    /// The full-attention layers' rope table, then the sliding layers' when it differs.
    ropes: Vec<RopeTable>,
    weight_bytes: usize,
    /// Whether the head is a matrix of its own, so the embedding table is only looked up.
    untied_head: bool,
    device: Device,
}

fn ce(e: candle_core::Error) -> Error {
    Error::internal(e)
}

impl Model {
    /// Builds the model from `src`; rope tables cover `max_positions` positions.
    pub fn load(args: ModelArgs, src: &WeightSource, max_positions: usize) -> Result<Self> {
        args.validate()?;
        let offset = args.norm_weight_offset;
        let norm = |name: &str| -> Result<Vec<f32>> {
            let mut w = src.vector(name)?;
            w.iter_mut().for_each(|x| *x += offset);
            Ok(w)
        };
        let mut layers = Vec::with_capacity(args.num_hidden_layers);
        for i in 0..args.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let sandwich = |name: &str| args.sandwich_norm.then(|| norm(&format!("{p}.{name}.weight"))).transpose();
            let norms = if args.sandwich_norm {
                Norms {
                    input: norm(&format!("{p}.input_layernorm.weight"))?,
                    post_attention: sandwich("post_attention_layernorm")?,
                    pre_feedforward: norm(&format!("{p}.pre_feedforward_layernorm.weight"))?,
                    post_feedforward: sandwich("post_feedforward_layernorm")?,
                }
            } else {
                Norms {
                    input: norm(&format!("{p}.input_layernorm.weight"))?,
                    post_attention: None,
                    pre_feedforward: norm(&format!("{p}.post_attention_layernorm.weight"))?,
                    post_feedforward: None,
                }
            };
            let attn = Attention::load(src, &p, &args, i, &norm)?;
            let mlp = match &args.moe {
                Some(m) if m.sparse_layers[i] => Ffn::Moe(Moe::load(src, &p, m, args.hidden_act)?),
                _ => Ffn::Dense(Mlp::load(src, &format!("{p}.mlp"), args.hidden_act)?),
            };
            layers.push(Layer { norms, attn, mlp });
        }
        // Quantized tables stay quantized and are decoded per row (`Matrix::rows`).
        let embed_tokens = src.matrix("model.embed_tokens.weight")?;
        let lm_head = if src.has("lm_head.weight") { Some(src.linear("lm_head", false)?) } else { None };
        let untied_head = lm_head.is_some();
        let head_bytes = lm_head.as_ref().map_or(0, Linear::size_in_bytes);
        // Tied embeddings: the head shares the table's memory.
        let lm_head = lm_head.unwrap_or_else(|| Linear { weight: embed_tokens.clone(), bias: None });
        if lm_head.weight.dims() != (args.vocab_size, args.hidden_size) {
            return Err(Error::model_load(format!(
                "the output head is {:?} but vocab_size x hidden_size is {:?}",
                lm_head.weight.dims(),
                (args.vocab_size, args.hidden_size)
            )));
        }
        let norm = norm("model.norm.weight")?;
        let freq_factors = src.rope_freq_factors()?;
        let mut ropes = vec![RopeTable::new(&args.rope, args.head_dim, max_positions, freq_factors.as_deref())];
        if let Some(local) = &args.rope_local {
            ropes.push(RopeTable::new(local, args.head_dim, max_positions, None));
        }
        let layer_bytes: usize =
            layers.iter().map(|l| l.norms.size_in_bytes() + l.attn.size_in_bytes() + l.mlp.size_in_bytes()).sum();
        Ok(Self {
            weight_bytes: embed_tokens.size_in_bytes() + head_bytes + layer_bytes + norm.len() * 4,
            untied_head,
            embed_tokens,
            layers,
            norm,
            lm_head,
            ropes,
            args,
            device: Device::Cpu,
        })
    }

    /// The projections a LoRA adapter may adapt, as the checkpoint names them (attention in
    /// every layer, the MLP in dense layers; never experts, embeddings or the head).
    pub fn lora_modules(&self) -> Vec<LoraModule> {
        let a = &self.args;
        let mut out = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            out.extend(l.attn.lora_modules(i, a.hidden_size));
            if let Ffn::Dense(m) = &l.mlp {
                out.extend(m.lora_modules(i, a.hidden_size));
            }
        }
        crate::lora::mark_permuted_heads(&mut out, a);
        out
    }

    /// Bytes held by weights.
    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    /// Bytes held by the routed experts of MoE layers (part of `weight_bytes`).
    pub fn expert_weight_bytes(&self) -> usize {
        self.layers.iter().map(|l| if let Ffn::Moe(m) = &l.mlp { m.expert_bytes() } else { 0 }).sum()
    }

    /// Bytes of weights one decode step of one sequence reads: all of them but an embedding
    /// table that is not also the head (a step reads one row of it per token) and the routed
    /// experts a token does not take (it reads `top_k` of each layer's). The decode roofline's
    /// numerator.
    pub fn decode_weight_bytes(&self) -> usize {
        let unread_experts: usize = self
            .layers
            .iter()
            .map(|l| if let Ffn::Moe(m) = &l.mlp { m.expert_bytes() - m.active_expert_bytes() } else { 0 })
            .sum();
        self.weight_bytes - unread_experts - if self.untied_head { self.embed_tokens.size_in_bytes() } else { 0 }
    }

    /// Bytes held besides weights: the rope tables.
    pub fn other_bytes(&self) -> usize {
        self.ropes.iter().map(RopeTable::size_in_bytes).sum()
    }

    /// Positions the rope tables cover: no sequence may grow past this many tokens.
    pub fn max_positions(&self) -> usize {
        self.ropes[0].max_positions
    }

    /// A KV cache with this model's shapes, of `dtype` elements.
    pub fn new_kv_cache(&self, num_blocks: usize, block_size: usize, dtype: KvDtype) -> Result<KvCache> {
        let a = &self.args;
        KvCache::with_dtype(a.num_hidden_layers, num_blocks, block_size, a.num_key_value_heads, a.head_dim, dtype)
    }

    /// Runs every layer over the batch; returns the selected rows' logits `[rows, vocab]` (f32),
    /// rows in batch order.
    ///
    /// Parallel loops run on `team` (threads that spin between loops); the caller's thread
    /// takes part in each.
    pub fn forward(&self, batch: &ForwardBatch, kv: &mut KvCache) -> Result<Tensor> {
        let logits = self.forward_logits(batch, kv)?;
        let rows = batch.num_logit_rows();
        Tensor::from_vec(logits, (rows, self.args.vocab_size), &self.device).map_err(ce)
    }

    /// `forward`'s logits as the `[rows, vocab]` row-major buffer the head wrote (no tensor,
    /// no copy).
    pub fn forward_logits(&self, batch: &ForwardBatch, kv: &mut KvCache) -> Result<Vec<f32>> {
        self.forward_logits_between(batch, kv, &|| {})
    }

    /// `forward_logits`, calling `between_layers` after each decoder layer on the caller's
    /// thread (the engine's path: there a step may give the device to another model's step,
    /// `lmplex_sched::Turn::give_way`). What the pass computes does not depend on it.
    pub fn forward_logits_between(
        &self,
        batch: &ForwardBatch,
        kv: &mut KvCache,
        between_layers: &dyn Fn(),
    ) -> Result<Vec<f32>> {
        let rows = self.forward_hidden_between(batch, kv, between_layers)?;
        let nrows = rows.len() / self.args.hidden_size;
        if nrows == 0 {
            return Ok(Vec::new());
        }
        // The head takes the decode kernel for every row: most calls have one row per sequence.
        // `[nrows, vocab_size]`: the head's shape is checked at load.
        let mut logits = self.lm_head.forward_rows(&rows, nrows, &RowKinds::uniform(nrows, false));
        if let Some(cap) = self.args.final_logit_softcapping {
            rowops::softcap_in_place(&mut logits, cap);
        }
        Ok(logits)
    }

    /// The selected rows' final hidden states, `[rows, hidden]` after the final norm (what the
    /// head reads; an embedding model pools them), in batch order; `between_layers` as in
    /// `forward_logits_between`.
    pub fn forward_hidden_between(
        &self,
        batch: &ForwardBatch,
        kv: &mut KvCache,
        between_layers: &dyn Fn(),
    ) -> Result<Vec<f32>> {
        kv.check_batch(batch)?;
        if let Some(s) = batch.seqs.iter().find(|s| s.end_pos() > self.max_positions()) {
            return Err(Error::invalid(format!(
                "sequence reaches position {} but the model was loaded for {}",
                s.end_pos(),
                self.max_positions()
            )));
        }
        let ids: Vec<u32> = batch.seqs.iter().flat_map(|s| s.token_ids.iter().copied()).collect();
        let n = ids.len();
        if n == 0 {
            return Err(Error::internal("empty forward batch"));
        }
        let mut x = self.embed_tokens.rows(&ids)?;
        if let Some(c) = self.args.embed_scale {
            rowops::scale_in_place(&mut x, c);
        }
        self.splice_embeds(batch, &mut x)?;
        let kinds = batch.row_kinds();
        let lora = LoraRows::new(batch.seqs.iter().map(|s| (s.token_ids.len(), s.lora)));
        for (li, layer) in self.layers.iter().enumerate() {
            self.layer_forward(li, layer, &mut x, batch, (&kinds, &lora), kv);
            between_layers();
        }
        // Keep only the selected rows, then the final norm.
        let h = self.args.hidden_size;
        let mut rows = Vec::with_capacity(batch.num_logit_rows() * h);
        let mut t = 0usize;
        for s in &batch.seqs {
            let len = s.token_ids.len();
            match s.logits {
                LogitsSelect::None => {}
                LogitsSelect::Last => rows.extend_from_slice(&x[(t + len - 1) * h..(t + len) * h]),
                LogitsSelect::All => rows.extend_from_slice(&x[t * h..(t + len) * h]),
            }
            t += len;
        }
        if !rows.is_empty() {
            rowops::rms_norm_in_place(&mut rows, &self.norm, self.args.rms_norm_eps);
        }
        Ok(rows)
    }

    /// Each sequence's `embeds` rows over its token rows in `x` (`InputEmbeds::splice`).
    fn splice_embeds(&self, batch: &ForwardBatch, x: &mut [f32]) -> Result<()> {
        let h = self.args.hidden_size;
        let mut t = 0usize;
        for s in &batch.seqs {
            let len = s.token_ids.len();
            if let Some(e) = s.embeds {
                if e.hidden() != h {
                    return Err(Error::invalid(format!("input embeddings of width {} for a model of {h}", e.hidden())));
                }
                if e.splits(s.start_pos + len) {
                    return Err(Error::internal(format!(
                        "a chunk ends at position {} inside a bidirectional image block",
                        s.start_pos + len
                    )));
                }
                e.splice(&mut x[t * h..(t + len) * h], s.start_pos);
            }
            t += len;
        }
        Ok(())
    }

    /// One decoder layer over the batch's `[tokens, hidden]` rows, in place.
    fn layer_forward(
        &self,
        li: usize,
        layer: &Layer,
        x: &mut [f32],
        batch: &ForwardBatch,
        (kinds, lora): (&RowKinds, &LoraRows),
        kv: &mut KvCache,
    ) {
        let (hidden, eps) = (self.args.hidden_size, self.args.rms_norm_eps);
        let n = x.len() / hidden;
        let h = rowops::rms_norm(x, &layer.norms.input, eps);
        let mut a = layer.attn.forward(&h, n, batch, kinds, kv, li, &self.ropes, lora);
        if let Some(w) = &layer.norms.post_attention {
            rowops::rms_norm_in_place(&mut a, w, eps);
        }
        rowops::add_in_place(x, &a, hidden);
        let h = rowops::rms_norm(x, &layer.norms.pre_feedforward, eps);
        let mut m = layer.mlp.forward(&h, n, kinds, li, lora);
        if let Some(w) = &layer.norms.post_feedforward {
            rowops::rms_norm_in_place(&mut m, w, eps);
        }
        rowops::add_in_place(x, &m, hidden);
    }
}
