//! Quantized matrix times activations: GGUF blocks are repacked once at load (`pack`: one
//! vector lane per 32-value unit, 16 units side by side, the same bytes per weight but for
//! K-quants' scales), decoded to exact integers in registers and multiplied with the
//! activations quantized to 16 bits per 32-value block (`acts`, in the same order), one scale
//! per block; dense types (F32/F16/BF16) and the rare Q2_K/Q3_K keep the GGUF bytes,
//! dequantize one row into a per-thread buffer and use an f32 dot.
//!
//! Why not candle's `QMatMul` or ggml's kernels: they quantize activations to 8 bits, which
//! moves logits by up to ~1 versus the dequantized model, and pick kernels by batch size, so a
//! row's result changes with the batch. Here:
//! - numerics: the only rounding beyond f32 is the 16-bit activation step (at most 1.5e-5 of
//!   a block's largest value), so logits stay within the HF-transformers oracle's tolerance;
//! - `out[i, r]` depends only on row `r` of the weights and row `i` of the input, with a fixed
//!   reduction order, so results are bit-identical whatever the batch (the engine's
//!   determinism guarantee rests on it);
//! - the kernel family (AVX-512, AVX2 or portable, `family::Isa`) is chosen once per process, never
//!   per batch; families share the exact integer sums and differ only in float rounding.
//!
//! Cost: one pass over the weight bytes per call, amortised over the batch's rows (a decoded
//! group serves up to `GROUP` input rows), with the rows ahead prefetched; tiles of input rows
//! by weight rows are split over the forward pass's thread team (`grid`, `team`). Per 16 units and
//! input row the float work is one convert, one multiply and one or two FMAs; the rest is a
//! `vpmaddwd` and an add per 32 weights (one `vpdpwssd` on four input rows with AVX-512 VNNI).
//!
//! That is the decode kernel. Prompt tokens (many rows per call) take `matmul_prompt`: on
//! AVX-512 and AVX2 machines the `tile` kernel (weights decoded once to f32, a
//! register-blocked f32 GEMM, somewhat faster on many rows, much slower on one), in the
//! portable build this one. The caller picks by the token's kind, never by the batch
//! (lmplex-model's `kv::RowKinds`).

mod acts;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod family;
mod formats;
mod grid;
mod pack;
mod portable;
#[cfg(target_arch = "x86_64")]
mod tile;

use acts::QActs;
use candle_core::quantized::k_quants::{self, GgmlType};
use candle_core::quantized::{GgmlDType, QTensor};
pub use family::portable_dot;
use family::qdot_rows;
pub use family::Isa;
pub(crate) use family::{avx512_bf16, dot_f32, has_avx2};
use formats::*;
pub(crate) use grid::{by_weight_row_blocks, by_weight_rows, Block};
use half::f16;
use lmplex_core::{Error, Result};

/// `$body!(F)` with `F` the format type of `$dtype` when it has an integer kernel, else `$other`.
macro_rules! by_format {
    ($dtype:expr, $body:ident, $other:expr) => {
        match $dtype {
            GgmlDType::Q4_0 => $body!(Q4_0),
            GgmlDType::Q4_1 => $body!(Q4_1),
            GgmlDType::Q5_0 => $body!(Q5_0),
            GgmlDType::Q5_1 => $body!(Q5_1),
            GgmlDType::Q8_0 => $body!(Q8_0),
            GgmlDType::Q4K => $body!(Q4K),
            GgmlDType::Q5K => $body!(Q5K),
            GgmlDType::Q6K => $body!(Q6K),
            _ => $other,
        }
    };
}

/// Input rows that share one decode of a weight block.
pub(super) const GROUP: usize = 4;

