//! The attention kernel of the CPU backend: causal attention of a run of query rows (the query
//! heads of one KV head, for one or more tokens of one sequence) over that sequence's paged
//! keys and values. Each key and value is loaded once per chunk for all the rows, so a prefill
//! reads its context once per item of rows instead of once per token and head.
//!
//! The arithmetic is flash attention's online softmax over fixed chunks of `CHUNK` keys
//! (positions `0..16`, `16..32`, ...). For one row and one chunk: scores are dot products of
//! the row's query (scaled by `AttnOpts::scale` first) with each key, in dimension order, then
//! soft-capped (`cap * tanh(s / cap)`, Gemma 2) when asked; the running maximum `m` and sum `l`
//! are updated and the row's accumulator is rescaled by `exp(m_old - m_new)` before the chunk's
//! values are added in key order. The output is the accumulator divided by `l`. (The AVX-512
//! build sums a score's even and odd dimensions separately, then adds the two: the same for
//! every row, so rows stay independent.)
//!
//! A sliding window of `w` keys (`AttnOpts::window`) limits a row of context length `len` to
//! keys `len - w .. len` (Mistral's and Gemma's convention: the row's own key and the `w - 1`
//! before it). Chunks wholly before a row's window are never read for it; in the chunk that
//! holds the window's first key, the keys before it get zero weight and do not enter `m`.
//!
//! Invariants:
//! - A row's output depends only on its query, its context length and its sequence's keys and
//!   values, never on which other rows share its item, how many there are, or the thread: every
//!   row runs the same operations in the same order, and a row adds exactly the keys below its
//!   own length (keys of a chunk past it are masked to zero weight and never touch its
//!   accumulator). So prefill chunks, decode steps and batches of any shape give the same bits.
//! - Rows of one call are ordered by non-decreasing context length (tokens in position order),
//!   so their windows' first keys are non-decreasing too.
//! - The kernel family follows `qmatmul::Isa` (chosen once per process): AVX-512 when the KV
//!   block size and head_dim are multiples of 16, otherwise the portable build (compiled with
//!   AVX2 where present, with the same results as without). Families may differ in the last bits.
//!
//! Prompt rows with `AttnOpts::bf16_prompt` (`dtype="bfloat16"`) on a CPU with AMX-BF16 or
//! AVX512_BF16 take the `amx` kernel instead: the same online softmax over blocks of 64 keys,
//! its products in bf16 on AMX's tiles or with `vdpbf16ps` (`tiles`). Its rows are batch-invariant too, but its bits are not the FMA
//! kernels', so the caller passes a row's kind (`Query::prompt`) and never mixes kinds in a call.
//!
//! KV layout (lmplex-model's `kv.rs`): per block of `block_size` slots, K is
//! `[kv_head, head_dim, block_size]` (transposed, so one vector holds one dimension of 16
//! consecutive keys) and V is `[block_size, kv_head, head_dim]`, in f32, f16 or int8
//! (`KvElem`): f16 and int8 values are widened to f32 exactly as they are loaded (`vcvtph2ps`,
//! or integer steps that vectorize in the portable build), so both families see the same f32
//! values. An int8 cache (`PagedKv::scales`) also holds K and V scales per key and group of
//! `KV_GROUP` dimensions: `drive` multiplies each chunk's keys and values by them into f32
//! scratch (`scaled`) and runs the kernels on that, and the AMX kernel multiplies them in as
//! it converts keys and values to bf16. Either way a key's values are `int * scale` in f32,
//! whatever the batch.

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod portable;
mod scaled;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod tiles;

use crate::aligned::Aligned;
use crate::kv_elem::KvElem;
use crate::qmatmul::Isa;

/// Keys per online-softmax step.
pub const CHUNK: usize = 16;

