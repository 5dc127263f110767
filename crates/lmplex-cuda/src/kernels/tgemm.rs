//! `tgemm.cu`: the tensor-core tile GEMM over dense or GGUF-block weights, its twin (the weights
//! rounded to the storage type as the kernel stages them) and its cases: two row tiles and two
//! column tiles, each partly filled, against float64 and against the twin. A `TileGemm` may ask
//! for the fused path's prologue and epilogue (`Fusion`); those entry points (`tgemm_fused_*`,
//! `tgemm_swiglu_*`) have their twins and cases in `tgemm_fused.rs`.

use super::check::{failed, matmul_cases, quantized, tolerance, Case, Instance, Rng};
use super::launch::{dim, Matmul};
use super::qgemv::{format_of, matmul_traffic};
use super::Kernel;
use crate::dtype::Dt;
use crate::exec::Arg::{self, F, I, P};
use crate::gpu::Gpu;
use crate::hostexec::{HostExec, Traffic, TwinCall};
use crate::quant::{dequantize, QFormat};
use lmplex_core::{Error, Result};

pub(super) const KERNEL: Kernel = Kernel { entries: &[("tgemm_", twin, traffic)], checks };

/// Rows and columns of y one block of the tile GEMM computes (`tgemm.cu`'s TM and TN).
pub const TILE: usize = 64;
/// `k` advances this much per step of the tile GEMM (`tgemm.cu`'s TK).
pub const TILE_K: usize = 32;

/// The RMSNorm a tile GEMM applies to x (the residual stream) as it stages it, as
/// `fused_add_rmsnorm` (without its add) would write it: `x * rsqrt(mean(x²) + eps) * (weight +
/// offset)`.
#[derive(Clone, Copy, Debug)]
pub struct RowNorm {
    pub weight: u64,
    pub eps: f32,
    pub offset: f32,
}

/// The fused path's prologue and epilogue of a tile GEMM.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fusion {
    /// x is the residual stream, multiplied normalised.
    pub norm: Option<RowNorm>,
    /// y is the residual stream (in the storage type) and receives `y + x · Wᵀ`, the product
    /// rounded to the storage type first.
    pub add: bool,
}

impl Fusion {
    pub const NONE: Fusion = Fusion { norm: None, add: false };

    pub fn is_none(&self) -> bool {
        self.norm.is_none() && !self.add
    }

    /// The arguments after the matmul's: `norm_w` (0 for none), `eps`, `weight_offset`, `add`.
    pub(crate) fn args(&self) -> [Arg; 4] {
        let n = self.norm.unwrap_or(RowNorm { weight: 0, eps: 0.0, offset: 0.0 });
        [P(n.weight), F(n.eps), F(n.offset), I(self.add as i32)]
    }
}

/// A `Matmul` on the tensor cores (`tgemm.cu`), W dense in the storage type (`format` `None`)
/// or in GGUF blocks, with the fused path's prologue and epilogue when `fusion` asks for them
/// (`tgemm_fused_*`).
pub struct TileGemm {
    pub format: Option<QFormat>,
    pub mm: Matmul,
    pub fusion: Fusion,
}

impl TileGemm {
    pub fn launch(&self, g: &Gpu, dt: Dt) -> Result<()> {
        if dt == Dt::F32 {
            return Err(Error::internal("tgemm: the tensor cores take f16 or bf16 inputs, not f32"));
        }
        // A whole number of steps and of blocks (every format's block is 32 or 256 weights).
        let step = self.format.map_or(TILE_K, |f| TILE_K.max(f.block().0));
        let mut args = self.mm.args("tgemm", step)?.to_vec();
        let weights = self.format.map_or("dense", |f| f.suffix());
        let grid = (dim(self.mm.m.div_ceil(TILE))?, dim(self.mm.n_out.div_ceil(TILE))?, 1);
        if self.fusion.is_none() {
            return g.launch(&format!("tgemm_{weights}_{}", dt.suffix()), grid, 128, &args);
        }
        if self.fusion.add && self.mm.y_f32 {
            return Err(Error::internal("tgemm_fused: the residual stream is in the storage type, not f32"));
        }
        args.extend(self.fusion.args());
        g.launch(&format!("tgemm_fused_{weights}_{}", dt.suffix()), grid, 128, &args)
    }
}

