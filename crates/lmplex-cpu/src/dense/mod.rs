//! Dense weight matrices (f32, bf16 or f16) times f32 activations, batch-invariant.
//!
//! Layout: the `[n, k]` matrix is repacked at load into panels of `PANEL` weight rows, in the
//! checkpoint's own element type (a bf16 checkpoint takes two bytes per weight, and the repacked
//! copy replaces the original). f32 and f16 panels are k-major (element `(r, j)` at offset
//! `j * PANEL + r % PANEL` of panel `r / PANEL`); bf16 panels hold k-step pairs (offset
//! `j / 2 * 2 * PANEL + 2 * (r % PANEL) + j % 2`: AMX's operand layout) and pad k with zeros to
//! a multiple of 32. The last panel is padded with zero rows.
//!
//! Arithmetic of `matmul` (the decode kernel, for generated rows): `out[i, r]` is one f32 fused
//! multiply-add chain over `j = 0..k` in order, `acc = fma(w[r, j], x[i, j], acc)` from
//! `acc = 0`, with each weight widened to f32 exactly (bf16 and f16 values are all f32 values).
//! Every kernel family (AVX-512, AVX2, portable) and every register block (1 to `MR` input rows)
//! computes exactly that chain, one vector lane per output, so a row's result is bit-identical
//! whatever else is in the batch, whichever thread ran it, and on whichever CPU.
//!
//! `matmul_prompt` (prompt rows, `tiled`): bf16 and f16 panels take AMX-BF16's tile kernel
//! (`amx`) where the CPU has it; else bf16 panels with bf16 activations take AVX512_BF16's
//! `vdpbf16ps` kernel (`dpbf16`, AMD Zen 4 and later). Neither gives the FMA chain's bits: the activations split into two bf16 parts,
//! about 2^-17 relative error per product, or for bf16 panels with `Activations::Bf16` rounded
//! to bf16 as torch's bf16 path does, 2^-9 and half the work; an f16 panel is split exactly
//! into two bf16 parts as a thread takes it. Everything else takes `matmul`. A row's result
//! still never depends on the other rows or the thread, so the engine's determinism guarantee
//! holds with the kernel chosen by the row's kind (`RowKinds`), as for `QWeight`'s prompt
//! kernel; a prompt row's bits differ between CPUs with different tile kernels.
//!
//! Why not a BLAS gemm: it picks blocking and micro-kernels by the shape of the product (and
//! may split the reduction), so a row rounds differently in a batch of 1 and of 37.
//!
//! Speed: a block of up to `MR` input rows by one panel keeps `MR x PANEL` sums in registers,
//! so each widened weight vector feeds `MR` FMAs and each activation one broadcast: the FMA
//! kernel is bound by the FMA units for many rows and by the memory stream of the panels for
//! one. The AMX kernel keeps 32 rows by one panel in four tiles, the `vdpbf16ps` kernel 8 rows
//! by one panel in 16 registers. Work is split over panels and input tiles on the forward
//! pass's thread team (`qmatmul::by_weight_row_blocks`).

mod amx;
mod dpbf16;
mod gated;
mod kernels;
mod tiled;

use tiled::TileKernel;

pub use amx::Activations;
#[cfg(test)]
mod tests;

use crate::aligned::{Aligned, Plain};
use crate::qmatmul::by_weight_row_blocks;
use half::{bf16, f16};
use kernels::Elem;

/// Weight rows per panel: two AVX-512 vectors of f32 sums per input row.
pub const PANEL: usize = 32;

/// The element type a dense matrix is stored in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DenseDtype {
    /// IEEE single precision, 4 bytes.
    F32,
    /// bfloat16, 2 bytes.
    Bf16,
    /// IEEE half precision, 2 bytes.
    F16,
}

impl DenseDtype {
    /// Bytes per stored weight.
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::Bf16 | Self::F16 => 2,
        }
    }
}

/// The panels, in the stored element type (bf16 and f16 as their bits).
#[derive(Clone)]
enum Panels {
    F32(Aligned<f32>),
    Bf16(Aligned<u16>),
    F16(Aligned<u16>),
}

/// A `[n, k]` matrix (n outputs of k inputs) repacked into panels (module docs).
pub struct DenseWeight {
    n: usize,
    k: usize,
    /// k-steps per panel: `k`, or for bf16 `k` padded with zeros to AMX's 32.
    kp: usize,
    panels: Panels,
    /// How prompt rows enter the AMX kernel (bf16 panels only).
    act: Activations,
    /// Unique in the process (`next_id`).
    id: u64,
    /// Rows are a gated MLP's gate and up, interleaved in runs of `rowops::GATE_RUN`
    /// (`interleave_halves`).
    interleaved: bool,
}

