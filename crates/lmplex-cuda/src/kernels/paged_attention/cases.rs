//! `paged_attention.cu`'s cases: both passes row by row and by tiles (bit for bit against each
//! other) against the twins, and one pass against the twins and, bit for bit, the two passes; the
//! same on the tensor cores (16-bit types, head_dim <= 128), whose rows by tiles and alone give
//! the same bits.

use super::super::check::{against_twin, get, put, put_raw, rows_of, typed, Case, Instance, Reference, Rng, DTS};
use super::{tensor_cores_take, PagedAttention, PARTITION};
use crate::dtype::Dt;
use crate::gpu::Gpu;
use lmplex_core::Result;

/// The three entry points are launched, and checked, together as `paged_attention_<dtype>`.
pub(super) fn checks(filter: &str) -> Vec<Instance> {
    typed("paged_attention", filter, &DTS, |dt| {
        let mut all = cases(dt);
        all.extend(one_pass_cases(dt, false));
        all.extend(one_pass_cases(dt, true));
        all
    })
}

/// One pass against its twin, row by row and by tiles, each run also checked bit for bit
/// against the two passes on the same executor (a difference fails the run): contexts within one
/// partition, a prefill chunk, a decode row and a padding row.
fn one_pass_cases(dt: Dt, tc: bool) -> Vec<Case> {
    let mut cases = Vec::new();
    for (hd, ratio) in [(64usize, 1usize), (128, 4)] {
        if tc && !tensor_cores_take(dt, hd) {
            continue;
        }
        let mut rng = Rng::new((hd * 100 + ratio) as u64);
        let (nkv, bs) = (2usize, 16usize);
        let nq = nkv * ratio;
        let width = (nq + 2 * nkv) * hd;
        let lens = [300usize, 37];
        let max_blocks = lens[0].div_ceil(bs);
        let num_blocks: usize = lens.iter().map(|l| l.div_ceil(bs)).sum();
        let mut tables = vec![0u32; 2 * max_blocks];
        (0..lens[0].div_ceil(bs)).for_each(|b| tables[b] = (num_blocks - 1 - b) as u32);
        (0..lens[1].div_ceil(bs)).for_each(|b| tables[max_blocks + b] = b as u32);
        // Rows 0..5: a prefill chunk of sequence 0 at positions 295..300; row 5 decodes sequence 1
        // at 37 keys; row 6 is padding.
        let row_seq: Vec<u32> = vec![0, 0, 0, 0, 0, 1, 1];
        let row_ctx: Vec<u32> = vec![296, 297, 298, 299, 300, 37, 0];
        let rows = row_seq.len();
        let cache_n = num_blocks * bs * nkv * hd;
        let (kc, vc) = (rng.values(cache_n, 1.0, dt), rng.values(cache_n, 1.0, dt));
        let q = rng.values(rows * width, 1.0, dt);
        let tiles: Vec<u32> = vec![0, 5, 5, 2];
        for tiled in [false, true] {
            let (tables, row_seq, row_ctx, kc, vc, q, tiles) =
                (tables.clone(), row_seq.clone(), row_ctx.clone(), kc.clone(), vc.clone(), q.clone(), tiles.clone());
            let on = if tc { ", tensor cores" } else { "" };
            let label = format!("one pass{on}, head_dim {hd}, {nq} q heads over {nkv} kv heads, tiled {tiled}");
            cases.push(against_twin(label, rows, move |g, sel| {
                let (seq, ctx) = (rows_of(&row_seq, 1, sel), rows_of(&row_ctx, 1, sel));
                let n = seq.len();
                let (qb, kb, vb) = (put(g, dt, &rows_of(&q, width, sel))?, put(g, dt, &kc)?, put(g, dt, &vc)?);
                let (tb, sb, cb) = (put_raw(g, &tables)?, put_raw(g, &seq)?, put_raw(g, &ctx)?);
                let tiles = if sel.is_some() { vec![0, 1] } else { tiles.clone() };
                let tl = put_raw(g, &tiles)?;
                let po = g.alloc(n * nq * hd * 4)?;
                let (pm, ps) = (g.alloc(n * nq * 4)?, g.alloc(n * nq * 4)?);
                let run = |one_pass: bool| -> Result<Vec<f32>> {
                    let out = put(g, dt, &vec![f32::NAN; n * nq * hd])?;
                    PagedAttention {
                        q: qb.ptr,
                        k_cache: kb.ptr,
                        v_cache: vb.ptr,
                        block_tables: tb.ptr,
                        row_seq: sb.ptr,
                        row_ctx: cb.ptr,
                        part_out: po.ptr,
                        part_max: pm.ptr,
                        part_sum: ps.ptr,
                        out: out.ptr,
                        scale: 1.0 / (hd as f32).sqrt(),
                        num_q_heads: nq,
                        num_kv_heads: nkv,
                        head_dim: hd,
                        block_size: bs,
                        max_blocks_per_seq: max_blocks,
                        max_partitions: 1,
                        q_stride: width,
                        tiles: tiled.then_some((tl.ptr, tiles.len() / 2, 0)),
                        one_pass,
                        tensor_cores: tc,
                    }
                    .launch(g, dt, n)?;
                    get(g, dt, &out, n * nq * hd)
                };
                let (one, two) = (run(true)?, run(false)?);
                if !one.iter().map(|v| v.to_bits()).eq(two.iter().map(|v| v.to_bits())) {
                    return Err(lmplex_core::Error::internal("one pass differs from two passes"));
                }
                Ok(one)
            }));
        }
    }
    cases
}

