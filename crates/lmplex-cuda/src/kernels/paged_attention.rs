//! `paged_attention.cu`: attention over the paged cache in two passes (partitions of keys, row
//! by row or by tiles of rows, then their combination), its twins and its cases.

use super::check::{against_twin, get, put, put_raw, rows_of, typed, Case, Instance, Reference, Rng, DTS};
use super::launch::{dim, int, name, HEAD_THREADS};
use super::Kernel;
use crate::dtype::Dt;
use crate::exec::Arg::{F, P};
use crate::gpu::Gpu;
use crate::hostexec::{bad, HostExec, Traffic, TwinCall};
use lmplex_core::Result;

pub(super) const KERNEL: Kernel = Kernel {
    entries: &[
        ("paged_attention_partition", partition, partition_traffic),
        ("paged_attention_tiles", partition, partition_traffic),
        ("paged_attention_reduce", reduce, reduce_traffic),
    ],
    checks,
};

/// Keys per attention partition (`PARTITION` in paged_attention.cu).
pub const PARTITION: usize = 512;
/// Most rows of one attention tile (`TILE_ROWS` in paged_attention.cu).
pub const TILE_ROWS: usize = 8;

/// Paged attention of `rows` query rows over the cache, both passes: partitions of `PARTITION`
/// keys into the f32 scratch (`part_out`, `part_max`, `part_sum`), then their combination.
pub struct PagedAttention {
    pub q: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    /// `u32[num_seqs, max_blocks_per_seq]`.
    pub block_tables: u64,
    /// `u32[rows]`: each row's sequence (its block-table row).
    pub row_seq: u64,
    /// `u32[rows]`: how many positions each row attends to.
    pub row_ctx: u64,
    pub part_out: u64,
    pub part_max: u64,
    pub part_sum: u64,
    pub out: u64,
    pub scale: f32,
    pub num_q_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub max_blocks_per_seq: usize,
    /// Partitions per row in the scratch: at least `ceil(max row_ctx / PARTITION)`.
    pub max_partitions: usize,
    pub q_stride: usize,
    /// The first pass by tiles of rows of one sequence (`paged_attention_tiles`, the same bits):
    /// the address of `(first row, rows)` u32 pairs, their count, and the row the launch's
    /// row 0 is in their numbering; `None` runs it row by row.
    pub tiles: Option<(u64, usize, usize)>,
}

impl PagedAttention {
    pub fn launch(&self, g: &Gpu, dt: Dt, rows: usize) -> Result<()> {
        let (h, r) = (dim(self.num_q_heads)?, dim(rows)?);
        let args = [
            P(self.q),
            P(self.k_cache),
            P(self.v_cache),
            P(self.block_tables),
            P(self.row_seq),
            P(self.row_ctx),
            P(self.part_out),
            P(self.part_max),
            P(self.part_sum),
            F(self.scale),
            int(self.num_q_heads)?,
            int(self.num_kv_heads)?,
            int(self.head_dim)?,
            int(self.block_size)?,
            int(self.max_blocks_per_seq)?,
            int(self.max_partitions)?,
            int(self.q_stride)?,
        ];
        let parts = dim(self.max_partitions)?;
        match self.tiles {
            None => g.launch(&name("paged_attention_partition", dt), (h, r, parts), HEAD_THREADS, &args)?,
            Some((tiles, n, row0)) => {
                let mut args = args.to_vec();
                args.extend([P(tiles), int(row0)?]);
                g.launch(&name("paged_attention_tiles", dt), (h, dim(n)?, parts), HEAD_THREADS, &args)?
            }
        }
        let args = [
            P(self.part_out),
            P(self.part_max),
            P(self.part_sum),
            P(self.row_ctx),
            P(self.out),
            int(self.num_q_heads)?,
            int(self.head_dim)?,
            int(self.max_partitions)?,
        ];
        g.launch(&name("paged_attention_reduce", dt), (h, r, 1), HEAD_THREADS, &args)
    }
}

/// The first pass's units of work: its rows one by one (`paged_attention_partition`, grid.1
/// rows), or its tiles of rows of one sequence (`paged_attention_tiles`, grid.1 tiles), as
/// rows of the launch; the argument count checked.
fn units(h: &HostExec, c: &TwinCall) -> Result<Vec<std::ops::Range<usize>>> {
    let a = &c.args;
    if c.stem != "paged_attention_tiles" {
        a.count(17)?;
        return Ok((0..c.grid.1 as usize).map(|r| r..r + 1).collect());
    }
    a.count(19)?;
    let (pairs, row0) = (h.rd_u32(a.p(17)?, 2 * c.grid.1 as usize)?, a.n(18)?);
    let first = |p: &[u32]| (p[0] as usize).checked_sub(row0).ok_or_else(|| bad("a tile before row 0"));
    pairs.chunks_exact(2).map(|p| Ok(first(p)?..first(p)? + p[1] as usize)).collect()
}

/// Partitions of a row attending to `ctx` positions.
fn partitions(ctx: usize) -> usize {
    ctx.div_ceil(PARTITION)
}

/// Each unit (`units`) reads the K and V of the positions its rows attend to (its longest
/// row's) once per KV head; each row reads its q and writes its partitions' partial sums; the
/// products are 4 · context · head_dim per row and q head.
fn partition_traffic(h: &HostExec, c: &TwinCall) -> Result<Traffic> {
    let (a, s) = (&c.args, c.dt.size());
    let (nq, nkv, hd) = (a.n(10)?, a.n(11)?, a.n(12)?);
    let units = units(h, c)?;
    let n = units.iter().map(|u| u.end).max().unwrap_or(0);
    let ctx = h.rd_u32(a.p(5)?, n)?;
    let mut t = Traffic::default();
    for u in units {
        let longest = ctx[u.clone()].iter().copied().max().unwrap_or(0) as usize;
        t.bytes += (longest * nkv * hd * 2 * s) as u64;
        for &c in &ctx[u] {
            let c = c as usize;
            t.bytes += (nq * hd * s + nq * partitions(c) * (hd + 2) * 4 + 8) as u64;
            t.flops += (4 * c * hd * nq) as u64;
        }
    }
    Ok(t)
}