/// A `[n, k]` quantized weight: packed rows (`pack`) for the formats with an integer kernel,
/// GGUF blocks for the others.
pub struct QWeight {
    dtype: GgmlDType,
    n: usize,
    k: usize,
    /// Whether rows are packed (else GGUF blocks).
    packed: bool,
    row_bytes: usize,
    /// Row bytes (then `pack::SLACK` zero bytes when packed), stored in u16s so every GGUF
    /// block (all sizes are even) is 2-byte aligned.
    data: Vec<u16>,
}

fn bytes_of(data: &[u16]) -> &[u8] {
    // SAFETY: u16 has no padding and any byte pattern is a valid u8.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), data.len() * 2) }
}

/// Reinterprets aligned block bytes as candle block structs (all `repr(C)`, alignment <= 2).
fn blocks<T: GgmlType>(b: &[u8]) -> &[T] {
    let size = std::mem::size_of::<T>();
    debug_assert_eq!(b.len() % size, 0);
    debug_assert_eq!(b.as_ptr() as usize % std::mem::align_of::<T>(), 0);
    // SAFETY: the bytes come from a GGUF tensor of type T::DTYPE (checked at construction),
    // the slice is aligned (u16 storage, even block sizes) and its length a multiple of size.
    unsafe { std::slice::from_raw_parts(b.as_ptr().cast::<T>(), b.len() / size) }
}

impl QWeight {
    /// Takes a quantized GGUF tensor `[n, k]`, repacked if the integer kernels read its format.
    pub fn from_qtensor(q: &QTensor) -> Result<Self> {
        let (n, k) = q.shape().dims2().map_err(Error::internal)?;
        let dtype = q.dtype();
        if k % dtype.block_size() != 0 {
            return Err(Error::model_load(format!("row length {k} is not a multiple of the {dtype:?} block size")));
        }
        let raw = q.data().map_err(Error::internal)?;
        let gguf_row = k / dtype.block_size() * dtype.type_size();
        if raw.len() != n * gguf_row || !gguf_row.is_multiple_of(2) {
            return Err(Error::model_load(format!("{dtype:?} tensor [{n}, {k}] has {} bytes", raw.len())));
        }
        let units = k / 32;
        macro_rules! packed {
            ($f:ty) => {{
                let row_bytes = pack::row_bytes::<$f>(units);
                let mut bytes = vec![0u8; n * row_bytes + pack::SLACK];
                for (src, dst) in raw.chunks_exact(gguf_row).zip(bytes.chunks_exact_mut(row_bytes)) {
                    pack::pack_row::<$f>(src, units, dst);
                }
                (true, row_bytes, bytes)
            }};
        }
        let (packed, row_bytes, bytes) = by_format!(dtype, packed, (false, gguf_row, raw.to_vec()));
        let data = bytes.chunks_exact(2).map(|c| u16::from_ne_bytes([c[0], c[1]])).collect();
        Ok(Self { dtype, n, k, packed, row_bytes, data })
    }

    /// The rows of `parts` one after another (`[sum n, k]`), when they share format and row
    /// length; each output row still depends only on its weight row, so a product with the
    /// result equals the parts' products side by side, bit for bit.
    pub fn concat(parts: &[&QWeight]) -> Option<QWeight> {
        let first = parts.first()?;
        let same = |p: &&QWeight| {
            (p.dtype, p.k, p.packed, p.row_bytes) == (first.dtype, first.k, first.packed, first.row_bytes)
        };
        if !parts.iter().all(same) {
            return None;
        }
        let n = parts.iter().map(|p| p.n).sum();
        let mut data = Vec::with_capacity(n * first.row_bytes / 2 + pack::SLACK / 2);
        for p in parts {
            data.extend_from_slice(&p.data[..p.n * p.row_bytes / 2]);
        }
        if first.packed {
            data.resize(data.len() + pack::SLACK / 2, 0);
        }
        Some(QWeight { n, data, ..**first })
    }

    /// `(n, k)`: rows (outputs) and row length (inputs).
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// The GGUF block format.
    pub fn dtype(&self) -> GgmlDType {
        self.dtype
    }

