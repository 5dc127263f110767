//! `sampling.cu`: the seeded draw and the logit edits, their twins (the host sampler's own
//! `lmplex_model::sample::draw` and `lmplex_model::sample::pick`, which the kernels equal bit for
//! bit; like the kernel, the draw's twin leaves each sampled row holding its weights) and their
//! cases: the host sampler's draws token for token, and the host's edits bit for bit.

use super::argmax::Argmax;
use super::check::{exact, get_u32, put_raw, Case, Instance, Reference, Rng};
use super::launch::{dim, int, ROW_THREADS, THREADS};
use super::Kernel;
use crate::dtype::Dt;
use crate::exec::Arg::P;
use crate::gpu::Gpu;
use crate::hostexec::{HostExec, Traffic, TwinCall};
use lmplex_core::{Result, SamplingParams};
use lmplex_model::sample::argmax as host_argmax;
use lmplex_model::sample::draw::{draw, weights, DrawParams};
use lmplex_model::sample::pick::{apply_edits, LogitEdit, Pick};

pub(super) const KERNEL: Kernel = Kernel {
    entries: &[("sample", sample, sample_traffic), ("logit_edits", logit_edits, logit_edits_traffic)],
    checks,
};

/// One seeded draw per row of f32 logits (`lmplex_model::sample::draw`, bit for bit), overwriting the
/// rows with their weights; rows whose temperature is 0 are left to `Argmax`. Per-row
/// parameters: `temperature`, `top_p` and `min_p` (f32), `top_k` (i32, 0 for none), `seed` and
/// `step` (u64); `out[r]` is a u32 id.
pub struct Sample {
    pub logits: u64,
    pub out: u64,
    pub temperature: u64,
    pub top_k: u64,
    pub top_p: u64,
    pub min_p: u64,
    pub seed: u64,
    pub step: u64,
    pub vocab: usize,
}

impl Sample {
    pub fn launch(&self, g: &Gpu, rows: usize) -> Result<()> {
        let args = [
            P(self.logits),
            P(self.out),
            P(self.temperature),
            P(self.top_k),
            P(self.top_p),
            P(self.min_p),
            P(self.seed),
            P(self.step),
            int(self.vocab)?,
        ];
        g.launch("sample_f32", (dim(rows)?, 1, 1), ROW_THREADS, &args)
    }
}

/// Each row's logit edits (`lmplex_model::sample::pick`, packed by `meta::pack_edits`) applied to the
/// f32 `logits[r, vocab]` in place: row `r`'s edits are `edits[row_start[r]..row_start[r + 1]]`.
pub struct LogitEdits {
    pub logits: u64,
    pub edits: u64,
    pub row_start: u64,
    pub vocab: usize,
}

impl LogitEdits {
    pub fn launch(&self, g: &Gpu, rows: usize) -> Result<()> {
        let args = [P(self.logits), P(self.edits), P(self.row_start), int(self.vocab)?];
        g.launch("logit_edits_f32", (dim(rows)?, 1, 1), THREADS, &args)
    }
}

