//! The decoder-only transformer shared by every supported family (llama, mistral, qwen2, qwen3,
//! phi3), running on the CPU backend over plain f32 row buffers: `qmatmul`/`dense` for the
//! projections, `rowops` for norms, activations and residuals, `ops` for rope and paged
//! attention, all parallel loops on the `team`.
//!
//! Invariants: the model owns no KV state and no per-request state; `forward` reads a
//! `ForwardBatch` (any mix of prefill chunks and decode steps) and writes K/V only into the
//! slots the batch's block tables name. Every projection maps one token row to one output row,
//! so a row's value never depends on the other rows of the batch; quantized projections take
//! the prompt or the decode kernel by the row's kind (`RowKinds`: prompt or generated token),
//! which is the token's own property, and the head always takes the decode kernel.

use crate::args::{Arch, ModelArgs};
use crate::kv::{ForwardBatch, KvCache, KvDtype, LogitsSelect, RowKinds};
use crate::ops::{paged_attention, AttnDims, RopeTable};
use crate::rowops;
use crate::weights::{Linear, Matrix, WeightSource};
use candle_core::{Device, Tensor};
use lmplex_core::{Error, Result};

enum AttnProj {
    Separate {
        q: Linear,
        k: Linear,
        v: Linear,
    },
    /// Rows are q, then k, then v: phi3's `qkv_proj`, or the three joined at load when they
    /// share a format (`Linear::concat`).
    Fused(Linear),
}

enum MlpProj {
    Separate {
        gate: Linear,
        up: Linear,
    },
    /// Rows are gate, then up: phi3's `gate_up_proj`, or the two joined at load.
    Fused(Linear),
}

struct Layer {
    input_layernorm: Vec<f32>,
    post_attention_layernorm: Vec<f32>,
    attn: AttnProj,
    o_proj: Linear,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    mlp: MlpProj,
    down_proj: Linear,
}

