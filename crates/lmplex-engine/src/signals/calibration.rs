//! Calibration: how far routed requests run over their uncalibrated prediction, as the factor
//! the router scales its predictions by (`LiveSignals::calibration`).
//!
//! A finished request that carried a prediction gives a sample, measured latency (submitted to
//! finished) over the prediction for the tokens it really generated, when the prediction's own
//! assumptions held (`sample`): no step it ran in held more requests than the batch it was
//! predicted to run in, and, predicted to have the device to itself, no step of it ran while
//! another model of the device held requests. Work that came later slows it, and the
//! prediction leaves that out on purpose: the scheduler's join guard lets a request join only
//! where every deadline in the batch still holds, and the device guard keeps other models from
//! starting where one would not, so the slack a generous budget gives away is not an error to
//! correct. A request that missed its deadline is a sample whatever its steps.
//!
//! The factor is a high quantile of the samples, taken from the samples themselves: the
//! `RANK`-th largest of the last `WINDOW`, never below 1, at most `MAX`. A moving mean and
//! variance would let over-predictions (a burst queued behind work that ended early) widen the
//! spread and so raise the factor; ranks see only the samples above.
//!
//! Relaxation: a sample's logarithm halves every `HALF_LIFE` once `HOLD` has passed since it
//! was taken, and the published factor's logarithm relaxes the same way while no request
//! finishes: a model whose calibration refuses every budgeted call would otherwise never get
//! the request that could correct it.
//!
//! Invariant: the published logarithm is finite, at most ln `MAX`, and comes with the time of
//! the sample that moved it.

use lmplex_route::Prediction;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Samples the quantile is taken over: the most recent.
const WINDOW: usize = 40;
/// The quantile is the `RANK`-th largest sample of the window (above 97.5% of a full one).
const RANK: usize = 2;
/// The largest calibration factor.
pub(super) const MAX: f64 = 20.0;
/// Time after a sample before it starts to relax.
const HOLD: Duration = Duration::from_secs(30);
/// Once relaxing, the time over which a sample's logarithm halves.
const HALF_LIFE: Duration = Duration::from_secs(10);

/// The factor a logarithm taken `age` ago keeps.
pub(super) fn relaxed(age: Duration) -> f64 {
    0.5f64.powf(age.saturating_sub(HOLD).as_secs_f64() / HALF_LIFE.as_secs_f64())
}

/// How a request ran, as the step loop saw it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Ran {
    /// Submitted to finished, in seconds.
    pub measured_s: f64,
    /// Tokens it generated.
    pub tokens: usize,
    /// The most requests a step it ran in held.
    pub max_batch: usize,
    /// Whether a step of it ran while another model of the device held requests.
    pub shared: bool,
    /// Whether it ended after its deadline.
    pub missed: bool,
}

/// The calibration sample of a request predicted as `p` that ran as `ran` (module docs); `None`
/// when it gives none.
pub(crate) fn sample(p: &Prediction, ran: &Ran) -> Option<f64> {
    let held = ran.max_batch <= p.batch && (p.shared || !ran.shared);
    let predicted_s = p.queue_and_prefill_s + ran.tokens as f64 * p.time_per_output_token_s;
    (held || ran.missed).then(|| ran.measured_s / predicted_s).filter(|r| r.is_finite() && *r > 0.0)
}

/// The recent samples' logarithms, with when each was taken.
#[derive(Default)]
pub(super) struct Calibration {
    samples: VecDeque<(f64, Instant)>,
}

impl Calibration {
    /// Adds a ratio taken at `now`; the quantile's logarithm to publish, or `None` for a ratio
    /// that is not finite and positive (ignored).
    pub fn add(&mut self, ratio: f64, now: Instant) -> Option<f64> {
        if !(ratio.is_finite() && ratio > 0.0) {
            return None;
        }
        if self.samples.len() == WINDOW {
            self.samples.pop_front();
        }
        self.samples.push_back((ratio.ln(), now));
        let mut lns: Vec<f64> =
            self.samples.iter().map(|&(ln, at)| ln * relaxed(now.saturating_duration_since(at))).collect();
        lns.sort_unstable_by(|a, b| b.total_cmp(a));
        Some(lns[(RANK - 1).min(lns.len() - 1)].min(MAX.ln()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prediction(batch: usize, shared: bool) -> Prediction {
        Prediction {
            latency_ms: 0.0,
            queue_and_prefill_s: 0.1,
            time_per_output_token_s: 0.01,
            max_cost: 0.0,
            load: 0.0,
            batch,
            shared,
        }
    }

    #[test]
    fn a_request_slowed_by_later_work_gives_no_sample_unless_it_missed_its_deadline() {
        let ran = Ran { measured_s: 0.4, tokens: 10, max_batch: 2, shared: false, missed: false };
        let r = sample(&prediction(2, false), &ran).unwrap();
        assert!((r - 2.0).abs() < 1e-12, "0.4 s over 0.1 + 10 x 0.01");
        let joined = Ran { max_batch: 3, ..ran };
        assert_eq!(sample(&prediction(2, false), &joined), None, "a third request joined");
        assert!(sample(&prediction(2, false), &Ran { missed: true, ..joined }).is_some(), "and it missed");
        let shared = Ran { shared: true, ..ran };
        assert_eq!(sample(&prediction(2, false), &shared), None, "another model started beside it");
        assert!(sample(&prediction(2, true), &shared).is_some(), "predicted beside another model");
        assert_eq!(sample(&prediction(2, false), &Ran { measured_s: f64::NAN, ..ran }), None);
    }

    #[test]
    fn the_quantile_is_a_rank_so_over_predictions_never_raise_it() {
        let t = Instant::now();
        let mut c = Calibration::default();
        assert!((c.add(1.2, t).unwrap() - 1.2f64.ln()).abs() < 1e-12, "the first ratio as it is");
        for i in 0..100 {
            c.add(if i % 2 == 0 { 1.0 } else { 1.1 }, t);
        }
        let steady = c.add(1.1, t).unwrap();
        assert!((steady - 1.1f64.ln()).abs() < 1e-12, "{steady}");
        for _ in 0..10 {
            assert!((c.add(0.2, t).unwrap() - steady).abs() < 1e-12, "a burst predicted too high");
        }
        c.add(3.0, t);
        assert!((c.add(1.0, t).unwrap() - steady).abs() < 1e-12, "one outlier is not the quantile");
        assert!((c.add(2.0, t).unwrap() - 2f64.ln()).abs() < 1e-12, "two are");
        assert_eq!(c.add(f64::NAN, t), None, "a bad ratio is ignored");
        for _ in 0..WINDOW {
            c.add(1.0, t);
        }
        assert_eq!(c.add(1.0, t), Some(0.0), "the window forgets");
        c.add(1e9, t);
        assert_eq!(c.add(1e9, t), Some(MAX.ln()), "at most MAX");
    }

    #[test]
    fn samples_relax_after_the_hold() {
        let t = Instant::now();
        let mut c = Calibration::default();
        c.add(4.0, t);
        c.add(4.0, t);
        let later = c.add(1.0, t + HOLD + HALF_LIFE).unwrap();
        assert!((later - 4f64.ln() / 2.0).abs() < 1e-9, "{later}");
    }
}