/// One sequence's paged K and V for one KV head of one layer.
pub struct PagedKv<'a, T> {
    /// The layer's K and V buffers (every block of the pool).
    pub k: &'a [T],
    /// The layer's V buffer, `[num_blocks, block_size, num_kv_heads, head_dim]` (K's is transposed).
    pub v: &'a [T],
    /// The sequence's blocks in position order: key `j` is in block `block_table[j / block_size]`.
    pub block_table: &'a [u32],
    /// Token slots per block.
    pub block_size: usize,
    /// KV heads per layer (the buffers hold them all; this view reads `kv_head`).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Which KV head this view reads.
    pub kv_head: usize,
    /// The per-token scales of a scaled cache (int8, `KvDtype::scaled`), else `None`.
    pub scales: Option<KvScales<'a>>,
}

/// The layer's K and V scales of an int8 cache, each `[num_blocks, num_kv_heads, groups,
/// block_size]` (`KvDtype::scale_groups`): a key's stored K values of group `g` (dimensions
/// `g * KV_GROUP ..`) times its K scale of group `g` are its keys, and likewise for V.
#[derive(Clone, Copy)]
pub struct KvScales<'a> {
    /// K scales.
    pub k: &'a [f32],
    /// V scales.
    pub v: &'a [f32],
}

impl<T> PagedKv<'_, T> {
    /// Offsets of key `key` in `k` (dimension `d` at `+ d * block_size`) and in `v` (dimension
    /// `d` at `+ d`). Panics when the block lies outside the buffers.
    fn offsets(&self, key: usize) -> (usize, usize) {
        let (bs, kw) = (self.block_size, self.num_kv_heads * self.head_dim);
        let block = self.block_table[key / bs] as usize;
        assert!((block + 1) * bs * kw <= self.k.len().min(self.v.len()), "KV block {block} out of range");
        let off = key % bs;
        (
            block * bs * kw + self.kv_head * self.head_dim * bs + off,
            (block * bs + off) * kw + self.kv_head * self.head_dim,
        )
    }

    /// Offset of key `key`'s group-0 scales in `KvScales::k` and `v` (group `g` at
    /// `+ g * block_size`). Panics when the block lies outside them.
    fn scale_offset(&self, key: usize, scales: &KvScales<'_>) -> usize {
        let (bs, groups) = (self.block_size, self.head_dim.div_ceil(crate::kv_elem::KV_GROUP));
        let block = self.block_table[key / bs] as usize;
        let head = block * self.num_kv_heads + self.kv_head;
        assert!((head + 1) * groups * bs <= scales.k.len().min(scales.v.len()), "KV scale block {block} out of range");
        head * groups * bs + key % bs
    }
}

/// How scores are formed: the query scale, an optional soft-cap and an optional sliding window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnOpts {
    /// Multiplies every query before the dot products (usually `1 / sqrt(head_dim)`).
    pub scale: f32,
    /// Scores become `cap * tanh(score / cap)` (Gemma 2's `attn_logit_softcapping`).
    pub softcap: Option<f32>,
    /// A row of context length `len` attends to keys `len - window .. len` only (at least 1).
    pub window: Option<usize>,
    /// Prompt rows (`Query::prompt`) in bf16 precision on the AMX tile unit where the CPU has
    /// it (`dtype="bfloat16"`; the `amx` kernel's docs say what is rounded).
    pub bf16_prompt: bool,
}

impl AttnOpts {
    /// Plain causal attention with query scale `scale`.
    pub fn scaled(scale: f32) -> Self {
        Self { scale, softcap: None, window: None, bf16_prompt: false }
    }

    /// The first key a row of context length `len` attends to.
    #[inline]
    pub fn first_key(&self, len: usize) -> usize {
        self.window.map_or(0, |w| len.saturating_sub(w.max(1)))
    }
}

/// Query rows `[rows, head_dim]` and each row's context length (non-decreasing, each >= 1).
pub struct Query<'a> {
    /// The query rows, `[rows, head_dim]` row-major (scaled by the kernel, not by the caller).
    pub q: &'a [f32],
    /// Per row, how many keys (from position 0) it attends to.
    pub lens: &'a [usize],
    /// The rows are prompt rows (`AttnOpts::bf16_prompt` applies to them).
    pub prompt: bool,
}