/// A loaded decoder-only transformer (weights and rope tables) on the CPU backend.
pub struct Model {
    /// The architecture it was built from.
    pub args: ModelArgs,
    embed_tokens: Matrix,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    lm_head: Linear,
    rope: RopeTable,
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
        let mut bytes = 0usize;
        let mut linear = |name: &str, bias: bool| -> Result<Linear> {
            let l = src.linear(name, bias)?;
            bytes += l.size_in_bytes();
            Ok(l)
        };
        // Bytes counted for parts that were then joined into one matrix (their padding).
        let mut joined = 0usize;
        let mut layers = Vec::with_capacity(args.num_hidden_layers);
        for i in 0..args.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let attn = if args.arch == Arch::Phi3 {
                AttnProj::Fused(linear(&format!("{p}.self_attn.qkv_proj"), false)?)
            } else {
                let b = args.attention_bias;
                let q = linear(&format!("{p}.self_attn.q_proj"), b)?;
                let k = linear(&format!("{p}.self_attn.k_proj"), b)?;
                let v = linear(&format!("{p}.self_attn.v_proj"), b)?;
                match Linear::concat(&[&q, &k, &v]) {
                    Some(qkv) => {
                        joined += q.size_in_bytes() + k.size_in_bytes() + v.size_in_bytes() - qkv.size_in_bytes();
                        AttnProj::Fused(qkv)
                    }
                    None => AttnProj::Separate { q, k, v },
                }
            };
            let mlp = if args.arch == Arch::Phi3 {
                MlpProj::Fused(linear(&format!("{p}.mlp.gate_up_proj"), false)?)
            } else {
                let gate = linear(&format!("{p}.mlp.gate_proj"), false)?;
                let up = linear(&format!("{p}.mlp.up_proj"), false)?;
                match Linear::concat(&[&gate, &up]) {
                    Some(gate_up) => {
                        joined += gate.size_in_bytes() + up.size_in_bytes() - gate_up.size_in_bytes();
                        MlpProj::Fused(gate_up)
                    }
                    None => MlpProj::Separate { gate, up },
                }
            };
            let o_proj = linear(&format!("{p}.self_attn.o_proj"), false)?;
            let down_proj = linear(&format!("{p}.mlp.down_proj"), false)?;
            let (q_norm, k_norm) = if args.qk_norm {
                (
                    Some(src.vector(&format!("{p}.self_attn.q_norm.weight"))?),
                    Some(src.vector(&format!("{p}.self_attn.k_norm.weight"))?),
                )
            } else {
                (None, None)
            };
            layers.push(Layer {
                input_layernorm: src.vector(&format!("{p}.input_layernorm.weight"))?,
                post_attention_layernorm: src.vector(&format!("{p}.post_attention_layernorm.weight"))?,
                attn,
                o_proj,
                q_norm,
                k_norm,
                mlp,
                down_proj,
            });
        }
        // Quantized tables stay quantized and are decoded per row (`Matrix::rows`).
        let embed_tokens = src.matrix("model.embed_tokens.weight")?;
        let lm_head = if src.has("lm_head.weight") { Some(linear("lm_head", false)?) } else { None };
        bytes += embed_tokens.size_in_bytes();
        let untied_head = lm_head.is_some();
        // Tied embeddings: the head shares the table's memory.
        let lm_head = lm_head.unwrap_or_else(|| Linear { weight: embed_tokens.clone(), bias: None });
        if lm_head.weight.dims() != (args.vocab_size, args.hidden_size) {
            return Err(Error::model_load(format!(
                "the output head is {:?} but vocab_size x hidden_size is {:?}",
                lm_head.weight.dims(),
                (args.vocab_size, args.hidden_size)
            )));
        }
        let norm = src.vector("model.norm.weight")?;
        let freq_factors = src.rope_freq_factors()?;
        let rope = RopeTable::new(&args.rope, args.head_dim, max_positions, freq_factors.as_deref());
        let norms = layers.len() * 2 * args.hidden_size + args.hidden_size;
        Ok(Self {
            weight_bytes: bytes - joined + norms * 4,
            untied_head,
            embed_tokens,
            layers,
            norm,
            lm_head,
            rope,
            args,
            device: Device::Cpu,
        })
    }

    /// Bytes held by weights.
    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    /// Bytes of weights one decode step reads: all of them but an embedding table that is not
    /// also the head (a step reads one row of it per token). The decode roofline's numerator.
    pub fn decode_weight_bytes(&self) -> usize {
        self.weight_bytes - if self.untied_head { self.embed_tokens.size_in_bytes() } else { 0 }
    }

    /// Bytes held besides weights: the rope tables.
    pub fn other_bytes(&self) -> usize {
        self.rope.size_in_bytes()
    }

    /// Positions the rope tables cover: no sequence may grow past this many tokens.
    pub fn max_positions(&self) -> usize {
        self.rope.max_positions
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

    /// `forward`'s logits as the `[rows, vocab]` row-major buffer the head wrote (the engine's
    /// path: no tensor, no copy).
    pub fn forward_logits(&self, batch: &ForwardBatch, kv: &mut KvCache) -> Result<Vec<f32>> {
        kv.check_batch(batch)?;
        if let Some(s) = batch.seqs.iter().find(|s| s.end_pos() > self.rope.max_positions) {
            return Err(Error::invalid(format!(
                "sequence reaches position {} but the model was loaded for {}",
                s.end_pos(),
                self.rope.max_positions
            )));
        }
        let ids: Vec<u32> = batch.seqs.iter().flat_map(|s| s.token_ids.iter().copied()).collect();
        let n = ids.len();
        if n == 0 {
            return Err(Error::internal("empty forward batch"));
        }
        let mut x = self.embed_tokens.rows(&ids)?;
        let kinds = batch.row_kinds();
        for (li, layer) in self.layers.iter().enumerate() {
            self.layer_forward(li, layer, &mut x, batch, &kinds, kv);
        }
        // Keep only the rows whose logits are wanted, then the final norm and head.
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
        let nrows = rows.len() / h;
        if nrows == 0 {
            return Ok(Vec::new());
        }
        rowops::rms_norm_in_place(&mut rows, &self.norm, self.args.rms_norm_eps);
        // The head takes the decode kernel for every row: most calls have one row per sequence.
        // `[nrows, vocab_size]`: the head's shape is checked at load.
        Ok(self.lm_head.forward_rows(&rows, nrows, &RowKinds::uniform(nrows, false)))
    }

    /// One decoder layer over the batch's `[tokens, hidden]` rows, in place.
    fn layer_forward(
        &self,
        li: usize,
        layer: &Layer,
        x: &mut [f32],
        batch: &ForwardBatch,
        kinds: &RowKinds,
        kv: &mut KvCache,
    ) {
        let a = &self.args;
        let (hidden, eps, hd) = (a.hidden_size, a.rms_norm_eps, a.head_dim);
        let n = x.len() / hidden;
        let (qw, kw) = (a.num_attention_heads * hd, a.num_key_value_heads * hd);
        let h = rowops::rms_norm(x, &layer.input_layernorm, eps);
        let (mut q, mut k, v) = match &layer.attn {
            AttnProj::Separate { q, k, v } => {
                (q.forward_rows(&h, n, kinds), k.forward_rows(&h, n, kinds), v.forward_rows(&h, n, kinds))
            }
            AttnProj::Fused(qkv) => {
                let y = qkv.forward_rows(&h, n, kinds);
                let w = qw + 2 * kw;
                let part = |lo: usize, len: usize| -> Vec<f32> {
                    let mut out = Vec::with_capacity(n * len);
                    y.chunks_exact(w).for_each(|r| out.extend_from_slice(&r[lo..lo + len]));
                    out
                };
                (part(0, qw), part(qw, kw), part(qw + kw, kw))
            }
        };
        if let Some(w) = &layer.q_norm {
            rowops::rms_norm_in_place(&mut q, w, eps);
        }
        if let Some(w) = &layer.k_norm {
            rowops::rms_norm_in_place(&mut k, w, eps);
        }
        let dims = AttnDims { num_heads: a.num_attention_heads, num_kv_heads: a.num_key_value_heads, head_dim: hd };
        let attn = paged_attention(batch, &mut q, &mut k, &v, kv, li, &self.rope, dims);
        rowops::add_in_place(x, &layer.o_proj.forward_rows(&attn, n, kinds), hidden);
        let h = rowops::rms_norm(x, &layer.post_attention_layernorm, eps);
        let act = match &layer.mlp {
            MlpProj::Separate { gate, up } => {
                let i = a.intermediate_size;
                rowops::silu_mul(gate.forward_rows(&h, n, kinds), Some(&up.forward_rows(&h, n, kinds)), i)
            }
            MlpProj::Fused(gate_up) => {
                let y = gate_up.forward_rows(&h, n, kinds);
                let i = y.len() / n / 2;
                rowops::silu_mul(y, None, i)
            }
        };
        rowops::add_in_place(x, &layer.down_proj.forward_rows(&act, n, kinds), hidden);
    }
}
