//! The dense kernels' twins, and `HostExec::launch`, which runs a kernel's twin by name (the
//! sampling twins are `super::pick`'s, the GGUF-block ones `super::quant`'s).

use super::{bad, Args, HostExec};
use crate::dtype::Dt;
use crate::exec::Arg;
use lmplex_core::Result;

impl HostExec {
    /// Runs kernel `name`'s twin over `grid`.
    pub fn launch(&self, name: &str, grid: (u32, u32, u32), args: &[Arg]) -> Result<()> {
        if name == "argmax_f32" || name == "sample_f32" || name == "logit_edits_f32" {
            return super::pick::twin(self, name, &Args(args), grid.0 as usize);
        }
        let (stem, dt) = [("_f32", Dt::F32), ("_f16", Dt::F16), ("_bf16", Dt::Bf16)]
            .iter()
            .find_map(|(s, dt)| name.strip_suffix(s).map(|stem| (stem, *dt)))
            .ok_or_else(|| bad(format!("no twin for kernel '{name}'")))?;
        let a = Args(args);
        let rows = grid.0 as usize;
        match stem {
            "embedding" => self.embedding(&a, dt, rows),
            "fused_add_rmsnorm" => self.fused_add_rmsnorm(&a, dt, rows),
            "add_bias" => {
                a.count(3)?;
                let (x, b, width) = (a.p(0)?, self.rd(a.p(1)?, dt, a.n(2)?)?, a.n(2)?);
                let mut v = self.rd(x, dt, rows * width)?;
                v.iter_mut().enumerate().for_each(|(i, e)| *e += b[i % width]);
                self.wr(x, dt, &v)
            }
            "rmsnorm_heads" => self.rmsnorm_heads(&a, dt, rows, grid.1 as usize),
            "rope" => self.rope(&a, dt, rows),
            "reshape_and_cache" => self.reshape_and_cache(&a, dt, rows),
            "silu_and_mul" => {
                a.count(5)?;
                let (inter, stride) = (a.n(3)?, a.n(4)?);
                for t in 0..rows {
                    let g = self.rd(a.p(0)? + (t * stride * dt.size()) as u64, dt, inter)?;
                    let u = self.rd(a.p(1)? + (t * stride * dt.size()) as u64, dt, inter)?;
                    let o: Vec<f32> = g.iter().zip(&u).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
                    self.wr(a.p(2)? + (t * inter * dt.size()) as u64, dt, &o)?;
                }
                Ok(())
            }
            "paged_attention_partition" => self.attn_partition(&a, dt, grid, false),
            "paged_attention_tiles" => self.attn_partition(&a, dt, grid, true),
            "paged_attention_reduce" => self.attn_reduce(&a, dt, grid),
            s if s.starts_with("qgemv_") || s.starts_with("qembedding_") || s.starts_with("tgemm_") => {
                super::quant::twin(self, s, &a, dt, rows)
            }
            _ => Err(bad(format!("no twin for kernel '{name}'"))),
        }
    }

    fn embedding(&self, a: &Args, dt: Dt, rows: usize) -> Result<()> {
        a.count(5)?;
        let (table, hidden, vocab) = (a.p(0)?, a.n(3)?, a.n(4)?);
        let ids = self.rd_u32(a.p(1)?, rows)?;
        for (t, &id) in ids.iter().enumerate() {
            let row = if (id as usize) < vocab {
                self.rd(table + (id as usize * hidden * dt.size()) as u64, dt, hidden)?
            } else {
                vec![0.0; hidden]
            };
            self.wr(a.p(2)? + (t * hidden * dt.size()) as u64, dt, &row)?;
        }
        Ok(())
    }

    fn fused_add_rmsnorm(&self, a: &Args, dt: Dt, rows: usize) -> Result<()> {
        a.count(8)?;
        let (hidden, eps, offset, add) = (a.n(4)?, a.f(5)?, a.f(6)?, a.n(7)? != 0);
        let w = self.rd(a.p(2)?, dt, hidden)?;
        for t in 0..rows {
            let at = (t * hidden * dt.size()) as u64;
            let mut h = self.rd(a.p(0)? + at, dt, hidden)?;
            if add {
                let r = self.rd(a.p(1)? + at, dt, hidden)?;
                h.iter_mut().zip(&r).for_each(|(h, r)| *h += r);
            }
            let hs = dt.decode(&dt.encode(&h));
            self.wr(a.p(1)? + at, dt, &hs)?;
            let ss: f32 = hs.iter().map(|v| v * v).sum();
            let scale = 1.0 / (ss / hidden as f32 + eps).sqrt();
            let out: Vec<f32> = hs.iter().zip(&w).map(|(h, w)| h * scale * (w + offset)).collect();
            self.wr(a.p(3)? + at, dt, &out)?;
        }
        Ok(())
    }

