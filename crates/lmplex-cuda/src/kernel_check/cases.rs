//! The cases of every kernel instance: shapes that matter (head_dim 64/128/256, GQA ratios 1, 2,
//! 7 and 8, contexts that cross partitions and end mid-block, prefill rows mixed with decode
//! rows and a padding row, widths and vocabularies that are not a multiple of the block).

use super::{get, put, put_raw, Case, Reference, Rng};
use crate::dtype::Dt;
use crate::gpu::Gpu;
use crate::launch::*;
use lmplex_core::Result;

type Kernel = (String, f64, Vec<Case>);

const DTS: [Dt; 3] = [Dt::F32, Dt::F16, Dt::Bf16];

fn pick<T: Copy>(v: &[T], width: usize, sel: Option<usize>) -> Vec<T> {
    match sel {
        None => v.to_vec(),
        Some(r) => v[r * width..(r + 1) * width].to_vec(),
    }
}

fn twin(label: String, rows: usize, run: impl Fn(&Gpu, Option<usize>) -> Result<Vec<f32>> + 'static) -> Case {
    Case { label, rows, run: Box::new(run), reference: Reference::Twin }
}

fn embedding(dt: Dt) -> Vec<Case> {
    let mut cases = Vec::new();
    for hidden in [64, 300] {
        let mut rng = Rng::new(hidden as u64);
        let (vocab, table) = (50usize, rng.values(50 * hidden, 1.0, dt));
        let ids: Vec<u32> = vec![3, 49, 0, 53, 17, 3];
        cases.push(twin(format!("hidden {hidden}, an id past the vocabulary"), ids.len(), move |g, sel| {
            let ids = pick(&ids, 1, sel);
            let (t, i, out) = (put(g, dt, &table)?, put_raw(g, &ids)?, g.alloc(ids.len() * hidden * dt.size())?);
            Embedding { table: t.ptr, ids: i.ptr, out: out.ptr, hidden, vocab }.launch(g, dt, ids.len())?;
            get(g, dt, &out, ids.len() * hidden)
        }));
    }
    cases
}

fn fused_add_rmsnorm(dt: Dt) -> Vec<Case> {
    let mut cases = Vec::new();
    for (hidden, add, offset) in [(64, true, 0.0), (1000, false, 0.0), (4096, true, 1.0)] {
        let mut rng = Rng::new(hidden as u64 + 7);
        let rows = 5;
        let (x, res, w) =
            (rng.values(rows * hidden, 2.0, dt), rng.values(rows * hidden, 2.0, dt), rng.values(hidden, 1.0, dt));
        let label = format!("hidden {hidden}, add {add}, weight offset {offset}");
        cases.push(twin(label, rows, move |g, sel| {
            let n = sel.map_or(rows, |_| 1);
            let (xb, rb, wb) =
                (put(g, dt, &pick(&x, hidden, sel))?, put(g, dt, &pick(&res, hidden, sel))?, put(g, dt, &w)?);
            let out = g.alloc(n * hidden * dt.size())?;
            let (eps, weight_offset) = (1e-6, offset);
            FusedAddRmsnorm {
                x: xb.ptr,
                residual: rb.ptr,
                weight: wb.ptr,
                out: out.ptr,
                hidden,
                eps,
                weight_offset,
                add_residual: add,
            }
            .launch(g, dt, n)?;
            let (o, r) = (get(g, dt, &out, n * hidden)?, get(g, dt, &rb, n * hidden)?);
            Ok(o.chunks(hidden).zip(r.chunks(hidden)).flat_map(|(a, b)| a.iter().chain(b).copied()).collect())
        }));
    }
    cases
}

fn add_bias(dt: Dt) -> Vec<Case> {
    [192usize, 777]
        .into_iter()
        .map(|width| {
            let mut rng = Rng::new(width as u64);
            let (rows, x, b) = (4, rng.values(4 * width, 3.0, dt), rng.values(width, 1.0, dt));
            twin(format!("width {width}"), rows, move |g, sel| {
                let n = sel.map_or(rows, |_| 1);
                let (xb, bb) = (put(g, dt, &pick(&x, width, sel))?, put(g, dt, &b)?);
                AddBias { x: xb.ptr, bias: bb.ptr, width }.launch(g, dt, n)?;
                get(g, dt, &xb, n * width)
            })
        })
        .collect()
}

