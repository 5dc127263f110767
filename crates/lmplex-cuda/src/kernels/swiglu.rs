//! `swiglu.cu`: SiLU of the gate times the up projection, its twin and its cases.

use super::check::{against_twin, get, put, rows_of, typed, Case, Instance, Rng, DTS};
use super::launch::{dim, int, name, THREADS};
use super::Kernel;
use crate::dtype::Dt;
use crate::exec::Arg::P;
use crate::gpu::Gpu;
use crate::hostexec::{HostExec, Traffic, TwinCall};
use lmplex_core::Result;

pub(super) const KERNEL: Kernel = Kernel { entries: &[("silu_and_mul", twin, traffic)], checks };

/// `out[t, i] = silu(gate[t, i]) * up[t, i]`, inputs in rows of `in_stride`.
pub struct SiluAndMul {
    pub gate: u64,
    pub up: u64,
    pub out: u64,
    pub inter: usize,
    pub in_stride: usize,
}

impl SiluAndMul {
    pub fn launch(&self, g: &Gpu, dt: Dt, rows: usize) -> Result<()> {
        let args = [P(self.gate), P(self.up), P(self.out), int(self.inter)?, int(self.in_stride)?];
        g.launch(&name("silu_and_mul", dt), (dim(rows)?, 1, 1), THREADS, &args)
    }
}

fn twin(h: &HostExec, c: &TwinCall) -> Result<()> {
    let (a, dt) = (&c.args, c.dt);
    a.count(5)?;
    let (inter, stride) = (a.n(3)?, a.n(4)?);
    for t in 0..c.rows() {
        let gate = h.rd(a.p(0)? + (t * stride * dt.size()) as u64, dt, inter)?;
        let up = h.rd(a.p(1)? + (t * stride * dt.size()) as u64, dt, inter)?;
        let o: Vec<f32> = gate.iter().zip(&up).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
        h.wr(a.p(2)? + (t * inter * dt.size()) as u64, dt, &o)?;
    }
    Ok(())
}

/// Gate and up read, the product written.
fn traffic(_: &HostExec, c: &TwinCall) -> Result<Traffic> {
    Ok(Traffic::moves(3 * c.rows() * c.args.n(3)? * c.dt.size()))
}

fn checks(filter: &str) -> Vec<Instance> {
    typed("silu_and_mul", filter, &DTS, cases)
}

fn cases(dt: Dt) -> Vec<Case> {
    [96usize, 1000]
        .into_iter()
        .map(|inter| {
            let mut rng = Rng::new(inter as u64 + 3);
            let (rows, x) = (4, rng.values(4 * 2 * inter, 4.0, dt));
            against_twin(format!("inter {inter}"), rows, move |g, sel| {
                let n = sel.map_or(rows, |_| 1);
                let (xb, out) = (put(g, dt, &rows_of(&x, 2 * inter, sel))?, g.alloc(n * inter * dt.size())?);
                let (gate, up) = (xb.ptr, xb.at(inter * dt.size()));
                SiluAndMul { gate, up, out: out.ptr, inter, in_stride: 2 * inter }.launch(g, dt, n)?;
                get(g, dt, &out, n * inter)
            })
        })
        .collect()
}
