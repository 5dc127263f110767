//! `rope.cu`: rotary position embedding on the q and k heads, and the fused rotation with the KV
//! write (`RopeAndCache`), their twins and their cases (the fused kernel's against the unfused
//! pair, bit for bit, on the same executor).

use super::check::{against_twin, get, put, put_raw, rows_of, typed, Case, Instance, Rng, DTS};
use super::kv_write::ReshapeAndCache;
use super::launch::{dim, int, name, THREADS};
use super::Kernel;
use crate::dtype::Dt;
use crate::exec::Arg::{I, P};
use crate::gpu::Gpu;
use crate::hostexec::{HostExec, Traffic, TwinCall};
use lmplex_core::Result;

pub(super) const KERNEL: Kernel =
    Kernel { entries: &[("rope_and_cache", fused_twin, fused_traffic), ("rope", twin, traffic)], checks };

/// RoPE in place on the q and k heads of each row at `positions[t]` (i64), frequencies
/// `inv_freq[rot_dim / 2]` (f32); `neox` rotates halves, otherwise adjacent pairs (GPT-J).
pub struct Rope {
    pub q: u64,
    pub k: u64,
    pub positions: u64,
    pub inv_freq: u64,
    pub num_q_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rot_dim: usize,
    pub q_stride: usize,
    pub k_stride: usize,
    pub neox: bool,
}

impl Rope {
    pub fn launch(&self, g: &Gpu, dt: Dt, rows: usize) -> Result<()> {
        let args = [
            P(self.q),
            P(self.k),
            P(self.positions),
            P(self.inv_freq),
            int(self.num_q_heads)?,
            int(self.num_kv_heads)?,
            int(self.head_dim)?,
            int(self.rot_dim)?,
            int(self.q_stride)?,
            int(self.k_stride)?,
            I(self.neox as i32),
        ];
        g.launch(&name("rope", dt), (dim(rows)?, 1, 1), THREADS, &args)
    }
}

/// `Rope` and `ReshapeAndCache` in one launch (`LMPLEX_CUDA_FUSED=1`): q rotated in place, k
/// rotated and v copied into the cache at `slot_mapping[t]` (−1 writes nothing); the k columns
/// of the input are left as they were. The cache and q hold the same bits as the two launches.
pub struct RopeAndCache {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub slot_mapping: u64,
    pub positions: u64,
    pub inv_freq: u64,
    pub num_q_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rot_dim: usize,
    pub q_stride: usize,
    /// Elements per token of k and of v (views into one qkv buffer).
    pub kv_stride: usize,
    pub neox: bool,
}

impl RopeAndCache {
    pub fn launch(&self, g: &Gpu, dt: Dt, rows: usize) -> Result<()> {
        let args = [
            P(self.q),
            P(self.k),
            P(self.v),
            P(self.k_cache),
            P(self.v_cache),
            P(self.slot_mapping),
            P(self.positions),
            P(self.inv_freq),
            int(self.num_q_heads)?,
            int(self.num_kv_heads)?,
            int(self.head_dim)?,
            int(self.rot_dim)?,
            int(self.q_stride)?,
            int(self.kv_stride)?,
            I(self.neox as i32),
        ];
        g.launch(&name("rope_and_cache", dt), (dim(rows)?, 1, 1), THREADS, &args)
    }
}

/// `v` (one head) rotated at position `p` by frequencies `inv` as `rope.cu` rotates it.
fn rotate(v: &mut [f32], p: i64, inv: &[f32], rot: usize, neox: bool) {
    for (i, f) in inv.iter().enumerate() {
        let (s, c) = (p as f32 * f).sin_cos();
        let (ia, ib) = if neox { (i, i + rot / 2) } else { (2 * i, 2 * i + 1) };
        let (x, y) = (v[ia], v[ib]);
        v[ia] = x * c - y * s;
        v[ib] = y * c + x * s;
    }
}

