//! One vision block (`Qwen2VLVisionBlock`, `Qwen2_5_VLVisionBlock`): `h += proj(attn(norm1(h)))`
//! with a fused `qkv` projection (bias), the 2D rotary on q and k and attention within the
//! block's segments (frames, or Qwen2.5-VL's windows); then `h += mlp(norm2(h))`.
//!
//! Qwen2-VL: LayerNorm (eps 1e-6, with bias) and `fc2(act(fc1(x)))`; Qwen2.5-VL: RMSNorm
//! (eps 1e-6) and `down(act(gate(x)) * up(x))`, all projections with biases.
//!
//! Invariant: hidden states are `[rows, hidden]`; norms, projections (`Linear::forward_rows`)
//! and activations are row-wise and batch-invariant and attention reads a row's own segment
//! only, so a row depends on its segment's rows alone.

use super::args::{Qwen2VlAct, Qwen2VlVisionArgs};
use super::attention::attention;
use super::rotary::Rotary;
use crate::kv::RowKinds;
use crate::rowops::{activate_in_place, add_in_place, gated, rms_norm_in_place, Activation};
use crate::vision::ops::{by_rows, gelu_erf, LayerNorm};
use crate::weights::Linear;
use std::ops::Range;

/// A block's (or the merger's) norm.
pub(super) enum Norm {
    /// `torch.nn.LayerNorm` (Qwen2-VL).
    Layer(LayerNorm),
    /// `Qwen2_5_VLRMSNorm`: `x / sqrt(mean(x^2) + eps) * weight` (Qwen2.5-VL).
    Rms { weight: Vec<f32>, eps: f32 },
}

impl Norm {
    /// The normalized rows of `x`, as a new buffer.
    pub(super) fn forward(&self, x: &[f32]) -> Vec<f32> {
        let mut y = x.to_vec();
        match self {
            Self::Layer(ln) => ln.forward_in_place(&mut y),
            Self::Rms { weight, eps } => rms_norm_in_place(&mut y, weight, *eps),
        }
        y
    }

    /// Bytes of the weights.
    pub(super) fn size_in_bytes(&self) -> usize {
        match self {
            Self::Layer(ln) => ln.size_in_bytes(),
            Self::Rms { weight, .. } => weight.len() * 4,
        }
    }
}

/// A block's MLP.
pub(super) enum Mlp {
    /// Qwen2-VL's `VisionMlp`: `fc2(act(fc1(x)))`.
    Plain { fc1: Linear, fc2: Linear },
    /// Qwen2.5-VL's `Qwen2_5_VLMLP`: `down(act(gate(x)) * up(x))`; `gate_up` is gate and up
    /// in one projection (each output row `[gate | up]`) where their weights share a format
    /// (`Linear::concat`), else the two.
    Gated { gate_up: GateUp, down: Linear },
}

/// Gate and up projections of a gated MLP.
pub(super) enum GateUp {
    Fused(Linear),
    Separate(Linear, Linear),
}

/// The activation as `rowops` computes it vectorized (`x * sigmoid(z(x))`), or `None` for
/// `gelu` (erf), computed per element.
fn sigmoidal(act: Qwen2VlAct) -> Option<Activation> {
    match act {
        // transformers' `QuickGELUActivation`: `x * torch.sigmoid(1.702 * x)`.
        Qwen2VlAct::QuickGelu => Some(Activation::QuickGelu),
        // torch's `silu`: `x / (1 + exp(-x))`.
        Qwen2VlAct::Silu => Some(Activation::Silu),
        Qwen2VlAct::GeluTanh => Some(Activation::GeluTanh),
        Qwen2VlAct::Gelu => None,
    }
}

/// `act(x)` elementwise over the rows of `x` (`width` values each).
fn activate(act: Qwen2VlAct, x: &mut [f32], width: usize) {
    match sigmoidal(act) {
        Some(a) => activate_in_place(a, x, width),
        None => by_rows(x, width, &|r| r.iter_mut().for_each(|v| *v = gelu_erf(*v))),
    }
}

