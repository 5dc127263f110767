//! `paged_attention.cu`: attention over the paged cache in two passes (partitions of keys, row
//! by row or by tiles of rows, then their combination), or in one when every row's context fits
//! one partition (`one_pass`, the fused path), its twins; its cases are `cases.rs`'s.

use super::launch::{dim, int, name, HEAD_THREADS};
use super::Kernel;
use crate::dtype::Dt;
use crate::exec::Arg::{F, I, P};
use crate::gpu::Gpu;
use crate::hostexec::{bad, HostExec, Traffic, TwinCall};
use lmplex_core::Result;

mod cases;
use cases::checks;

pub(super) const KERNEL: Kernel = Kernel {
    entries: &[
        ("paged_attention_partition", partition, partition_traffic),
        ("paged_attention_tiles", partition, partition_traffic),
        ("paged_attention_partition_one", partition, partition_traffic),
        ("paged_attention_tiles_one", partition, partition_traffic),
        ("paged_attention_tc", partition, partition_traffic),
        ("paged_attention_tc_one", partition, partition_traffic),
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
    /// The first pass writes `out` itself and the second is not launched (`_one` entry points,
    /// the same bits); only when `max_partitions` is 1.
    pub one_pass: bool,
    /// The first pass on the tensor cores (`paged_attention_tc`, `TensorAttention`): by `tiles`,
    /// or each row alone without them (the same bits either way); f16 and bf16 only.
    pub tensor_cores: bool,
}

/// Whether the tensor-core first pass takes `head_dim` in `dt` (`paged_attention.cu`'s `attn_tc`).
pub fn tensor_cores_take(dt: Dt, head_dim: usize) -> bool {
    dt != Dt::F32 && head_dim.is_multiple_of(16) && head_dim <= 128
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
        if self.one_pass && self.max_partitions != 1 {
            return Err(lmplex_core::Error::internal("one-pass attention over more than one partition"));
        }
        let (one, mut args) = (if self.one_pass { "_one" } else { "" }, args.to_vec());
        if self.tensor_cores && !tensor_cores_take(dt, self.head_dim) {
            return Err(lmplex_core::Error::internal("tensor-core attention takes f16 or bf16 and head_dim <= 128"));
        }
        let grid = match (self.tiles, self.tensor_cores) {
            (None, false) => (h, r, parts),
            (None, true) => {
                args.extend([P(0), I(0)]);
                (h, r, parts)
            }
            (Some((tiles, n, row0)), _) => {
                args.extend([P(tiles), int(row0)?]);
                (h, dim(n)?, parts)
            }
        };
        let stem = match (self.tensor_cores, self.tiles.is_some()) {
            (true, _) => "paged_attention_tc",
            (false, true) => "paged_attention_tiles",
            (false, false) => "paged_attention_partition",
        };
        if self.one_pass {
            args.push(P(self.out));
        }
        g.launch(&name(&format!("{stem}{one}"), dt), grid, HEAD_THREADS, &args)?;
        if self.one_pass {
            return Ok(());
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
    a.count(17 + 2 * tiled(c) as usize + one_pass(c) as usize)?;
    if !tiled(c) || a.p(17)? == 0 {
        return Ok((0..c.grid.1 as usize).map(|r| r..r + 1).collect());
    }
    let (pairs, row0) = (h.rd_u32(a.p(17)?, 2 * c.grid.1 as usize)?, a.n(18)?);
    let first = |p: &[u32]| (p[0] as usize).checked_sub(row0).ok_or_else(|| bad("a tile before row 0"));
    pairs.chunks_exact(2).map(|p| Ok(first(p)?..first(p)? + p[1] as usize)).collect()
}

/// Whether the launch takes a tile list (`paged_attention_tiles` and `paged_attention_tc`, `_one`
/// or not; the tensor-core pass's may be null: each row alone).
fn tiled(c: &TwinCall) -> bool {
    c.stem.starts_with("paged_attention_tiles") || c.stem.starts_with("paged_attention_tc")
}

/// Whether the launch writes the output itself (`_one`); its address is the last argument.
fn one_pass(c: &TwinCall) -> bool {
    c.stem.ends_with("_one")
}

/// Partitions of a row attending to `ctx` positions.
fn partitions(ctx: usize) -> usize {
    ctx.div_ceil(PARTITION)
}

/// Each unit (`units`) reads the K and V of the positions its rows attend to (its longest
/// row's) once per KV head; each row reads its q and writes its partitions' partial sums (in one
/// pass, its output); the products are 4 · context · head_dim per row and q head.
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
        for &x in &ctx[u] {
            let x = x as usize;
            let written = if one_pass(c) { nq * hd * s } else { nq * partitions(x) * (hd + 2) * 4 };
            t.bytes += (nq * hd * s + written + 8) as u64;
            t.flops += (4 * x * hd * nq) as u64;
        }
    }
    t.tensor_cores = c.stem.starts_with("paged_attention_tc");
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
/// each row computed as the partition kernel computes it); the `_one` entry points write each
/// row's output from its one partition as `reduce` would (0 for a row attending to nothing).
fn partition(h: &HostExec, c: &TwinCall) -> Result<()> {
    let (a, dt, grid) = (&c.args, c.dt, c.grid);
    let rows: Vec<usize> = units(h, c)?.into_iter().flatten().collect();
    let scale = a.f(9)?;
    let (nq, nkv, hd, bs) = (a.n(10)?, a.n(11)?, a.n(12)?, a.n(13)?);
    let (max_blocks, parts, q_stride) = (a.n(14)?, a.n(15)?, a.n(16)?);
    let n = rows.iter().max().map_or(0, |r| r + 1);
    let (row_elems, seqs, ctxs) = (nkv * hd, h.rd_u32(a.p(4)?, n)?, h.rd_u32(a.p(5)?, n)?);
    let out = match one_pass(c) {
        true => Some(a.p(a.0.len() - 1)?),
        false => None,
    };
    for r in rows {
        let ctx = ctxs[r] as usize;
        let table = h.rd_u32(a.p(3)? + (seqs[r] as usize * max_blocks * 4) as u64, max_blocks)?;
        for head in 0..nq {
            let q = h.rd(a.p(0)? + ((r * q_stride + head * hd) * dt.size()) as u64, dt, hd)?;
            let kvh = head / (nq / nkv);
            if let (Some(out), 0) = (out, ctx) {
                h.wr(out + ((r * nq + head) * hd * dt.size()) as u64, dt, &vec![0.0; hd])?;
            }
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
                if let Some(out) = out {
                    let l: f32 = scores.iter().sum();
                    let o: Vec<f32> = acc.iter().map(|v| v / l).collect();
                    h.wr(out + ((r * nq + head) * hd * dt.size()) as u64, dt, &o)?;
                    continue;
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