fn rmsnorm_heads(dt: Dt) -> Vec<Case> {
    [64usize, 128, 256]
        .into_iter()
        .map(|hd| {
            let mut rng = Rng::new(hd as u64 + 1);
            let (rows, heads) = (3, 3);
            let stride = (heads + 2) * hd;
            let (x, w) = (rng.values(rows * stride, 4.0, dt), rng.values(hd, 1.0, dt));
            twin(format!("head_dim {hd}, 3 heads from column {hd}"), rows, move |g, sel| {
                let n = sel.map_or(rows, |_| 1);
                let (xb, wb) = (put(g, dt, &pick(&x, stride, sel))?, put(g, dt, &w)?);
                let k =
                    RmsnormHeads { x: xb.ptr, weight: wb.ptr, row_stride: stride, col0: hd, head_dim: hd, eps: 1e-6 };
                k.launch(g, dt, n, heads)?;
                get(g, dt, &xb, n * stride)
            })
        })
        .collect()
}

fn rope(dt: Dt) -> Vec<Case> {
    let mut cases = Vec::new();
    for (hd, neox) in [(64usize, true), (128, false), (128, true)] {
        let mut rng = Rng::new(hd as u64 + neox as u64);
        let (rows, nq, nkv) = (4, 4, 2);
        let width = (nq + 2 * nkv) * hd;
        let x = rng.values(rows * width, 1.0, dt);
        let pos: Vec<i64> = (0..rows).map(|_| rng.below(5000) as i64).collect();
        let inv: Vec<f32> = (0..hd / 2).map(|i| 10000f32.powf(-2.0 * i as f32 / hd as f32)).collect();
        cases.push(twin(format!("head_dim {hd}, neox {neox}"), rows, move |g, sel| {
            let n = sel.map_or(rows, |_| 1);
            let (xb, pb, fb) =
                (put(g, dt, &pick(&x, width, sel))?, put_raw(g, &pick(&pos, 1, sel))?, put_raw(g, &inv)?);
            Rope {
                q: xb.ptr,
                k: xb.at(nq * hd * dt.size()),
                positions: pb.ptr,
                inv_freq: fb.ptr,
                num_q_heads: nq,
                num_kv_heads: nkv,
                head_dim: hd,
                rot_dim: hd,
                q_stride: width,
                k_stride: width,
                neox,
            }
            .launch(g, dt, n)?;
            get(g, dt, &xb, n * width)
        }));
    }
    cases
}

fn reshape_and_cache(dt: Dt) -> Vec<Case> {
    let mut rng = Rng::new(11);
    let (nkv, hd, rows, slots_total) = (2usize, 64usize, 5usize, 16usize);
    let width = 3 * nkv * hd;
    let x = rng.values(rows * width, 1.0, dt);
    let slots: Vec<i64> = vec![3, -1, 7, 0, 12];
    let label = "5 rows, one with slot -1 (padding)".to_string();
    vec![twin(label, 1, move |g, _| {
        let (xb, sb) = (put(g, dt, &x)?, put_raw(g, &slots)?);
        let (kc, vc) = (g.alloc(slots_total * nkv * hd * dt.size())?, g.alloc(slots_total * nkv * hd * dt.size())?);
        ReshapeAndCache {
            k: xb.ptr,
            v: xb.at(nkv * hd * dt.size()),
            k_cache: kc.ptr,
            v_cache: vc.ptr,
            slot_mapping: sb.ptr,
            num_kv_heads: nkv,
            head_dim: hd,
            k_stride: width,
            v_stride: width,
        }
        .launch(g, dt, rows)?;
        let n = slots_total * nkv * hd;
        Ok([get(g, dt, &kc, n)?, get(g, dt, &vc, n)?].concat())
    })]
}

