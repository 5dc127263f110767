//! `rmsnorm.cu`: the residual add fused with RMSNorm, its twin and its cases.

use super::check::{against_twin, get, put, rows_of, typed, Case, Instance, Rng, DTS};
use super::launch::{dim, int, name, THREADS};
use super::Kernel;
use crate::dtype::Dt;
use crate::exec::Arg::{F, I, P};
use crate::gpu::Gpu;
use crate::hostexec::{HostExec, Traffic, TwinCall};
use lmplex_core::Result;

pub(super) const KERNEL: Kernel = Kernel { entries: &[("fused_add_rmsnorm", twin, traffic)], checks };

/// `residual = x (+ residual)`, `out = rmsnorm(residual) * (weight + weight_offset)`, per row.
pub struct FusedAddRmsnorm {
    pub x: u64,
    pub residual: u64,
    pub weight: u64,
    pub out: u64,
    pub hidden: usize,
    pub eps: f32,
    pub weight_offset: f32,
    pub add_residual: bool,
}

impl FusedAddRmsnorm {
    pub fn launch(&self, g: &Gpu, dt: Dt, rows: usize) -> Result<()> {
        let args = [
            P(self.x),
            P(self.residual),
            P(self.weight),
            P(self.out),
            int(self.hidden)?,
            F(self.eps),
            F(self.weight_offset),
            I(self.add_residual as i32),
        ];
        g.launch(&name("fused_add_rmsnorm", dt), (dim(rows)?, 1, 1), THREADS, &args)
    }
}

fn twin(h: &HostExec, c: &TwinCall) -> Result<()> {
    let (a, dt) = (&c.args, c.dt);
    a.count(8)?;
    let (hidden, eps, offset, add) = (a.n(4)?, a.f(5)?, a.f(6)?, a.n(7)? != 0);
    let w = h.rd(a.p(2)?, dt, hidden)?;
    for t in 0..c.rows() {
        let at = (t * hidden * dt.size()) as u64;
        let mut x = h.rd(a.p(0)? + at, dt, hidden)?;
        if add {
            let r = h.rd(a.p(1)? + at, dt, hidden)?;
            x.iter_mut().zip(&r).for_each(|(x, r)| *x += r);
        }
        let stored = dt.decode(&dt.encode(&x));
        h.wr(a.p(1)? + at, dt, &stored)?;
        let ss: f32 = stored.iter().map(|v| v * v).sum();
        let scale = 1.0 / (ss / hidden as f32 + eps).sqrt();
        let out: Vec<f32> = stored.iter().zip(&w).map(|(x, w)| x * scale * (w + offset)).collect();
        h.wr(a.p(3)? + at, dt, &out)?;
    }
    Ok(())
}

/// x read, the residual read (when added) and written, the output written, the weight.
fn traffic(_: &HostExec, c: &TwinCall) -> Result<Traffic> {
    let (hidden, add) = (c.args.n(4)?, c.args.n(7)? != 0);
    let per_row = (3 + add as usize) * hidden * c.dt.size();
    Ok(Traffic::moves(c.rows() * per_row + hidden * c.dt.size()))
}

fn checks(filter: &str) -> Vec<Instance> {
    typed("fused_add_rmsnorm", filter, &DTS, cases)
}

fn cases(dt: Dt) -> Vec<Case> {
    let mut cases = Vec::new();
    for (hidden, add, offset) in [(64, true, 0.0), (1000, false, 0.0), (4096, true, 1.0)] {
        let mut rng = Rng::new(hidden as u64 + 7);
        let rows = 5;
        let (x, res, w) =
            (rng.values(rows * hidden, 2.0, dt), rng.values(rows * hidden, 2.0, dt), rng.values(hidden, 1.0, dt));
        let label = format!("hidden {hidden}, add {add}, weight offset {offset}");
        cases.push(against_twin(label, rows, move |g, sel| {
            let n = sel.map_or(rows, |_| 1);
            let (xb, rb, wb) =
                (put(g, dt, &rows_of(&x, hidden, sel))?, put(g, dt, &rows_of(&res, hidden, sel))?, put(g, dt, &w)?);
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
