//! `argmax.cu`: the index of each row's largest logit, its twin (the host sampler's own
//! `lmplex_model::sample::argmax`) and its cases, checked against the exact index.

use super::check::{exact, get_u32, put_raw, Case, Instance, Reference, Rng};
use super::launch::{dim, int, ROW_THREADS};
use super::Kernel;
use crate::dtype::Dt;
use crate::exec::Arg::P;
use crate::gpu::Gpu;
use crate::hostexec::{HostExec, Traffic, TwinCall};
use lmplex_core::Result;
use lmplex_model::sample::argmax;

pub(super) const KERNEL: Kernel = Kernel { entries: &[("argmax", twin, traffic)], checks };

/// `out[r]` (u32) = the index of the largest of the f32 `logits[r, vocab]`, per row.
pub struct Argmax {
    pub logits: u64,
    pub out: u64,
    pub vocab: usize,
}

impl Argmax {
    pub fn launch(&self, g: &Gpu, rows: usize) -> Result<()> {
        let args = [P(self.logits), P(self.out), int(self.vocab)?];
        g.launch("argmax_f32", (dim(rows)?, 1, 1), ROW_THREADS, &args)
    }
}

fn twin(h: &HostExec, c: &TwinCall) -> Result<()> {
    let a = &c.args;
    a.count(3)?;
    let vocab = a.n(2)?;
    let l = h.rd(a.p(0)?, Dt::F32, c.rows() * vocab)?;
    let ids: Vec<u32> = l.chunks_exact(vocab).map(argmax).collect();
    h.write_bytes(a.p(1)?, &ids.iter().flat_map(|i| i.to_le_bytes()).collect::<Vec<u8>>())
}

/// Each row of f32 logits read, its id written.
fn traffic(_: &HostExec, c: &TwinCall) -> Result<Traffic> {
    Ok(Traffic::moves(c.rows() * (c.args.n(2)? * 4 + 4)))
}

fn checks(filter: &str) -> Vec<Instance> {
    exact("argmax_f32", filter, cases)
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

/// Ids that must equal `want`, row for row.
fn ids(want: Vec<usize>) -> Reference {
    Reference::Check(Box::new(move |got: &[f32]| match want.iter().zip(got).position(|(w, g)| *w as f32 != *g) {
        None => Ok(0.0),
        Some(r) => Err(format!("row {r}: got {}, want {}", got[r], want[r])),
    }))
}

fn cases() -> Vec<Case> {
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
            get_u32(g, &ob, n)
        };
        cases.push(Case { label, rows: 4, run: Box::new(run), reference: ids(want) });
    }
    cases
}
