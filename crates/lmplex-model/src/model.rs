//! The decoder-only transformer shared by every supported family (llama, mistral, qwen2, qwen3,
//! phi3), running on the CPU backend: candle tensors and quantized matmuls for the projections,
//! `ops` for rope and paged attention.
//!
//! Invariants: the model owns no KV state and no per-request state; `forward` reads a
//! `ForwardBatch` (any mix of prefill chunks and decode steps) and writes K/V only into the
//! slots the batch's block tables name. Every projection maps one token row to one output row,
//! so a row's value never depends on the other rows of the batch.

use crate::args::{Arch, ModelArgs};
use crate::kv::{ForwardBatch, KvCache, LogitsSelect};
use crate::ops::{paged_attention, AttnDims, RopeTable};
use crate::weights::{Linear, Matrix, WeightSource};
use candle_core::{Device, Tensor, D};
use lmplex_core::{Error, Result};

enum AttnProj {
    Separate {
        q: Linear,
        k: Linear,
        v: Linear,
    },
    /// phi3's `qkv_proj`: rows are q, then k, then v.
    Fused(Linear),
}

enum MlpProj {
    Separate {
        gate: Linear,
        up: Linear,
    },
    /// phi3's `gate_up_proj`: rows are gate, then up.
    Fused(Linear),
}

struct Layer {
    input_layernorm: Tensor,
    post_attention_layernorm: Tensor,
    attn: AttnProj,
    o_proj: Linear,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    mlp: MlpProj,
    down_proj: Linear,
}

