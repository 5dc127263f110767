//! CPU kernels the forward pass uses besides matmuls: paged attention, with the rotary
//! embedding (`rope`) applied as K and V are written. They are the CPU references the CUDA
//! kernels are checked against.
//!
//! Invariants: each output row depends only on its own sequence (its tokens, its KV blocks) and
//! the reduction order inside a row is fixed, so a sequence's results do not change with what
//! else is in the batch. Softmax is computed in f32 with the running maximum subtracted.

pub use crate::rope::{inv_freq, rope_magnitude, RopeTable};

use crate::attention::{attend, AttnOpts, KvScales, PagedKv, Query, Scratch};
use crate::kv::{
    hadamard, inv_scale, row_scale, ForwardBatch, KvCache, KvDtype, KvElem, KvRotation, SeqChunk, KV_GROUP,
};
use crate::thread_team::{parallel_for, Cells};

thread_local! {
    /// Per-thread attention inputs, output and working memory (the text model's and the vision
    /// tower's attention both take it).
    pub(crate) static ATTN: std::cell::RefCell<AttnScratch> = std::cell::RefCell::new(AttnScratch::default());
}

/// One attention task's working memory, reused by each thread.
#[derive(Default)]
pub(crate) struct AttnScratch {
    /// The task's query rows.
    pub q: Vec<f32>,
    /// Each row's context length.
    pub lens: Vec<usize>,
    /// The rows' output.
    pub out: Vec<f32>,
    /// The kernel's own.
    pub work: Scratch,
}

/// Shapes of one attention layer.
#[derive(Debug, Clone, Copy)]
pub struct AttnDims {
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads; divides `num_heads` (query head `h` reads KV head `h / group`).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

/// Query rows per attention work item (tokens times query heads): enough that each key and
/// value row loaded serves many rows, few enough that a long prefill splits into many items.
const ROWS_PER_ITEM: usize = 128;

/// One attention work item: tokens `tok0..tok0 + ntok` of batch sequence `seq` (offsets into
/// its chunk) and query heads `h0..h0 + nh` (all sharing KV head `h0 / group`).
#[derive(Clone, Copy)]
struct Item {
    seq: usize,
    tok0: usize,
    ntok: usize,
    h0: usize,
    nh: usize,
    /// The tokens are prompt tokens (`Query::prompt`).
    prompt: bool,
    /// Keys added to a sliding window for this item's one row (`widening`); 0 for others.
    widen: usize,
}

/// The context length of row `pos` of `s`: `pos + 1`, or its bidirectional block's end
/// (`InputEmbeds::context_len`).
fn context_len(s: &SeqChunk, pos: usize) -> usize {
    s.embeds.map_or(pos + 1, |e| e.context_len(pos))
}

/// For a row of a bidirectional block that sees past itself (context `len > pos + 1`) under a
/// sliding window `w`: transformers' mask is `(causal or in the same image) and within the
/// window of the row` (keys after `pos - w`; transformers 5's `create_masks_for_vision_model`),
/// so the row's first key is `pos + 1 - w`, not the kernel's `len - w`
/// (`AttnOpts::first_key`); the window widens by the difference for that row alone. `None`
/// where the two agree.
fn widening(s: &SeqChunk, pos: usize, opts: &AttnOpts) -> Option<usize> {
    let (len, w) = (context_len(s, pos), opts.window?);
    if len <= pos + 1 || len <= w {
        return None;
    }
    let first = (pos + 1).saturating_sub(w);
    Some(len - first - w)
}

/// Applies rope to `q` and `k` (`[tokens, heads * head_dim]`, tokens in batch order), writes
/// k and v into the layer's KV slots, then computes causal attention of every new token over
/// its sequence's context (its whole context, or its window: `opts`; a row of a bidirectional
/// image block sees up to its block's end, `InputEmbeds::context_len`). Returns
/// `[tokens, num_heads * head_dim]`. K and V are stored in the cache's element type (rounded
/// once, here) and read back from it.
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
    opts: &AttnOpts,
) -> Vec<f32> {
    match kv.dtype {
        KvDtype::F32 => attention_t::<f32>(batch, q, k, v, kv, layer, rope, d, opts),
        KvDtype::F16 => attention_t::<half::f16>(batch, q, k, v, kv, layer, rope, d, opts),
        KvDtype::I8 => attention_t::<i8>(batch, q, k, v, kv, layer, rope, d, opts),
    }
}

