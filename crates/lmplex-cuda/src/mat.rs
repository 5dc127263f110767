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
use crate::kernels::launch::Matmul;
use crate::kernels::tgemm::TILE_K;
use crate::kernels::{Embedding, QEmbedding, Qgemv, TileGemm};
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
        let tiles = g.gemm_kind == GemmKind::Tiles && dt != Dt::F32 && k.is_multiple_of(TILE_K);
        let y_f32 = out == Dt::F32;
        let parts = match self {
            Self::Dense(w) if tiles => {
                let mm = Matmul { w: w.ptr, x, y, n_out, k, m: rows, ldy: n_out, y_f32 };
                return TileGemm { format: None, mm }.launch(g, dt);
            }
            Self::Dense(w) => return g.gemm(x, w.ptr, y, padded, n_out, k, dt, out),
            Self::Quant(parts) => parts,
        };
        let mut col = 0;
        for p in parts {
            let (w, y, n) = (p.buf.ptr, y + (col * out.size()) as u64, p.rows);
            let mm = Matmul { w, x, y, n_out: n, k, m: rows, ldy: n_out, y_f32 };
            if tiles {
                TileGemm { format: Some(p.format), mm }.launch(g, dt)?;
            } else {
                Qgemv { format: p.format, mm }.launch(g, dt)?;
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
