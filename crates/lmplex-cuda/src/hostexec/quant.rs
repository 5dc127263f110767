//! The host executor's twins of the GGUF-block kernels (`qgemv`, `qembedding`, `tgemm`): they
//! dequantize with candle (`crate::quant::dequantize`) and multiply in index order.

use super::{Args, HostExec};
use crate::dtype::Dt;
use crate::quant::{dequantize, QFormat};
use lmplex_core::{Error, Result};

/// The host executor's twin of `qgemv_<format>` (`grid` blocks of columns), `tgemm_<format>`
/// and `tgemm_dense` (`crate::mat::TileGemm`: the same arguments, the weights rounded to the
/// storage type as the kernel stages them), and `qembedding_<format>` (`grid` = rows).
pub(crate) fn twin(h: &HostExec, stem: &str, a: &Args, dt: Dt, grid: usize) -> Result<()> {
    let unknown = || Error::internal(format!("no twin for '{stem}'"));
    let (kernel, suffix) = stem.split_once('_').ok_or_else(unknown)?;
    let format = QFormat::ALL.into_iter().find(|f| f.suffix() == suffix);
    let raw = |ptr: u64, len: usize| -> Result<Vec<u8>> {
        let mut b = vec![0u8; len];
        h.read_bytes(&mut b, ptr)?;
        Ok(b)
    };
    if kernel == "qembedding" {
        let format = format.ok_or_else(unknown)?;
        a.count(5)?;
        let (hidden, vocab) = (a.n(3)?, a.n(4)?);
        let row_bytes = format.bytes(1, hidden);
        for (t, id) in h.rd_u32(a.p(1)?, grid)?.into_iter().enumerate() {
            let row = match id as usize {
                id if id < vocab => dequantize(format, &raw(a.p(0)? + (id * row_bytes) as u64, row_bytes)?, 1, hidden)?,
                _ => vec![0.0; hidden],
            };
            h.wr(a.p(2)? + (t * hidden * dt.size()) as u64, dt, &row)?;
        }
        return Ok(());
    }
    a.count(8)?;
    let (n, k, m, ldy, y_f32) = (a.n(3)?, a.n(4)?, a.n(5)?, a.n(6)?, a.n(7)? != 0);
    let w = match (kernel, format) {
        ("qgemv", Some(f)) => dequantize(f, &raw(a.p(0)?, f.bytes(n, k))?, n, k)?,
        ("tgemm", Some(f)) => dt.decode(&dt.encode(&dequantize(f, &raw(a.p(0)?, f.bytes(n, k))?, n, k)?)),
        ("tgemm", None) if suffix == "dense" => h.rd(a.p(0)?, dt, n * k)?,
        _ => return Err(unknown()),
    };
    let x = h.rd(a.p(1)?, dt, m * k)?;
    let out = if y_f32 { Dt::F32 } else { dt };
    for r in 0..m {
        let xr = &x[r * k..(r + 1) * k];
        let y: Vec<f32> = w.chunks_exact(k).map(|wr| xr.iter().zip(wr).map(|(a, b)| a * b).sum()).collect();
        h.wr(a.p(2)? + (r * ldy * out.size()) as u64, out, &y)?;
    }
    Ok(())
}