/// Repacks row-major `data` (`n` rows of `k`) into panels of `kp` k-steps laid out as `E`,
/// padding with zeros (all bits zero, as `Aligned::zeroed` writes).
fn pack<E: Elem>(n: usize, k: usize, kp: usize, data: &[E::Raw]) -> Aligned<E::Raw>
where
    E::Raw: Plain,
{
    assert_eq!(data.len(), n * k, "dense weight [{n}, {k}] needs {} values", n * k);
    let np = n.div_ceil(PANEL);
    let mut out = Aligned::zeroed(np * PANEL * kp);
    for (r, row) in data.chunks_exact(k.max(1)).enumerate().take(n) {
        let panel = &mut out[r / PANEL * PANEL * kp..][..PANEL * kp];
        for (j, &v) in row.iter().enumerate() {
            panel[E::at(r % PANEL, j)] = v;
        }
    }
    out
}

thread_local! {
    /// The calling thread's split activations for the AMX kernel (reused across calls).
    static SPLIT: std::cell::RefCell<Aligned<u16>> = const { std::cell::RefCell::new(Aligned::new()) };
    /// A team thread's last f16 panel as bf16 `hi` and `lo` parts (`amx::f16_parts`), and
    /// which it is (`DenseWeight::id`, panel): consecutive blocks of one panel convert it once.
    static F16_PARTS: std::cell::RefCell<F16Parts> = const { std::cell::RefCell::new(F16Parts::new()) };
}

/// One f16 panel split into bf16 parts, and whose panel it is.
struct F16Parts {
    of: Option<(u64, usize)>,
    hi: Aligned<u16>,
    lo: Aligned<u16>,
}

impl F16Parts {
    const fn new() -> Self {
        Self { of: None, hi: Aligned::new(), lo: Aligned::new() }
    }
}

