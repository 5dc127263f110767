//! CPU kernels the forward pass uses besides matmuls: rotary embedding and paged attention.
//! They are the CPU references the CUDA kernels are checked against.
//!
//! Invariants: each output row depends only on its own sequence (its tokens, its KV blocks) and
//! the reduction order inside a row is fixed, so a sequence's results do not change with what
//! else is in the batch. Softmax is computed in f32 with the running maximum subtracted.

use crate::args::RopeArgs;
use crate::attention::{attend, Context};
use crate::kv::{ForwardBatch, KvCache};
use crate::team::{parallel_for, Cells};

/// Rotary inverse frequencies `[head_dim / 2]` as transformers computes them, Llama-3 scaling
/// and GGUF `rope_freqs` factors included (shared by the CPU tables and the CUDA kernel).
pub fn inv_freq(args: &RopeArgs, head_dim: usize, freq_factors: Option<&[f32]>) -> Vec<f32> {
    let half = head_dim / 2;
    let mut inv_freq: Vec<f32> = (0..half).map(|i| 1.0 / args.theta.powf((2 * i) as f32 / head_dim as f32)).collect();
    if let Some(s) = args.llama3 {
        let low_wavelen = s.original_max_position_embeddings as f32 / s.low_freq_factor;
        let high_wavelen = s.original_max_position_embeddings as f32 / s.high_freq_factor;
        for f in inv_freq.iter_mut() {
            let wavelen = 2.0 * std::f32::consts::PI / *f;
            *f = if wavelen < high_wavelen {
                *f
            } else if wavelen > low_wavelen {
                *f / s.factor
            } else {
                let smooth = (s.original_max_position_embeddings as f32 / wavelen - s.low_freq_factor)
                    / (s.high_freq_factor - s.low_freq_factor);
                (1.0 - smooth) * *f / s.factor + smooth * *f
            };
        }
    } else if let Some(ff) = freq_factors {
        for (f, d) in inv_freq.iter_mut().zip(ff) {
            *f /= d;
        }
    }
    inv_freq
}

/// cos/sin tables `[max_positions, rot_dim / 2]`.
pub struct RopeTable {
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
    interleaved: bool,
    pub max_positions: usize,
}

impl RopeTable {
    pub fn size_in_bytes(&self) -> usize {
        (self.cos.len() + self.sin.len()) * 4
    }

