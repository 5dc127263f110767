//! The Mixture-of-Experts MLP: a router picks `top_k` experts per token and the token's output
//! is their weighted sum (plus Qwen2-MoE's gated shared expert).
//!
//! Routing is deterministic and per token: the router's logits row, a softmax in f32 with the
//! maximum subtracted, then the `top_k` largest probabilities with ties broken by the lower
//! expert index, renormalized to sum 1 when `norm_topk_prob`. Experts run grouped: the rows
//! routed to an expert are gathered and multiplied in one matmul per expert per step (never a
//! loop over tokens), then each token adds its experts' outputs in its own rank order.
//!
//! Invariant: a token's chosen experts, their weights and its output depend only on its own
//! row (the router and every expert map one row to one row, whatever else is gathered with
//! it), so a request's tokens do not change with the batch.

use super::mlp::Mlp;
use crate::args::{Activation, MoeArgs};
use crate::kv::RowKinds;
use crate::lora::LoraRows;
use crate::weights::{Linear, WeightSource};
use lmplex_core::{Error, Result};

/// One layer's experts and router.
pub(super) struct Moe {
    router: Linear,
    experts: Vec<Mlp>,
    top_k: usize,
    norm_topk_prob: bool,
    /// Qwen2-MoE: a dense expert every token takes, scaled by `sigmoid(gate(x))`.
    shared: Option<(Mlp, Linear)>,
}

/// `top_k` (expert, weight) pairs of one router logits row, best first (ties: lower index).
pub(crate) fn route(logits: &[f32], top_k: usize, norm_topk_prob: bool) -> Vec<(usize, f32)> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let e: Vec<f32> = logits.iter().map(|&x| (x - max).exp()).collect();
    let z: f32 = e.iter().sum();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    // Stable sort by descending probability: equal ones keep index order.
    order.sort_by(|&a, &b| e[b].total_cmp(&e[a]));
    let mut picked: Vec<(usize, f32)> = order[..top_k].iter().map(|&i| (i, e[i] / z)).collect();
    if norm_topk_prob {
        let sum: f32 = picked.iter().map(|p| p.1).sum();
        picked.iter_mut().for_each(|p| p.1 /= sum);
    }
    picked
}

impl Moe {
    /// The experts of layer `p` (`model.layers.N`), in whichever layout the checkpoint has.
    pub(super) fn load(src: &WeightSource, p: &str, moe: &MoeArgs, act: Activation) -> Result<Self> {
        let ne = moe.num_experts;
        let (router, experts) = if src.has(&format!("{p}.block_sparse_moe.gate.weight")) {
            // Mixtral's original names: w1 gate, w3 up, w2 down.
            let router = src.linear(&format!("{p}.block_sparse_moe.gate"), false)?;
            let experts = (0..ne)
                .map(|e| {
                    let x = format!("{p}.block_sparse_moe.experts.{e}");
                    Ok(Mlp::from_parts(
                        src.linear(&format!("{x}.w1"), false)?,
                        src.linear(&format!("{x}.w3"), false)?,
                        src.linear(&format!("{x}.w2"), false)?,
                        act,
                    ))
                })
                .collect::<Result<Vec<_>>>()?;
            (router, experts)
        } else {
            let router = src.linear(&format!("{p}.mlp.gate"), false)?;
            let x = format!("{p}.mlp.experts");
            let experts = if src.has(&format!("{x}.gate_up_proj")) {
                // transformers 5: `gate_up_proj` [E, 2I, H] (gate rows first), `down_proj` [E, H, I].
                let gate_up = src.expert_matrices(&format!("{x}.gate_up_proj"), ne)?;
                let down = src.expert_matrices(&format!("{x}.down_proj"), ne)?;
                gate_up.into_iter().zip(down).map(|(gu, d)| Mlp::fused(gu, d, act)).collect()
            } else if src.has(&format!("{x}.gate_proj.weight")) {
                // GGUF: `ffn_{gate,up,down}_exps`, one 3-D tensor each.
                let gate = src.expert_matrices(&format!("{x}.gate_proj.weight"), ne)?;
                let up = src.expert_matrices(&format!("{x}.up_proj.weight"), ne)?;
                let down = src.expert_matrices(&format!("{x}.down_proj.weight"), ne)?;
                let parts = gate.into_iter().zip(up).zip(down);
                parts.map(|((g, u), d)| Mlp::from_parts(g.into(), u.into(), d.into(), act)).collect()
            } else {
                (0..ne).map(|e| Mlp::load(src, &format!("{x}.{e}"), act)).collect::<Result<Vec<_>>>()?
            };
            (router, experts)
        };
        if router.weight.dims().0 != ne {
            return Err(Error::model_load(format!(
                "{p}: the router has {} rows for {ne} experts",
                router.weight.dims().0
            )));
        }
        let shared = match moe.shared_expert_intermediate_size {
            Some(_) => Some((
                Mlp::load(src, &format!("{p}.mlp.shared_expert"), act)?,
                src.linear(&format!("{p}.mlp.shared_expert_gate"), false)?,
            )),
            None => None,
        };
        Ok(Self { router, experts, top_k: moe.num_experts_per_tok, norm_topk_prob: moe.norm_topk_prob, shared })
    }