impl Mlp {
    /// `x: [m, hidden]` -> `[m, hidden]`.
    fn forward(&self, act: Qwen2VlAct, x: &[f32], m: usize, kinds: &RowKinds) -> Vec<f32> {
        match self {
            Self::Plain { fc1, fc2 } => {
                let mut y = fc1.forward_rows(x, m, kinds);
                let width = y.len() / m;
                activate(act, &mut y, width);
                fc2.forward_rows(&y, m, kinds)
            }
            Self::Gated { gate_up, down } => {
                let (gate, up) = match gate_up {
                    // Each row is [gate | up].
                    GateUp::Fused(gu) => (gu.forward_rows(x, m, kinds), None),
                    GateUp::Separate(gate, up) => (gate.forward_rows(x, m, kinds), Some(up.forward_rows(x, m, kinds))),
                };
                let width = if up.is_some() { gate.len() / m } else { gate.len() / (2 * m) };
                let y = match sigmoidal(act) {
                    Some(a) => gated(a, gate, up.as_deref(), width),
                    None => {
                        let rows: Vec<(&[f32], &[f32])> = match &up {
                            Some(u) => gate.chunks_exact(width).zip(u.chunks_exact(width)).collect(),
                            None => gate.chunks_exact(2 * width).map(|r| r.split_at(width)).collect(),
                        };
                        rows.iter().flat_map(|(g, u)| g.iter().zip(*u).map(|(&g, &u)| gelu_erf(g) * u)).collect()
                    }
                };
                down.forward_rows(&y, m, kinds)
            }
        }
    }

    fn size_in_bytes(&self) -> usize {
        match self {
            Self::Plain { fc1, fc2 } => fc1.size_in_bytes() + fc2.size_in_bytes(),
            Self::Gated { gate_up, down } => {
                down.size_in_bytes()
                    + match gate_up {
                        GateUp::Fused(gu) => gu.size_in_bytes(),
                        GateUp::Separate(g, u) => g.size_in_bytes() + u.size_in_bytes(),
                    }
            }
        }
    }
}

/// One vision block.
pub(super) struct Block {
    pub(super) norm1: Norm,
    /// `[3 * hidden, hidden]` with bias: each output row q | k | v.
    pub(super) qkv: Linear,
    pub(super) proj: Linear,
    pub(super) norm2: Norm,
    pub(super) mlp: Mlp,
    /// Attention's products in bf16 (`AttnOpts::bf16_prompt`), where the tower computes in bf16.
    pub(super) bf16: bool,
}

impl Block {
    /// `h: [rows, hidden]`, updated in place; attention within `segments` (disjoint ranges of
    /// rows covering them all), q and k rotated by `rotary`'s row angles.
    pub(super) fn forward(&self, a: &Qwen2VlVisionArgs, h: &mut [f32], rotary: &Rotary, segments: &[Range<usize>]) {
        let d = a.hidden_size;
        let m = h.len() / d;
        let kinds = RowKinds::uniform(m, true);
        let x = self.norm1.forward(h);
        let mut qkv = self.qkv.forward_rows(&x, m, &kinds);
        rotary.apply(&mut qkv, d);
        let attn = attention(&qkv, segments, a.num_heads, a.head_dim(), self.bf16);
        add_in_place(h, &self.proj.forward_rows(&attn, m, &kinds), d);
        let x = self.norm2.forward(h);
        add_in_place(h, &self.mlp.forward(a.hidden_act, &x, m, &kinds), d);
    }

    /// Bytes of the weights.
    pub(super) fn size_in_bytes(&self) -> usize {
        self.norm1.size_in_bytes()
            + self.qkv.size_in_bytes()
            + self.proj.size_in_bytes()
            + self.norm2.size_in_bytes()
            + self.mlp.size_in_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The activations against their f64 formulas.
    #[test]
    fn activations_match_their_formulas() {
        let x: Vec<f32> = (-60..=60).map(|i| i as f32 * 0.2).collect();
        let sig = |z: f64| 1.0 / (1.0 + (-z).exp());
        for (act, k) in [(Qwen2VlAct::QuickGelu, 1.702), (Qwen2VlAct::Silu, 1.0)] {
            let mut y = x.clone();
            activate(act, &mut y, x.len());
            for (&x, &y) in x.iter().zip(&y) {
                let xd = x as f64;
                assert!((y as f64 - xd * sig(k * xd)).abs() < 4e-7 * (1.0 + xd.abs()), "{act:?}({x})");
            }
        }
        let mut far = vec![-200.0, 200.0];
        activate(Qwen2VlAct::Silu, &mut far, 2);
        // torch gives -0.0 (its exp overflows); the polynomial exp saturates first.
        assert!(far[0].abs() < 1e-30 && far[1] == 200.0, "{far:?}");
    }
}