fn cases(dt: Dt) -> Vec<Case> {
    let mut cases = Vec::new();
    for (hd, ratio) in [(64usize, 1usize), (128, 2), (256, 7), (128, 8), (64, 8)] {
        let mut rng = Rng::new((hd * 10 + ratio) as u64);
        let (nkv, bs) = (2usize, 16usize);
        let nq = nkv * ratio;
        let width = (nq + 2 * nkv) * hd;
        // Sequences: 0 decodes at 1100 keys (two partitions, ends mid-block); 1 is a prefill
        // chunk at positions 508..514 (rows cross the partition edge); 2 decodes at 37 keys.
        let lens = [1100usize, 514, 37];
        let max_blocks = lens[0].div_ceil(bs);
        let num_blocks: usize = lens.iter().map(|l| l.div_ceil(bs)).sum();
        let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, rng.below(i + 1));
        }
        let mut tables = vec![0u32; 3 * max_blocks];
        let mut next = 0;
        for (s, l) in lens.iter().enumerate() {
            for b in 0..l.div_ceil(bs) {
                tables[s * max_blocks + b] = ids[next];
                next += 1;
            }
        }
        let mut row_seq: Vec<u32> = vec![0];
        let mut row_ctx: Vec<u32> = vec![1100];
        for p in 508..514u32 {
            row_seq.push(1);
            row_ctx.push(p + 1);
        }
        row_seq.extend([2, 2]);
        row_ctx.extend([37, 0]); // the last row is padding: it attends to nothing
        let rows = row_seq.len();
        let cache_n = num_blocks * bs * nkv * hd;
        let (kc, vc) = (rng.values(cache_n, 1.0, dt), rng.values(cache_n, 1.0, dt));
        let q = rng.values(rows * width, 1.0, dt);
        let label = format!("head_dim {hd}, {nq} q heads over {nkv} kv heads, contexts 1100, 509..514, 37, 0");
        // Tiles: row 0; rows 1..7 (sequence 1); rows 7..9 (sequence 2, its padding row too).
        let tiles: Vec<u32> = vec![0, 1, 1, 6, 7, 2];
        let run = move |g: &Gpu, sel: Option<usize>, tiled: bool, tc: bool| {
            let (seq, ctx) = (rows_of(&row_seq, 1, sel), rows_of(&row_ctx, 1, sel));
            let n = seq.len();
            let parts = (*ctx.iter().max().unwrap_or(&0) as usize).div_ceil(PARTITION).max(1);
            let (qb, kb, vb) = (put(g, dt, &rows_of(&q, width, sel))?, put(g, dt, &kc)?, put(g, dt, &vc)?);
            let (tb, sb, cb) = (put_raw(g, &tables)?, put_raw(g, &seq)?, put_raw(g, &ctx)?);
            let tiles = if sel.is_some() { vec![5, 1] } else { tiles.clone() };
            let tl = put_raw(g, &tiles)?;
            let po = g.alloc(n * nq * parts * hd * 4)?;
            let (pm, ps) = (g.alloc(n * nq * parts * 4)?, g.alloc(n * nq * parts * 4)?);
            let out = g.alloc(n * nq * hd * dt.size())?;
            let row0 = if sel.is_some() { 5 } else { 0 };
            PagedAttention {
                q: qb.ptr,
                k_cache: kb.ptr,
                v_cache: vb.ptr,
                block_tables: tb.ptr,
                row_seq: sb.ptr,
                row_ctx: cb.ptr,
                part_out: po.ptr,
                part_max: pm.ptr,
                part_sum: ps.ptr,
                out: out.ptr,
                scale: 1.0 / (hd as f32).sqrt(),
                num_q_heads: nq,
                num_kv_heads: nkv,
                head_dim: hd,
                block_size: bs,
                max_blocks_per_seq: max_blocks,
                max_partitions: parts,
                q_stride: width,
                tiles: tiled.then_some((tl.ptr, tiles.len() / 2, row0)),
                one_pass: false,
                tensor_cores: tc,
            }
            .launch(g, dt, n)?;
            get(g, dt, &out, n * nq * hd)
        };
        let by_rows = run.clone();
        cases.push(against_twin(label.clone(), rows, move |g, sel| by_rows(g, sel, false, false)));
        if tensor_cores_take(dt, hd) {
            // On the tensor cores, by tiles against the twin, each run also against the same rows
            // alone on the same executor, bit for bit.
            let tc = run.clone();
            cases.push(against_twin(format!("{label}, tensor cores"), rows, move |g, sel| {
                let (tiled, alone) = (tc(g, sel, true, true)?, tc(g, sel, false, true)?);
                if !tiled.iter().map(|v| v.to_bits()).eq(alone.iter().map(|v| v.to_bits())) {
                    return Err(lmplex_core::Error::internal("tensor cores: rows by tiles differ from rows alone"));
                }
                Ok(tiled)
            }));
        }
        // By tiles: the same bits as row by row, on the same kernels.
        let want = Gpu::emulated(lmplex_kernels::Order::Forward).and_then(|g| run(&g, None, false, false));
        let check = move |got: &[f32]| match &want {
            Ok(w) if w.iter().map(|v| v.to_bits()).eq(got.iter().map(|v| v.to_bits())) => Ok(0.0),
            Ok(_) => Err("the tiled pass differs from the row-by-row pass".to_string()),
            Err(e) => Err(format!("row by row: {e}")),
        };
        cases.push(Case {
            label: format!("{label}, by tiles of rows (bit for bit against row by row)"),
            rows,
            run: Box::new(move |g, sel| run(g, sel, true, false)),
            reference: Reference::Check(Box::new(check)),
        });
    }
    cases
}
