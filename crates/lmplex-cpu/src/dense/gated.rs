//! A gated MLP's gate and up projections as one interleaved matrix: rows alternate in runs of
//! `rowops::GATE_RUN` (16 gate rows, then the up rows of the same 16 outputs, ...), so each
//! 32-row panel holds the gate and up of 16 outputs. The tile prompt kernels (AMX,
//! `vdpbf16ps`) then apply the activation to a panel's sums as they store them and write only
//! the `[m, width]` result; the `[m, 2 * width]` product and the separate activation pass over
//! it disappear.
//!
//! Invariant: `matmul_prompt_gated` gives the bits of `rowops::gated_interleaved` applied to
//! `matmul_prompt`'s product, and `matmul_gated` those of it applied to `matmul`'s: the same
//! sums, then the same activation code (`rowops::gated_rows`) on each value. So a row's result
//! depends only on the row and its kind, as for the plain products.

use super::{DenseWeight, Panels, TileKernel, PANEL};
use crate::rowops::{self, Activation, GATE_RUN};

// A panel is one run of gate rows and one of up rows (`amx::panel`'s gated epilogue).
const _: () = assert!(2 * GATE_RUN == PANEL);

impl DenseWeight {
    /// This matrix's rows as `[gate | up]` halves, interleaved in runs of `GATE_RUN`. None
    /// unless the halves' height is a multiple of `GATE_RUN` (or the matrix is already
    /// interleaved).
    pub fn interleave_halves(&self) -> Option<DenseWeight> {
        let width = self.n / 2;
        if self.interleaved || !self.n.is_multiple_of(2) || !width.is_multiple_of(GATE_RUN) || width == 0 {
            return None;
        }
        // New row `r`: run `r / 32`, gate rows in its first half, up rows in its second.
        let old = |r: usize| {
            let (run, c) = (r / (2 * GATE_RUN), r % (2 * GATE_RUN));
            if c < GATE_RUN {
                run * GATE_RUN + c
            } else {
                width + run * GATE_RUN + c - GATE_RUN
            }
        };
        let k = self.k;
        let mut out = match &self.panels {
            Panels::F32(_) => {
                let data = (0..self.n).flat_map(|r| (0..k).map(move |j| self.get(old(r), j))).collect();
                Self::new(self.n, k, data)
            }
            Panels::Bf16(v) | Panels::F16(v) => {
                let bits: Vec<u16> = (0..self.n).flat_map(|r| (0..k).map(move |j| v[self.at(old(r), j)])).collect();
                match self.panels {
                    Panels::Bf16(_) => Self::from_bf16(self.n, k, &bits),
                    _ => Self::from_f16(self.n, k, &bits),
                }
            }
        }
        .with_activations(self.act);
        out.interleaved = true;
        Some(out)
    }

    /// Whether the rows are interleaved gate and up (`interleave_halves`).
    pub fn is_interleaved(&self) -> bool {
        self.interleaved
    }

    /// `act(gate) * up` for generated rows: `[m, n / 2]` from `matmul`'s product. Panics
    /// unless the matrix is interleaved.
    pub fn matmul_gated(&self, x: &[f32], m: usize, act: Activation) -> Vec<f32> {
        assert!(self.interleaved, "a gated product needs an interleaved matrix");
        rowops::gated_interleaved(act, &self.matmul(x, m), self.n / 2)
    }

    /// `act(gate) * up` for prompt rows: `[m, n / 2]`. bf16 and f16 panels on a CPU with a
    /// tile kernel (AMX-BF16 or AVX512_BF16) apply the activation in that kernel (module
    /// docs); otherwise as `matmul_gated` from `matmul_prompt`'s product.
    pub fn matmul_prompt_gated(&self, x: &[f32], m: usize, act: Activation) -> Vec<f32> {
        self.matmul_prompt_gated_with(x, m, act, self.tile_kernel())
    }

    /// `matmul_prompt_gated` with the tile kernel chosen by the caller (tests run each).
    pub(super) fn matmul_prompt_gated_with(
        &self,
        x: &[f32],
        m: usize,
        act: Activation,
        kernel: Option<TileKernel>,
    ) -> Vec<f32> {
        assert!(self.interleaved, "a gated product needs an interleaved matrix");
        match (&self.panels, kernel) {
            (Panels::Bf16(v), Some(t)) if self.k > 0 => self.matmul_tiled(t, Some(&v[..]), x, m, Some(act)),
            (Panels::F16(_), Some(t)) if self.k > 0 => self.matmul_tiled(t, None, x, m, Some(act)),
            _ => rowops::gated_interleaved(act, &self.matmul_prompt_with(x, m, kernel), self.n / 2),
        }
    }
}
