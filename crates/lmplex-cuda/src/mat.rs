//! A weight matrix on the device and how it multiplies a batch: dense in the backend's dtype or
//! in GGUF blocks (`Mat`), by one of two GEMM paths (`GemmKind`).
//!
//! - `GemmKind::Vendor` (the default): a dense matrix by cuBLAS in `GEMM_ROWS`-row calls of one
//!   shape (`Gpu::gemm`), a quantized one by the dequantizing GEMV (`qgemv.cu`, 8 rows per pass
//!   over the weights).
//! - `GemmKind::Tiles` (`LMPLEX_CUDA_GEMM=tiles`): f16 and bf16 matrices, dense or quantized, by
//!   the tensor-core tile GEMM (`tgemm.cu`), whose row tiles of one weight tile run as
//!   consecutive blocks, so a step fetches each weight tile from memory about once whatever its
//!   number of rows. An f32 model, or a matrix whose `k` is not a multiple of 32, keeps `Vendor`.
//!
//! With the fused kernels on (`Gpu::fused`) and the tile GEMM, a matrix multiplies with the
//! residual stream's RMSNorm as its prologue or its residual add as its epilogue
//! (`Mat::apply_fused`, `tgemm_fused`), and a fused `[gate | up]` matrix straight into the SwiGLU
//! activation (`Mat::apply_swiglu`, `tgemm_swiglu`) when its two halves are dense or in one
//! format; otherwise the caller runs the unfused launches.
//!
//! Invariants: the path depends only on the kind, the dtype and the matrix's shape, never on the
//! batch, and each path reduces every row in one fixed order, so a row's result never depends on
//! what else is in the batch; a fused matrix's parts write their own columns of `y` (`ldy`).

use crate::dtype::Dt;
use crate::exec::GemmKind;
use crate::gpu::{DevBuf, Gpu};
use crate::kernels::launch::Matmul;
use crate::kernels::tgemm::TILE_K;
use crate::kernels::{Embedding, Fusion, QEmbedding, Qgemv, RowNorm, TileGemm, TileGemmSwiglu};
use crate::quant::QFormat;
use lmplex_core::{Error, Result};

/// A matrix `[out, in]` on the device.
pub enum Mat {
    /// In the backend's dtype, row-major.
    Dense(DevBuf),
    /// GGUF blocks as stored: consecutive runs of rows, each in one format.
    Quant(Vec<QPart>),
}

/// `rows` rows of a quantized matrix, in `format` blocks.
pub struct QPart {
    pub format: QFormat,
    pub rows: usize,
    pub buf: DevBuf,
}

impl Mat {
    pub fn bytes(&self) -> usize {
        match self {
            Self::Dense(b) => b.bytes,
            Self::Quant(parts) => parts.iter().map(|p| p.buf.bytes).sum(),
        }
    }

    /// `y[r, n_out] = x[r, k] · selfᵀ` for the batch's rows, by `g.gemm_kind`'s path (the module
    /// header): on `Vendor`, dense as `padded` rows of GEMM tiles and quantized as the GEMV over
    /// the `rows` real rows; on `Tiles`, the tile GEMM over the real rows. `x` and `y` are
    /// row-major in `dt`, y in `out` (`dt` or f32).
    #[allow(clippy::too_many_arguments)]
    pub fn apply(
        &self,
        g: &Gpu,
        x: u64,
        y: u64,
        (padded, rows): (usize, usize),
        n_out: usize,
        k: usize,
        dt: Dt,
        out: Dt,
    ) -> Result<()> {
        if tiles(g, dt, k) {
            return self.apply_fused(g, x, y, rows, n_out, k, (dt, out), Fusion::NONE);
        }
        let y_f32 = out == Dt::F32;
        let parts = match self {
            Self::Dense(w) => return g.gemm(x, w.ptr, y, padded, n_out, k, dt, out),
            Self::Quant(parts) => parts,
        };
        let mut col = 0;
        for p in parts {
            let (w, y, n) = (p.buf.ptr, y + (col * out.size()) as u64, p.rows);
            let mm = Matmul { w, x, y, n_out: n, k, m: rows, ldy: n_out, y_f32 };
            Qgemv { format: p.format, mm }.launch(g, dt)?;
            col += p.rows;
        }
        Ok(())
    }

