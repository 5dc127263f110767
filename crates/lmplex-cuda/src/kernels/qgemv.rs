//! `qgemv.cu`: the dequantizing GEMV and embedding gather over GGUF blocks, their twins (candle's
//! dequantization, `crate::quant`, then a loop in index order) and their cases: against float64
//! over candle's dequantization of the same blocks (ggml's layouts, an outside oracle) for every
//! format, and the GEMV's strided f32 output (the head's) against its twin.

use super::check::{failed, get, matmul_cases, put_raw, quantized, tolerance, Case, Instance, Reference, Rng, DTS};
use super::launch::{dim, int, name, Matmul, THREADS};
use super::Kernel;
use crate::dtype::Dt;
use crate::exec::Arg::P;
use crate::gpu::Gpu;
use crate::hostexec::{bad, HostExec, Traffic, TwinCall};
use crate::quant::{dequantize, QFormat};
use lmplex_core::{Error, Result};

pub(super) const KERNEL: Kernel = Kernel {
    entries: &[("qgemv_", gemv_twin, gemv_traffic), ("qembedding_", embedding_twin, embedding_traffic)],
    checks,
};

/// Warps per block of the quantized GEMV: each warp computes one output column.
pub const QGEMV_WARPS: u32 = 4;

/// A `Matmul` with W as GGUF rows of `format` blocks.
pub struct Qgemv {
    pub format: QFormat,
    pub mm: Matmul,
}

impl Qgemv {
    pub fn launch(&self, g: &Gpu, dt: Dt) -> Result<()> {
        let args = self.mm.args("qgemv", self.format.block().0)?;
        let grid = dim(self.mm.n_out.div_ceil(QGEMV_WARPS as usize))?;
        let kernel = format!("qgemv_{}", self.format.suffix());
        g.launch(&name(&kernel, dt), (grid, 1, 1), QGEMV_WARPS * 32, &args)
    }
}

/// `out[t, :]` = row `ids[t]` of a `[vocab, hidden]` table in GGUF blocks, dequantized (a zero
/// row for an id outside the vocabulary).
pub struct QEmbedding {
    pub format: QFormat,
    pub table: u64,
    pub ids: u64,
    pub out: u64,
    pub hidden: usize,
    pub vocab: usize,
}

impl QEmbedding {
    pub fn launch(&self, g: &Gpu, dt: Dt, rows: usize) -> Result<()> {
        if !self.hidden.is_multiple_of(self.format.block().0) {
            return Err(Error::internal(format!("qembedding: {} is not a whole number of blocks", self.hidden)));
        }
        let args = [P(self.table), P(self.ids), P(self.out), int(self.hidden)?, int(self.vocab)?];
        let kernel = format!("qembedding_{}", self.format.suffix());
        g.launch(&name(&kernel, dt), (dim(rows)?, 1, 1), THREADS, &args)
    }
}

/// The format a stem ends in (`qgemv_q4_k` → Q4_K), after `prefix`.
pub(super) fn format_of(stem: &str, prefix: &str) -> Result<QFormat> {
    let suffix = stem.strip_prefix(prefix).ok_or_else(|| bad(format!("no twin for '{stem}'")))?;
    QFormat::ALL.into_iter().find(|f| f.suffix() == suffix).ok_or_else(|| bad(format!("no twin for '{stem}'")))
}

/// `qgemv_<format>` (`grid` blocks of columns).
fn gemv_twin(h: &HostExec, c: &TwinCall) -> Result<()> {
    let (a, dt, format) = (&c.args, c.dt, format_of(c.stem, "qgemv_")?);
    a.count(8)?;
    let (n, k, m, ldy, y_f32) = (a.n(3)?, a.n(4)?, a.n(5)?, a.n(6)?, a.n(7)? != 0);
    let w = dequantize(format, &h.rd_bytes(a.p(0)?, format.bytes(n, k))?, n, k)?;
    h.matmul_rows(&w, a.p(1)?, a.p(2)?, (m, k, ldy), dt, if y_f32 { Dt::F32 } else { dt })
}

/// `qembedding_<format>` (`grid` = rows).
fn embedding_twin(h: &HostExec, c: &TwinCall) -> Result<()> {
    let (a, dt, format) = (&c.args, c.dt, format_of(c.stem, "qembedding_")?);
    a.count(5)?;
    let (hidden, vocab) = (a.n(3)?, a.n(4)?);
    let row_bytes = format.bytes(1, hidden);
    for (t, id) in h.rd_u32(a.p(1)?, c.rows())?.into_iter().enumerate() {
        let row = match id as usize {
            id if id < vocab => {
                dequantize(format, &h.rd_bytes(a.p(0)? + (id * row_bytes) as u64, row_bytes)?, 1, hidden)?
            }
            _ => vec![0.0; hidden],
        };
        h.wr(a.p(2)? + (t * hidden * dt.size()) as u64, dt, &row)?;
    }
    Ok(())
}

