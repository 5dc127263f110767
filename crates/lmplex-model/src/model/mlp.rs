//! The MLP part of a decoder layer: a gated MLP (`down(act(gate(x)) * up(x))`) with the
//! family's activation, gate and up separate or fused (as stored, or joined at load; dense
//! ones interleaved, so the prompt kernel applies the activation itself).
//!
//! Invariant: each token row maps to one output row, whatever else is in the batch.

use crate::args::Activation;
use crate::dense::DenseWeight;
use crate::kv::RowKinds;
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
}

impl Mlp {
    /// The MLP whose tensors are under `p` (`model.layers.N.mlp`).
    pub(super) fn load(src: &WeightSource, p: &str, act: Activation) -> Result<Self> {
        let proj = if src.has(&format!("{p}.gate_up_proj.weight")) {
            gate_up(src.linear(&format!("{p}.gate_up_proj"), false)?)
        } else {
            let gate = src.linear(&format!("{p}.gate_proj"), false)?;
            let up = src.linear(&format!("{p}.up_proj"), false)?;
            match Linear::concat(&[&gate, &up]) {
                Some(joined) => gate_up(joined),
                None => Proj::Separate { gate, up },
            }
        };
        Ok(Self { proj, down: src.linear(&format!("{p}.down_proj"), false)?, act })
    }

    /// From separate gate, up and down projections (joined when they share a format).
    pub(super) fn from_parts(gate: Linear, up: Linear, down: Linear, act: Activation) -> Self {
        let proj = match Linear::concat(&[&gate, &up]) {
            Some(joined) => gate_up(joined),
            None => Proj::Separate { gate, up },
        };
        Self { proj, down, act }
    }

    /// From a fused `[gate | up]` matrix (gate rows first) and the down matrix.
    pub(super) fn fused(gate_up: Matrix, down: Matrix, act: Activation) -> Self {
        Self { proj: self::gate_up(gate_up.into()), down: down.into(), act }
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

    /// `h: [n, hidden]` -> `[n, hidden]`.
    pub(super) fn forward(&self, h: &[f32], n: usize, kinds: &RowKinds) -> Vec<f32> {
        let act = match &self.proj {
            Proj::Separate { gate, up } => {
                let g = gate.forward_rows(h, n, kinds);
                let i = g.len() / n;
                rowops::gated(self.act, g, Some(&up.forward_rows(h, n, kinds)), i)
            }
            Proj::Fused(gate_up) => {
                let y = gate_up.forward_rows(h, n, kinds);
                let i = y.len() / n / 2;
                rowops::gated(self.act, y, None, i)
            }
            Proj::Interleaved(d) => match kinds.num_prompt() {
                0 => d.matmul_gated(h, n, self.act),
                p if p == n => d.matmul_prompt_gated(h, n, self.act),
                _ => {
                    let y = Matrix::Dense(d.clone()).matmul_rows(h, n, kinds);
                    rowops::gated_interleaved(self.act, &y, d.dims().0 / 2)
                }
            },
        };
        self.down.forward_rows(&act, n, kinds)
    }
}
