//! `rope.cu`: rotary position embedding on the q and k heads, its twin and its cases.

use super::check::{against_twin, get, put, put_raw, rows_of, typed, Case, Instance, Rng, DTS};
use super::launch::{dim, int, name, THREADS};
use super::Kernel;
use crate::dtype::Dt;
use crate::exec::Arg::{I, P};
use crate::gpu::Gpu;
use crate::hostexec::{HostExec, Traffic, TwinCall};
use lmplex_core::Result;

pub(super) const KERNEL: Kernel = Kernel { entries: &[("rope", twin, traffic)], checks };

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
            for (i, f) in inv.iter().enumerate() {
                let (s, c) = (p as f32 * f).sin_cos();
                let (ia, ib) = if neox { (i, i + rot / 2) } else { (2 * i, 2 * i + 1) };
                let (x, y) = (v[ia], v[ib]);
                v[ia] = x * c - y * s;
                v[ib] = y * c + x * s;
            }
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
    typed("rope", filter, &DTS, cases)
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
