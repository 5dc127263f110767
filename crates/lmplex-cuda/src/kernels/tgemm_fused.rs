//! `tgemm.cu`'s fused entry points (the fused path, `LMPLEX_CUDA_FUSED=1`, with the tile GEMM):
//! `tgemm_fused_*`, the tile GEMM with the residual stream's RMSNorm as its prologue and its
//! residual add as its epilogue (`tgemm::Fusion`, launched through `TileGemm`), and `tgemm_swiglu_*`,
//! the gate and up products into the SwiGLU activation (`TileGemmSwiglu`); their twins and
//! their cases, each run also checked bit for bit against the launches the kernel replaces
//! (`fused_add_rmsnorm`, `tgemm`, `silu_and_mul`) on the same executor.

use super::check::{against_twin, failed, get, put, put_raw, quantized, rows_of, tolerance, Case, Instance, Rng};
use super::launch::{dim, int, Matmul};
use super::qgemv::format_of;
use super::tgemm::{staged, Fusion, RowNorm, TileGemm, TILE, TILE_K};
use super::{FusedAddRmsnorm, Kernel, SiluAndMul};
use crate::dtype::Dt;
use crate::exec::Arg::P;
use crate::gpu::Gpu;
use crate::hostexec::{HostExec, Traffic, TwinCall};
use crate::quant::QFormat;
use lmplex_core::{Error, Result};

pub(super) const KERNEL: Kernel = Kernel {
    entries: &[("tgemm_fused_", fused_twin, fused_traffic), ("tgemm_swiglu_", swiglu_twin, swiglu_traffic)],
    checks,
};

/// `y[m, inter] = silu(x · Wgᵀ) * (x · Wuᵀ)` on the tensor cores in one launch: the gate and up
/// matrices (`[inter, k]` each, dense in the storage type or both in `format` blocks) at their
/// own addresses; x normalised first when `norm` is set; y in the storage type, rows of `inter`.
/// The same bits as the tile GEMM of `[gate | up]` then `SiluAndMul`.
pub struct TileGemmSwiglu {
    pub format: Option<QFormat>,
    pub w_gate: u64,
    pub w_up: u64,
    pub x: u64,
    pub y: u64,
    pub inter: usize,
    pub k: usize,
    pub m: usize,
    pub norm: Option<RowNorm>,
}

impl TileGemmSwiglu {
    pub fn launch(&self, g: &Gpu, dt: Dt) -> Result<()> {
        if dt == Dt::F32 {
            return Err(Error::internal("tgemm_swiglu: the tensor cores take f16 or bf16 inputs, not f32"));
        }
        let step = self.format.map_or(TILE_K, |f| TILE_K.max(f.block().0));
        if !self.k.is_multiple_of(step) {
            return Err(Error::internal(format!("tgemm_swiglu: k = {} is not a whole number of {step}", self.k)));
        }
        let mut args = vec![P(self.w_gate), P(self.w_up), P(self.x), P(self.y), int(self.inter)?, int(self.k)?];
        args.push(int(self.m)?);
        args.extend(&Fusion { norm: self.norm, add: false }.args()[..3]);
        let weights = self.format.map_or("dense", |f| f.suffix());
        let grid = (dim(self.m.div_ceil(TILE))?, dim(self.inter.div_ceil(TILE))?, 1);
        g.launch(&format!("tgemm_swiglu_{weights}_{}", dt.suffix()), grid, 128, &args)
    }
}

/// x (`[m, k]` at `ptr`) as the kernel multiplies it: normalised as `fused_add_rmsnorm`'s twin
/// writes it when `norm_w` (the argument at `at`) is set, else as it is.
fn x_rows(h: &HostExec, c: &TwinCall, ptr: u64, (m, k): (usize, usize), at: usize) -> Result<Vec<f32>> {
    let (a, dt) = (&c.args, c.dt);
    let x = h.rd(ptr, dt, m * k)?;
    let norm_w = a.p(at)?;
    if norm_w == 0 {
        return Ok(x);
    }
    let (eps, offset, w) = (a.f(at + 1)?, a.f(at + 2)?, h.rd(norm_w, dt, k)?);
    let mut out = Vec::with_capacity(m * k);
    for row in x.chunks_exact(k) {
        let ss: f32 = row.iter().map(|v| v * v).sum();
        let scale = 1.0 / (ss / k as f32 + eps).sqrt();
        out.extend(
            dt.decode(&dt.encode(&row.iter().zip(&w).map(|(x, w)| x * scale * (w + offset)).collect::<Vec<_>>())),
        );
    }
    Ok(out)
}

