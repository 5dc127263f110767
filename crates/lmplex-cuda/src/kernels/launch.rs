//! What every kernel's launch shares: the block sizes, the conversion of sizes to a kernel's
//! `int` and to grid dimensions (refused when they do not fit), the name of a dtype's instance,
//! and the argument list of the matmul kernels. A leaf of `crate::kernels`.

use crate::dtype::Dt;
use crate::exec::Arg;
use lmplex_core::{Error, Result};
use Arg::{I, P};

/// Threads per block of the row-wise kernels (embedding, norms, RoPE, KV write, SwiGLU).
pub const THREADS: u32 = 256;
/// Threads per block of the head-wise kernels (head norms, paged attention).
pub const HEAD_THREADS: u32 = 128;
/// Threads per block of argmax and sampling: one block per row of logits.
pub const ROW_THREADS: u32 = 1024;

/// `v` as a kernel's `int` argument.
pub fn int(v: usize) -> Result<Arg> {
    i32::try_from(v).map(I).map_err(|_| Error::internal(format!("{v} does not fit a kernel's int argument")))
}

/// `v` blocks as a grid dimension.
pub(crate) fn dim(v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::internal(format!("{v} blocks do not fit a grid dimension")))
}

/// The entry point of `stem`'s instance for `dt` (`rope_bf16`).
pub(crate) fn name(stem: &str, dt: Dt) -> String {
    format!("{stem}_{}", dt.suffix())
}

/// The operands of every matmul kernel (`qgemv_*`, `tgemm_*`): `y[r, n] = x[m, k] · W[n_out, k]ᵀ`,
/// row `r` of y at `y + r * ldy` elements, in the storage type or f32 (`y_f32`).
#[derive(Clone, Copy, Debug)]
pub struct Matmul {
    pub w: u64,
    pub x: u64,
    pub y: u64,
    pub n_out: usize,
    pub k: usize,
    pub m: usize,
    pub ldy: usize,
    pub y_f32: bool,
}

impl Matmul {
    /// The kernels' argument list, `w, x, y, n_out, k, m, ldy, y_f32`, once `k` is a whole number
    /// of `k_step` and each row of y holds `n_out` (`kernel` names the refusal).
    pub(crate) fn args(&self, kernel: &str, k_step: usize) -> Result<[Arg; 8]> {
        if !self.k.is_multiple_of(k_step) {
            return Err(Error::internal(format!("{kernel}: k = {} is not a whole number of {k_step}", self.k)));
        }
        if self.ldy < self.n_out {
            return Err(Error::internal(format!("{kernel}: ldy {} < n_out {}", self.ldy, self.n_out)));
        }
        let (n_out, k, m, ldy) = (int(self.n_out)?, int(self.k)?, int(self.m)?, int(self.ldy)?);
        Ok([P(self.w), P(self.x), P(self.y), n_out, k, m, ldy, int(self.y_f32 as usize)?])
    }
}