/// The weights `[n, k]` at `ptr` of the launch's format as the kernel stages them (rounded to
/// the storage type); `prefix` is the entry point's stem before its format.
pub(super) fn staged(h: &HostExec, c: &TwinCall, prefix: &str, ptr: u64, n: usize, k: usize) -> Result<Vec<f32>> {
    let dt = c.dt;
    match c.stem.strip_prefix(prefix) {
        Some("dense") => h.rd(ptr, dt, n * k),
        _ => {
            let f = format_of(c.stem, prefix)?;
            Ok(dt.decode(&dt.encode(&dequantize(f, &h.rd_bytes(ptr, f.bytes(n, k))?, n, k)?)))
        }
    }
}

/// `tgemm_dense` and `tgemm_<format>`: the same arguments as the GEMV's, the weights rounded to
/// the storage type as the kernel stages them.
fn twin(h: &HostExec, c: &TwinCall) -> Result<()> {
    let (a, dt) = (&c.args, c.dt);
    a.count(8)?;
    let (n, k, m, ldy, y_f32) = (a.n(3)?, a.n(4)?, a.n(5)?, a.n(6)?, a.n(7)? != 0);
    let w = staged(h, c, "tgemm_", a.p(0)?, n, k)?;
    h.matmul_rows(&w, a.p(1)?, a.p(2)?, (m, k, ldy), dt, if y_f32 { Dt::F32 } else { dt })
}

/// The weights once (a weight tile's row tiles run as consecutive blocks), x read, y written; the
/// products on the tensor cores.
fn traffic(_: &HostExec, c: &TwinCall) -> Result<Traffic> {
    let (n, k) = (c.args.n(3)?, c.args.n(4)?);
    let weights = match c.stem {
        "tgemm_dense" => n * k * c.dt.size(),
        stem => format_of(stem, "tgemm_")?.bytes(n, k),
    };
    matmul_traffic(weights, c, true)
}

/// The 16-bit storage types only (the tensor cores take no f32 inputs).
fn checks(filter: &str) -> Vec<Instance> {
    let mut out = Vec::new();
    for dt in [Dt::F16, Dt::Bf16] {
        for format in std::iter::once(None).chain(QFormat::ALL.map(Some)) {
            let kernel = format!("tgemm_{}_{}", format.map_or("dense", |f| f.suffix()), dt.suffix());
            if kernel.contains(filter) {
                out.push(Instance { kernel, tol: tolerance(dt), cases: cases(format, dt) });
            }
        }
    }
    out
}

/// The tile GEMM over `format` blocks (`None`: dense weights in `dt`): two row tiles and two
/// column tiles, each partly filled, eight steps of k; rows of y `ldy` apart, in `dt` or f32.
fn cases(format: Option<QFormat>, dt: Dt) -> Vec<Case> {
    let (n, k) = (72usize, 256usize);
    let mut rng = Rng::new(format.map_or(7, |f| f as u64 + 140));
    let (raw, w) = match format {
        None => {
            let w = rng.values(n * k, 1.0, dt);
            (dt.encode(&w), w)
        }
        Some(f) => match quantized(f, n, k, &mut rng) {
            Ok((raw, deq)) => (raw, dt.decode(&dt.encode(&deq))),
            Err(e) => return failed(format!("{f:?} weights"), e.to_string()),
        },
    };
    let shapes = [(1usize, n, false), (70, n, false), (3, n + 6, true)];
    let launch = move |g: &Gpu, [w, x, y]: [u64; 3], (m, ldy, y_f32): (usize, usize, bool)| {
        TileGemm { format, mm: Matmul { w, x, y, n_out: n, k, m, ldy, y_f32 }, fusion: Fusion::NONE }.launch(g, dt)
    };
    matmul_cases(&mut rng, dt, (raw, w), (n, k), &shapes, (5, n, false), "float64 reference", launch)
}
