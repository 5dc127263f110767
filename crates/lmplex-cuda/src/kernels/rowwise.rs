//! `rowwise.cu`: the bias add and the per-head RMSNorm (Qwen3's q/k norms), their twins and
//! their cases.

use super::check::{against_twin, get, put, rows_of, typed, Case, Instance, Rng, DTS};
use super::launch::{dim, int, name, HEAD_THREADS, THREADS};
use super::Kernel;
use crate::dtype::Dt;
use crate::exec::Arg::{F, P};
use crate::gpu::Gpu;
use crate::hostexec::{HostExec, Traffic, TwinCall};
use lmplex_core::Result;

pub(super) const KERNEL: Kernel = Kernel {
    entries: &[("add_bias", add_bias, add_bias_traffic), ("rmsnorm_heads", rmsnorm_heads, rmsnorm_heads_traffic)],
    checks,
};

/// `x[t, i] += bias[i]` over rows of `width`.
pub struct AddBias {
    pub x: u64,
    pub bias: u64,
    pub width: usize,
}

impl AddBias {
    pub fn launch(&self, g: &Gpu, dt: Dt, rows: usize) -> Result<()> {
        g.launch(&name("add_bias", dt), (dim(rows)?, 1, 1), THREADS, &[P(self.x), P(self.bias), int(self.width)?])
    }
}

/// RMSNorm of each of `heads` heads of `head_dim` starting at column `col0` of rows of
/// `row_stride` (Qwen3's q/k norms on the fused qkv buffer), in place.
pub struct RmsnormHeads {
    pub x: u64,
    pub weight: u64,
    pub row_stride: usize,
    pub col0: usize,
    pub head_dim: usize,
    pub eps: f32,
}

impl RmsnormHeads {
    pub fn launch(&self, g: &Gpu, dt: Dt, rows: usize, heads: usize) -> Result<()> {
        let args =
            [P(self.x), P(self.weight), int(self.row_stride)?, int(self.col0)?, int(self.head_dim)?, F(self.eps)];
        g.launch(&name("rmsnorm_heads", dt), (dim(rows)?, dim(heads)?, 1), HEAD_THREADS, &args)
    }
}

fn add_bias(h: &HostExec, c: &TwinCall) -> Result<()> {
    let (a, dt) = (&c.args, c.dt);
    a.count(3)?;
    let (x, width) = (a.p(0)?, a.n(2)?);
    let b = h.rd(a.p(1)?, dt, width)?;
    let mut v = h.rd(x, dt, c.rows() * width)?;
    v.iter_mut().enumerate().for_each(|(i, e)| *e += b[i % width]);
    h.wr(x, dt, &v)
}

fn rmsnorm_heads(h: &HostExec, c: &TwinCall) -> Result<()> {
    let (a, dt) = (&c.args, c.dt);
    a.count(6)?;
    let (stride, col0, hd, eps) = (a.n(2)?, a.n(3)?, a.n(4)?, a.f(5)?);
    let w = h.rd(a.p(1)?, dt, hd)?;
    for t in 0..c.rows() {
        for head in 0..c.grid.1 as usize {
            let at = a.p(0)? + ((t * stride + col0 + head * hd) * dt.size()) as u64;
            let v = h.rd(at, dt, hd)?;
            let ss: f32 = v.iter().map(|x| x * x).sum();
            let scale = 1.0 / (ss / hd as f32 + eps).sqrt();
            h.wr(at, dt, &v.iter().zip(&w).map(|(x, w)| x * scale * w).collect::<Vec<_>>())?;
        }
    }
    Ok(())
}

/// Each row read and written, the bias.
fn add_bias_traffic(_: &HostExec, c: &TwinCall) -> Result<Traffic> {
    let width = c.args.n(2)?;
    Ok(Traffic::moves((2 * c.rows() + 1) * width * c.dt.size()))
}

/// Each head of each row read and written, the weight.
fn rmsnorm_heads_traffic(_: &HostExec, c: &TwinCall) -> Result<Traffic> {
    let (hd, heads) = (c.args.n(4)?, c.grid.1 as usize);
    Ok(Traffic::moves((2 * c.rows() * heads + 1) * hd * c.dt.size()))
}

fn checks(filter: &str) -> Vec<Instance> {
    let mut out = typed("add_bias", filter, &DTS, add_bias_cases);
    out.extend(typed("rmsnorm_heads", filter, &DTS, rmsnorm_heads_cases));
    out
}

fn add_bias_cases(dt: Dt) -> Vec<Case> {
    [192usize, 777]
        .into_iter()
        .map(|width| {
            let mut rng = Rng::new(width as u64);
            let (rows, x, b) = (4, rng.values(4 * width, 3.0, dt), rng.values(width, 1.0, dt));
            against_twin(format!("width {width}"), rows, move |g, sel| {
                let n = sel.map_or(rows, |_| 1);
                let (xb, bb) = (put(g, dt, &rows_of(&x, width, sel))?, put(g, dt, &b)?);
                AddBias { x: xb.ptr, bias: bb.ptr, width }.launch(g, dt, n)?;
                get(g, dt, &xb, n * width)
            })
        })
        .collect()
}

fn rmsnorm_heads_cases(dt: Dt) -> Vec<Case> {
    [64usize, 128, 256]
        .into_iter()
        .map(|hd| {
            let mut rng = Rng::new(hd as u64 + 1);
            let (rows, heads) = (3, 3);
            let stride = (heads + 2) * hd;
            let (x, w) = (rng.values(rows * stride, 4.0, dt), rng.values(hd, 1.0, dt));
            against_twin(format!("head_dim {hd}, 3 heads from column {hd}"), rows, move |g, sel| {
                let n = sel.map_or(rows, |_| 1);
                let (xb, wb) = (put(g, dt, &rows_of(&x, stride, sel))?, put(g, dt, &w)?);
                let k =
                    RmsnormHeads { x: xb.ptr, weight: wb.ptr, row_stride: stride, col0: hd, head_dim: hd, eps: 1e-6 };
                k.launch(g, dt, n, heads)?;
                get(g, dt, &xb, n * stride)
            })
        })
        .collect()
}