    fn rmsnorm_heads(&self, a: &Args, dt: Dt, rows: usize, heads: usize) -> Result<()> {
        a.count(6)?;
        let (stride, col0, hd, eps) = (a.n(2)?, a.n(3)?, a.n(4)?, a.f(5)?);
        let w = self.rd(a.p(1)?, dt, hd)?;
        for t in 0..rows {
            for h in 0..heads {
                let at = a.p(0)? + ((t * stride + col0 + h * hd) * dt.size()) as u64;
                let v = self.rd(at, dt, hd)?;
                let ss: f32 = v.iter().map(|x| x * x).sum();
                let scale = 1.0 / (ss / hd as f32 + eps).sqrt();
                self.wr(at, dt, &v.iter().zip(&w).map(|(x, w)| x * scale * w).collect::<Vec<_>>())?;
            }
        }
        Ok(())
    }

    fn rope(&self, a: &Args, dt: Dt, rows: usize) -> Result<()> {
        a.count(11)?;
        let (nq, nkv, hd, rot) = (a.n(4)?, a.n(5)?, a.n(6)?, a.n(7)?);
        let (qs, ks, neox) = (a.n(8)?, a.n(9)?, a.n(10)? != 0);
        let pos = self.rd_i64(a.p(2)?, rows)?;
        let inv = self.rd(a.p(3)?, Dt::F32, rot / 2)?;
        for (t, &p) in pos.iter().enumerate() {
            for head in 0..nq + nkv {
                let at = if head < nq {
                    a.p(0)? + ((t * qs + head * hd) * dt.size()) as u64
                } else {
                    a.p(1)? + ((t * ks + (head - nq) * hd) * dt.size()) as u64
                };
                let mut v = self.rd(at, dt, hd)?;
                for (i, f) in inv.iter().enumerate() {
                    let (s, c) = (p as f32 * f).sin_cos();
                    let (ia, ib) = if neox { (i, i + rot / 2) } else { (2 * i, 2 * i + 1) };
                    let (x, y) = (v[ia], v[ib]);
                    v[ia] = x * c - y * s;
                    v[ib] = y * c + x * s;
                }
                self.wr(at, dt, &v)?;
            }
        }
        Ok(())
    }

    fn reshape_and_cache(&self, a: &Args, dt: Dt, rows: usize) -> Result<()> {
        a.count(9)?;
        let (nkv, hd, ks, vs) = (a.n(5)?, a.n(6)?, a.n(7)?, a.n(8)?);
        let n = nkv * hd;
        let slots = self.rd_i64(a.p(4)?, rows)?;
        for (t, &slot) in slots.iter().enumerate() {
            if slot < 0 {
                continue;
            }
            let k = self.rd(a.p(0)? + (t * ks * dt.size()) as u64, dt, n)?;
            let v = self.rd(a.p(1)? + (t * vs * dt.size()) as u64, dt, n)?;
            self.wr(a.p(2)? + (slot as usize * n * dt.size()) as u64, dt, &k)?;
            self.wr(a.p(3)? + (slot as usize * n * dt.size()) as u64, dt, &v)?;
        }
        Ok(())
    }