    /// Bytes the weight data takes in memory (padding and slack included).
    pub fn size_in_bytes(&self) -> usize {
        self.data.len() * 2
    }

    /// Row `r`: its GGUF blocks, or for a packed row everything from its start to the buffer's
    /// end (the kernels' whole-vector loads of a partial group read on into the next row or
    /// the slack).
    fn row(&self, r: usize) -> &[u8] {
        let b = &bytes_of(&self.data)[r * self.row_bytes..];
        if self.packed {
            b
        } else {
            &b[..self.row_bytes]
        }
    }

    /// Row `r` as f32 into `out` (`k` values): embeddings and the generic kernel.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let b = self.row(r);
        if self.packed {
            let units = self.k / 32;
            macro_rules! unpack {
                ($f:ty) => {
                    for (u, o) in out.chunks_exact_mut(32).enumerate() {
                        let un = pack::unit::<$f>(b, units, u);
                        o.iter_mut().enumerate().for_each(|(e, o)| *o = un.c[e / 16] * un.v[e] as f32 + un.mn);
                    }
                };
            }
            return by_format!(self.dtype, unpack, ());
        }
        match self.dtype {
            GgmlDType::F32 => out
                .iter_mut()
                .zip(b.chunks_exact(4))
                .for_each(|(o, c)| *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            GgmlDType::F16 => {
                out.iter_mut().zip(b.chunks_exact(2)).for_each(|(o, c)| *o = f16::from_le_bytes([c[0], c[1]]).to_f32())
            }
            GgmlDType::BF16 => out
                .iter_mut()
                .zip(b.chunks_exact(2))
                .for_each(|(o, c)| *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32()),
            GgmlDType::Q4_0 => k_quants::BlockQ4_0::to_float(blocks(b), out),
            GgmlDType::Q4_1 => k_quants::BlockQ4_1::to_float(blocks(b), out),
            GgmlDType::Q5_0 => k_quants::BlockQ5_0::to_float(blocks(b), out),
            GgmlDType::Q5_1 => k_quants::BlockQ5_1::to_float(blocks(b), out),
            GgmlDType::Q8_0 => k_quants::BlockQ8_0::to_float(blocks(b), out),
            GgmlDType::Q2K => k_quants::BlockQ2K::to_float(blocks(b), out),
            GgmlDType::Q3K => k_quants::BlockQ3K::to_float(blocks(b), out),
            GgmlDType::Q4K => k_quants::BlockQ4K::to_float(blocks(b), out),
            GgmlDType::Q5K => k_quants::BlockQ5K::to_float(blocks(b), out),
            GgmlDType::Q6K => k_quants::BlockQ6K::to_float(blocks(b), out),
            GgmlDType::Q8_1 | GgmlDType::Q8K => out.fill(f32::NAN), // rejected at load
        }
    }

