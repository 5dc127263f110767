//! Cases of argmax and sampling: they have no twin, so they are checked against exact indices
//! and the properties a draw must have (inside top-k and the top-p nucleus, the right
//! frequencies).

use super::{put_raw, Case, Reference, Rng};
use crate::gpu::Gpu;
use crate::launch::{Argmax, SampleTopKTopP};
use lmplex_core::Result;

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

/// Per-row sampling parameters of one case.
struct Draw {
    logits: Vec<f32>,
    vocab: usize,
    temperature: f32,
    top_k: i32,
    top_p: f32,
}

impl Draw {
    fn rows(&self) -> usize {
        self.logits.len() / self.vocab
    }

    fn run(&self, g: &Gpu, sel: Option<usize>) -> Result<Vec<f32>> {
        let all: Vec<usize> = (0..self.rows()).collect();
        let rows = sel.map_or(all, |r| vec![r]);
        let n = rows.len();
        let l: Vec<f32> =
            rows.iter().flat_map(|&r| self.logits[r * self.vocab..(r + 1) * self.vocab].to_vec()).collect();
        let seeds: Vec<u64> = rows.iter().map(|&r| 1000 + r as u64).collect();
        let steps: Vec<u64> = rows.iter().map(|&r| (r as u64 * 7) % 5).collect();
        let (lb, ob) = (put_raw(g, &l)?, g.alloc(n * 4)?);
        let (tb, kb, pb) = (
            put_raw(g, &vec![self.temperature; n])?,
            put_raw(g, &vec![self.top_k; n])?,
            put_raw(g, &vec![self.top_p; n])?,
        );
        let (sb, stb) = (put_raw(g, &seeds)?, put_raw(g, &steps)?);
        SampleTopKTopP {
            logits: lb.ptr,
            out: ob.ptr,
            temperature: tb.ptr,
            top_k: kb.ptr,
            top_p: pb.ptr,
            seed: sb.ptr,
            step: stb.ptr,
            vocab: self.vocab,
        }
        .launch(g, n)?;
        u32_out(g, &ob, n)
    }

    /// The tokens a draw may return for row `r`: the top-k (all when `top_k <= 0`), cut to the
    /// smallest prefix holding `top_p` of their mass, plus one token of slack at the edge.
    fn allowed(&self, r: usize) -> Vec<usize> {
        let row = &self.logits[r * self.vocab..(r + 1) * self.vocab];
        let mut order: Vec<usize> = (0..self.vocab).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        let k = if self.top_k > 0 { (self.top_k as usize).min(self.vocab) } else { self.vocab };
        let m = row[order[0]] as f64;
        let p: Vec<f64> = order[..k].iter().map(|&i| ((row[i] as f64 - m) / self.temperature as f64).exp()).collect();
        let total: f64 = p.iter().sum();
        let (mut acc, mut keep) = (0.0, 0);
        while keep < k && acc < self.top_p as f64 * total * (1.0 - 1e-6) {
            acc += p[keep];
            keep += 1;
        }
        order[..(keep + 1).min(k).max(1)].to_vec()
    }
}

fn sample_case(label: &str, d: Draw, check_frequencies: bool) -> Case {
    let rows = d.rows();
    let d = std::rc::Rc::new(d);
    let check = {
        let d = d.clone();
        move |got: &[f32]| -> std::result::Result<f64, String> {
            for (r, &t) in got.iter().enumerate() {
                if !d.allowed(r).contains(&(t as usize)) {
                    return Err(format!("row {r} drew token {t}, outside top-k/top-p"));
                }
            }
            if check_frequencies {
                // Every row has the same logits: the shares must follow softmax(l / T).
                let row = &d.logits[..d.vocab];
                let e: Vec<f64> = row.iter().map(|&l| (l as f64 / d.temperature as f64).exp()).collect();
                let s: f64 = e.iter().sum();
                let mut worst = 0f64;
                for (i, ei) in e.iter().enumerate() {
                    let share = got.iter().filter(|&&t| t as usize == i).count() as f64 / got.len() as f64;
                    worst = worst.max((share - ei / s).abs());
                }
                if worst > 0.06 {
                    return Err(format!("token shares differ from the probabilities by {worst:.3}"));
                }
            }
            Ok(0.0)
        }
    };
    let run = move |g: &Gpu, sel: Option<usize>| d.run(g, sel);
    Case { label: label.into(), rows, run: Box::new(run), reference: Reference::Check(Box::new(check)) }
}

pub(super) fn sample() -> Vec<Case> {
    let mut rng = Rng::new(77);
    let vocab = 5003;
    let logits: Vec<f32> = (0..16 * vocab).map(|_| rng.unit() * 4.0).collect();
    let draw = |temperature, top_k, top_p| Draw { logits: logits.clone(), vocab, temperature, top_k, top_p };
    let same: Vec<f32> = [1.0f32, 0.5, 0.0, -1.0].repeat(512);
    vec![
        sample_case("vocab 5003, top_k 1 (greedy)", draw(1.0, 1, 1.0), false),
        sample_case("vocab 5003, top_k 5", draw(0.8, 5, 1.0), false),
        sample_case("vocab 5003, top_p 1e-6 (greedy)", draw(1.0, 0, 1e-6), false),
        sample_case("vocab 5003, top_k 50, top_p 0.9", draw(1.3, 50, 0.9), false),
        sample_case(
            "vocab 4, 512 draws, temperature 0.7: shares follow the probabilities",
            Draw { logits: same, vocab: 4, temperature: 0.7, top_k: 0, top_p: 1.0 },
            true,
        ),
    ]
}