    /// `paged_attention_partition` (`tiles` false: grid.1 rows) or `paged_attention_tiles`
    /// (grid.1 tiles of rows, each row computed as the partition kernel computes it).
    fn attn_partition(&self, a: &Args, dt: Dt, grid: (u32, u32, u32), tiles: bool) -> Result<()> {
        a.count(if tiles { 19 } else { 17 })?;
        let rows: Vec<usize> = if tiles {
            let (pairs, row0) = (self.rd_u32(a.p(17)?, 2 * grid.1 as usize)?, a.n(18)?);
            let first = |p: &[u32]| (p[0] as usize).checked_sub(row0).ok_or_else(|| bad("a tile before row 0"));
            let spans = pairs.chunks_exact(2).map(|p| Ok(first(p)?..first(p)? + p[1] as usize));
            spans.collect::<Result<Vec<_>>>()?.into_iter().flatten().collect()
        } else {
            (0..grid.1 as usize).collect()
        };
        let scale = a.f(9)?;
        let (nq, nkv, hd, bs) = (a.n(10)?, a.n(11)?, a.n(12)?, a.n(13)?);
        let (max_blocks, parts, q_stride) = (a.n(14)?, a.n(15)?, a.n(16)?);
        let n = rows.iter().max().map_or(0, |r| r + 1);
        let (row_elems, seqs, ctxs) = (nkv * hd, self.rd_u32(a.p(4)?, n)?, self.rd_u32(a.p(5)?, n)?);
        for r in rows {
            let ctx = ctxs[r] as usize;
            let table = self.rd_u32(a.p(3)? + (seqs[r] as usize * max_blocks * 4) as u64, max_blocks)?;
            for h in 0..nq {
                let q = self.rd(a.p(0)? + ((r * q_stride + h * hd) * dt.size()) as u64, dt, hd)?;
                let kvh = h / (nq / nkv);
                for p in 0..grid.2 as usize {
                    let (start, end) = (p * 512, ctx.min(p * 512 + 512));
                    if start >= ctx {
                        continue;
                    }
                    let slot = |t: usize| (table[t / bs] as usize * bs + t % bs) * row_elems + kvh * hd;
                    let mut scores = Vec::with_capacity(end - start);
                    for t in start..end {
                        let k = self.rd(a.p(1)? + (slot(t) * dt.size()) as u64, dt, hd)?;
                        scores.push(q.iter().zip(&k).map(|(a, b)| a * b).sum::<f32>() * scale);
                    }
                    let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    scores.iter_mut().for_each(|s| *s = (*s - m).exp());
                    let mut acc = vec![0f32; hd];
                    for (i, t) in (start..end).enumerate() {
                        let v = self.rd(a.p(2)? + (slot(t) * dt.size()) as u64, dt, hd)?;
                        acc.iter_mut().zip(&v).for_each(|(o, v)| *o += scores[i] * v);
                    }
                    let o = (r * nq + h) * parts + p;
                    self.wr(a.p(6)? + (o * hd * 4) as u64, Dt::F32, &acc)?;
                    self.wr(a.p(7)? + (o * 4) as u64, Dt::F32, &[m])?;
                    self.wr(a.p(8)? + (o * 4) as u64, Dt::F32, &[scores.iter().sum()])?;
                }
            }
        }
        Ok(())
    }

    fn attn_reduce(&self, a: &Args, dt: Dt, grid: (u32, u32, u32)) -> Result<()> {
        a.count(8)?;
        let (nq, hd, parts) = (a.n(5)?, a.n(6)?, a.n(7)?);
        let rows = grid.1 as usize;
        let ctxs = self.rd_u32(a.p(3)?, rows)?;
        for (r, &ctx) in ctxs.iter().enumerate() {
            let n = (ctx as usize).div_ceil(512);
            for h in 0..nq {
                let base = (r * nq + h) * parts;
                let pm = self.rd(a.p(1)? + (base * 4) as u64, Dt::F32, n)?;
                let ps = self.rd(a.p(2)? + (base * 4) as u64, Dt::F32, n)?;
                let m = pm.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let l: f32 = ps.iter().zip(&pm).map(|(s, x)| s * (x - m).exp()).sum();
                let mut out = vec![0f32; hd];
                for (p, &mp) in pm.iter().enumerate() {
                    let po = self.rd(a.p(0)? + ((base + p) * hd * 4) as u64, Dt::F32, hd)?;
                    out.iter_mut().zip(&po).for_each(|(o, v)| *o += v * (mp - m).exp());
                }
                out.iter_mut().for_each(|o| *o = if n > 0 { *o / l } else { 0.0 });
                self.wr(a.p(4)? + ((r * nq + h) * hd * dt.size()) as u64, dt, &out)?;
            }
        }
        Ok(())
    }
}
