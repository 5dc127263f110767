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
//! Invariants: the path depends only on the kind, the dtype and the matrix's shape, never on the
//! batch, and each path reduces every row in one fixed order, so a row's result never depends on
//! what else is in the batch; a fused matrix's parts write their own columns of `y` (`ldy`).

use crate::dtype::Dt;
use crate::exec::GemmKind;
use crate::gpu::{DevBuf, Gpu};
use crate::launch::{dim, matmul_args, Embedding, QEmbedding, Qgemv};
use crate::quant::QFormat;
use lmplex_core::{Error, Result};

/// Rows and columns of y one block of the tile GEMM computes (`tgemm.cu`'s TM and TN).
pub const TILE: usize = 64;
/// `k` advances this much per step of the tile GEMM (`tgemm.cu`'s TK).
pub const TILE_K: usize = 32;

/// `y[r, n] = x[m, k] · W[n_out, k]ᵀ` on the tensor cores (`tgemm.cu`), W dense in the storage
/// type (`format` `None`) or in GGUF blocks; row `r` of y at `y + r * ldy` elements, in the
/// storage type or f32 (`y_f32`).
pub struct TileGemm {
    pub format: Option<QFormat>,
    pub w: u64,
    pub x: u64,
    pub y: u64,
    pub n_out: usize,
    pub k: usize,
    pub m: usize,
    pub ldy: usize,
    pub y_f32: bool,
}

impl TileGemm {
    pub fn launch(&self, g: &Gpu, dt: Dt) -> Result<()> {
        if dt == Dt::F32 {
            return Err(Error::internal("tgemm: the tensor cores take f16 or bf16 inputs, not f32"));
        }
        if !self.k.is_multiple_of(TILE_K) || !self.k.is_multiple_of(self.format.map_or(1, |f| f.block().0)) {
            return Err(Error::internal(format!("tgemm: k = {} is not a whole number of steps or blocks", self.k)));
        }
        if self.ldy < self.n_out {
            return Err(Error::internal(format!("tgemm: ldy {} < n_out {}", self.ldy, self.n_out)));
        }
        let args = matmul_args(self.w, self.x, self.y, (self.n_out, self.k, self.m, self.ldy), self.y_f32)?;
        let weights = self.format.map_or("dense", |f| f.suffix());
        let grid = (dim(self.m.div_ceil(TILE))?, dim(self.n_out.div_ceil(TILE))?, 1);
        g.launch(&format!("tgemm_{weights}_{}", dt.suffix()), grid, 128, &args)
    }
}

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
        let tiles = g.gemm_kind == GemmKind::Tiles && dt != Dt::F32 && k.is_multiple_of(TILE_K);
        let y_f32 = out == Dt::F32;
        let parts = match self {
            Self::Dense(w) if tiles => {
                return TileGemm { format: None, w: w.ptr, x, y, n_out, k, m: rows, ldy: n_out, y_f32 }.launch(g, dt);
            }
            Self::Dense(w) => return g.gemm(x, w.ptr, y, padded, n_out, k, dt, out),
            Self::Quant(parts) => parts,
        };
        let mut col = 0;
        for p in parts {
            let (w, y, n) = (p.buf.ptr, y + (col * out.size()) as u64, p.rows);
            if tiles {
                TileGemm { format: Some(p.format), w, x, y, n_out: n, k, m: rows, ldy: n_out, y_f32 }.launch(g, dt)?;
            } else {
                Qgemv { format: p.format, w, x, y, n_out: n, k, m: rows, ldy: n_out, y_f32 }.launch(g, dt)?;
            }
            col += p.rows;
        }
        Ok(())
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