/// Per-thread working memory of `attend`, reused between calls.
#[derive(Default)]
pub struct Scratch {
    /// Scaled queries and accumulators, `[rows, head_dim]`.
    qs: Vec<f32>,
    acc: Vec<f32>,
    /// Scores, then weights, of the current chunk: `[rows, CHUNK]`.
    s: Vec<f32>,
    /// Running maximum and sum, this chunk's rescale factor and valid key count per row.
    m: Vec<f32>,
    l: Vec<f32>,
    alpha: Vec<f32>,
    valid: Vec<usize>,
    /// The AMX kernel's bf16 queries, keys and values (`amx`'s layouts), and its f32 scores
    /// and products, on cache lines (`aligned`: tile rows never straddle two).
    amx_q: Aligned<u16>,
    amx_k: Aligned<u16>,
    amx_v: Aligned<u16>,
    amx_s: Aligned<f32>,
    amx_o: Aligned<f32>,
    /// An int8 chunk's keys `[head_dim, CHUNK]` and values `[CHUNK, head_dim]` in f32 (`scaled`).
    dk: Vec<f32>,
    dv: Vec<f32>,
}

/// Where the keys of one chunk live: K offsets (dimension stride `kstride`) and V offsets.
/// Keys past the last row's length get zero weight; their offsets stay inside the buffers
/// (the rest of the chunk's block, or the last key where a chunk spans blocks).
pub(crate) struct ChunkAt {
    pub k: [usize; CHUNK],
    pub v: [usize; CHUNK],
    pub kstride: usize,
    /// `k[j] = k[0] + j`: the chunk lies in one block.
    pub consecutive: bool,
}

/// The per-chunk steps of one kernel family. Each row's arithmetic must not depend on `n`.
pub(crate) trait Kernel {
    /// `s[r][j] = sum_d q[r][d] * key_j[d]` for `n` rows and the chunk's 16 keys.
    ///
    /// # Safety
    /// `q` holds `n * hd` values, `s` room for `n * CHUNK`; every offset in `at` plus
    /// `(hd - 1) * at.kstride` is inside `k` (and, for kernels that load 16 keys at once, the
    /// chunk's keys are consecutive in one block).
    unsafe fn scores<T: KvElem>(q: &[f32], n: usize, hd: usize, k: &[T], at: &ChunkAt, s: &mut [f32]);
    /// Turns one row's scores (`s[..CHUNK]`, those in `lo..valid` real) into weights (zero
    /// outside `lo..valid`), updates `m` and `l`, and returns the factor the accumulator is
    /// rescaled by.
    ///
    /// # Safety
    /// The CPU has the kernel family's features; `lo < valid <= CHUNK`.
    unsafe fn softmax(s: &mut [f32], lo: usize, valid: usize, m: &mut f32, l: &mut f32) -> f32;
    /// `acc[r] = acc[r] * alpha[r] + sum_{j < valid[r]} p[r][j] * value_j` for every row.
    ///
    /// # Safety
    /// `rows.acc` holds `rows.n * hd` values, `rows.p` `rows.n * CHUNK`; `at.v[j] + hd <=
    /// v.len()` for every `j` below the largest `valid`.
    unsafe fn values<T: KvElem>(rows: Rows<'_>, hd: usize, v: &[T], at: &ChunkAt);
}

/// The rows of one chunk step that `Kernel::values` reads and updates: accumulators
/// `[n, hd]`, weights `[n, CHUNK]`, and each row's rescale factor and valid key count.
pub(crate) struct Rows<'a> {
    pub acc: &'a mut [f32],
    pub p: &'a [f32],
    pub alpha: &'a [f32],
    pub valid: &'a [usize],
    pub n: usize,
}

/// `out[r] = softmax(cap(scale * q[r] . K[a..lens[r]]^T)) V[a..lens[r]]` for every row of
/// `query`, where `a` is the row's first key (`AttnOpts::first_key`) and `cap` the soft-cap.
pub fn attend<T: KvElem>(
    query: Query<'_>,
    kv: &PagedKv<'_, T>,
    opts: &AttnOpts,
    out: &mut [f32],
    scratch: &mut Scratch,
) {
    attend_with(Isa::detect(), query, kv, opts, out, scratch)
}

