//! The host executor's twins of `argmax_f32`, `sample_f32` and `logit_edits_f32`: the host
//! sampler's own picks and edits (`lmplex_model::sample::argmax`, `lmplex_model::sample::draw`,
//! `lmplex_model::sample::pick`), which the kernels equal bit for bit (`kernel_check`). Like
//! the kernel, the draw leaves each sampled row holding its weights.

use super::{Args, HostExec};
use crate::dtype::Dt;
use lmplex_core::Result;
use lmplex_model::sample::argmax;
use lmplex_model::sample::draw::{weights, DrawParams};
use lmplex_model::sample::pick::{apply_edits, LogitEdit};

pub(crate) fn twin(h: &HostExec, name: &str, a: &Args, rows: usize) -> Result<()> {
    if name == "logit_edits_f32" {
        return edits(h, a, rows);
    }
    let (logits, out) = (a.p(0)?, a.p(1)?);
    let vocab = a.n(if name == "argmax_f32" { 2 } else { 8 })?;
    let l = h.rd(logits, Dt::F32, rows * vocab)?;
    if name == "argmax_f32" {
        a.count(3)?;
        let ids: Vec<u32> = l.chunks_exact(vocab).map(argmax).collect();
        return h.write_bytes(out, &ids.iter().flat_map(|i| i.to_le_bytes()).collect::<Vec<u8>>());
    }
    a.count(9)?;
    let (t, p, m) = (h.rd(a.p(2)?, Dt::F32, rows)?, h.rd(a.p(4)?, Dt::F32, rows)?, h.rd(a.p(5)?, Dt::F32, rows)?);
    let k: Vec<i32> = h.rd_u32(a.p(3)?, rows)?.into_iter().map(|v| v as i32).collect();
    let (seed, step) = (h.rd_i64(a.p(6)?, rows)?, h.rd_i64(a.p(7)?, rows)?);
    for (r, row) in l.chunks_exact(vocab).enumerate() {
        if t[r].is_nan() || t[r] <= 0.0 {
            continue;
        }
        let top_k = k[r].max(0) as usize;
        let d = DrawParams {
            temperature: t[r],
            top_k,
            top_p: p[r],
            min_p: m[r],
            seed: seed[r] as u64,
            step: step[r] as u64,
        };
        h.write_bytes(out + 4 * r as u64, &d.pick(row).to_le_bytes())?;
        h.wr(logits + (r * vocab * 4) as u64, Dt::F32, &weights(row, t[r]))?;
    }
    Ok(())
}

/// `logit_edits_f32`: each row's packed edits (`meta::pack_edits`) through `LogitEdit::apply`.
fn edits(h: &HostExec, a: &Args, rows: usize) -> Result<()> {
    a.count(4)?;
    let (logits, vocab) = (a.p(0)?, a.n(3)?);
    let starts = h.rd_u32(a.p(2)?, rows + 1)?;
    let n = starts.last().copied().unwrap_or(0) as usize;
    let words = h.rd_u32(a.p(1)?, 5 * n)?;
    let opt = |on: bool, bits: u32| on.then_some(f32::from_bits(bits));
    for r in 0..rows {
        let at = logits + (r * vocab * 4) as u64;
        let mut row = h.rd(at, Dt::F32, vocab)?;
        for w in words.chunks_exact(5).take(starts[r + 1] as usize).skip(starts[r] as usize) {
            let (token, flags) = (w[0], w[1]);
            let e = LogitEdit {
                token,
                repetition: opt(flags & 1 != 0, w[2]),
                subtract: opt(flags & 2 != 0, w[3]),
                add: opt(flags & 4 != 0, w[4]),
                forbid: flags & 8 != 0,
            };
            apply_edits(&mut row, &[e]);
        }
        h.wr(at, Dt::F32, &row)?;
    }
    Ok(())
}
