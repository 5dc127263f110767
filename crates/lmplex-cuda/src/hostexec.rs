//! The host executor: each kernel's CPU twin, run by name with the same argument list on a
//! host arena addressed like device memory, plus a reference GEMM.
//!
//! Purpose: `Gpu::host()` runs the whole CUDA forward pass (`forward.rs`) without a GPU, so its
//! orchestration (buffer sizes, byte offsets, strides, argument order, the GEMM's row-major
//! layout, padding rows) is checked against the CPU model in `cargo test` on any machine. The
//! kernels themselves are checked on the device against NumPy (`tests/gpu`).
//!
//! Invariants: every twin follows its `.cu` file line by line (same storage rounding: values are
//! rounded to the storage type exactly where the kernel's `from_f32` stores them); addresses
//! start at `BASE`, so a null or stray pointer is an error, as is any access outside the arena
//! or an argument of the wrong kind; nothing here panics on bad input.

use crate::dtype::Dt;
use crate::gpu::Arg;
use lmplex_core::{Error, Result};
use std::sync::Mutex;

const BASE: u64 = 1 << 40;
const ALIGN: usize = 256;

#[derive(Default)]
pub struct HostExec {
    mem: Mutex<Arena>,
}

/// Host memory addressed like device memory: 16-byte-aligned words viewed as `len` bytes, so a
/// kernel compiled for the CPU may read any type through an address the backend hands it.
#[derive(Default)]
struct Arena {
    words: Vec<u128>,
    len: usize,
}

impl Arena {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `words` holds at least `len` initialised bytes; u8 has no alignment needs.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), self.len) }
    }
    fn grow(&mut self, len: usize) {
        self.words.resize(len.div_ceil(16), 0);
        self.len = len;
    }
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::internal(format!("host executor: {what}"))
}

/// Typed access to a kernel's argument list.
pub(crate) struct Args<'a>(pub(crate) &'a [Arg]);

impl Args<'_> {
    pub(crate) fn p(&self, i: usize) -> Result<u64> {
        match self.0.get(i) {
            Some(Arg::P(p)) => Ok(*p),
            other => Err(bad(format!("argument {i} should be a pointer, is {other:?}"))),
        }
    }
    pub(crate) fn n(&self, i: usize) -> Result<usize> {
        match self.0.get(i) {
            Some(Arg::I(v)) if *v >= 0 => Ok(*v as usize),
            other => Err(bad(format!("argument {i} should be a non-negative int, is {other:?}"))),
        }
    }
    pub(crate) fn f(&self, i: usize) -> Result<f32> {
        match self.0.get(i) {
            Some(Arg::F(v)) => Ok(*v),
            other => Err(bad(format!("argument {i} should be a float, is {other:?}"))),
        }
    }
    pub(crate) fn count(&self, n: usize) -> Result<()> {
        if self.0.len() == n {
            Ok(())
        } else {
            Err(bad(format!("{} arguments where the kernel takes {n}", self.0.len())))
        }
    }
}

impl HostExec {
    pub fn alloc(&self, bytes: usize) -> u64 {
        let mut m = self.mem.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let at = m.len.next_multiple_of(ALIGN);
        m.grow(at + bytes);
        BASE + at as u64
    }

    fn range(&self, ptr: u64, len: usize, size: usize) -> Result<std::ops::Range<usize>> {
        let start = ptr.checked_sub(BASE).ok_or_else(|| bad(format!("address {ptr:#x} below the arena")))? as usize;
        match start.checked_add(len) {
            Some(end) if end <= size => Ok(start..end),
            _ => Err(bad(format!("access of {len} bytes at {ptr:#x} outside the arena"))),
        }
    }

    pub fn write_bytes(&self, dst: u64, src: &[u8]) -> Result<()> {
        let mut m = self.mem.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let r = self.range(dst, src.len(), m.len)?;
        m.bytes_mut()[r].copy_from_slice(src);
        Ok(())
    }

    pub fn read_bytes(&self, dst: &mut [u8], src: u64) -> Result<()> {
        let m = self.mem.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let r = self.range(src, dst.len(), m.len)?;
        dst.copy_from_slice(&m.bytes()[r]);
        Ok(())
    }

    /// Runs `f` with the arena locked: a translation of device addresses to host pointers (an
    /// error for one outside the arena), valid only during `f`.
    pub fn with_host_pointers<R>(&self, f: impl FnOnce(&dyn Fn(u64) -> Result<*mut u8>) -> Result<R>) -> Result<R> {
        let mut m = self.mem.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let len = m.len;
        let base = m.bytes_mut().as_mut_ptr();
        let translate = |p: u64| -> Result<*mut u8> {
            let off = self.range(p, 0, len)?.start;
            // SAFETY: `off <= len`, inside (or one past) the arena's allocation.
            Ok(unsafe { base.add(off) })
        };
        f(&translate)
    }

    pub(crate) fn rd(&self, ptr: u64, dt: Dt, n: usize) -> Result<Vec<f32>> {
        let mut b = vec![0u8; n * dt.size()];
        self.read_bytes(&mut b, ptr)?;
        Ok(dt.decode(&b))
    }

    pub(crate) fn wr(&self, ptr: u64, dt: Dt, x: &[f32]) -> Result<()> {
        self.write_bytes(ptr, &dt.encode(x))
    }

    pub(crate) fn rd_u32(&self, ptr: u64, n: usize) -> Result<Vec<u32>> {
        let mut b = vec![0u8; n * 4];
        self.read_bytes(&mut b, ptr)?;
        Ok(b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }

    pub(crate) fn rd_i64(&self, ptr: u64, n: usize) -> Result<Vec<i64>> {
        let mut b = vec![0u8; n * 8];
        self.read_bytes(&mut b, ptr)?;
        Ok(b.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect())
    }

    /// `y[rows, n] = x[rows, k] · w[n, k]ᵀ`, f32 accumulation in index order.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm(&self, x: u64, w: u64, y: u64, rows: usize, n: usize, k: usize, dt: Dt, out: Dt) -> Result<()> {
        let (xv, wv) = (self.rd(x, dt, rows * k)?, self.rd(w, dt, n * k)?);
        let mut yv = vec![0f32; rows * n];
        for (r, yr) in yv.chunks_exact_mut(n).enumerate() {
            let xr = &xv[r * k..(r + 1) * k];
            for (j, o) in yr.iter_mut().enumerate() {
                *o = xr.iter().zip(&wv[j * k..(j + 1) * k]).map(|(a, b)| a * b).sum();
            }
        }
        self.wr(y, out, &yv)
    }

    /// Runs kernel `name`'s twin over `grid`.
    pub fn launch(&self, name: &str, grid: (u32, u32, u32), args: &[Arg]) -> Result<()> {
        if name == "argmax_f32" || name == "sample_f32" || name == "logit_edits_f32" {
            return crate::hostpick::twin(self, name, &Args(args), grid.0 as usize);
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
                crate::quant::twin(self, s, &a, dt, rows)
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
