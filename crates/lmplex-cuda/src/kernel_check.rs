//! The runner of the kernel checks: every kernel instance executed on the CPU (the `.cu` code
//! through `lmplex_kernels::cpu`) against its CPU twin or, where the twin is missing or cheap to
//! beat, a float64 reference; with the race check and batch invariance. The cases are each
//! kernel's own (`crate::kernels`). Used by `tests/kernels_on_cpu.rs` and
//! `scripts/kernels_on_cpu` (the `kernels_on_cpu` example).
//!
//! Per case: the kernel runs on the CPU kernels with the threads of each phase in forward,
//! reverse and random order (the three outputs must be bit-identical, so a missing barrier or a
//! shared-memory race fails); the forward output is compared with the reference, as the largest
//! absolute difference over the reference's largest magnitude (at least 1), against the
//! dtype's tolerance; and rows run alone must give the bits they give in the batch.
//! Launches go through `crate::kernels`, the forward pass's own launch code.

use crate::gpu::Gpu;
use crate::kernels::check::{Case, Instance, Reference};
use crate::kernels::checks;
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
    for Instance { kernel, tol, cases } in checks(filter) {
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