fn sample(h: &HostExec, c: &TwinCall) -> Result<()> {
    let a = &c.args;
    a.count(9)?;
    let (logits, out, vocab, rows) = (a.p(0)?, a.p(1)?, a.n(8)?, c.rows());
    let l = h.rd(logits, Dt::F32, rows * vocab)?;
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

/// Each row's packed edits (`meta::pack_edits`) through `LogitEdit::apply`.
fn logit_edits(h: &HostExec, c: &TwinCall) -> Result<()> {
    let a = &c.args;
    a.count(4)?;
    let (logits, vocab, rows) = (a.p(0)?, a.n(3)?, c.rows());
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

/// Each sampled row (temperature above 0) read and overwritten with its weights, every row's
/// parameters read and id written.
fn sample_traffic(h: &HostExec, c: &TwinCall) -> Result<Traffic> {
    let (vocab, rows) = (c.args.n(8)?, c.rows());
    let sampled = h.rd(c.args.p(2)?, Dt::F32, rows)?.iter().filter(|t| **t > 0.0).count();
    Ok(Traffic::moves(sampled * 2 * vocab * 4 + rows * (5 * 4 + 2 * 8)))
}

/// The row starts, the packed edits, and each edited logit read and written.
fn logit_edits_traffic(h: &HostExec, c: &TwinCall) -> Result<Traffic> {
    let rows = c.rows();
    let edits = h.rd_u32(c.args.p(2)?, rows + 1)?.last().copied().unwrap_or(0) as usize;
    Ok(Traffic::moves((rows + 1) * 4 + edits * (5 * 4 + 2 * 4)))
}

fn checks(filter: &str) -> Vec<Instance> {
    let mut out = exact("sample_f32", filter, sample_cases);
    out.extend(exact("logit_edits_f32", filter, logit_edits_cases));
    out
}
/// One sampling case: rows of logits, each row's temperature (0: greedy, left to argmax), and
/// the cuts every row shares.
struct Draw {
    logits: Vec<f32>,
    vocab: usize,
    temperatures: Vec<f32>,
    top_k: usize,
    top_p: f32,
    min_p: f32,
}

impl Draw {
    fn rows(&self) -> usize {
        self.logits.len() / self.vocab
    }

    fn seed(r: usize) -> (u64, u64) {
        (1000 + r as u64, (r as u64 * 7) % 5)
    }

    /// What the forward pass launches: argmax over every row, then the draw over the others.
    fn run(&self, g: &Gpu, sel: Option<usize>) -> Result<Vec<f32>> {
        let all: Vec<usize> = (0..self.rows()).collect();
        let rows = sel.map_or(all, |r| vec![r]);
        let n = rows.len();
        let l: Vec<f32> =
            rows.iter().flat_map(|&r| self.logits[r * self.vocab..(r + 1) * self.vocab].to_vec()).collect();
        let (lb, ob) = (put_raw(g, &l)?, g.alloc(n * 4)?);
        let temps: Vec<f32> = rows.iter().map(|&r| self.temperatures[r % self.temperatures.len()]).collect();
        let (tb, kb, pb, mb) = (
            put_raw(g, &temps)?,
            put_raw(g, &vec![self.top_k as i32; n])?,
            put_raw(g, &vec![self.top_p; n])?,
            put_raw(g, &vec![self.min_p; n])?,
        );
        let (seeds, steps): (Vec<u64>, Vec<u64>) = rows.iter().map(|&r| Self::seed(r)).unzip();
        let (sb, stb) = (put_raw(g, &seeds)?, put_raw(g, &steps)?);
        Argmax { logits: lb.ptr, out: ob.ptr, vocab: self.vocab }.launch(g, n)?;
        let (logits, out, temperature, top_k, top_p, min_p) = (lb.ptr, ob.ptr, tb.ptr, kb.ptr, pb.ptr, mb.ptr);
        let (seed, step, vocab) = (sb.ptr, stb.ptr, self.vocab);
        Sample { logits, out, temperature, top_k, top_p, min_p, seed, step, vocab }.launch(g, n)?;
        get_u32(g, &ob, n)
    }

    /// The host sampler's tokens (`lmplex_model::sample::draw`, or the argmax for greedy rows).
    fn host(&self) -> Vec<f64> {
        (0..self.rows())
            .map(|r| {
                let row = &self.logits[r * self.vocab..(r + 1) * self.vocab];
                let temperature = self.temperatures[r % self.temperatures.len()];
                if temperature == 0.0 {
                    return f64::from(host_argmax(row));
                }
                let p = SamplingParams {
                    temperature,
                    top_k: self.top_k,
                    top_p: self.top_p,
                    min_p: self.min_p,
                    ..Default::default()
                };
                let (seed, step) = Self::seed(r);
                f64::from(draw(row, &p, seed, step))
            })
            .collect()
    }
}

fn sample_case(label: &str, d: Draw) -> Case {
    let (rows, want) = (d.rows(), d.host());
    let run = move |g: &Gpu, sel: Option<usize>| d.run(g, sel);
    Case { label: label.into(), rows, run: Box::new(run), reference: Reference::Values(want) }
}

/// Every draw equals the host sampler's, token for token.
fn sample_cases() -> Vec<Case> {
    let mut rng = Rng::new(77);
    let vocab = 5003;
    let logits: Vec<f32> = (0..16 * vocab).map(|_| rng.unit() * 4.0).collect();
    let draw = |temperature: f32, top_k, top_p, min_p| Draw {
        logits: logits.clone(),
        vocab,
        temperatures: vec![temperature],
        top_k,
        top_p,
        min_p,
    };
    // Ties everywhere (8 distinct values), impossible tokens, and greedy rows between.
    let coarse: Vec<f32> = (0..8 * 3001)
        .map(|i| match i % 97 {
            0 => f32::NEG_INFINITY,
            1 => f32::NAN,
            _ => (rng.unit() * 4.0).round() * 0.5,
        })
        .collect();
    let same: Vec<f32> = [1.0f32, 0.5, 0.0, -1.0].repeat(512);
    vec![
        sample_case("vocab 5003, temperature 1", draw(1.0, 0, 1.0, 0.0)),
        sample_case("vocab 5003, top_k 5", draw(0.8, 5, 1.0, 0.0)),
        sample_case("vocab 5003, top_p 1e-6", draw(1.0, 0, 1e-6, 0.0)),
        sample_case("vocab 5003, top_k 50, top_p 0.9", draw(1.3, 50, 0.9, 0.0)),
        sample_case("vocab 5003, min_p 0.05, top_p 0.95", draw(1.0, 0, 0.95, 0.05)),
        sample_case("vocab 5003, top_k 3000, top_p 0.99, min_p 0.01", draw(0.7, 3000, 0.99, 0.01)),
        sample_case(
            "vocab 3001 of 8 values with -inf and NaN, top_k 700, top_p 0.8, greedy rows between",
            Draw { logits: coarse, vocab: 3001, temperatures: vec![1.0, 0.0, 0.6], top_k: 700, top_p: 0.8, min_p: 0.0 },
        ),
        sample_case(
            "vocab 4, 512 rows, temperature 0.7",
            Draw { logits: same, vocab: 4, temperatures: vec![0.7], top_k: 0, top_p: 1.0, min_p: 0.0 },
        ),
    ]
}

/// The edits of three rows (penalties, bias and forbidding on one token; repetition on
/// positive, negative, zero and NaN logits; none; a token past the vocabulary) against
/// `LogitEdit::apply`, bit for bit.
fn logit_edits_cases() -> Vec<Case> {
    let vocab = 3000usize;
    let mut rng = Rng::new(77);
    let mut logits: Vec<f32> = (0..3 * vocab).map(|_| rng.unit() * 8.0).collect();
    logits[5] = 0.0;
    logits[6] = -0.0;
    logits[7] = f32::NAN;
    let edit = |token, repetition, subtract, add, forbid| LogitEdit { token, repetition, subtract, add, forbid };
    let mut first: Vec<LogitEdit> = (0..600).map(|t| edit(t * 5, Some(1.3), None, None, false)).collect();
    first.extend([5, 6, 7].map(|t| edit(t, Some(1.7), Some(0.25), Some(-1.5), false)));
    first.sort_by_key(|e| e.token);
    first.dedup_by_key(|e| e.token);
    let picks = [
        first,
        vec![],
        vec![
            edit(2, Some(0.9), Some(1.0), Some(2.5), true),
            edit(11, None, Some(0.3), None, false),
            edit(9999, None, None, Some(1.0), false),
        ],
    ];
    let want: Vec<f64> = (0..3)
        .flat_map(|r| {
            let mut row = logits[r * vocab..(r + 1) * vocab].to_vec();
            apply_edits(&mut row, &picks[r]);
            row
        })
        .map(f64::from)
        .collect();
    let check = move |got: &[f32]| match want.iter().zip(got).position(|(w, g)| (*w as f32).to_bits() != g.to_bits()) {
        None => Ok(0.0),
        Some(i) => Err(format!("logit {i}: got {}, want {}", got[i], want[i])),
    };
    let run = move |g: &Gpu, sel: Option<usize>| {
        let rows: Vec<usize> = sel.map_or_else(|| vec![0, 1, 2], |r| vec![r]);
        let l: Vec<f32> = rows.iter().flat_map(|&r| logits[r * vocab..(r + 1) * vocab].to_vec()).collect();
        let draw = DrawParams { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 0, step: 0 };
        let p: Vec<Pick> = rows.iter().map(|&r| Pick { draw, edits: picks[r].clone() }).collect();
        let (bytes, at) = crate::meta::pack_edits(&p);
        let (lb, eb) = (put_raw(g, &l)?, put_raw(g, &bytes)?);
        LogitEdits { logits: lb.ptr, edits: eb.at(at), row_start: eb.ptr, vocab }.launch(g, rows.len())?;
        let mut out = vec![0f32; l.len()];
        g.dtoh(&mut out, lb.ptr)?;
        Ok(out)
    };
    let label =
        "three rows: 600 repetition edits and signed zeros and NaN; none; every kind, a token past the vocabulary";
    vec![Case { label: label.into(), rows: 3, run: Box::new(run), reference: Reference::Check(Box::new(check)) }]
}