/// Row `xr` times each row of `w` (`[n, k]`), f32 in index order.
fn products(xr: &[f32], w: &[f32], k: usize) -> Vec<f32> {
    w.chunks_exact(k).map(|wr| xr.iter().zip(wr).map(|(a, b)| a * b).sum()).collect()
}

/// `tgemm_fused_<weights>`: x normalised (when asked), the product, then y written or, with
/// `add`, y + the product rounded to the storage type.
fn fused_twin(h: &HostExec, c: &TwinCall) -> Result<()> {
    let (a, dt) = (&c.args, c.dt);
    a.count(12)?;
    let (n, k, m, ldy, y_f32, add) = (a.n(3)?, a.n(4)?, a.n(5)?, a.n(6)?, a.n(7)? != 0, a.n(11)? != 0);
    let w = staged(h, c, "tgemm_fused_", a.p(0)?, n, k)?;
    let x = x_rows(h, c, a.p(1)?, (m, k), 8)?;
    let out = if y_f32 { Dt::F32 } else { dt };
    for r in 0..m {
        let at = a.p(2)? + (r * ldy * out.size()) as u64;
        let mut y = products(&x[r * k..(r + 1) * k], &w, k);
        if add {
            let old = h.rd(at, dt, n)?;
            y = dt.decode(&dt.encode(&y)).iter().zip(&old).map(|(p, o)| p + o).collect();
        }
        h.wr(at, out, &y)?;
    }
    Ok(())
}

/// The weights once, x read, y written (and read, with `add`), the norm's weights; the products
/// on the tensor cores.
fn fused_traffic(_: &HostExec, c: &TwinCall) -> Result<Traffic> {
    let a = &c.args;
    let (n, k, m, s) = (a.n(3)?, a.n(4)?, a.n(5)?, c.dt.size());
    let out = if a.n(7)? != 0 { 4 } else { s };
    let weights = match c.stem {
        "tgemm_fused_dense" => n * k * s,
        stem => format_of(stem, "tgemm_fused_")?.bytes(n, k),
    };
    let norm = if a.p(8)? != 0 { k * s } else { 0 };
    let bytes = weights + m * k * s + m * n * out * (1 + (a.n(11)? != 0) as usize) + norm;
    Ok(Traffic { bytes: bytes as u64, flops: (2 * m * n * k) as u64, tensor_cores: true })
}

/// `tgemm_swiglu_<weights>`: x normalised (when asked), both products f32 in index order, each
/// rounded to the storage type, then the activation as `silu_and_mul`'s twin computes it.
fn swiglu_twin(h: &HostExec, c: &TwinCall) -> Result<()> {
    let (a, dt) = (&c.args, c.dt);
    a.count(10)?;
    let (inter, k, m) = (a.n(4)?, a.n(5)?, a.n(6)?);
    let wg = staged(h, c, "tgemm_swiglu_", a.p(0)?, inter, k)?;
    let wu = staged(h, c, "tgemm_swiglu_", a.p(1)?, inter, k)?;
    let x = x_rows(h, c, a.p(2)?, (m, k), 7)?;
    let round = |v: Vec<f32>| dt.decode(&dt.encode(&v));
    for r in 0..m {
        let xr = &x[r * k..(r + 1) * k];
        let (gate, up) = (round(products(xr, &wg, k)), round(products(xr, &wu, k)));
        let act: Vec<f32> = gate.iter().zip(&up).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
        h.wr(a.p(3)? + (r * inter * dt.size()) as u64, dt, &act)?;
    }
    Ok(())
}

/// Both matrices once, x read, the activation written, the norm's weights; the products on the
/// tensor cores.
fn swiglu_traffic(_: &HostExec, c: &TwinCall) -> Result<Traffic> {
    let (inter, k, m, s) = (c.args.n(4)?, c.args.n(5)?, c.args.n(6)?, c.dt.size());
    let weights = match c.stem {
        "tgemm_swiglu_dense" => 2 * inter * k * s,
        stem => 2 * format_of(stem, "tgemm_swiglu_")?.bytes(inter, k),
    };
    let norm = if c.args.p(7)? != 0 { k * s } else { 0 };
    let bytes = weights + m * k * s + m * inter * s + norm;
    Ok(Traffic { bytes: bytes as u64, flops: (4 * m * inter * k) as u64, tensor_cores: true })
}

