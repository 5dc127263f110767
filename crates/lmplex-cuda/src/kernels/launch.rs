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

/// The argument list of every matmul kernel (`qgemv_*`, `tgemm_*`): `w, x, y, n_out, k, m, ldy,
/// y_f32`.
pub(crate) fn matmul_args(
    w: u64,
    x: u64,
    y: u64,
    (n_out, k, m, ldy): (usize, usize, usize, usize),
    y_f32: bool,
) -> Result<[Arg; 8]> {
    Ok([P(w), P(x), P(y), int(n_out)?, int(k)?, int(m)?, int(ldy)?, int(y_f32 as usize)?])
}