    /// `y[r, n_out] = x[r, k] · selfᵀ` for the `rows` real rows by the tile GEMM with `fusion`'s
    /// prologue and epilogue (`Fusion::NONE`: the plain tile GEMM), each part of a quantized
    /// matrix writing its own columns; an error where the tile GEMM does not apply (`tiles`).
    #[allow(clippy::too_many_arguments)]
    pub fn apply_fused(
        &self,
        g: &Gpu,
        x: u64,
        y: u64,
        rows: usize,
        n_out: usize,
        k: usize,
        (dt, out): (Dt, Dt),
        fusion: Fusion,
    ) -> Result<()> {
        if !tiles(g, dt, k) {
            return Err(Error::internal(format!("the tile GEMM does not take a {dt:?} matrix of k = {k}")));
        }
        let y_f32 = out == Dt::F32;
        let launch = |format, w, n, col: usize| {
            let mm = Matmul { w, x, y: y + (col * out.size()) as u64, n_out: n, k, m: rows, ldy: n_out, y_f32 };
            TileGemm { format, mm, fusion }.launch(g, dt)
        };
        match self {
            Self::Dense(w) => launch(None, w.ptr, n_out, 0),
            Self::Quant(parts) => {
                let mut col = 0;
                for p in parts {
                    launch(Some(p.format), p.buf.ptr, p.rows, col)?;
                    col += p.rows;
                }
                Ok(())
            }
        }
    }

    /// `y[r, inter] = silu(x[r] · gateᵀ) * (x[r] · upᵀ)` for the real rows, `self` being
    /// `[gate | up]` (`[2 * inter, k]`), by the fused tile GEMM when the fused kernels and the tile
    /// GEMM are on and the halves are dense or in one format (the module header), x normalised
    /// first when `norm` is set; `false` (and nothing run) otherwise.
    #[allow(clippy::too_many_arguments)]
    pub fn apply_swiglu(
        &self,
        g: &Gpu,
        x: u64,
        y: u64,
        (rows, inter, k): (usize, usize, usize),
        dt: Dt,
        norm: Option<RowNorm>,
    ) -> Result<bool> {
        if !(g.fused && tiles(g, dt, k)) {
            return Ok(false);
        }
        let (format, w_gate, w_up) = match self {
            Self::Dense(w) => (None, w.ptr, w.at(inter * k * dt.size())),
            Self::Quant(parts) => match parts.as_slice() {
                [p] if p.rows == 2 * inter => (Some(p.format), p.buf.ptr, p.buf.at(p.format.bytes(inter, k))),
                [a, b] if a.rows == inter && b.format == a.format => (Some(a.format), a.buf.ptr, b.buf.ptr),
                _ => return Ok(false),
            },
        };
        TileGemmSwiglu { format, w_gate, w_up, x, y, inter, k, m: rows, norm }.launch(g, dt)?;
        Ok(true)
    }

    /// `out[t] = self[ids[t]]` for `rows` ids (the embedding gather), in `dt`.
    #[allow(clippy::too_many_arguments)]
    pub fn gather(&self, g: &Gpu, ids: u64, out: u64, rows: usize, hidden: usize, vocab: usize, dt: Dt) -> Result<()> {
        match self {
            Self::Dense(t) => Embedding { table: t.ptr, ids, out, hidden, vocab }.launch(g, dt, rows),
            Self::Quant(parts) => match parts.as_slice() {
                [p] => QEmbedding { format: p.format, table: p.buf.ptr, ids, out, hidden, vocab }.launch(g, dt, rows),
                _ => Err(Error::internal("an embedding table in several parts")),
            },
        }
    }
}

/// Whether `g` multiplies a `dt` matrix of `k` columns by the tile GEMM (the module header).
pub fn tiles(g: &Gpu, dt: Dt, k: usize) -> bool {
    g.gemm_kind == GemmKind::Tiles && dt != Dt::F32 && k.is_multiple_of(TILE_K)
}
