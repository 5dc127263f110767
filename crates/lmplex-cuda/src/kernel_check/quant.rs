//! Cases of the quantized kernels (`qgemv.cu`) for every GGUF format they read: the GEMV and
//! the embedding gather against float64 over candle's dequantization of the same blocks
//! (ggml's layouts, an outside oracle), and the GEMV's strided f32 output (the head's) against
//! its twin. The same for the tensor-core tile GEMM (`tgemm.cu`), dense and quantized, whose
//! reference rounds the weights to the storage type first, as the kernel stages them.

use super::{get, put, put_raw, setup, Case, Reference, Rng};
use crate::dtype::Dt;
use crate::gpu::Gpu;
use crate::launch::{QEmbedding, QFormat, Qgemv};
use crate::mat::TileGemm;
use candle_core::quantized::QTensor;
use candle_core::{Device, Tensor};
use lmplex_core::Result;

fn failed(label: String, why: String) -> Vec<Case> {
    let run = move |_: &Gpu, _: Option<usize>| -> Result<Vec<f32>> { Err(setup(&why)) };
    vec![Case { label, rows: 1, run: Box::new(run), reference: Reference::Values(Vec::new()) }]
}

/// GGUF bytes of random `[n, k]` weights in `format`, and their dequantized values.
fn quantized(format: QFormat, n: usize, k: usize, rng: &mut Rng) -> candle_core::Result<(Vec<u8>, Vec<f32>)> {
    let w: Vec<f32> = (0..n * k).map(|_| rng.unit()).collect();
    let q = QTensor::quantize(&Tensor::from_vec(w, (n, k), &Device::Cpu)?, format.ggml())?;
    Ok((q.data()?.to_vec(), q.dequantize(&Device::Cpu)?.flatten_all()?.to_vec1()?))
}

pub(super) fn qgemv(format: QFormat, dt: Dt) -> Vec<Case> {
    // 42 columns: the last block's last two warps have no column and return at once.
    let (n, k) = (42usize, 512usize);
    let mut rng = Rng::new(format as u64 + 40);
    let (raw, deq) = match quantized(format, n, k, &mut rng) {
        Ok(v) => v,
        Err(e) => return failed(format!("{format:?} weights"), e.to_string()),
    };
    let mut cases = Vec::new();
    // Rows of y `ldy` apart, in the storage type or f32; the gap between rows stays zero.
    for (m, ldy, y_f32) in [(1usize, n, false), (9, n, false), (3, n + 6, true)] {
        let x = rng.values(m * k, 1.0, dt);
        let want: Vec<f64> = (0..m * ldy)
            .map(|o| {
                let (r, c) = (o / ldy, o % ldy);
                if c >= n {
                    return 0.0;
                }
                (0..k).map(|j| x[r * k + j] as f64 * deq[c * k + j] as f64).sum()
            })
            .collect();
        let raw = raw.clone();
        let out = if y_f32 { Dt::F32 } else { dt };
        let run = move |g: &Gpu, sel: Option<usize>| {
            let rows = sel.map_or(m, |_| 1);
            let xs = match sel {
                None => x.clone(),
                Some(r) => x[r * k..(r + 1) * k].to_vec(),
            };
            let (wb, xb, yb) = (put_raw(g, &raw)?, put(g, dt, &xs)?, put(g, out, &vec![0.0; rows * ldy])?);
            Qgemv { format, w: wb.ptr, x: xb.ptr, y: yb.ptr, n_out: n, k, m: rows, ldy, y_f32 }.launch(g, dt)?;
            get(g, out, &yb, rows * ldy)
        };
        let label = format!("{n}x{k} weights, {m} rows, ldy {ldy}, f32 out {y_f32} (vs candle's dequantization)");
        cases.push(Case { label, rows: m, run: Box::new(run), reference: Reference::Values(want.clone()) });
    }
    // The twin the host executor runs, on the head's layout.
    let x = rng.values(2 * k, 1.0, dt);
    let run = move |g: &Gpu, sel: Option<usize>| {
        let rows = sel.map_or(2, |_| 1);
        let xs = sel.map_or_else(|| x.clone(), |r| x[r * k..(r + 1) * k].to_vec());
        let (wb, xb, yb) = (put_raw(g, &raw)?, put(g, dt, &xs)?, put(g, Dt::F32, &vec![0.0; rows * (n + 2)])?);
        Qgemv { format, w: wb.ptr, x: xb.ptr, y: yb.ptr, n_out: n, k, m: rows, ldy: n + 2, y_f32: true }
            .launch(g, dt)?;
        get(g, Dt::F32, &yb, rows * (n + 2))
    };
    cases.push(Case {
        label: "f32 out, ldy n + 2 (vs its twin)".into(),
        rows: 2,
        run: Box::new(run),
        reference: Reference::Twin,
    });
    cases
}

pub(super) fn qembedding(format: QFormat, dt: Dt) -> Vec<Case> {
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

/// The tile GEMM over `format` blocks (`None`: dense weights in `dt`): two row tiles and two
/// column tiles, each partly filled, eight steps of k; rows of y `ldy` apart, in `dt` or f32.
pub(super) fn tgemm(format: Option<QFormat>, dt: Dt) -> Vec<Case> {
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
    let mut cases = Vec::new();
    for (m, ldy, y_f32) in [(1usize, n, false), (70, n, false), (3, n + 6, true)] {
        let x = rng.values(m * k, 1.0, dt);
        let want: Vec<f64> = (0..m * ldy)
            .map(|o| {
                let (r, c) = (o / ldy, o % ldy);
                if c >= n {
                    return 0.0;
                }
                (0..k).map(|j| x[r * k + j] as f64 * w[c * k + j] as f64).sum()
            })
            .collect();
        let raw = raw.clone();
        let out = if y_f32 { Dt::F32 } else { dt };
        let run = move |g: &Gpu, sel: Option<usize>| {
            let rows = sel.map_or(m, |_| 1);
            let xs = sel.map_or_else(|| x.clone(), |r| x[r * k..(r + 1) * k].to_vec());
            let (wb, xb, yb) = (put_raw(g, &raw)?, put(g, dt, &xs)?, put(g, out, &vec![0.0; rows * ldy])?);
            TileGemm { format, w: wb.ptr, x: xb.ptr, y: yb.ptr, n_out: n, k, m: rows, ldy, y_f32 }.launch(g, dt)?;
            get(g, out, &yb, rows * ldy)
        };
        let label = format!("{n}x{k} weights, {m} rows, ldy {ldy}, f32 out {y_f32} (float64 reference)");
        cases.push(Case { label, rows: m, run: Box::new(run), reference: Reference::Values(want) });
    }
    let x = rng.values(5 * k, 1.0, dt);
    let run = move |g: &Gpu, sel: Option<usize>| {
        let rows = sel.map_or(5, |_| 1);
        let xs = sel.map_or_else(|| x.clone(), |r| x[r * k..(r + 1) * k].to_vec());
        let (wb, xb, yb) = (put_raw(g, &raw)?, put(g, dt, &xs)?, put(g, dt, &vec![0.0; rows * n])?);
        TileGemm { format, w: wb.ptr, x: xb.ptr, y: yb.ptr, n_out: n, k, m: rows, ldy: n, y_f32: false }
            .launch(g, dt)?;
        get(g, dt, &yb, rows * n)
    };
    cases.push(Case { label: "5 rows (vs its twin)".into(), rows: 5, run: Box::new(run), reference: Reference::Twin });
    cases
}
