//! Bidirectional multi-head attention within segments of rows (a frame, or a Qwen2.5-VL
//! window: transformers' `cu_seqlens`) on the decoder's kernel, `attention::attend`.
//!
//! Each segment's keys and values form one KV block of its length rounded up to the kernel's
//! chunk of 16 keys (the slots past the segment are zeros the kernel gives no weight), and
//! every query row of the segment attends to all of the segment's keys (context length = the
//! segment's length), so the causal kernel computes the bidirectional attention exactly.
//!
//! Scale: the kernel multiplies each query by `head_dim^-0.5` before its dot products, where
//! transformers multiplies the dot products; the queries are rotated (`rotary`) before, as in
//! transformers. For a power-of-two `head_dim` the scale is a power of two and both agree up to
//! the order of the sums; otherwise (Qwen2-VL's 80) they differ by a rounding of the scaled
//! query, well inside the tolerance of the float32 comparisons.
//!
//! Invariant: a row's output depends on its own segment's rows only (their count, values and
//! order), never on the other segments, the batch or the thread split: the kernel is
//! row-independent and a segment's block size depends on its length alone.

use crate::attention::{attend, AttnOpts, PagedKv, Query, CHUNK};
use crate::ops::{AttnScratch, ATTN};
use crate::thread_team::{parallel_for, Cells};
use std::ops::Range;

/// Query rows per attention task (one head of one segment).
const ROWS_PER_TASK: usize = 64;

/// `qkv: [rows, 3 * d]` (rows q | k | v, `heads` heads of `hd`, q and k rotated) ->
/// `[rows, d]`: `softmax(q k^T * hd^-0.5) v` per segment and head, over the segment's rows.
/// `segments` are disjoint ranges of rows covering `0..rows`.
pub(super) fn attention(qkv: &[f32], segments: &[Range<usize>], heads: usize, hd: usize, bf16: bool) -> Vec<f32> {
    let d = heads * hd;
    let rows = qkv.len() / (3 * d);
    // Each segment's block in the kernel's layout (`attention`'s docs), at `offsets[s]`:
    // K `[heads, hd, block]` (transposed), V `[block, heads, hd]`.
    let blocks: Vec<usize> = segments.iter().map(|s| s.len().next_multiple_of(CHUNK)).collect();
    let mut offsets = Vec::with_capacity(segments.len() + 1);
    offsets.push(0);
    for b in &blocks {
        offsets.push(offsets[offsets.len() - 1] + b * d);
    }
    let total = offsets[segments.len()];
    let (mut k, mut v) = (vec![0f32; total], vec![0f32; total]);
    for (s, seg) in segments.iter().enumerate() {
        let (block, off) = (blocks[s], offsets[s]);
        for (slot, src) in qkv[seg.start * 3 * d..seg.end * 3 * d].chunks_exact(3 * d).enumerate() {
            let kt = &mut k[off..off + block * d];
            src[d..2 * d].iter().enumerate().for_each(|(e, &x)| kt[e * block + slot] = x);
            v[off + slot * d..off + (slot + 1) * d].copy_from_slice(&src[2 * d..]);
        }
    }
    // Tasks: (segment, head, chunk of query rows).
    let mut tasks = Vec::new();
    for (s, seg) in segments.iter().enumerate() {
        for h in 0..heads {
            tasks.extend((0..seg.len().div_ceil(ROWS_PER_TASK)).map(|c| (s, h, c)));
        }
    }
    let opts = AttnOpts { bf16_prompt: bf16, ..AttnOpts::scaled((hd as f64).powf(-0.5) as f32) };
    let mut out = vec![0f32; rows * d];
    let dst = Cells::new(&mut out);
    parallel_for(tasks.len(), &|i| {
        let (s, h, c) = tasks[i];
        let (seg, block, off) = (&segments[s], blocks[s], offsets[s]);
        let n = seg.len();
        let local = c * ROWS_PER_TASK..((c + 1) * ROWS_PER_TASK).min(n);
        let kv = PagedKv {
            k: &k[off..off + block * d],
            v: &v[off..off + block * d],
            block_table: &[0],
            block_size: block,
            num_kv_heads: heads,
            head_dim: hd,
            kv_head: h,
            scales: None,
        };
        ATTN.with_borrow_mut(|AttnScratch { q, lens, out: o, work }| {
            q.clear();
            for r in local.clone() {
                q.extend_from_slice(&qkv[(seg.start + r) * 3 * d + h * hd..][..hd]);
            }
            lens.clear();
            lens.resize(local.len(), n);
            o.clear();
            o.resize(q.len(), 0.0);
            attend(Query { q, lens, prompt: true }, &kv, &opts, o, work);
            for (r, src) in local.zip(o.chunks_exact(hd)) {
                // SAFETY: task i alone writes head h of its segment's rows `local`: disjoint cells.
                unsafe { dst.slice((seg.start + r) * d + h * hd, hd) }.copy_from_slice(src);
            }
        });
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel-based attention equals a naive softmax(q k^T * scale) v in f64 within each
    /// segment (lengths below, at and past the kernel's chunk and the task's rows); a segment
    /// gives the same bits alone.
    #[test]
    fn attention_matches_a_naive_softmax_per_segment() {
        let (heads, hd) = (3, 16);
        let d = heads * hd;
        let segments = [0..5, 5..21, 21..91, 91..92];
        let rows = 92;
        let qkv: Vec<f32> =
            (0..rows * 3 * d).map(|i| ((i * 2_654_435_761usize) % 2001) as f32 / 1000.0 - 1.0).collect();
        let got = attention(&qkv, &segments, heads, hd, false);
        let at = |r: usize, part: usize, h: usize, e: usize| qkv[r * 3 * d + part * d + h * hd + e] as f64;
        for seg in &segments {
            for h in 0..heads {
                for r in seg.clone().step_by(3) {
                    let s: Vec<f64> = seg
                        .clone()
                        .map(|j| (0..hd).map(|e| at(r, 0, h, e) * at(j, 1, h, e)).sum::<f64>() * 0.25)
                        .collect();
                    let max = s.iter().copied().fold(f64::MIN, f64::max);
                    let w: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
                    let sum: f64 = w.iter().sum();
                    for e in 0..hd {
                        let want = seg.clone().zip(&w).map(|(j, w)| w * at(j, 2, h, e)).sum::<f64>() / sum;
                        let g = got[r * d + h * hd + e] as f64;
                        assert!((g - want).abs() < 1e-5, "segment {seg:?} head {h} row {r} dim {e}: {g} vs {want}");
                    }
                }
            }
        }
        let whole = 0..70;
        let alone = attention(&qkv[21 * 3 * d..91 * 3 * d], std::slice::from_ref(&whole), heads, hd, false);
        assert_eq!(alone, got[21 * d..91 * d]);
    }
}