/// A number no other `DenseWeight` of this process has (the key of `F16_PARTS`).
fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl DenseWeight {
    /// Packs `data`, `n` f32 rows of `k` values row-major. Panics unless `data.len() == n * k`.
    pub fn new(n: usize, k: usize, data: Vec<f32>) -> Self {
        let panels = Panels::F32(pack::<kernels::F32>(n, k, k, &data));
        Self { n, k, kp: k, panels, act: Activations::Split, id: next_id(), interleaved: false }
    }

    /// Packs `n` rows of `k` bf16 values row-major (raw bits).
    pub fn from_bf16(n: usize, k: usize, bits: &[u16]) -> Self {
        let kp = amx::padded(k);
        let panels = Panels::Bf16(pack::<kernels::Bf16>(n, k, kp, bits));
        Self { n, k, kp, panels, act: Activations::Split, id: next_id(), interleaved: false }
    }

    /// Packs `n` rows of `k` f16 values row-major (raw bits).
    pub fn from_f16(n: usize, k: usize, bits: &[u16]) -> Self {
        let panels = Panels::F16(pack::<kernels::F16>(n, k, k, bits));
        Self { n, k, kp: k, panels, act: Activations::Split, id: next_id(), interleaved: false }
    }

    /// This matrix with prompt rows multiplied in precision `act` (bf16 panels on AMX; the
    /// other kernels ignore it).
    pub fn with_activations(mut self, act: Activations) -> Self {
        self.act = act;
        self
    }

    /// The rows of `parts` one after another, when they share the row length and element type.
    pub fn concat(parts: &[&DenseWeight]) -> Option<DenseWeight> {
        let first = parts.first()?;
        let (k, dtype, act) = (first.k, first.dtype(), first.act);
        if parts.iter().any(|p| p.k != k || p.dtype() != dtype || p.act != act) {
            return None;
        }
        let n = parts.iter().map(|p| p.n).sum();
        let joined = match dtype {
            DenseDtype::F32 => {
                let data: Vec<f32> = parts.iter().flat_map(|p| p.row_major_f32()).collect();
                Self::new(n, k, data)
            }
            DenseDtype::Bf16 => {
                Self::from_bf16(n, k, &parts.iter().flat_map(|p| p.row_major_bits()).collect::<Vec<_>>())
            }
            DenseDtype::F16 => Self::from_f16(n, k, &parts.iter().flat_map(|p| p.row_major_bits()).collect::<Vec<_>>()),
        };
        Some(joined.with_activations(act))
    }

    /// `(n, k)`: rows (outputs) and row length (inputs).
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// The element type the weights are stored in.
    pub fn dtype(&self) -> DenseDtype {
        match self.panels {
            Panels::F32(_) => DenseDtype::F32,
            Panels::Bf16(_) => DenseDtype::Bf16,
            Panels::F16(_) => DenseDtype::F16,
        }
    }

    /// Bytes the stored panels take (padding included).
    pub fn size_in_bytes(&self) -> usize {
        match &self.panels {
            Panels::F32(v) => v.len() * 4,
            Panels::Bf16(v) | Panels::F16(v) => v.len() * 2,
        }
    }

    /// Where weight `(r, j)` sits in the panels.
    fn at(&self, r: usize, j: usize) -> usize {
        let base = r / PANEL * PANEL * self.kp;
        base + match self.panels {
            Panels::F32(_) => kernels::F32::at(r % PANEL, j),
            Panels::Bf16(_) => kernels::Bf16::at(r % PANEL, j),
            Panels::F16(_) => kernels::F16::at(r % PANEL, j),
        }
    }

    /// Weight `(r, j)` as f32 (exact).
    fn get(&self, r: usize, j: usize) -> f32 {
        let at = self.at(r, j);
        match &self.panels {
            Panels::F32(v) => v[at],
            Panels::Bf16(v) => bf16::from_bits(v[at]).to_f32(),
            Panels::F16(v) => f16::from_bits(v[at]).to_f32(),
        }
    }

    /// Weight row `r` widened to f32 into `out` (`k` values): an embedding lookup.
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.n && out.len() == self.k, "row {r} of [{}, {}]", self.n, self.k);
        for (j, o) in out.iter_mut().enumerate() {
            *o = self.get(r, j);
        }
    }

    fn row_major_f32(&self) -> Vec<f32> {
        (0..self.n).flat_map(|r| (0..self.k).map(move |j| self.get(r, j))).collect()
    }

    fn row_major_bits(&self) -> Vec<u16> {
        let (Panels::Bf16(v) | Panels::F16(v)) = &self.panels else { return Vec::new() };
        (0..self.n).flat_map(|r| (0..self.k).map(move |j| v[self.at(r, j)])).collect()
    }

    /// `x: [m, k]` row-major -> `[m, n]` row-major, each output the FMA chain (module docs):
    /// the decode kernel, for generated rows.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_with(x, m, kernels::Isa::detect())
    }

    /// `matmul` with the kernel family chosen by the caller (tests run each).
    fn matmul_with(&self, x: &[f32], m: usize, isa: kernels::Isa) -> Vec<f32> {
        let (k, kp) = (self.k, self.kp);
        assert_eq!(x.len(), m * k, "activations of {m} rows of {k}");
        if k == 0 {
            return vec![0.0; m * self.n];
        }
        // One row on AVX-512: blocks of two panels (`kernels::avx512_row_by_two`).
        let two = m == 1 && isa == kernels::Isa::Avx512;
        by_weight_row_blocks(self.n, m, if two { 2 * PANEL } else { PANEL }, |b, _| {
            let p = b.r / PANEL;
            let (out, stride) = b.at(0, b.li);
            let rows = &x[b.i0 * k..(b.i0 + b.li) * k];
            let panel = |q: usize| q * PANEL * kp..(q + 1) * PANEL * kp;
            // SAFETY: `Block::at` checked that input rows 0..li of the block's `nr` weight rows
            // are its cells (`stride` apart), which only this task writes; a two-panel block
            // has `nr > PANEL` columns, `PANEL` of the first panel and the rest of the second.
            unsafe {
                #[cfg(target_arch = "x86_64")]
                if b.nr > PANEL {
                    let nr1 = b.nr - PANEL;
                    macro_rules! by_two {
                        ($elem:ty, $v:expr) => {
                            kernels::avx512_row_by_two::<$elem>(&$v[panel(p)], &$v[panel(p + 1)], k, rows, out, nr1)
                        };
                    }
                    match &self.panels {
                        Panels::F32(v) => by_two!(kernels::F32, v),
                        Panels::Bf16(v) => by_two!(kernels::Bf16, v),
                        Panels::F16(v) => by_two!(kernels::F16, v),
                    }
                    return;
                }
                let nr = b.nr;
                match &self.panels {
                    Panels::F32(v) => kernels::panel::<kernels::F32>(isa, &v[panel(p)], k, rows, out, stride, nr),
                    Panels::Bf16(v) => kernels::panel::<kernels::Bf16>(isa, &v[panel(p)], k, rows, out, stride, nr),
                    Panels::F16(v) => kernels::panel::<kernels::F16>(isa, &v[panel(p)], k, rows, out, stride, nr),
                }
            }
        })
    }
}