pub(crate) fn attend_with<T: KvElem>(
    isa: Isa,
    query: Query<'_>,
    kv: &PagedKv<'_, T>,
    opts: &AttnOpts,
    out: &mut [f32],
    sc: &mut Scratch,
) {
    let hd = kv.head_dim;
    assert_eq!(query.q.len(), query.lens.len() * hd, "queries and lengths disagree");
    assert_eq!(out.len(), query.q.len(), "output size");
    assert!(kv.kv_head < kv.num_kv_heads, "KV head {} of {}", kv.kv_head, kv.num_kv_heads);
    assert!(query.lens.windows(2).all(|w| w[0] <= w[1]) && query.lens.first().is_none_or(|&l| l >= 1));
    #[cfg(target_arch = "x86_64")]
    if query.prompt && opts.bf16_prompt && isa == Isa::Avx512 {
        // SAFETY: `unit` found AVX-512 with BF16 and, for AMX, the tiles with their permission;
        // a head_dim that is a multiple of 32 and a block size that is a multiple of 16.
        match amx::unit(hd, kv.block_size) {
            Some(tiles::Unit::Amx) => return unsafe { amx::run(query, kv, opts, out, sc, tiles::Amx) },
            Some(tiles::Unit::Vectors) => return unsafe { amx::run(query, kv, opts, out, sc, tiles::Vectors) },
            None => {}
        }
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && kv.block_size.is_multiple_of(CHUNK) && hd.is_multiple_of(16) {
        // SAFETY: `Isa::detect` found AVX-512 F/BW/VL/DQ, AVX2, FMA and F16C at run time; a
        // chunk's keys are consecutive in one block (block_size is a multiple of 16) and
        // `drive` checks every block against the buffers.
        unsafe { avx512::run(query, kv, opts, out, sc) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable {
        // SAFETY: AVX2 and FMA were detected at run time (`Isa` is Avx2 or Avx512 only then).
        unsafe { portable::run_avx2(query, kv, opts, out, sc) };
        return;
    }
    let _ = isa;
    portable::run(query, kv, opts, out, sc)
}

/// Asks the CPU for the keys and values of the chunk from `key0` (its block is elsewhere in
/// the pool, where the hardware prefetcher does not look); a hint, no effect on results.
#[inline(always)]
fn prefetch_chunk<T: KvElem>(kv: &PagedKv<'_, T>, key0: usize, last: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let (k0, v0) = kv.offsets(key0);
        let size = std::mem::size_of::<T>();
        let (kb, vb) = (kv.k.as_ptr().cast::<u8>(), kv.v.as_ptr().cast::<u8>());
        let kbytes = ((kv.head_dim - 1) * kv.block_size + CHUNK) * size;
        let kw = kv.num_kv_heads * kv.head_dim;
        // The chunk's K rows and V rows when it lies in one block (always with the engine's
        // block size); with other block sizes some addresses may lie past it, hence
        // `wrapping_add`: a prefetch of any address is harmless.
        // SAFETY: a prefetch reads nothing architecturally and never faults.
        unsafe {
            for off in (0..kbytes).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(kb.wrapping_add(k0 * size + off).cast());
            }
            for j in 0..CHUNK.min(last - key0) {
                for off in (0..kv.head_dim * size).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(vb.wrapping_add((v0 + j * kw) * size + off).cast());
                }
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (kv, key0, last);
}

/// The chunk loop shared by the kernel families (inlined into each, so it is compiled with
/// their target features).
#[inline(always)]
pub(crate) fn drive<K: Kernel, T: KvElem>(
    query: Query<'_>,
    kv: &PagedKv<'_, T>,
    opts: &AttnOpts,
    out: &mut [f32],
    sc: &mut Scratch,
) {
    let (n, hd, lens) = (query.lens.len(), kv.head_dim, query.lens);
    if n == 0 {
        return;
    }
    sc.qs.clear();
    sc.qs.extend(query.q.iter().map(|x| x * opts.scale));
    sc.acc.clear();
    sc.acc.resize(n * hd, 0.0);
    sc.s.resize(n * CHUNK, 0.0);
    sc.m.clear();
    sc.m.resize(n, f32::NEG_INFINITY);
    sc.l.clear();
    sc.l.resize(n, 0.0);
    sc.alpha.resize(n, 0.0);
    sc.valid.resize(n, 0);
    let last = lens[n - 1];
    // Rows r0..r1 take part in a chunk: those not yet past their length (r0 moves on as rows
    // end) whose window starts before the chunk ends (r1 moves on as windows begin).
    let (mut r0, mut r1) = (0, 0);
    for key0 in (opts.first_key(lens[0]) / CHUNK * CHUNK..last).step_by(CHUNK) {
        while lens[r0] <= key0 {
            r0 += 1;
        }
        while r1 < n && opts.first_key(lens[r1]) < key0 + CHUNK {
            r1 += 1;
        }
        if r1 <= r0 {
            continue;
        }
        let consecutive = key0 % kv.block_size + CHUNK <= kv.block_size;
        let mut at = ChunkAt { k: [0; CHUNK], v: [0; CHUNK], kstride: kv.block_size, consecutive };
        if consecutive {
            // The chunk lies in one block (always, when block_size is a multiple of 16).
            let ((k0, v0), kw) = (kv.offsets(key0), kv.num_kv_heads * hd);
            for j in 0..CHUNK {
                (at.k[j], at.v[j]) = (k0 + j, v0 + j * kw);
            }
        } else {
            for j in 0..CHUNK {
                (at.k[j], at.v[j]) = kv.offsets((key0 + j).min(last - 1));
            }
        }
        if key0 + CHUNK < last {
            prefetch_chunk(kv, key0 + CHUNK, last);
        }
        let rows = r1 - r0;
        // SAFETY: `offsets` checked each key's block against the buffers; a chunk's K offset
        // plus (hd - 1) * block_size stays inside its block; the slices hold `rows` rows.
        let scratch = kv.scales.map(|sv| scaled::dequantize(kv, &sv, key0, last, &at, &mut sc.dk, &mut sc.dv));
        match &scratch {
            None => unsafe { K::scores(&sc.qs[r0 * hd..], rows, hd, kv.k, &at, &mut sc.s[r0 * CHUNK..]) },
            // SAFETY: `dequantize` wrote the chunk's 16 keys consecutively, `hd` dimensions apart.
            Some(sat) => unsafe { K::scores(&sc.qs[r0 * hd..], rows, hd, &sc.dk, sat, &mut sc.s[r0 * CHUNK..]) },
        }
        let state = sc.valid.iter_mut().zip(&mut sc.alpha).zip(sc.m.iter_mut().zip(&mut sc.l));
        let scores = sc.s.chunks_exact_mut(CHUNK).zip(lens);
        for (((valid, alpha), (m, l)), (s, &len)) in state.zip(scores).take(r1).skip(r0) {
            *valid = (len - key0).min(CHUNK);
            let lo = opts.first_key(len).saturating_sub(key0);
            if let Some(cap) = opts.softcap {
                s[lo..*valid].iter_mut().for_each(|x| *x = cap * (*x / cap).tanh());
            }
            // SAFETY: `drive` runs inside the kernel family's entry point, on a CPU with its
            // features; the row is active, so its window starts before `valid`.
            *alpha = unsafe { K::softmax(s, lo, *valid, m, l) };
        }
        let rows = Rows {
            acc: &mut sc.acc[r0 * hd..],
            p: &sc.s[r0 * CHUNK..],
            alpha: &sc.alpha[r0..],
            valid: &sc.valid[r0..],
            n: rows,
        };
        // SAFETY: as above, for the values of the keys below each row's length.
        match &scratch {
            None => unsafe { K::values(rows, hd, kv.v, &at) },
            Some(sat) => unsafe { K::values(rows, hd, &sc.dv, sat) },
        }
    }
    for ((o, a), l) in out.chunks_exact_mut(hd).zip(sc.acc.chunks_exact(hd)).zip(&sc.l) {
        o.iter_mut().zip(a).for_each(|(o, a)| *o = a / l);
    }
}