pub struct Model {
    pub args: ModelArgs,
    embed_tokens: Matrix,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Linear,
    rope: RopeTable,
    weight_bytes: usize,
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
        let mut layers = Vec::with_capacity(args.num_hidden_layers);
        for i in 0..args.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let attn = if args.arch == Arch::Phi3 {
                AttnProj::Fused(linear(&format!("{p}.self_attn.qkv_proj"), false)?)
            } else {
                let b = args.attention_bias;
                AttnProj::Separate {
                    q: linear(&format!("{p}.self_attn.q_proj"), b)?,
                    k: linear(&format!("{p}.self_attn.k_proj"), b)?,
                    v: linear(&format!("{p}.self_attn.v_proj"), b)?,
                }
            };
            let mlp = if args.arch == Arch::Phi3 {
                MlpProj::Fused(linear(&format!("{p}.mlp.gate_up_proj"), false)?)
            } else {
                MlpProj::Separate {
                    gate: linear(&format!("{p}.mlp.gate_proj"), false)?,
                    up: linear(&format!("{p}.mlp.up_proj"), false)?,
                }
            };
            let o_proj = linear(&format!("{p}.self_attn.o_proj"), false)?;
            let down_proj = linear(&format!("{p}.mlp.down_proj"), false)?;
            let (q_norm, k_norm) = if args.qk_norm {
                (
                    Some(src.tensor(&format!("{p}.self_attn.q_norm.weight"))?),
                    Some(src.tensor(&format!("{p}.self_attn.k_norm.weight"))?),
                )
            } else {
                (None, None)
            };
            layers.push(Layer {
                input_layernorm: src.tensor(&format!("{p}.input_layernorm.weight"))?,
                post_attention_layernorm: src.tensor(&format!("{p}.post_attention_layernorm.weight"))?,
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
        // Tied embeddings: the head shares the table's memory.
        let lm_head = lm_head.unwrap_or_else(|| Linear { weight: embed_tokens.clone(), bias: None });
        let norm = src.tensor("model.norm.weight")?;
        let freq_factors = src.rope_freq_factors()?;
        let rope = RopeTable::new(&args.rope, args.head_dim, max_positions, freq_factors.as_deref());
        let norms = layers.len() * 2 * args.hidden_size + args.hidden_size;
        Ok(Self {
            weight_bytes: bytes + norms * 4,
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

    /// Bytes held besides weights: the rope tables.
    pub fn other_bytes(&self) -> usize {
        self.rope.size_in_bytes()
    }

    pub fn max_positions(&self) -> usize {
        self.rope.max_positions
    }

    /// A KV cache with this model's shapes.
    pub fn new_kv_cache(&self, num_blocks: usize, block_size: usize) -> Result<KvCache> {
        let a = &self.args;
        KvCache::new(a.num_hidden_layers, num_blocks, block_size, a.num_key_value_heads, a.head_dim)
    }

    /// Runs every layer over the batch; returns the selected rows' logits `[rows, vocab]` (f32),
    /// rows in batch order.
    ///
    /// The whole pass runs as one job on the shared rayon pool: its parallel loops then split
    /// work on a pool thread, instead of every loop injecting work from the caller's thread
    /// and putting it to sleep (a futex round trip per matmul, a quarter of a small model's
    /// decode time).
    pub fn forward(&self, batch: &ForwardBatch, kv: &mut KvCache) -> Result<Tensor> {
        rayon::scope(|_| self.forward_in_pool(batch, kv))
    }

    fn forward_in_pool(&self, batch: &ForwardBatch, kv: &mut KvCache) -> Result<Tensor> {
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
        let ids = Tensor::from_vec(ids, n, &self.device).map_err(ce)?;
        let mut x = self.embed_tokens.rows(&ids).map_err(ce)?;
        for (li, layer) in self.layers.iter().enumerate() {
            x = self.layer_forward(li, layer, &x, batch, kv).map_err(ce)?;
        }
        // Keep only the rows whose logits are wanted, then the final norm and head.
        let mut rows = Vec::with_capacity(batch.num_logit_rows());
        let mut t = 0u32;
        for s in &batch.seqs {
            let len = s.token_ids.len() as u32;
            match s.logits {
                LogitsSelect::None => {}
                LogitsSelect::Last => rows.push(t + len - 1),
                LogitsSelect::All => rows.extend(t..t + len),
            }
            t += len;
        }
        if rows.is_empty() {
            return Tensor::zeros((0, self.args.vocab_size), candle_core::DType::F32, &self.device).map_err(ce);
        }
        let nrows = rows.len();
        let rows = Tensor::from_vec(rows, nrows, &self.device).map_err(ce)?;
        let x = x.index_select(&rows, 0).map_err(ce)?;
        let x = candle_nn::ops::rms_norm(&x, &self.norm, self.args.rms_norm_eps).map_err(ce)?;
        self.lm_head.forward(&x).map_err(ce)
    }

    fn layer_forward(
        &self,
        li: usize,
        layer: &Layer,
        x: &Tensor,
        batch: &ForwardBatch,
        kv: &mut KvCache,
    ) -> candle_core::Result<Tensor> {
        let a = &self.args;
        let (n, eps) = (x.dim(0)?, a.rms_norm_eps);
        let (qw, kw) = (a.num_attention_heads * a.head_dim, a.num_key_value_heads * a.head_dim);
        let h = candle_nn::ops::rms_norm(x, &layer.input_layernorm, eps)?;
        let (q, k, v) = match &layer.attn {
            AttnProj::Separate { q, k, v } => (q.forward(&h)?, k.forward(&h)?, v.forward(&h)?),
            AttnProj::Fused(qkv) => {
                let y = qkv.forward(&h)?;
                (y.narrow(1, 0, qw)?, y.narrow(1, qw, kw)?, y.narrow(1, qw + kw, kw)?)
            }
        };
        let head_norm = |t: Tensor, w: &Option<Tensor>, width: usize| -> candle_core::Result<Tensor> {
            match w {
                Some(w) => candle_nn::ops::rms_norm(&t.reshape((n * width / a.head_dim, a.head_dim))?, w, eps),
                None => Ok(t),
            }
        };
        let q = head_norm(q, &layer.q_norm, qw)?;
        let k = head_norm(k, &layer.k_norm, kw)?;
        let mut qv = q.flatten_all()?.to_vec1::<f32>()?;
        let mut kv_k = k.flatten_all()?.to_vec1::<f32>()?;
        let vv = v.flatten_all()?.to_vec1::<f32>()?;
        let dims =
            AttnDims { num_heads: a.num_attention_heads, num_kv_heads: a.num_key_value_heads, head_dim: a.head_dim };
        let attn = paged_attention(batch, &mut qv, &mut kv_k, &vv, kv, li, &self.rope, dims);
        let attn = Tensor::from_vec(attn, (n, qw), &self.device)?;
        let x = (x + layer.o_proj.forward(&attn)?)?;
        let h = candle_nn::ops::rms_norm(&x, &layer.post_attention_layernorm, eps)?;
        let act = match &layer.mlp {
            MlpProj::Separate { gate, up } => (gate.forward(&h)?.silu()? * up.forward(&h)?)?,
            MlpProj::Fused(gate_up) => {
                let y = gate_up.forward(&h)?;
                let i = y.dim(D::Minus1)? / 2;
                (y.narrow(1, 0, i)?.silu()? * y.narrow(1, i, i)?)?
            }
        };
        x + layer.down_proj.forward(&act)?
    }
}