/// Each row's partial sums read and its output written.
fn reduce_traffic(h: &HostExec, c: &TwinCall) -> Result<Traffic> {
    let (a, s) = (&c.args, c.dt.size());
    let (nq, hd) = (a.n(5)?, a.n(6)?);
    let ctx = h.rd_u32(a.p(3)?, c.grid.1 as usize)?;
    let bytes: usize = ctx.iter().map(|&c| nq * partitions(c as usize) * (hd + 2) * 4 + nq * hd * s + 4).sum();
    Ok(Traffic::moves(bytes))
}

/// `paged_attention_partition` (grid.1 rows) or `paged_attention_tiles` (grid.1 tiles of rows,
/// each row computed as the partition kernel computes it).
fn partition(h: &HostExec, c: &TwinCall) -> Result<()> {
    let (a, dt, grid) = (&c.args, c.dt, c.grid);
    let rows: Vec<usize> = units(h, c)?.into_iter().flatten().collect();
    let scale = a.f(9)?;
    let (nq, nkv, hd, bs) = (a.n(10)?, a.n(11)?, a.n(12)?, a.n(13)?);
    let (max_blocks, parts, q_stride) = (a.n(14)?, a.n(15)?, a.n(16)?);
    let n = rows.iter().max().map_or(0, |r| r + 1);
    let (row_elems, seqs, ctxs) = (nkv * hd, h.rd_u32(a.p(4)?, n)?, h.rd_u32(a.p(5)?, n)?);
    for r in rows {
        let ctx = ctxs[r] as usize;
        let table = h.rd_u32(a.p(3)? + (seqs[r] as usize * max_blocks * 4) as u64, max_blocks)?;
        for head in 0..nq {
            let q = h.rd(a.p(0)? + ((r * q_stride + head * hd) * dt.size()) as u64, dt, hd)?;
            let kvh = head / (nq / nkv);
            for p in 0..grid.2 as usize {
                let (start, end) = (p * PARTITION, ctx.min((p + 1) * PARTITION));
                if start >= ctx {
                    continue;
                }
                let slot = |t: usize| (table[t / bs] as usize * bs + t % bs) * row_elems + kvh * hd;
                let mut scores = Vec::with_capacity(end - start);
                for t in start..end {
                    let k = h.rd(a.p(1)? + (slot(t) * dt.size()) as u64, dt, hd)?;
                    scores.push(q.iter().zip(&k).map(|(a, b)| a * b).sum::<f32>() * scale);
                }
                let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                scores.iter_mut().for_each(|s| *s = (*s - m).exp());
                let mut acc = vec![0f32; hd];
                for (i, t) in (start..end).enumerate() {
                    let v = h.rd(a.p(2)? + (slot(t) * dt.size()) as u64, dt, hd)?;
                    acc.iter_mut().zip(&v).for_each(|(o, v)| *o += scores[i] * v);
                }
                let o = (r * nq + head) * parts + p;
                h.wr(a.p(6)? + (o * hd * 4) as u64, Dt::F32, &acc)?;
                h.wr(a.p(7)? + (o * 4) as u64, Dt::F32, &[m])?;
                h.wr(a.p(8)? + (o * 4) as u64, Dt::F32, &[scores.iter().sum()])?;
            }
        }
    }
    Ok(())
}

/// `paged_attention_reduce`: each row's partitions combined (grid.1 rows).
fn reduce(h: &HostExec, c: &TwinCall) -> Result<()> {
    let (a, dt) = (&c.args, c.dt);
    a.count(8)?;
    let (nq, hd, parts) = (a.n(5)?, a.n(6)?, a.n(7)?);
    let ctxs = h.rd_u32(a.p(3)?, c.grid.1 as usize)?;
    for (r, &ctx) in ctxs.iter().enumerate() {
        let n = partitions(ctx as usize);
        for head in 0..nq {
            let base = (r * nq + head) * parts;
            let pm = h.rd(a.p(1)? + (base * 4) as u64, Dt::F32, n)?;
            let ps = h.rd(a.p(2)? + (base * 4) as u64, Dt::F32, n)?;
            let m = pm.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let l: f32 = ps.iter().zip(&pm).map(|(s, x)| s * (x - m).exp()).sum();
            let mut out = vec![0f32; hd];
            for (p, &mp) in pm.iter().enumerate() {
                let po = h.rd(a.p(0)? + ((base + p) * hd * 4) as u64, Dt::F32, hd)?;
                out.iter_mut().zip(&po).for_each(|(o, v)| *o += v * (mp - m).exp());
            }
            out.iter_mut().for_each(|o| *o = if n > 0 { *o / l } else { 0.0 });
            h.wr(a.p(4)? + ((r * nq + head) * hd * dt.size()) as u64, dt, &out)?;
        }
    }
    Ok(())
}

/// The three entry points are launched, and checked, together as `paged_attention_<dtype>`.
fn checks(filter: &str) -> Vec<Instance> {
    typed("paged_attention", filter, &DTS, cases)
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
        let run = move |g: &Gpu, sel: Option<usize>, tiled: bool| {
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
            }
            .launch(g, dt, n)?;
            get(g, dt, &out, n * nq * hd)
        };
        let by_rows = run.clone();
        cases.push(against_twin(label.clone(), rows, move |g, sel| by_rows(g, sel, false)));
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