#[allow(clippy::too_many_arguments)]
fn attention_t<T: KvElem>(
    batch: &ForwardBatch,
    q: &mut [f32],
    k: &mut [f32],
    v: &[f32],
    kv: &mut KvCache,
    layer: usize,
    rope: &RopeTable,
    d: AttnDims,
    opts: &AttnOpts,
) -> Vec<f32> {
    let (qw, kw, hd) = (d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim, d.head_dim);
    let bs = kv.block_size;
    // 1. rope + KV write, token by token (K transposed within its block, `kv.rs`).
    let (kc, vc, ksc, vsc) = kv.layer_mut::<T>(layer);
    let scaled = T::DTYPE.scaled();
    let (groups, group_w) = if scaled { (T::DTYPE.scale_groups(hd), KV_GROUP) } else { (1, hd) };
    // A scaled cache's rotation (`KvRotation`): Q and K, and V, rotated before K and V are
    // stored; the output rotated back at the end.
    let rot = KvRotation::of(T::DTYPE, hd);
    let mut vrow = Vec::with_capacity(kw);
    let mut t = 0;
    let mut first_row = Vec::with_capacity(batch.seqs.len());
    for s in &batch.seqs {
        first_row.push(t);
        for i in 0..s.token_ids.len() {
            let pos = s.start_pos + i;
            let at = s.embeds.map_or([pos; 3], |e| e.rope_position(pos));
            rope.apply_at(&mut q[t * qw..(t + 1) * qw], at, hd);
            rope.apply_at(&mut k[t * kw..(t + 1) * kw], at, hd);
            vrow.clear();
            vrow.extend_from_slice(&v[t * kw..(t + 1) * kw]);
            if let Some(r) = rot {
                hadamard(&mut q[t * qw..(t + 1) * qw], r.k);
                hadamard(&mut k[t * kw..(t + 1) * kw], r.k);
                hadamard(&mut vrow, r.v);
            }
            let (block, off) = (s.block_table[pos / bs] as usize, pos % bs);
            let kt = &mut kc[block * bs * kw..(block + 1) * bs * kw];
            let sl = block * bs + off;
            let vs = &mut vc[sl * kw..(sl + 1) * kw];
            // Per KV head and scale group (the whole head unless int8): its scale (1 unless
            // int8), then its values times the inverse.
            for h in 0..d.num_kv_heads {
                for g in 0..groups {
                    let dims = h * hd + g * group_w..h * hd + ((g + 1) * group_w).min(hd);
                    let (kr, vr) = (&k[t * kw..][dims.clone()], &vrow[dims.clone()]);
                    let (sk, sv) = (row_scale(T::DTYPE, kr), row_scale(T::DTYPE, vr));
                    if scaled {
                        let at = ((block * d.num_kv_heads + h) * groups + g) * bs + off;
                        (ksc[at], vsc[at]) = (sk, sv);
                    }
                    let (ik, iv) = (inv_scale(sk), inv_scale(sv));
                    for (e, &x) in dims.clone().zip(kr) {
                        kt[e * bs + off] = T::from_f32(x * ik);
                    }
                    vs[dims].iter_mut().zip(vr).for_each(|(o, &x)| *o = T::from_f32(x * iv));
                }
            }
            t += 1;
        }
    }
    // 2. attention. A work item is a run of tokens of one sequence and the query heads of one
    // KV head (so each key and value is read once for all of them), or single heads when the
    // items would leave a thread idle. A row's arithmetic does not depend on its item
    // (`attention`), so the split never changes a result. Items near the end of a sequence
    // (the longest contexts) come first, so the dynamic schedule ends evenly.
    let group = d.num_heads / d.num_kv_heads;
    let tokens_per_item = (ROWS_PER_ITEM / group).max(1);
    let mut items = Vec::new();
    for (si, s) in batch.seqs.iter().enumerate() {
        // Prompt rows and generated rows never share an item (`RowKinds`: the kernel may
        // depend on a row's kind).
        let n = s.token_ids.len();
        let split = s.num_prompt_tokens.saturating_sub(s.start_pos).min(n);
        for (lo, hi, prompt) in [(0, split, true), (split, n, false)] {
            for tok0 in (lo..hi).step_by(tokens_per_item).rev() {
                let ntok = (hi - tok0).min(tokens_per_item);
                let head_items = |tok0, ntok, widen| {
                    (0..d.num_kv_heads).map(move |g| Item {
                        seq: si,
                        tok0,
                        ntok,
                        h0: g * group,
                        nh: group,
                        prompt,
                        widen,
                    })
                };
                // Rows whose window widens run alone; the rest in runs between them.
                let mut run = tok0;
                for tok in tok0..tok0 + ntok {
                    if let Some(widen) = widening(s, s.start_pos + tok, opts) {
                        items.extend(head_items(run, tok - run, 0).filter(|it| it.ntok > 0));
                        items.extend(head_items(tok, 1, widen));
                        run = tok + 1;
                    }
                }
                items.extend(head_items(run, tok0 + ntok - run, 0).filter(|it| it.ntok > 0));
            }
        }
    }
    let threads = rayon::current_num_threads();
    if items.len() < 4 * threads && !items.len().is_multiple_of(threads) {
        items = items.iter().flat_map(|it| (it.h0..it.h0 + it.nh).map(move |h0| Item { h0, nh: 1, ..*it })).collect();
    }
    items.sort_by_key(|it| std::cmp::Reverse(batch.seqs[it.seq].start_pos + it.tok0 + it.ntok));
    let (kc, vc) = kv.layer::<T>(layer);
    let scales = kv.layer_scales(layer).map(|(k, v)| KvScales { k, v });
    let mut out = vec![0f32; t * qw];
    let dst = Cells::new(&mut out);
    parallel_for(items.len(), &|i| {
        let it = items[i];
        let s = &batch.seqs[it.seq];
        let paged = PagedKv {
            k: kc,
            v: vc,
            block_table: s.block_table,
            block_size: bs,
            num_kv_heads: d.num_kv_heads,
            head_dim: hd,
            kv_head: it.h0 / group,
            scales,
        };
        ATTN.with_borrow_mut(|a| {
            let AttnScratch { q: qs, lens, out: o, work } = a;
            let rows = first_row[it.seq] + it.tok0..first_row[it.seq] + it.tok0 + it.ntok;
            qs.clear();
            lens.clear();
            for (i, row) in rows.clone().enumerate() {
                qs.extend_from_slice(&q[row * qw + it.h0 * hd..][..it.nh * hd]);
                lens.extend(std::iter::repeat_n(context_len(s, s.start_pos + it.tok0 + i), it.nh));
            }
            o.resize(qs.len(), 0.0);
            let widened = AttnOpts { window: opts.window.map(|w| w + it.widen), ..*opts };
            attend(Query { q: qs, lens, prompt: it.prompt }, &paged, &widened, o, work);
            for (row, src) in rows.zip(o.chunks_exact(it.nh * hd)) {
                // SAFETY: item i owns heads h0..h0 + nh of its tokens' rows: disjoint ranges.
                unsafe { dst.slice(row * qw + it.h0 * hd, it.nh * hd) }.copy_from_slice(src);
            }
        });
    });
    if let Some(r) = rot {
        hadamard(&mut out, r.v);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::RopeArgs;
    use crate::kv::{LogitsSelect, SeqChunk};

    /// Attention over a paged cache equals a naive dense computation, and a sequence's rows are
    /// bit-identical whether it runs alone or next to another one: f32, and int8 with (head_dim
    /// 64) and without (head_dim 8) its rotation, within its rounding.
    #[test]
    fn paged_attention_matches_dense_and_is_batch_invariant() {
        for (dtype, hd, tol) in [(KvDtype::F32, 8, 1e-5), (KvDtype::I8, 8, 2e-2), (KvDtype::I8, 64, 2e-2)] {
            check_paged_attention(dtype, hd, tol);
        }
    }

    fn check_paged_attention(dtype: KvDtype, hd: usize, tol: f32) {
        let d = AttnDims { num_heads: 4, num_kv_heads: 2, head_dim: hd };
        let (qw, kw) = (4 * hd, 2 * hd);
        let rope = RopeTable::new(&RopeArgs::plain(10000.0), hd, 64, None);
        let n = 5;
        let gen = |seed: u32, len: usize| -> Vec<f32> {
            (0..len).map(|i| ((((i as u32).wrapping_mul(2654435761)) ^ seed) % 1000) as f32 / 500.0 - 1.0).collect()
        };
        let (q0, k0, v0) = (gen(1, n * qw), gen(2, n * kw), gen(3, n * kw));
        let ids = vec![0u32; n];
        let scale = 1.0 / (hd as f32).sqrt();
        let run = |tables: Vec<Vec<u32>>, extra: bool| {
            let mut kv = KvCache::with_dtype(1, 8, 2, 2, hd, dtype).unwrap();
            let mut seqs = vec![SeqChunk {
                token_ids: &ids,
                start_pos: 0,
                block_table: &tables[0],
                logits: LogitsSelect::Last,
                num_prompt_tokens: usize::MAX,
                lora: None,
                embeds: None,
            }];
            let (mut q, mut k, mut v) = (q0.clone(), k0.clone(), v0.clone());
            if extra {
                seqs.push(SeqChunk {
                    token_ids: &ids[..3],
                    start_pos: 0,
                    block_table: &tables[1],
                    logits: LogitsSelect::Last,
                    num_prompt_tokens: usize::MAX,
                    lora: None,
                    embeds: None,
                });
                q.extend(gen(4, 3 * qw));
                k.extend(gen(5, 3 * kw));
                v.extend(gen(6, 3 * kw));
            }
            let batch = ForwardBatch { seqs };
            paged_attention(&batch, &mut q, &mut k, &v, &mut kv, 0, &rope, d, &AttnOpts::scaled(scale))[..n * qw]
                .to_vec()
        };
        let alone = run(vec![vec![5, 1, 7]], false);
        let together = run(vec![vec![2, 6, 0], vec![3, 4]], true);
        assert_eq!(alone, together, "{dtype:?} hd{hd}");
        // dense reference
        let (mut q, mut k) = (q0.clone(), k0.clone());
        for t in 0..n {
            rope.apply(&mut q[t * qw..(t + 1) * qw], t, hd);
            rope.apply(&mut k[t * kw..(t + 1) * kw], t, hd);
        }
        for t in 0..n {
            for h in 0..4 {
                let kvh = h / 2;
                let qh = &q[t * qw + h * hd..][..hd];
                let s: Vec<f32> =
                    (0..=t).map(|j| crate::qmatmul::portable_dot(qh, &k[j * kw + kvh * hd..][..hd]) * scale).collect();
                let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f32 = e.iter().sum();
                for c in 0..hd {
                    let want: f32 = (0..=t).map(|j| e[j] / z * v0[j * kw + kvh * hd + c]).sum();
                    let got = alone[t * qw + h * hd + c];
                    assert!((want - got).abs() < tol, "{dtype:?} hd{hd} t{t} h{h} c{c}: {want} vs {got}");
                }
            }
        }
    }
}