fn fused_twin(h: &HostExec, c: &TwinCall) -> Result<()> {
    let (a, dt) = (&c.args, c.dt);
    a.count(15)?;
    let (nq, nkv, hd, rot) = (a.n(8)?, a.n(9)?, a.n(10)?, a.n(11)?);
    let (qs, kvs, neox) = (a.n(12)?, a.n(13)?, a.n(14)? != 0);
    let (slots, pos) = (h.rd_i64(a.p(5)?, c.rows())?, h.rd_i64(a.p(6)?, c.rows())?);
    let inv = h.rd(a.p(7)?, Dt::F32, rot / 2)?;
    let n = nkv * hd;
    for (t, (&p, &slot)) in pos.iter().zip(&slots).enumerate() {
        for head in 0..nq {
            let at = a.p(0)? + ((t * qs + head * hd) * dt.size()) as u64;
            let mut v = h.rd(at, dt, hd)?;
            rotate(&mut v, p, &inv, rot, neox);
            h.wr(at, dt, &v)?;
        }
        if slot < 0 {
            continue;
        }
        let mut k = h.rd(a.p(1)? + (t * kvs * dt.size()) as u64, dt, n)?;
        k.chunks_exact_mut(hd).for_each(|head| rotate(head, p, &inv, rot, neox));
        let v = h.rd(a.p(2)? + (t * kvs * dt.size()) as u64, dt, n)?;
        h.wr(a.p(3)? + (slot as usize * n * dt.size()) as u64, dt, &k)?;
        h.wr(a.p(4)? + (slot as usize * n * dt.size()) as u64, dt, &v)?;
    }
    Ok(())
}

/// The rotated part of each q head read and written; each row with a slot: its k and v read
/// and written into the cache; every row's position and slot, the frequencies.
fn fused_traffic(h: &HostExec, c: &TwinCall) -> Result<Traffic> {
    let (nq, n, rot, s) = (c.args.n(8)?, c.args.n(9)? * c.args.n(10)?, c.args.n(11)?, c.dt.size());
    let written = h.rd_i64(c.args.p(5)?, c.rows())?.iter().filter(|&&s| s >= 0).count();
    Ok(Traffic::moves(c.rows() * (2 * nq * rot * s + 16) + written * 4 * n * s + rot / 2 * 4))
}

fn twin(h: &HostExec, c: &TwinCall) -> Result<()> {
    let (a, dt) = (&c.args, c.dt);
    a.count(11)?;
    let (nq, nkv, hd, rot) = (a.n(4)?, a.n(5)?, a.n(6)?, a.n(7)?);
    let (qs, ks, neox) = (a.n(8)?, a.n(9)?, a.n(10)? != 0);
    let pos = h.rd_i64(a.p(2)?, c.rows())?;
    let inv = h.rd(a.p(3)?, Dt::F32, rot / 2)?;
    for (t, &p) in pos.iter().enumerate() {
        for head in 0..nq + nkv {
            let at = if head < nq {
                a.p(0)? + ((t * qs + head * hd) * dt.size()) as u64
            } else {
                a.p(1)? + ((t * ks + (head - nq) * hd) * dt.size()) as u64
            };
            let mut v = h.rd(at, dt, hd)?;
            rotate(&mut v, p, &inv, rot, neox);
            h.wr(at, dt, &v)?;
        }
    }
    Ok(())
}

/// The rotated part of each q and k head read and written, the positions, the frequencies.
fn traffic(_: &HostExec, c: &TwinCall) -> Result<Traffic> {
    let (nq, nkv, rot) = (c.args.n(4)?, c.args.n(5)?, c.args.n(7)?);
    Ok(Traffic::moves(c.rows() * (2 * (nq + nkv) * rot * c.dt.size() + 8) + rot / 2 * 4))
}

fn checks(filter: &str) -> Vec<Instance> {
    let mut all = typed("rope", filter, &DTS, cases);
    all.extend(typed("rope_and_cache", filter, &DTS, fused_cases));
    all
}

