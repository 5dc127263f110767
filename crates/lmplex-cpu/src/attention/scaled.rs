//! Int8 chunks for the FMA kernels: a chunk's 16 keys and values multiplied by their scales
//! into f32 scratch, laid out as a one-block f32 cache (`ChunkAt` with consecutive keys), so
//! every kernel family runs on them unchanged.
//!
//! Invariant: key `j`'s value in dimension `d` becomes `int * scale[j][d / KV_GROUP]`, one f32
//! multiplication, whatever the rows, the batch or the kernel family that reads it.

use super::{ChunkAt, KvScales, PagedKv, CHUNK};
use crate::kv_elem::{KvElem, KV_GROUP};

/// Writes the chunk at `at` (keys `key0..key0 + 16`, those at or past `last` read as key
/// `last - 1`, as `at` does) into `dk` (`[head_dim, CHUNK]`) and `dv` (`[CHUNK, head_dim]`),
/// and returns where the kernels find it there. (Inlined into each kernel family's entry
/// point, so it is compiled with its target features.)
#[inline(always)]
pub(super) fn dequantize<T: KvElem>(
    kv: &PagedKv<'_, T>,
    sv: &KvScales<'_>,
    key0: usize,
    last: usize,
    at: &ChunkAt,
    dk: &mut Vec<f32>,
    dv: &mut Vec<f32>,
) -> ChunkAt {
    let (hd, bs) = (kv.head_dim, kv.block_size);
    dk.resize(hd * CHUNK, 0.0);
    dv.resize(CHUNK * hd, 0.0);
    let base: [usize; CHUNK] = std::array::from_fn(|j| kv.scale_offset((key0 + j).min(last - 1), sv));
    for g in 0..hd.div_ceil(KV_GROUP) {
        let ks: [f32; CHUNK] = std::array::from_fn(|j| sv.k[base[j] + g * bs]);
        for d in g * KV_GROUP..((g + 1) * KV_GROUP).min(hd) {
            let row = &mut dk[d * CHUNK..(d + 1) * CHUNK];
            if at.consecutive {
                let src = &kv.k[at.k[0] + d * at.kstride..][..CHUNK];
                row.iter_mut().zip(src).zip(&ks).for_each(|((o, x), s)| *o = x.to_f32() * s);
            } else {
                for (j, o) in row.iter_mut().enumerate() {
                    *o = kv.k[at.k[j] + d * at.kstride].to_f32() * ks[j];
                }
            }
        }
        for (j, out) in dv.chunks_exact_mut(hd).enumerate() {
            let s = sv.v[base[j] + g * bs];
            let dims = g * KV_GROUP..((g + 1) * KV_GROUP).min(hd);
            let src = &kv.v[at.v[j] + dims.start..at.v[j] + dims.end];
            out[dims].iter_mut().zip(src).for_each(|(o, x)| *o = x.to_f32() * s);
        }
    }
    ChunkAt { k: std::array::from_fn(|j| j), v: std::array::from_fn(|j| j * hd), kstride: CHUNK, consecutive: true }
}
