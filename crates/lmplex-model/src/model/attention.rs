//! The attention part of a decoder layer: q/k/v projections (separate, or fused as stored or
//! joined at load), optional biases and q/k RMSNorms (per head, or over the whole projection
//! for OLMoE), rope from the layer's table,
//! paged attention with the layer's options (query scale, soft-cap, sliding window) and the
//! output projection.
//!
//! Invariant: every option is fixed at load from `ModelArgs` for this layer; `forward` maps
//! each token row to one output row and reads K/V only of the row's own sequence.

use crate::args::{LayerType, ModelArgs, QkNorm};
use crate::attention::AttnOpts;
use crate::kv::{ForwardBatch, KvCache, RowKinds};
use crate::lora::{Cols, LoraModule, LoraRows, Target};
use crate::ops::{paged_attention, AttnDims, RopeTable};
use crate::rowops;
use crate::weights::{Linear, WeightSource};
use lmplex_core::Result;

enum Proj {
    Separate {
        q: Linear,
        k: Linear,
        v: Linear,
    },
    /// Rows are q, then k, then v: phi3's `qkv_proj` (`stored`), or the three joined at load
    /// when they share a format (`Linear::concat`).
    Fused {
        qkv: Linear,
        stored: bool,
    },
}

/// One layer's self-attention.
pub(super) struct Attention {
    proj: Proj,
    o_proj: Linear,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    dims: AttnDims,
    opts: AttnOpts,
    /// Index of the layer's rope table in the model's (`Model::ropes`).
    rope: usize,
    eps: f32,
}

impl Attention {
    /// Layer `layer`'s attention from the tensors under `p` (`model.layers.N`); `norm` reads a
    /// norm weight with the family's offset applied.
    pub(super) fn load(
        src: &WeightSource,
        p: &str,
        a: &ModelArgs,
        layer: usize,
        norm: &dyn Fn(&str) -> Result<Vec<f32>>,
    ) -> Result<Self> {
        let proj = if src.has(&format!("{p}.self_attn.qkv_proj.weight")) {
            Proj::Fused { qkv: src.linear(&format!("{p}.self_attn.qkv_proj"), a.attention_bias)?, stored: true }
        } else {
            let b = a.attention_bias;
            let q = src.linear(&format!("{p}.self_attn.q_proj"), b)?;
            let k = src.linear(&format!("{p}.self_attn.k_proj"), b)?;
            let v = src.linear(&format!("{p}.self_attn.v_proj"), b)?;
            match Linear::concat(&[&q, &k, &v]) {
                Some(qkv) => Proj::Fused { qkv, stored: false },
                None => Proj::Separate { q, k, v },
            }
        };
        let (q_norm, k_norm) = if a.qk_norm != QkNorm::None {
            (Some(norm(&format!("{p}.self_attn.q_norm.weight"))?), Some(norm(&format!("{p}.self_attn.k_norm.weight"))?))
        } else {
            (None, None)
        };
        let sliding = a.layer_type(layer) == LayerType::Sliding;
        Ok(Self {
            proj,
            o_proj: src.linear(&format!("{p}.self_attn.o_proj"), false)?,
            q_norm,
            k_norm,
            dims: AttnDims {
                num_heads: a.num_attention_heads,
                num_kv_heads: a.num_key_value_heads,
                head_dim: a.head_dim,
            },
            opts: AttnOpts {
                scale: a.attn_scale,
                softcap: a.attn_logit_softcapping,
                window: if sliding { a.sliding_window } else { None },
                bf16_prompt: src.dtype() == lmplex_core::DType::BF16,
            },
            rope: usize::from(sliding && a.rope_local.is_some()),
            eps: a.rms_norm_eps,
        })
    }

    /// Bytes of the projections and norms.
    pub(super) fn size_in_bytes(&self) -> usize {
        let proj = match &self.proj {
            Proj::Separate { q, k, v } => q.size_in_bytes() + k.size_in_bytes() + v.size_in_bytes(),
            Proj::Fused { qkv, .. } => qkv.size_in_bytes(),
        };
        let norms = [&self.q_norm, &self.k_norm].iter().map(|n| n.as_ref().map_or(0, |n| n.len() * 4)).sum::<usize>();
        proj + self.o_proj.size_in_bytes() + norms
    }

    /// The projections an adapter may adapt in layer `layer`, as the checkpoint names them.
    pub(super) fn lora_modules(&self, layer: usize, hidden: usize) -> Vec<LoraModule> {
        let d = self.dims;
        let (qw, kw) = (d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim);
        let m = |target, in_features, out_features| LoraModule::new(layer, target, in_features, out_features);
        let mut out = match self.proj {
            Proj::Fused { stored: true, .. } => vec![m(Target::Qkv, hidden, qw + 2 * kw)],
            _ => vec![m(Target::Q, hidden, qw), m(Target::K, hidden, kw), m(Target::V, hidden, kw)],
        };
        out.push(m(Target::O, qw, hidden));
        out
    }

    /// `h: [n, hidden]` (normalized rows) -> the attention output `[n, hidden]`, writing the
    /// rows' K/V into layer `layer` of `kv`; `lora`'s rows add their adapters' deltas.
    #[allow(clippy::too_many_arguments)] // the rows, the batch and its KV, the layer and its tables
    pub(super) fn forward(
        &self,
        h: &[f32],
        n: usize,
        batch: &ForwardBatch,
        kinds: &RowKinds,
        kv: &mut KvCache,
        layer: usize,
        ropes: &[RopeTable],
        lora: &LoraRows,
    ) -> Vec<f32> {
        let d = self.dims;
        let (qw, kw) = (d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim);
        let hidden = h.len() / n.max(1);
        let (mut q, mut k, mut v) = match &self.proj {
            Proj::Separate { q, k, v } => {
                (q.forward_rows(h, n, kinds), k.forward_rows(h, n, kinds), v.forward_rows(h, n, kinds))
            }
            Proj::Fused { qkv, .. } => {
                let mut y = qkv.forward_rows(h, n, kinds);
                lora.add(layer, Target::Qkv, h, hidden, &mut y, Cols::From(0));
                let w = qw + 2 * kw;
                let part = |lo: usize, len: usize| -> Vec<f32> {
                    let mut out = Vec::with_capacity(n * len);
                    y.chunks_exact(w).for_each(|r| out.extend_from_slice(&r[lo..lo + len]));
                    out
                };
                (part(0, qw), part(qw, kw), part(qw + kw, kw))
            }
        };
        for (t, y) in [(Target::Q, &mut q), (Target::K, &mut k), (Target::V, &mut v)] {
            lora.add(layer, t, h, hidden, y, Cols::From(0));
        }
        if let Some(w) = &self.q_norm {
            rowops::rms_norm_in_place(&mut q, w, self.eps);
        }
        if let Some(w) = &self.k_norm {
            rowops::rms_norm_in_place(&mut k, w, self.eps);
        }
        let attn = paged_attention(batch, &mut q, &mut k, &v, kv, layer, &ropes[self.rope], d, &self.opts);
        let mut out = self.o_proj.forward_rows(&attn, n, kinds);
        lora.add(layer, Target::O, &attn, qw, &mut out, Cols::From(0));
        out
    }
}