/// The 16-bit storage types, dense and every format.
fn checks(filter: &str) -> Vec<Instance> {
    let mut out = Vec::new();
    for dt in [Dt::F16, Dt::Bf16] {
        for format in std::iter::once(None).chain(QFormat::ALL.map(Some)) {
            let weights = format.map_or("dense", |f| f.suffix());
            for (stem, cases) in [("tgemm_fused", fused_cases as Cases), ("tgemm_swiglu", swiglu_cases)] {
                let kernel = format!("{stem}_{weights}_{}", dt.suffix());
                if kernel.contains(filter) {
                    out.push(Instance { kernel, tol: tolerance(dt), cases: cases(format, dt) });
                }
            }
        }
    }
    out
}

type Cases = fn(Option<QFormat>, Dt) -> Vec<Case>;

/// Raw weights `[n, k]` in `format` (dense in `dt` when `None`), values of order 0.3.
fn weights(
    format: Option<QFormat>,
    dt: Dt,
    (n, k): (usize, usize),
    rng: &mut Rng,
) -> std::result::Result<Vec<u8>, String> {
    match format {
        None => Ok(dt.encode(&rng.values(n * k, 0.3, dt))),
        Some(f) => quantized(f, n, k, rng).map(|(raw, _)| raw).map_err(|e| e.to_string()),
    }
}

/// Whether two outputs hold the same bits; an error naming `what` otherwise.
fn same_bits(fused: &[f32], apart: &[f32], what: &str) -> Result<()> {
    match fused.iter().map(|v| v.to_bits()).eq(apart.iter().map(|v| v.to_bits())) {
        true => Ok(()),
        false => Err(Error::internal(format!("{what} differs from the launches it replaces"))),
    }
}

/// The norm prologue (x the residual stream, 1 and 70 rows, k past 256 so every virtual thread
/// of the norm sums) and the residual epilogue, against the twin; every run also against
/// `fused_add_rmsnorm` then `tgemm` (prologue) and `tgemm` then `fused_add_rmsnorm`'s add
/// (epilogue).
fn fused_cases(format: Option<QFormat>, dt: Dt) -> Vec<Case> {
    let (n, k) = (72usize, 512usize);
    let mut rng = Rng::new(format.map_or(11, |f| f as u64 + 340));
    let raw = match weights(format, dt, (n, k), &mut rng) {
        Ok(raw) => raw,
        Err(e) => return failed(format!("{format:?} weights"), e),
    };
    let norm_w = rng.values(k, 1.0, dt);
    let mut cases = Vec::new();
    for (m, add) in [(1usize, false), (70, false), (3, true), (70, true)] {
        let (raw, norm_w) = (raw.clone(), norm_w.clone());
        let (x, res) = (rng.values(m * k, 2.0, dt), rng.values(m * n, 2.0, dt));
        let label = if add { format!("{m} rows, residual add") } else { format!("{m} rows, rmsnorm prologue") };
        cases.push(against_twin(label, m, move |g, sel| {
            let rows = sel.map_or(m, |_| 1);
            let (wb, xb, nb) = (put_raw(g, &raw)?, put(g, dt, &rows_of(&x, k, sel))?, put(g, dt, &norm_w)?);
            let (eps, offset) = (1e-5, 0.0);
            let mm = |x: u64, y: u64| Matmul { w: wb.ptr, x, y, n_out: n, k, m: rows, ldy: n, y_f32: false };
            let none = Fusion::NONE;
            if add {
                let (fused, apart) = (put(g, dt, &rows_of(&res, n, sel))?, put(g, dt, &rows_of(&res, n, sel))?);
                let fusion = Fusion { norm: None, add: true };
                TileGemm { format, mm: mm(xb.ptr, fused.ptr), fusion }.launch(g, dt)?;
                let (tmp, h) = (g.alloc(rows * n * dt.size())?, g.alloc(rows * n * dt.size())?);
                TileGemm { format, mm: mm(xb.ptr, tmp.ptr), fusion: none }.launch(g, dt)?;
                let ones = put(g, dt, &vec![1.0; n])?;
                let (x, residual, weight, out, hidden) = (tmp.ptr, apart.ptr, ones.ptr, h.ptr, n);
                FusedAddRmsnorm { x, residual, weight, out, hidden, eps, weight_offset: 0.0, add_residual: true }
                    .launch(g, dt, rows)?;
                let (fused, apart) = (get(g, dt, &fused, rows * n)?, get(g, dt, &apart, rows * n)?);
                same_bits(&fused, &apart, "tgemm_fused's residual add")?;
                return Ok(fused);
            }
            let (yf, ya, h) =
                (g.alloc(rows * n * dt.size())?, g.alloc(rows * n * dt.size())?, g.alloc(rows * k * dt.size())?);
            let norm = Some(RowNorm { weight: nb.ptr, eps, offset });
            TileGemm { format, mm: mm(xb.ptr, yf.ptr), fusion: Fusion { norm, add: false } }.launch(g, dt)?;
            let (x, residual, weight, out, hidden) = (xb.ptr, xb.ptr, nb.ptr, h.ptr, k);
            FusedAddRmsnorm { x, residual, weight, out, hidden, eps, weight_offset: offset, add_residual: false }
                .launch(g, dt, rows)?;
            TileGemm { format, mm: mm(h.ptr, ya.ptr), fusion: none }.launch(g, dt)?;
            let (fused, apart) = (get(g, dt, &yf, rows * n)?, get(g, dt, &ya, rows * n)?);
            same_bits(&fused, &apart, "tgemm_fused's rmsnorm prologue")?;
            Ok(fused)
        }));
    }
    cases
}