    /// `x: [m, k]` row-major -> `[m, n]` row-major.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_with(x, m, Isa::detect())
    }

    /// `x: [m, k]` -> `[m, n]` with the prompt kernel (`tile`: f32 weights and activations,
    /// register-blocked) where this CPU and format have one, else `matmul`'s integer kernel.
    pub fn matmul_prompt(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_prompt_with(x, m, Isa::detect())
    }

    /// `matmul_prompt` with the kernel family chosen by the caller (tests run each).
    fn matmul_prompt_with(&self, x: &[f32], m: usize, isa: Isa) -> Vec<f32> {
        #[cfg(target_arch = "x86_64")]
        {
            let (n, k) = (self.n, self.k);
            let row = |r: usize| self.row(r);
            macro_rules! tile {
                ($f:ty) => {
                    match isa {
                        // SAFETY: `Isa::detect` found AVX-512 F/BW/VL/DQ, AVX2, FMA and F16C.
                        Isa::Avx512 => return unsafe { tile::matmul::<tile::Avx512<$f>>(n, k, row, x, m) },
                        // SAFETY: `Isa::detect` found AVX2, FMA and F16C.
                        Isa::Avx2 => return unsafe { tile::matmul::<tile::Avx2<$f>>(n, k, row, x, m) },
                        Isa::Portable => {}
                    }
                };
            }
            by_format!(self.dtype, tile, {})
        }
        self.matmul_with(x, m, isa)
    }

    /// `matmul` with the kernel family chosen by the caller (tests run each).
    fn matmul_with(&self, x: &[f32], m: usize, isa: Isa) -> Vec<f32> {
        self.matmul_with_vnni(x, m, isa, family::vnni())
    }

    /// `matmul_with`, and whether the AVX-512 family uses VNNI (which must be present when
    /// `vnni`; tests run both ways and compare the bits).
    fn matmul_with_vnni(&self, x: &[f32], m: usize, isa: Isa, vnni: bool) -> Vec<f32> {
        let (n, k) = (self.n, self.k);
        debug_assert_eq!(x.len(), m * k);
        macro_rules! int {
            ($f:ty) => {{
                let acts = QActs::new(x, k);
                by_weight_row_blocks(n, m, weight_rows::<$f>(isa, m), |b, _| self.rows_times::<$f>(b, &acts, isa, vnni))
            }};
        }
        if !self.packed {
            return self.matmul_generic(x, m);
        }
        by_format!(self.dtype, int, self.matmul_generic(x, m))
    }

    /// Dequantize-then-f32-dot for the formats without an integer kernel.
    fn matmul_generic(&self, x: &[f32], m: usize) -> Vec<f32> {
        let (n, k) = (self.n, self.k);
        by_weight_rows(n, m, |b, buf| {
            buf.resize(k, 0.0);
            self.dequantize_row(b.r, buf);
            for i in 0..b.li {
                let row = b.i0 + i;
                b.set(i, 0, dot_f32(buf, &x[row * k..(row + 1) * k]));
            }
        })
    }

    /// Block `b`'s cells: `dot(weight row, input row)` for its `nr` weight rows and `li` input
    /// rows. Each group of weight blocks is decoded once per group of `GROUP` input rows (then
    /// a pair, then one), for two weight rows at a time; the arithmetic of one (weight row,
    /// input row) pair is the same in any grouping, so the result does not depend on it.
    fn rows_times<F: Format>(&self, b: &mut Block<'_>, acts: &QActs, isa: Isa, vnni: bool) {
        match b.nr {
            2 => self.rows_times_w::<F, 2>(b, acts, isa, vnni),
            _ => self.rows_times_w::<F, 1>(b, acts, isa, vnni),
        }
    }

    fn rows_times_w<F: Format, const W: usize>(&self, b: &mut Block<'_>, acts: &QActs, isa: Isa, vnni: bool) {
        let rows: [&[u8]; W] = std::array::from_fn(|w| self.row(b.r + w));
        // Fewer input rows than a group: bound by memory (see `PREFETCH_AHEAD`).
        if b.li < GROUP {
            prefetch::<{ HINT_L2 }>(rows[0], PREFETCH_AHEAD, W * self.row_bytes);
        } else {
            prefetch::<{ HINT_L1 }>(rows[0], BATCH_PREFETCH_AHEAD, W * self.row_bytes);
        }
        qdot_rows::<F, W>(isa, vnni, rows, self.k / 32, acts, b);
    }
}

/// Weight rows per call of the integer kernel (`m` input rows). The AVX-512 build shares each
/// activation load between two rows (batched decode is bound by those loads: 1.3-1.6x at 16
/// input rows). Q6_K does so from four input rows: at one, its rows (4 KB at Qwen's 4,864)
/// ran 1.3x slower two at a time with the early flush that two need (`avx512::group`;
/// measured while that one row also took `vpdpwssd`). The result of a cell does not depend
/// on this.
fn weight_rows<F: Format>(isa: Isa, m: usize) -> usize {
    if isa == Isa::Avx512 && (F::SCALES != formats::Scales::K6 || m >= 4) {
        2
    } else {
        1
    }
}