    /// cos/sin of `inv_freq` (Llama-3 scaling and GGUF `rope_freqs` factors included) for
    /// every position below `max_positions`.
    pub fn new(args: &RopeArgs, head_dim: usize, max_positions: usize, freq_factors: Option<&[f32]>) -> Self {
        let half = head_dim / 2;
        let inv_freq = inv_freq(args, head_dim, freq_factors);
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for p in 0..max_positions {
            for f in &inv_freq {
                let a = p as f32 * f;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        Self { cos, sin, half, interleaved: args.interleaved, max_positions }
    }

    /// Rotates every head of one token (`x: [heads * head_dim]`) in place for position `pos`.
    pub fn apply(&self, x: &mut [f32], pos: usize, head_dim: usize) {
        let (cos, sin) = (&self.cos[pos * self.half..][..self.half], &self.sin[pos * self.half..][..self.half]);
        for head in x.chunks_exact_mut(head_dim) {
            for i in 0..self.half {
                let (a, b) = if self.interleaved { (2 * i, 2 * i + 1) } else { (i, i + self.half) };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * cos[i] - x1 * sin[i];
                head[b] = x0 * sin[i] + x1 * cos[i];
            }
        }
    }
}

thread_local! {
    /// Per-thread attention scores.
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Shapes of one attention layer.
#[derive(Debug, Clone, Copy)]
pub struct AttnDims {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

/// Applies rope to `q` and `k` (`[tokens, heads * head_dim]`, tokens in batch order), writes
/// k and v into the layer's KV slots, then computes causal attention of every new token over
/// its sequence's whole context. Returns `[tokens, num_heads * head_dim]`.
#[allow(clippy::too_many_arguments)] // the layer's tensors, its KV and the batch: all distinct inputs
pub fn paged_attention(
    batch: &ForwardBatch,
    q: &mut [f32],
    k: &mut [f32],
    v: &[f32],
    kv: &mut KvCache,
    layer: usize,
    rope: &RopeTable,
    d: AttnDims,
) -> Vec<f32> {
    let (qw, kw) = (d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim);
    let bs = kv.block_size;
    let slot = |table: &[u32], pos: usize| table[pos / bs] as usize * bs + pos % bs;
    // 1. rope + KV write, token by token.
    let mut t = 0;
    for s in &batch.seqs {
        for i in 0..s.token_ids.len() {
            let pos = s.start_pos + i;
            rope.apply(&mut q[t * qw..(t + 1) * qw], pos, d.head_dim);
            rope.apply(&mut k[t * kw..(t + 1) * kw], pos, d.head_dim);
            let sl = slot(s.block_table, pos);
            kv.k[layer][sl * kw..(sl + 1) * kw].copy_from_slice(&k[t * kw..(t + 1) * kw]);
            kv.v[layer][sl * kw..(sl + 1) * kw].copy_from_slice(&v[t * kw..(t + 1) * kw]);
            t += 1;
        }
    }
    // 2. attention. A work item is one token and a run of query heads sharing a KV head: the
    // whole group (each key and value row read once) when the items keep every thread
    // equally busy, single heads otherwise. A head's arithmetic is the same either way
    // (`attention::attend`), so the choice never changes a result.
    let mut rows: Vec<(usize, usize)> = Vec::with_capacity(t); // (seq index, position)
    for (si, s) in batch.seqs.iter().enumerate() {
        rows.extend((0..s.token_ids.len()).map(|i| (si, s.start_pos + i)));
    }
    let (kc, vc) = (&kv.k[layer], &kv.v[layer]);
    let group = d.num_heads / d.num_kv_heads;
    let (items, threads) = (t * d.num_kv_heads, rayon::current_num_threads());
    let run = if items >= 4 * threads || items.is_multiple_of(threads) { group } else { 1 };
    let scale = 1.0 / (d.head_dim as f32).sqrt();
    let mut out = vec![0f32; t * qw];
    let runs_per_row = d.num_heads / run;
    let dst = Cells::new(&mut out);
    parallel_for(t * runs_per_row, &|idx| {
        let (row, h0) = (idx / runs_per_row, idx % runs_per_row * run);
        let (si, pos) = rows[row];
        let table = batch.seqs[si].block_table;
        let kvh = h0 / group;
        let ctx = Context { k: kc, v: vc, base: |j| slot(table, j) * kw + kvh * d.head_dim, len: pos + 1 };
        let qh = &q[row * qw + h0 * d.head_dim..][..run * d.head_dim];
        // SAFETY: work item idx owns heads h0..h0 + run of token row, a disjoint range of `out`.
        let o = unsafe { dst.slice(idx * run * d.head_dim, run * d.head_dim) };
        SCORES.with_borrow_mut(|scores| attend(qh, &ctx, d.head_dim, scale, o, scores));
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{LogitsSelect, SeqChunk};

    /// Attention over a paged cache equals a naive dense computation, and a sequence's rows are
    /// bit-identical whether it runs alone or next to another one.
    #[test]
    fn paged_attention_matches_dense_and_is_batch_invariant() {
        let d = AttnDims { num_heads: 4, num_kv_heads: 2, head_dim: 8 };
        let rope = RopeTable::new(&RopeArgs { theta: 10000.0, llama3: None, interleaved: false }, 8, 64, None);
        let n = 5;
        let gen = |seed: u32, len: usize| -> Vec<f32> {
            (0..len).map(|i| ((((i as u32).wrapping_mul(2654435761)) ^ seed) % 1000) as f32 / 500.0 - 1.0).collect()
        };
        let (q0, k0, v0) = (gen(1, n * 32), gen(2, n * 16), gen(3, n * 16));
        let ids = vec![0u32; n];
        let run = |tables: Vec<Vec<u32>>, extra: bool| {
            let mut kv = KvCache::new(1, 8, 2, 2, 8).unwrap();
            let mut seqs = vec![SeqChunk {
                token_ids: &ids,
                start_pos: 0,
                block_table: &tables[0],
                logits: LogitsSelect::Last,
                num_prompt_tokens: usize::MAX,
            }];
            let (mut q, mut k, mut v) = (q0.clone(), k0.clone(), v0.clone());
            if extra {
                seqs.push(SeqChunk {
                    token_ids: &ids[..3],
                    start_pos: 0,
                    block_table: &tables[1],
                    logits: LogitsSelect::Last,
                    num_prompt_tokens: usize::MAX,
                });
                q.extend(gen(4, 3 * 32));
                k.extend(gen(5, 3 * 16));
                v.extend(gen(6, 3 * 16));
            }
            let batch = ForwardBatch { seqs };
            paged_attention(&batch, &mut q, &mut k, &v, &mut kv, 0, &rope, d)[..n * 32].to_vec()
        };
        let alone = run(vec![vec![5, 1, 7]], false);
        let together = run(vec![vec![2, 6, 0], vec![3, 4]], true);
        assert_eq!(alone, together);
        // dense reference
        let (mut q, mut k) = (q0.clone(), k0.clone());
        for t in 0..n {
            rope.apply(&mut q[t * 32..(t + 1) * 32], t, 8);
            rope.apply(&mut k[t * 16..(t + 1) * 16], t, 8);
        }
        for t in 0..n {
            for h in 0..4 {
                let kvh = h / 2;
                let qh = &q[t * 32 + h * 8..][..8];
                let s: Vec<f32> = (0..=t)
                    .map(|j| crate::qmatmul::portable_dot(qh, &k[j * 16 + kvh * 8..][..8]) / 8f32.sqrt())
                    .collect();
                let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f32 = e.iter().sum();
                for c in 0..8 {
                    let want: f32 = (0..=t).map(|j| e[j] / z * v0[j * 16 + kvh * 8 + c]).sum();
                    let got = alone[t * 32 + h * 8 + c];
                    assert!((want - got).abs() < 1e-5, "t{t} h{h} c{c}: {want} vs {got}");
                }
            }
        }
    }
}
