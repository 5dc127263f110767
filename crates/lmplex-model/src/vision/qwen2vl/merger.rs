//! The patch merger (`PatchMerger`, `Qwen2_5_VLPatchMerger`): `ln_q` over every patch row
//! (Qwen2-VL's LayerNorm, Qwen2.5-VL's RMSNorm, eps 1e-6), then each merged unit's
//! `spatial_merge_size^2` consecutive rows concatenated into one row and projected by
//! `mlp.0` -> GELU (erf) -> `mlp.2` to the text model's width: one image token per unit.
//!
//! Invariant: a token reads its own unit's rows only, and every step is row-wise and
//! batch-invariant, so a token depends on its unit alone.

use super::block::Norm;
use crate::kv::RowKinds;
use crate::vision::ops::{by_rows, gelu_erf};
use crate::weights::Linear;

/// `ln_q` and the two-layer MLP.
pub(super) struct Merger {
    pub(super) ln_q: Norm,
    /// `[unit * hidden, unit * hidden]` with bias.
    pub(super) fc1: Linear,
    /// `[text_hidden, unit * hidden]` with bias.
    pub(super) fc2: Linear,
}

impl Merger {
    /// `h: [units * unit, hidden]` -> `[units, text_hidden]`, unit `u` from rows
    /// `u * unit .. (u + 1) * unit`.
    pub(super) fn forward(&self, h: &[f32], hidden: usize, unit: usize) -> Vec<f32> {
        let x = self.ln_q.forward(h);
        let units = x.len() / (hidden * unit);
        let kinds = RowKinds::uniform(units, true);
        let mut y = self.fc1.forward_rows(&x, units, &kinds);
        by_rows(&mut y, hidden * unit, &|r| r.iter_mut().for_each(|v| *v = gelu_erf(*v)));
        self.fc2.forward_rows(&y, units, &kinds)
    }

    /// Bytes of the weights.
    pub(super) fn size_in_bytes(&self) -> usize {
        self.ln_q.size_in_bytes() + self.fc1.size_in_bytes() + self.fc2.size_in_bytes()
    }
}
