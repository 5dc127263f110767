//! Every kernel instance executed on the CPU (the `.cu` code through `lmplex_kernels::cpu`)
//! against its CPU twin (`hostexec`) or, where the twin is missing or cheap to beat, a float64
//! reference; with the race check and batch invariance. Used by `tests/kernels_on_cpu.rs` and
//! `scripts/kernels_on_cpu` (the `kernels_on_cpu` example).
//!
//! Per case: the kernel runs on the CPU kernels with the threads of each phase in forward,
//! reverse and random order (the three outputs must be bit-identical, so a missing barrier or a
//! shared-memory race fails); the forward output is compared with the reference, as the largest
//! absolute difference over the reference's largest magnitude (at least 1), against the
//! dtype's tolerance; and rows run alone must give the bits they give in the batch.
//! Launches go through `crate::launch`, the forward pass's own launch code.

mod cases;
mod quant;
mod sampling;

use crate::dtype::Dt;
use crate::gpu::{DevBuf, Gpu};
use lmplex_core::Result;
use lmplex_kernels::Order;

/// One kernel instance's result.
#[derive(Debug, Clone)]
pub struct Report {
    /// The entry point, e.g. `rope_bf16`.
    pub kernel: String,
    pub cases: usize,
    /// Largest relative error over the cases (see the module header).
    pub max_err: f64,
    pub tol: f64,
    /// What failed, one line each; empty when the instance passed.
    pub failures: Vec<String>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Relative tolerance of a kernel's output stored in `dt`: a few units in the last place of the
/// storage type (f32 sums run in another order than the reference's).
pub fn tolerance(dt: Dt) -> f64 {
    match dt {
        Dt::F32 => 2e-5,
        Dt::F16 => 2e-3,
        Dt::Bf16 => 1.6e-2,
    }
}

/// Checks a case's output: its error (0 when it holds) or a failure line.
pub type OutputCheck = Box<dyn Fn(&[f32]) -> std::result::Result<f64, String>>;
/// Launches a case on an executor: the whole batch (`None`) or one row alone.
pub type CaseRun = Box<dyn Fn(&Gpu, Option<usize>) -> Result<Vec<f32>>>;

/// What a case's output is checked against.
pub enum Reference {
    /// The same launch on the host executor (the kernel's CPU twin).
    Twin,
    /// Values computed here in float64.
    Values(Vec<f64>),
    /// A check of the output that returns its error (0 when it holds) or a failure line.
    Check(OutputCheck),
}

/// A case: `run(gpu, None)` launches the whole batch on `gpu` and returns its outputs as f32,
/// `rows` rows of equal width; `run(gpu, Some(r))` launches row `r` alone (as a batch of one).
pub struct Case {
    pub label: String,
    pub rows: usize,
    pub run: CaseRun,
    pub reference: Reference,
}

/// Uploads `v` encoded in `dt`.
pub fn put(g: &Gpu, dt: Dt, v: &[f32]) -> Result<DevBuf> {
    g.upload(&dt.encode(v))
}

/// Uploads plain numbers (ids, positions, slots, tables) as they are.
pub fn put_raw<T: Copy>(g: &Gpu, v: &[T]) -> Result<DevBuf> {
    let b = g.alloc(std::mem::size_of_val(v))?;
    g.htod(b.ptr, v)?;
    Ok(b)
}

/// Reads `n` values stored in `dt`.
pub fn get(g: &Gpu, dt: Dt, b: &DevBuf, n: usize) -> Result<Vec<f32>> {
    let mut bytes = vec![0u8; n * dt.size()];
    g.dtoh(&mut bytes, b.ptr)?;
    Ok(dt.decode(&bytes))
}

/// A seeded generator (SplitMix64) for case inputs.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut x = self.0;
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    /// `n` values uniform in [-scale, scale), rounded to `dt` (what the kernel will read).
    pub fn values(&mut self, n: usize, scale: f32, dt: Dt) -> Vec<f32> {
        let v: Vec<f32> = (0..n).map(|_| self.unit() * scale).collect();
        dt.decode(&dt.encode(&v))
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// An error for a case whose setup failed (a library call outside the kernels).
fn setup(e: impl std::fmt::Display) -> lmplex_core::Error {
    lmplex_core::Error::internal(format!("case setup: {e}"))
}

fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    let scale = want.iter().fold(1f64, |m, v| m.max(v.abs()));
    got.iter().zip(want).map(|(g, w)| (*g as f64 - w).abs()).fold(0f64, f64::max) / scale
}

const ORDERS: [Order; 3] = [Order::Forward, Order::Reverse, Order::Random(0x5eed)];

/// Runs one case; its error against the reference, or the failure.
fn run_case(c: &Case) -> std::result::Result<f64, String> {
    let emulated = |order| Gpu::emulated(order).map_err(|e| e.to_string());
    let mut outs = Vec::new();
    for order in ORDERS {
        outs.push((c.run)(&emulated(order)?, None).map_err(|e| format!("{order:?}: {e}"))?);
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    if let Some(i) = (1..outs.len()).find(|&i| bits(&outs[i]) != bits(&outs[0])) {
        let at = outs[0].iter().zip(&outs[i]).position(|(a, b)| a.to_bits() != b.to_bits()).unwrap_or(0);
        return Err(format!("{:?} order differs from forward order at output {at} (a race)", ORDERS[i]));
    }
    let got = &outs[0];
    if got.len() % c.rows.max(1) != 0 {
        return Err(format!("{} outputs are not {} equal rows", got.len(), c.rows));
    }
    let width = got.len() / c.rows.max(1);
    for r in [0, c.rows / 2, c.rows.saturating_sub(1)] {
        if r >= c.rows || c.rows == 1 {
            continue;
        }
        let alone = (c.run)(&emulated(Order::Forward)?, Some(r)).map_err(|e| format!("row {r} alone: {e}"))?;
        if alone.iter().map(|v| v.to_bits()).ne(got[r * width..(r + 1) * width].iter().map(|v| v.to_bits())) {
            return Err(format!("row {r} alone differs from row {r} in the batch"));
        }
    }
    match &c.reference {
        Reference::Twin => {
            let twin = (c.run)(&Gpu::host(), None).map_err(|e| format!("twin: {e}"))?;
            Ok(rel_err(got, &twin.iter().map(|&v| v as f64).collect::<Vec<_>>()))
        }
        Reference::Values(want) => Ok(rel_err(got, want)),
        Reference::Check(check) => check(got),
    }
}

/// Checks every kernel instance whose name contains `filter` (all with `""`), in the order of
/// `lmplex_kernels::all_kernels`.
pub fn run_all(filter: &str) -> Vec<Report> {
    let mut reports = Vec::new();
    for (kernel, tol, cases) in cases::all(filter) {
        let mut r = Report { kernel, cases: cases.len(), max_err: 0.0, tol, failures: Vec::new() };
        for c in &cases {
            match run_case(c) {
                Ok(e) if e <= tol => r.max_err = r.max_err.max(e),
                Ok(e) => {
                    r.max_err = r.max_err.max(e);
                    r.failures.push(format!("{}: error {e:.3e} over {tol:.1e}", c.label));
                }
                Err(why) => r.failures.push(format!("{}: {why}", c.label)),
            }
        }
        reports.push(r);
    }
    reports
}
