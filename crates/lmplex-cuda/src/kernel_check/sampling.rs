//! Cases of argmax, sampling and logit edits: they are checked against exact values: argmax's
//! indices, the host sampler's draws (`lmplex_model::sample::draw`), which the kernel must equal token
//! for token, and the host's edits (`lmplex_model::sample::pick`), bit for bit.

use super::{put_raw, Case, Reference, Rng};
use crate::gpu::Gpu;
use crate::launch::{Argmax, LogitEdits, Sample};
use lmplex_core::Result;
use lmplex_core::SamplingParams;
use lmplex_model::sample::argmax as host_argmax;
use lmplex_model::sample::draw::{draw, DrawParams};
use lmplex_model::sample::pick::{apply_edits, LogitEdit, Pick};

fn u32_out(g: &Gpu, b: &crate::gpu::DevBuf, n: usize) -> Result<Vec<f32>> {
    let mut v = vec![0u32; n];
    g.dtoh(&mut v, b.ptr)?;
    Ok(v.into_iter().map(|i| i as f32).collect())
}

/// Index of the largest value, the lowest among equals, NaN never winning; 0 for no winner.
fn argmax_of(row: &[f32]) -> usize {
    let mut best: Option<usize> = None;
    for (i, &v) in row.iter().enumerate() {
        if !v.is_nan() && best.is_none_or(|b| v > row[b]) {
            best = Some(i);
        }
    }
    best.unwrap_or(0)
}

fn exact(want: Vec<usize>) -> Reference {
    Reference::Check(Box::new(move |got: &[f32]| match want.iter().zip(got).position(|(w, g)| *w as f32 != *g) {
        None => Ok(0.0),
        Some(r) => Err(format!("row {r}: got {}, want {}", got[r], want[r])),
    }))
}

pub(super) fn argmax() -> Vec<Case> {
    let mut cases = Vec::new();
    for vocab in [1000usize, 5003, 32001] {
        let mut rng = Rng::new(vocab as u64);
        let mut rows: Vec<Vec<f32>> = (0..4).map(|_| (0..vocab).map(|_| rng.unit()).collect()).collect();
        let (a, b) = (rng.below(vocab / 2), vocab / 2 + rng.below(vocab / 2));
        rows[1][a] = 3.0; // a tie: the lower index wins
        rows[1][b] = 3.0;
        rows[2].fill(f32::NEG_INFINITY);
        rows[3][b] = f32::NAN; // NaN never wins
        rows[3][a] = 2.0;
        let want: Vec<usize> = rows.iter().map(|r| argmax_of(r)).collect();
        let logits: Vec<f32> = rows.concat();
        let label = format!("vocab {vocab}: random, a tie, all -inf, a NaN");
        let run = move |g: &Gpu, sel: Option<usize>| {
            let l = match sel {
                None => logits.clone(),
                Some(r) => logits[r * vocab..(r + 1) * vocab].to_vec(),
            };
            let n = l.len() / vocab;
            let (lb, ob) = (put_raw(g, &l)?, g.alloc(n * 4)?);
            Argmax { logits: lb.ptr, out: ob.ptr, vocab }.launch(g, n)?;
            u32_out(g, &ob, n)
        };
        cases.push(Case { label, rows: 4, run: Box::new(run), reference: exact(want) });
    }
    cases
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
        u32_out(g, &ob, n)
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
pub(super) fn sample() -> Vec<Case> {
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
pub(super) fn logit_edits() -> Vec<Case> {
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