fn paged_attention(dt: Dt) -> Vec<Case> {
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
        let run = move |g: &Gpu, sel: Option<usize>, tiled: bool| {
            let (seq, ctx) = (pick(&row_seq, 1, sel), pick(&row_ctx, 1, sel));
            let n = seq.len();
            let parts = (*ctx.iter().max().unwrap_or(&0) as usize).div_ceil(PARTITION).max(1);
            let (qb, kb, vb) = (put(g, dt, &pick(&q, width, sel))?, put(g, dt, &kc)?, put(g, dt, &vc)?);
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
            }
            .launch(g, dt, n)?;
            get(g, dt, &out, n * nq * hd)
        };
        let by_rows = run.clone();
        cases.push(twin(label.clone(), rows, move |g, sel| by_rows(g, sel, false)));
        // By tiles: the same bits as row by row, on the same kernels.
        let want = Gpu::emulated(lmplex_kernels::Order::Forward).and_then(|g| run(&g, None, false));
        let check = move |got: &[f32]| match &want {
            Ok(w) if w.iter().map(|v| v.to_bits()).eq(got.iter().map(|v| v.to_bits())) => Ok(0.0),
            Ok(_) => Err("the tiled pass differs from the row-by-row pass".to_string()),
            Err(e) => Err(format!("row by row: {e}")),
        };
        cases.push(Case {
            label: format!("{label}, by tiles of rows (bit for bit against row by row)"),
            rows,
            run: Box::new(move |g, sel| run(g, sel, true)),
            reference: Reference::Check(Box::new(check)),
        });
    }
    cases
}

fn silu_and_mul(dt: Dt) -> Vec<Case> {
    [96usize, 1000]
        .into_iter()
        .map(|inter| {
            let mut rng = Rng::new(inter as u64 + 3);
            let (rows, x) = (4, rng.values(4 * 2 * inter, 4.0, dt));
            twin(format!("inter {inter}"), rows, move |g, sel| {
                let n = sel.map_or(rows, |_| 1);
                let (xb, out) = (put(g, dt, &pick(&x, 2 * inter, sel))?, g.alloc(n * inter * dt.size())?);
                let (gate, up) = (xb.ptr, xb.at(inter * dt.size()));
                SiluAndMul { gate, up, out: out.ptr, inter, in_stride: 2 * inter }.launch(g, dt, n)?;
                get(g, dt, &out, n * inter)
            })
        })
        .collect()
}

pub(super) fn all(filter: &str) -> Vec<Kernel> {
    type Builder = fn(Dt) -> Vec<Case>;
    let typed: [(&str, Builder); 8] = [
        ("embedding", embedding),
        ("fused_add_rmsnorm", fused_add_rmsnorm),
        ("add_bias", add_bias),
        ("rmsnorm_heads", rmsnorm_heads),
        ("rope", rope),
        ("reshape_and_cache", reshape_and_cache),
        ("paged_attention", paged_attention),
        ("silu_and_mul", silu_and_mul),
    ];
    let mut out = Vec::new();
    let mut add = |name: String, tol: f64, build: &dyn Fn() -> Vec<Case>| {
        if name.contains(filter) {
            out.push((name, tol, build()));
        }
    };
    for (stem, build) in typed {
        for dt in DTS {
            add(format!("{stem}_{}", dt.suffix()), super::tolerance(dt), &|| build(dt));
        }
    }
    for format in QFormat::ALL {
        for dt in DTS {
            let (f, d, tol) = (format.suffix(), dt.suffix(), super::tolerance(dt));
            add(format!("qgemv_{f}_{d}"), tol, &|| super::quant::qgemv(format, dt));
            add(format!("qembedding_{f}_{d}"), tol, &|| super::quant::qembedding(format, dt));
        }
    }
    for dt in [Dt::F16, Dt::Bf16] {
        let (d, tol) = (dt.suffix(), super::tolerance(dt));
        add(format!("tgemm_dense_{d}"), tol, &|| super::quant::tgemm(None, dt));
        for format in QFormat::ALL {
            add(format!("tgemm_{}_{d}", format.suffix()), tol, &|| super::quant::tgemm(Some(format), dt));
        }
    }
    add("argmax_f32".into(), 0.0, &super::sampling::argmax);
    add("sample_f32".into(), 0.0, &super::sampling::sample);
    add("logit_edits_f32".into(), 0.0, &super::sampling::logit_edits);
    out
}