/// The fused SwiGLU GEMM: two row tiles and two column tiles of the activation, each partly
/// filled, with and without the norm prologue, against its twin; every run also against
/// (`fused_add_rmsnorm`, then) `TileGemm` of `[gate | up]` then `SiluAndMul`.
fn swiglu_cases(format: Option<QFormat>, dt: Dt) -> Vec<Case> {
    let (inter, k) = (72usize, 256usize);
    let mut rng = Rng::new(format.map_or(9, |f| f as u64 + 240));
    let raw = match weights(format, dt, (2 * inter, k), &mut rng) {
        Ok(raw) => raw,
        Err(e) => return failed(format!("{format:?} weights"), e),
    };
    let (half, norm_w) = (raw.len() / 2, rng.values(k, 1.0, dt));
    let mut cases = Vec::new();
    for (m, normed) in [(1usize, false), (70, false), (70, true)] {
        let (raw, x, norm_w) = (raw.clone(), rng.values(m * k, 1.0, dt), norm_w.clone());
        let label = format!("{m} rows, inter {inter}, rmsnorm prologue {normed}");
        cases.push(against_twin(label, m, move |g, sel| {
            let rows = sel.map_or(m, |_| 1);
            let (wb, xb, nb) = (put_raw(g, &raw)?, put(g, dt, &rows_of(&x, k, sel))?, put(g, dt, &norm_w)?);
            let (y, gate_up) = (g.alloc(rows * inter * dt.size())?, g.alloc(rows * 2 * inter * dt.size())?);
            let (w_gate, w_up, eps) = (wb.ptr, wb.at(half), 1e-5);
            let norm = normed.then_some(RowNorm { weight: nb.ptr, eps, offset: 0.0 });
            TileGemmSwiglu { format, w_gate, w_up, x: xb.ptr, y: y.ptr, inter, k, m: rows, norm }.launch(g, dt)?;
            let fused = get(g, dt, &y, rows * inter)?;
            let h = g.alloc(rows * k * dt.size())?;
            let input = if normed {
                let (x, residual, weight, out, hidden) = (xb.ptr, xb.ptr, nb.ptr, h.ptr, k);
                FusedAddRmsnorm { x, residual, weight, out, hidden, eps, weight_offset: 0.0, add_residual: false }
                    .launch(g, dt, rows)?;
                h.ptr
            } else {
                xb.ptr
            };
            let mm = Matmul {
                w: wb.ptr,
                x: input,
                y: gate_up.ptr,
                n_out: 2 * inter,
                k,
                m: rows,
                ldy: 2 * inter,
                y_f32: false,
            };
            TileGemm { format, mm, fusion: Fusion::NONE }.launch(g, dt)?;
            let (gate, up) = (gate_up.ptr, gate_up.at(inter * dt.size()));
            SiluAndMul { gate, up, out: y.ptr, inter, in_stride: 2 * inter }.launch(g, dt, rows)?;
            same_bits(&fused, &get(g, dt, &y, rows * inter)?, "tgemm_swiglu")?;
            Ok(fused)
        }));
    }
    cases
}