/// The weights' blocks read once, x read, y written; 2 · m · n · k products on the CUDA cores.
fn gemv_traffic(_: &HostExec, c: &TwinCall) -> Result<Traffic> {
    let (a, format) = (&c.args, format_of(c.stem, "qgemv_")?);
    matmul_traffic(format.bytes(a.n(3)?, a.n(4)?), c, false)
}

/// The traffic of a matmul launch (`w, x, y, n_out, k, m, ldy, y_f32`) whose weights take
/// `weight_bytes`: those once, x read, y written.
pub(super) fn matmul_traffic(weight_bytes: usize, c: &TwinCall, tensor_cores: bool) -> Result<Traffic> {
    let a = &c.args;
    let (n, k, m, y_f32) = (a.n(3)?, a.n(4)?, a.n(5)?, a.n(7)? != 0);
    let out = if y_f32 { 4 } else { c.dt.size() };
    let bytes = weight_bytes + m * k * c.dt.size() + m * n * out;
    Ok(Traffic { bytes: bytes as u64, flops: (2 * m * n * k) as u64, tensor_cores })
}

/// Each gathered row's blocks read, its output written, the ids.
fn embedding_traffic(_: &HostExec, c: &TwinCall) -> Result<Traffic> {
    let (format, hidden) = (format_of(c.stem, "qembedding_")?, c.args.n(3)?);
    Ok(Traffic::moves(c.rows() * (format.bytes(1, hidden) + hidden * c.dt.size() + 4)))
}

fn checks(filter: &str) -> Vec<Instance> {
    let mut out = Vec::new();
    for format in QFormat::ALL {
        for dt in DTS {
            let (f, d, tol) = (format.suffix(), dt.suffix(), tolerance(dt));
            for (kernel, build) in
                [("qgemv", gemv_cases as fn(QFormat, Dt) -> Vec<Case>), ("qembedding", embedding_cases)]
            {
                let kernel = format!("{kernel}_{f}_{d}");
                if kernel.contains(filter) {
                    out.push(Instance { kernel, tol, cases: build(format, dt) });
                }
            }
        }
    }
    out
}

fn gemv_cases(format: QFormat, dt: Dt) -> Vec<Case> {
    // 42 columns: the last block's last two warps have no column and return at once.
    let (n, k) = (42usize, 512usize);
    let mut rng = Rng::new(format as u64 + 40);
    let weights = match quantized(format, n, k, &mut rng) {
        Ok(v) => v,
        Err(e) => return failed(format!("{format:?} weights"), e.to_string()),
    };
    // Against its twin on the head's layout: f32 out into rows of n + 2.
    let shapes = [(1usize, n, false), (9, n, false), (3, n + 6, true)];
    let launch = move |g: &Gpu, [w, x, y]: [u64; 3], (m, ldy, y_f32): (usize, usize, bool)| {
        Qgemv { format, mm: Matmul { w, x, y, n_out: n, k, m, ldy, y_f32 } }.launch(g, dt)
    };
    let what = "vs candle's dequantization";
    matmul_cases(&mut rng, dt, weights, (n, k), &shapes, (2, n + 2, true), what, launch)
}

fn embedding_cases(format: QFormat, dt: Dt) -> Vec<Case> {
    let (vocab, hidden) = (20usize, 512usize);
    let mut rng = Rng::new(format as u64 + 90);
    let (raw, deq) = match quantized(format, vocab, hidden, &mut rng) {
        Ok(v) => v,
        Err(e) => return failed(format!("{format:?} table"), e.to_string()),
    };
    let ids: Vec<u32> = vec![3, 19, 0, 25, 7];
    let want: Vec<f64> = ids
        .iter()
        .flat_map(|&id| match id as usize {
            id if id < vocab => dt.decode(&dt.encode(&deq[id * hidden..(id + 1) * hidden])),
            _ => vec![0.0; hidden],
        })
        .map(f64::from)
        .collect();
    let rows = ids.len();
    let run = move |g: &Gpu, sel: Option<usize>| {
        let ids = sel.map_or_else(|| ids.clone(), |r| vec![ids[r]]);
        let (t, i, out) = (put_raw(g, &raw)?, put_raw(g, &ids)?, g.alloc(ids.len() * hidden * dt.size())?);
        QEmbedding { format, table: t.ptr, ids: i.ptr, out: out.ptr, hidden, vocab }.launch(g, dt, ids.len())?;
        get(g, dt, &out, ids.len() * hidden)
    };
    let label = format!("{vocab}x{hidden} table, an id past the vocabulary (vs candle's dequantization)");
    vec![Case { label, rows, run: Box::new(run), reference: Reference::Values(want) }]
}