/// The fused launch against its twin, each run also checked bit for bit against `Rope` then
/// `ReshapeAndCache` on the same executor (a difference fails the run): q and both caches.
fn fused_cases(dt: Dt) -> Vec<Case> {
    let mut cases = Vec::new();
    for (hd, rot, neox) in [(64usize, 64usize, true), (128, 128, false), (128, 64, true)] {
        let mut rng = Rng::new((hd + rot) as u64 + neox as u64);
        let (rows, nq, nkv, slots_total) = (5, 4, 2, 16);
        let width = (nq + 2 * nkv) * hd;
        let x = rng.values(rows * width, 1.0, dt);
        let pos: Vec<i64> = (0..rows).map(|_| rng.below(5000) as i64).collect();
        let slots: Vec<i64> = vec![3, -1, 7, 0, 12];
        let inv: Vec<f32> = (0..rot / 2).map(|i| 10000f32.powf(-2.0 * i as f32 / rot as f32)).collect();
        let label = format!("head_dim {hd}, rot_dim {rot}, neox {neox}, one row with slot -1");
        cases.push(against_twin(label, rows, move |g, sel| {
            let n = sel.map_or(rows, |_| 1);
            let (pb, sb, fb) =
                (put_raw(g, &rows_of(&pos, 1, sel))?, put_raw(g, &rows_of(&slots, 1, sel))?, put_raw(g, &inv)?);
            let cache = slots_total * nkv * hd;
            let run = |fused: bool| -> Result<Vec<f32>> {
                let xb = put(g, dt, &rows_of(&x, width, sel))?;
                let (kc, vc) = (put(g, dt, &vec![0.0; cache])?, put(g, dt, &vec![0.0; cache])?);
                let (q, k, v) = (xb.ptr, xb.at(nq * hd * dt.size()), xb.at((nq + nkv) * hd * dt.size()));
                let (positions, inv_freq, slot_mapping) = (pb.ptr, fb.ptr, sb.ptr);
                let (num_q_heads, num_kv_heads, head_dim, rot_dim) = (nq, nkv, hd, rot);
                if fused {
                    let (k_cache, v_cache, q_stride, kv_stride) = (kc.ptr, vc.ptr, width, width);
                    RopeAndCache {
                        q,
                        k,
                        v,
                        k_cache,
                        v_cache,
                        slot_mapping,
                        positions,
                        inv_freq,
                        num_q_heads,
                        num_kv_heads,
                        head_dim,
                        rot_dim,
                        q_stride,
                        kv_stride,
                        neox,
                    }
                    .launch(g, dt, n)?;
                } else {
                    let (q_stride, k_stride, v_stride) = (width, width, width);
                    Rope {
                        q,
                        k,
                        positions,
                        inv_freq,
                        num_q_heads,
                        num_kv_heads,
                        head_dim,
                        rot_dim,
                        q_stride,
                        k_stride,
                        neox,
                    }
                    .launch(g, dt, n)?;
                    let (k_cache, v_cache) = (kc.ptr, vc.ptr);
                    ReshapeAndCache {
                        k,
                        v,
                        k_cache,
                        v_cache,
                        slot_mapping,
                        num_kv_heads,
                        head_dim,
                        k_stride,
                        v_stride,
                    }
                    .launch(g, dt, n)?;
                }
                // Each row: its q, then the k and v its slot holds (zeros for slot -1).
                let (x, kc, vc) = (get(g, dt, &xb, n * width)?, get(g, dt, &kc, cache)?, get(g, dt, &vc, cache)?);
                let (kv, row_slots) = (nkv * hd, rows_of(&slots, 1, sel));
                let at = |c: &[f32], s: i64| if s < 0 { vec![0.0; kv] } else { c[s as usize * kv..][..kv].to_vec() };
                Ok(x.chunks_exact(width)
                    .zip(&row_slots)
                    .flat_map(|(r, &s)| [r[..nq * hd].to_vec(), at(&kc, s), at(&vc, s)].concat())
                    .collect())
            };
            let (fused, apart) = (run(true)?, run(false)?);
            if !fused.iter().map(|v| v.to_bits()).eq(apart.iter().map(|v| v.to_bits())) {
                return Err(lmplex_core::Error::internal("rope_and_cache differs from rope + reshape_and_cache"));
            }
            Ok(fused)
        }));
    }
    cases
}

fn cases(dt: Dt) -> Vec<Case> {
    let mut cases = Vec::new();
    for (hd, neox) in [(64usize, true), (128, false), (128, true)] {
        let mut rng = Rng::new(hd as u64 + neox as u64);
        let (rows, nq, nkv) = (4, 4, 2);
        let width = (nq + 2 * nkv) * hd;
        let x = rng.values(rows * width, 1.0, dt);
        let pos: Vec<i64> = (0..rows).map(|_| rng.below(5000) as i64).collect();
        let inv: Vec<f32> = (0..hd / 2).map(|i| 10000f32.powf(-2.0 * i as f32 / hd as f32)).collect();
        cases.push(against_twin(format!("head_dim {hd}, neox {neox}"), rows, move |g, sel| {
            let n = sel.map_or(rows, |_| 1);
            let (xb, pb, fb) =
                (put(g, dt, &rows_of(&x, width, sel))?, put_raw(g, &rows_of(&pos, 1, sel))?, put_raw(g, &inv)?);
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