/// How far ahead of a weight row's start `rows_times_w` asks for the bytes of the rows to come
/// (a row's length of them), and (`STREAM_AHEAD`) how far past the group a kernel is reading
/// it asks for each of its rows' bytes to come (`prefetch_ahead`). Decode streams every
/// weight from memory once per step, and the hardware prefetcher alone leaves the kernel
/// waiting on most lines: SmolLM2 decode went from about 127 to 170-180 tok/s and
/// Qwen2.5-0.5B from 42 to 65 with the first. The second serves long rows, which the first,
/// issued all at once per call, covered late: from memory, at one input row and 2 threads,
/// 2,816-value Q4_0 rows streamed at 15 GB/s where 1,024-value rows reached 28. Both go to L2
/// (`T1`), whose miss queue is deeper than L1's: a step of the synthetic MoE's products
/// (`step_timing`) streamed at 18-20 GB/s into L1 and 24-27 GB/s into L2 (3 and 4 KiB ahead
/// into L1 were best; 6 and 8 KiB into L2).
const PREFETCH_AHEAD: usize = 6144;

/// `PREFETCH_AHEAD` for a group of input rows or more (batched decode), into L1: there the
/// kernel's arithmetic, not memory, sets the pace, and the L2 form ran rows of up to 1,024
/// values 2-8% slower on 8 input rows (from memory; long rows gain from `STREAM_AHEAD`).
const BATCH_PREFETCH_AHEAD: usize = 3072;

#[cfg(target_arch = "x86_64")]
const HINT_L1: i32 = std::arch::x86_64::_MM_HINT_T0;
#[cfg(target_arch = "x86_64")]
const HINT_L2: i32 = std::arch::x86_64::_MM_HINT_T1;
#[cfg(not(target_arch = "x86_64"))]
const HINT_L1: i32 = 0;
#[cfg(not(target_arch = "x86_64"))]
const HINT_L2: i32 = 0;

/// See `PREFETCH_AHEAD`.
pub(super) const STREAM_AHEAD: usize = 8192;

/// Rows of more units than this also prefetch per group (`STREAM_AHEAD`), on the first input
/// rows of a block only (the later ones read the rows from cache); shorter rows are covered by
/// their call's `PREFETCH_AHEAD`, and per group as well they ran 4-9% slower on 8 input rows
/// (Q5_0 and Q8_0 rows of 896 and 576 values, from memory).
pub(super) const STREAM_UNITS: usize = 32;

/// Asks the CPU to bring the `len` bytes `STREAM_AHEAD` past `p` (a group's planes in a
/// packed row) into L2; they may lie past the row's end, in the rows after it, or past the
/// buffer: a prefetch reads nothing architecturally and never faults. A hint, no effect on
/// results. Apart from `prefetch` because it runs in the kernels' group loop: a fixed count
/// of lines, unrolled, with no clipping to a slice (clipped there, long rows ran 5-8% slower
/// at one input row).
#[inline(always)]
pub(super) fn prefetch_ahead(p: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for off in (0..len).step_by(64) {
        // SAFETY: a prefetch of any address is allowed and reads nothing architecturally; the
        // pointer is formed with `wrapping_add`, so it is never an out-of-bounds `add`.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                p.wrapping_add(STREAM_AHEAD + off).cast(),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

/// Asks the CPU to bring `b[at..at + len]` (clipped to `b`) into the cache level `HINT`
/// names; a hint, no effect on results.
#[inline(always)]
fn prefetch<const HINT: i32>(b: &[u8], at: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for off in (at..(at + len).min(b.len())).step_by(64) {
        // SAFETY: `off` is inside `b`; a prefetch reads nothing architecturally.
        unsafe { std::arch::x86_64::_mm_prefetch::<HINT>(b.as_ptr().add(off).cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (b, at, len);
}

#[cfg(test)]
mod tests;