    /// Bytes of the router, the experts and the shared expert.
    pub(super) fn size_in_bytes(&self) -> usize {
        self.router.size_in_bytes()
            + self.expert_bytes()
            + self.shared.as_ref().map_or(0, |(m, g)| m.size_in_bytes() + g.size_in_bytes())
    }

    /// Bytes of the routed experts one token reads: `top_k` of them (experts are equal in size).
    pub(super) fn active_expert_bytes(&self) -> usize {
        self.expert_bytes() * self.top_k / self.experts.len()
    }

    /// Bytes of the routed experts alone.
    pub(super) fn expert_bytes(&self) -> usize {
        self.experts.iter().map(Mlp::size_in_bytes).sum()
    }

    /// `h: [n, hidden]` -> `[n, hidden]`.
    pub(super) fn forward(&self, h: &[f32], n: usize, kinds: &RowKinds) -> Vec<f32> {
        let hidden = h.len() / n;
        let k = self.top_k;
        let logits = self.router.forward_rows(h, n, kinds);
        let ne = self.experts.len();
        let routes: Vec<Vec<(usize, f32)>> =
            logits.chunks_exact(ne).map(|row| route(row, k, self.norm_topk_prob)).collect();
        // Each expert's rows: (token, rank) in token order.
        let mut rows: Vec<Vec<(usize, usize)>> = vec![Vec::new(); ne];
        for (t, r) in routes.iter().enumerate() {
            for (rank, &(e, _)) in r.iter().enumerate() {
                rows[e].push((t, rank));
            }
        }
        // Expert outputs by (token, rank).
        let mut ys = vec![0f32; n * k * hidden];
        for (e, picked) in rows.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
            let m = picked.len();
            let mut x = Vec::with_capacity(m * hidden);
            picked.iter().for_each(|&(t, _)| x.extend_from_slice(&h[t * hidden..(t + 1) * hidden]));
            let sub = RowKinds::new(picked.iter().map(|&(t, _)| kinds.is_prompt(t)).collect());
            let y = self.experts[e].forward(&x, m, &sub, 0, &LoraRows::default());
            for (&(t, rank), row) in picked.iter().zip(y.chunks_exact(hidden)) {
                ys[(t * k + rank) * hidden..][..hidden].copy_from_slice(row);
            }
        }
        let mut out = vec![0f32; n * hidden];
        for (t, (o, r)) in out.chunks_exact_mut(hidden).zip(&routes).enumerate() {
            for (rank, &(_, w)) in r.iter().enumerate() {
                let y = &ys[(t * k + rank) * hidden..][..hidden];
                o.iter_mut().zip(y).for_each(|(o, y)| *o += w * y);
            }
        }
        if let Some((mlp, gate)) = &self.shared {
            let s = mlp.forward(h, n, kinds, 0, &LoraRows::default());
            let g = gate.forward_rows(h, n, kinds);
            for ((o, s), g) in out.chunks_exact_mut(hidden).zip(s.chunks_exact(hidden)).zip(&g) {
                let w = 1.0 / (1.0 + (-g).exp());
                o.iter_mut().zip(s).for_each(|(o, s)| *o += w * s);
            }
        }
        out
    }
}
