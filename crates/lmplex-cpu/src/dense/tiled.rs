//! The prompt path of bf16 and f16 panels on a bf16 tile kernel (`TileKernel`): AMX-BF16's tiles
//! (`amx`), or AVX512_BF16's `vdpbf16ps` (`dpbf16`) for bf16 panels with bf16 activations.
//!
//! Invariants: a kernel runs only where the CPU has it (`TileKernel::detect` / `all`, asserted
//! in `matmul_tiled`); each block's kernel writes its own cells and reads the split activations
//! of its own rows, so a row's result never depends on the batch (the module docs of `dense`).

use super::amx::{self, Activations};
use super::{dpbf16, DenseDtype, DenseWeight, Panels, F16_PARTS, PANEL, SPLIT};
use crate::qmatmul::by_weight_row_blocks;
use crate::rowops::Activation;

impl DenseWeight {
    /// `matmul` for prompt rows: bf16 and f16 panels take the tile kernel this CPU has
    /// (`TileKernel::detect`: not the FMA chain's bits, and the same bits whatever the batch;
    /// an f16 panel is split exactly into two bf16 parts when a thread takes it, kept for the
    /// thread's next block of the same panel); every other case is `matmul`.
    pub fn matmul_prompt(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_prompt_with(x, m, self.tile_kernel())
    }

    /// The tile kernel this CPU runs for these panels in this precision, if one beats the FMA
    /// chain: AMX always; `vdpbf16ps` for bf16 panels with bf16 activations only. With split
    /// activations (two passes) or f16 panels (three) it is slower than the FMA chain, which
    /// widens each weight once for 8 rows (`dense_timing` on a Zen 4, 2 threads, 512 rows:
    /// 350-430 GFLOP/s for one pass, 210 for two, 125 for three, 195-225 for the FMA chain).
    pub(super) fn tile_kernel(&self) -> Option<TileKernel> {
        match TileKernel::detect()? {
            TileKernel::Amx => Some(TileKernel::Amx),
            TileKernel::Dpbf16 => {
                (self.dtype() == DenseDtype::Bf16 && self.act == Activations::Bf16).then_some(TileKernel::Dpbf16)
            }
        }
    }

    /// `matmul_prompt` with the tile kernel chosen by the caller (tests run each).
    pub(super) fn matmul_prompt_with(&self, x: &[f32], m: usize, kernel: Option<TileKernel>) -> Vec<f32> {
        match (&self.panels, kernel) {
            (Panels::Bf16(v), Some(t)) if self.k > 0 => self.matmul_tiled(t, Some(&v[..]), x, m, None),
            (Panels::F16(_), Some(t)) if self.k > 0 => self.matmul_tiled(t, None, x, m, None),
            _ => self.matmul(x, m),
        }
    }

    /// The tile kernel's product of bf16 panels `v`, or (`None`) of this matrix's f16 panels,
    /// each block's panel split into bf16 parts first. With `gate` (an interleaved matrix),
    /// the `[m, n / 2]` activations instead (`amx::panel`).
    pub(super) fn matmul_tiled(
        &self,
        kernel: TileKernel,
        v: Option<&[u16]>,
        x: &[f32],
        m: usize,
        gate: Option<Activation>,
    ) -> Vec<f32> {
        let (k, kp) = (self.k, amx::padded(self.k));
        assert_eq!(x.len(), m * k, "activations of {m} rows of {k}");
        let here = match kernel {
            TileKernel::Amx => amx::available(),
            TileKernel::Dpbf16 => dpbf16::available(),
        };
        assert!(here, "{kernel:?} is not available on this CPU");
        // f16 weights keep f32 precision: both parts of the activations.
        let act = if v.is_some() { self.act } else { Activations::Split };
        let mut split = SPLIT.take();
        amx::split(x, m, k, act, &mut split);
        // A gated product's block is one panel's 16 output columns.
        let (cols, w) = if gate.is_some() { (self.n / 2, PANEL / 2) } else { (self.n, PANEL) };
        let out = by_weight_row_blocks(cols, m, w, |b, _| {
            let (p, nr) = (b.r / w, if gate.is_some() { PANEL } else { b.nr });
            let (out, stride) = b.at(0, b.li);
            assert!(b.i0.is_multiple_of(16), "input tiles start at a multiple of 16");
            let a = split[amx::split_at(b.i0, 0, kp, act)..].as_ptr();
            // SAFETY: the kernel runs here (asserted above); the split
            // rows from `i0` are readable for `li` rounded up to 16 (`split` pads the rows to
            // 16, and blocks start at a multiple of 16); the cells as in `matmul_with`.
            #[cfg(target_arch = "x86_64")]
            let run = |w: &[u16], wl: Option<&[u16]>| unsafe {
                match kernel {
                    TileKernel::Amx => amx::panel(w, wl, kp, act, a, b.li, out, stride, nr, gate),
                    TileKernel::Dpbf16 => dpbf16::panel(w, wl, kp, act, a, b.li, out, stride, nr, gate),
                }
            };
            #[cfg(target_arch = "x86_64")]
            match (v, &self.panels) {
                (Some(v), _) => run(&v[p * PANEL * kp..][..PANEL * kp], None),
                (None, Panels::F16(h)) => F16_PARTS.with_borrow_mut(|parts| {
                    if parts.of != Some((self.id, p)) {
                        amx::f16_parts(&h[p * PANEL * k..][..PANEL * k], k, &mut parts.hi, &mut parts.lo);
                        parts.of = Some((self.id, p));
                    }
                    // `hi` and `lo` hold `PANEL * kp` values.
                    run(&parts.hi, Some(&parts.lo))
                }),
                (None, _) => unreachable!("a tile kernel without bf16 panels is for f16 panels"),
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = (a, out, stride, p, nr);
        });
        SPLIT.set(split);
        out
    }
}

/// The prompt kernels for bf16 and f16 panels, by the units they run on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum TileKernel {
    /// AMX-BF16 tiles (`amx`).
    Amx,
    /// AVX512_BF16's `vdpbf16ps` (`dpbf16`).
    Dpbf16,
}

impl TileKernel {
    /// The fastest this CPU runs: AMX, then `vdpbf16ps`; None for the FMA chain alone.
    pub(super) fn detect() -> Option<Self> {
        if amx::available() {
            Some(Self::Amx)
        } else if dpbf16::available() {
            Some(Self::Dpbf16)
        } else {
            None
        }
    }

    /// Every kernel this CPU runs (the tests compare them).
    #[cfg(test)]
    pub(super) fn all() -> Vec<Self> {
        [(amx::available(), Self::Amx), (dpbf16::available(), Self::Dpbf16)]
            .into_iter()
            .filter_map(|(ok, t)| ok.then_some(t))
            .collect()
    }
}
