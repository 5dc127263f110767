//! The MLP part of a decoder layer: a gated MLP (`down(act(gate(x)) * up(x))`) with the
//! family's activation, gate and up separate or fused (as stored, or joined at load; dense
//! ones interleaved, so the prompt kernel applies the activation itself).
//!
//! Invariant: each token row maps to one output row, whatever else is in the batch.

use crate::args::Activation;
use crate::dense::DenseWeight;
use crate::kv::RowKinds;
use crate::lora::{Cols, LoraModule, LoraRows, Target};
use crate::rowops;
use crate::weights::{Linear, Matrix, WeightSource};
use lmplex_core::Result;
use std::sync::Arc;

enum Proj {
    Separate {
        gate: Linear,
        up: Linear,
    },
    /// Rows are gate, then up: phi3's `gate_up_proj`, or the two joined at load.
    Fused(Linear),
    /// Dense gate and up without biases, interleaved (`DenseWeight::interleave_halves`): the
    /// prompt kernel applies the activation as it stores the product.
    Interleaved(Arc<DenseWeight>),
}

/// The projection for a `[gate | up]` matrix: interleaved where it is dense and has no bias.
fn gate_up(joined: Linear) -> Proj {
    if let (Matrix::Dense(d), None) = (&joined.weight, &joined.bias) {
        if let Some(il) = d.interleave_halves() {
            return Proj::Interleaved(Arc::new(il));
        }
    }
    Proj::Fused(joined)
}

/// A gated MLP.
pub(super) struct Mlp {
    proj: Proj,
    down: Linear,
    act: Activation,
    /// The checkpoint stores gate and up as one `gate_up_proj` (Phi-3).
    stored_gate_up: bool,
}

impl Mlp {
    /// The MLP whose tensors are under `p` (`model.layers.N.mlp`).
    pub(super) fn load(src: &WeightSource, p: &str, act: Activation) -> Result<Self> {
        let stored_gate_up = src.has(&format!("{p}.gate_up_proj.weight"));
        let proj = if stored_gate_up {
            gate_up(src.linear(&format!("{p}.gate_up_proj"), false)?)
        } else {
            let gate = src.linear(&format!("{p}.gate_proj"), false)?;
            let up = src.linear(&format!("{p}.up_proj"), false)?;
            match Linear::concat(&[&gate, &up]) {
                Some(joined) => gate_up(joined),
                None => Proj::Separate { gate, up },
            }
        };
        Ok(Self { proj, down: src.linear(&format!("{p}.down_proj"), false)?, act, stored_gate_up })
    }

    /// From separate gate, up and down projections (joined when they share a format).
    pub(super) fn from_parts(gate: Linear, up: Linear, down: Linear, act: Activation) -> Self {
        let proj = match Linear::concat(&[&gate, &up]) {
            Some(joined) => gate_up(joined),
            None => Proj::Separate { gate, up },
        };
        Self { proj, down, act, stored_gate_up: false }
    }

    /// From a fused `[gate | up]` matrix (gate rows first) and the down matrix.
    pub(super) fn fused(gate_up: Matrix, down: Matrix, act: Activation) -> Self {
        Self { proj: self::gate_up(gate_up.into()), down: down.into(), act, stored_gate_up: true }
    }

    /// Bytes of the three projections.
    pub(super) fn size_in_bytes(&self) -> usize {
        let proj = match &self.proj {
            Proj::Separate { gate, up } => gate.size_in_bytes() + up.size_in_bytes(),
            Proj::Fused(gate_up) => gate_up.size_in_bytes(),
            Proj::Interleaved(d) => d.size_in_bytes(),
        };
        proj + self.down.size_in_bytes()
    }

    /// The projections an adapter may adapt in layer `layer`, as the checkpoint names them.
    pub(super) fn lora_modules(&self, layer: usize, hidden: usize) -> Vec<LoraModule> {
        let inter = self.down.weight.dims().1;
        let m = |target, in_features, out_features| LoraModule::new(layer, target, in_features, out_features);
        let mut out = if self.stored_gate_up {
            vec![m(Target::GateUp, hidden, 2 * inter)]
        } else {
            vec![m(Target::Gate, hidden, inter), m(Target::Up, hidden, inter)]
        };
        out.push(m(Target::Down, inter, hidden));
        out
    }

    /// `h: [n, hidden]` -> `[n, hidden]`; `lora`'s rows add their adapters' deltas to layer
    /// `layer`'s projections (before the activation for gate and up).
    pub(super) fn forward(&self, h: &[f32], n: usize, kinds: &RowKinds, layer: usize, lora: &LoraRows) -> Vec<f32> {
        let hidden = h.len() / n.max(1);
        let act = match &self.proj {
            Proj::Separate { gate, up } => {
                let mut g = gate.forward_rows(h, n, kinds);
                let mut u = up.forward_rows(h, n, kinds);
                lora.add(layer, Target::Gate, h, hidden, &mut g, Cols::From(0));
                lora.add(layer, Target::Up, h, hidden, &mut u, Cols::From(0));
                let i = g.len() / n;
                rowops::gated(self.act, g, Some(&u), i)
            }
            Proj::Fused(gate_up) => {
                let mut y = gate_up.forward_rows(h, n, kinds);
                let i = y.len() / n / 2;
                lora.add(layer, Target::GateUp, h, hidden, &mut y, Cols::From(0));
                lora.add(layer, Target::Gate, h, hidden, &mut y, Cols::From(0));
                lora.add(layer, Target::Up, h, hidden, &mut y, Cols::From(i));
                rowops::gated(self.act, y, None, i)
            }
            Proj::Interleaved(d) => {
                let adapted = lora.adapts(layer, &[Target::Gate, Target::Up, Target::GateUp]);
                match kinds.num_prompt() {
                    0 if !adapted => d.matmul_gated(h, n, self.act),
                    p if p == n && !adapted => d.matmul_prompt_gated(h, n, self.act),
                    // The gated kernels' bits (`gated_interleaved`), with the deltas added
                    // before the activation.
                    _ => {
                        let mut y = Matrix::Dense(d.clone()).matmul_rows(h, n, kinds);
                        let i = d.dims().0 / 2;
                        lora.add(layer, Target::GateUp, h, hidden, &mut y, Cols::InterleavedHalves(i));
                        lora.add(layer, Target::Gate, h, hidden, &mut y, Cols::InterleavedGate);
                        lora.add(layer, Target::Up, h, hidden, &mut y, Cols::InterleavedUp);
                        rowops::gated_interleaved(self.act, &y, i)
                    }
                }
            }
        };
        let mut out = self.down.forward_rows(&act, n, kinds);
        lora.add(layer, Target::Down, &act, act.len() / n.max(1), &mut out, Cols::From(0));
        out
    }
}
