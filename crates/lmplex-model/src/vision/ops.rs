//! Row operations of the vision encoder that the decoder's `rowops` lacks: LayerNorm (with a
//! bias) and the two GELUs of `vision_config.hidden_act`, on `[rows, width]` f32 buffers.
//!
//! Invariant: each row's arithmetic is sequential in a fixed order and reads only that row
//! (and the weights), so a row's result depends neither on the other rows nor on how the rows
//! are split over the thread team (`by_rows`).

use super::args::VisionAct;
use crate::rowops::Activation;
use crate::thread_team::{parallel_for, Cells};

/// Elements per task of `by_rows` (a loop on the team costs a few microseconds).
const TASK_ELEMS: usize = 1 << 14;

/// Applies `f` to every row of `x` (`width` values each), split over the thread team.
pub(super) fn by_rows(x: &mut [f32], width: usize, f: &(dyn Fn(&mut [f32]) + Sync)) {
    let rows = x.len() / width.max(1);
    let per_task = (TASK_ELEMS / width.max(1)).max(1);
    let tasks = rows.div_ceil(per_task);
    if tasks <= 1 {
        x.chunks_exact_mut(width).for_each(f);
        return;
    }
    let cells = Cells::new(x);
    parallel_for(tasks, &|t| {
        let (r0, r1) = (t * per_task, ((t + 1) * per_task).min(rows));
        // SAFETY: task t owns rows r0..r1, a disjoint range of `x`, which outlives the loop.
        let chunk = unsafe { cells.slice(r0 * width, (r1 - r0) * width) };
        chunk.chunks_exact_mut(width).for_each(f);
    });
}

/// `torch.nn.LayerNorm`: `(x - mean) / sqrt(var + eps) * weight + bias` per row, the mean and
/// the (biased) variance summed in f64.
pub(super) struct LayerNorm {
    pub(super) weight: Vec<f32>,
    pub(super) bias: Vec<f32>,
    pub(super) eps: f64,
}

impl LayerNorm {
    /// The normalized rows of `x`, as a new buffer.
    pub(super) fn forward(&self, x: &[f32]) -> Vec<f32> {
        let mut y = x.to_vec();
        self.forward_in_place(&mut y);
        y
    }

    /// As [`LayerNorm::forward`], overwriting `x`.
    pub(super) fn forward_in_place(&self, x: &mut [f32]) {
        let d = self.weight.len();
        by_rows(x, d, &|r| {
            let mean = r.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
            let var = r.iter().map(|&v| (v as f64 - mean) * (v as f64 - mean)).sum::<f64>() / d as f64;
            let rstd = (1.0 / (var + self.eps).sqrt()) as f32;
            let mean = mean as f32;
            for ((v, w), b) in r.iter_mut().zip(&self.weight).zip(&self.bias) {
                *v = (*v - mean) * rstd * w + b;
            }
        });
    }

    /// Bytes of the weight and bias.
    pub(super) fn size_in_bytes(&self) -> usize {
        (self.weight.len() + self.bias.len()) * 4
    }
}

/// `act(x)` elementwise over `x`, rows of `width`.
pub(super) fn activate(act: VisionAct, x: &mut [f32], width: usize) {
    match act {
        VisionAct::GeluTanh => lmplex_cpu::rowops::activate_in_place(Activation::GeluTanh, x, width),
        VisionAct::Gelu => by_rows(x, width, &|r| r.iter_mut().for_each(|v| *v = gelu_erf(*v))),
    }
}

/// torch's `gelu(x)`: `x * 0.5 * (1 + erf(x * sqrt(1/2)))` in f32, with `erf` exact to f32
/// (torch's vectorized `erf` is within about 1e-7 of it).
#[inline]
pub(super) fn gelu_erf(x: f32) -> f32 {
    let e = erf((x * std::f32::consts::FRAC_1_SQRT_2) as f64) as f32;
    x * 0.5 * (1.0 + e)
}

/// The error function in f64, within 2e-15 of the exact value: its Maclaurin series below 2,
/// `erfc`'s continued fraction (60 terms, evaluated backwards) from 2 to 6, and ±1 beyond
/// (`erfc(6)` is 2e-17).
pub(super) fn erf(x: f64) -> f64 {
    let a = x.abs();
    let r = if a < 2.0 {
        let x2 = a * a;
        let (mut term, mut sum) = (a, a);
        for n in 1..100 {
            term *= -x2 / n as f64;
            let t = term / (2 * n + 1) as f64;
            sum += t;
            if t.abs() < 1e-17 * sum.abs() {
                break;
            }
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else if a < 6.0 {
        let mut t = a;
        for n in (1..=60).rev() {
            t = a + (n as f64 / 2.0) / t;
        }
        1.0 - (-a * a).exp() / (std::f64::consts::PI.sqrt() * t)
    } else {
        1.0
    };
    r.copysign(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `erf` against reference values (Python's `math.erf` and `math.erfc`).
    #[test]
    fn erf_matches_reference_values() {
        let table = [
            (0.0, 0.0),
            (0.1, 0.112_462_916_018_284_9),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (1.5, 0.966_105_146_475_310_7),
            (1.999_999, 0.995_322_244_351_926_1),
            (2.0, 0.995_322_265_018_952_7),
            (3.0, 1.0 - 2.209_049_699_858_544e-5),
            (4.0, 1.0 - 1.541_725_790_028_002e-8),
            (7.5, 1.0),
        ];
        for (x, want) in table {
            assert!((erf(x) - want).abs() < 1e-13, "erf({x}) = {} != {want}", erf(x));
            assert!((erf(-x) + want).abs() < 1e-13, "erf is odd at {x}");
        }
        // Continuous where the two methods meet: one step below 2 is erf(2) less the slope's share.
        let slope = std::f64::consts::FRAC_2_SQRT_PI * (-4f64).exp();
        assert!((erf(2.0 - 1e-9) - (erf(2.0) - 1e-9 * slope)).abs() < 1e-15);
    }

    /// Both GELUs, as `activate` computes them, against their f64 formulas, and their limits.
    #[test]
    fn gelus_match_their_formulas() {
        let gelu_tanh = |x: f32| {
            let mut v = [x];
            activate(VisionAct::GeluTanh, &mut v, 1);
            v[0]
        };
        for i in -80..=80 {
            let x = i as f32 * 0.1;
            let xd = x as f64;
            let tanh = 0.5 * xd * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd.powi(3))).tanh());
            let exact = 0.5 * xd * (1.0 + erf(xd / std::f64::consts::SQRT_2));
            assert!((gelu_tanh(x) as f64 - tanh).abs() <= 2e-7 * (1.0 + xd.abs()), "gelu_tanh({x})");
            assert!((gelu_erf(x) as f64 - exact).abs() <= 2e-7 * (1.0 + xd.abs()), "gelu({x})");
        }
        assert_eq!((gelu_tanh(0.0), gelu_erf(0.0)), (0.0, 0.0));
        assert_eq!((gelu_tanh(20.0), gelu_erf(20.0)), (20.0, 20.0));
        assert!(gelu_erf(-20.0).abs() < 1e-30 && gelu_tanh(-20.0).abs() < 1e-30);
    }

    /// LayerNorm against the f64 formula; a row's bits do not depend on the rows around it.
    #[test]
    fn layer_norm_matches_the_formula_and_is_row_independent() {
        let d = 48;
        let ln = LayerNorm {
            weight: (0..d).map(|i| 1.0 + i as f32 * 0.01).collect(),
            bias: (0..d).map(|i| i as f32 * -0.02).collect(),
            eps: 1e-6,
        };
        let rows = 2000; // several tasks of `by_rows`
        let x: Vec<f32> =
            (0..rows * d).map(|i| ((i * 7919) % 1013) as f32 / 100.0 - 5.0 + (i / d % 10) as f32).collect();
        let y = ln.forward(&x);
        for (r, (xr, yr)) in x.chunks(d).zip(y.chunks(d)).enumerate().step_by(97) {
            let mean = xr.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
            let var = xr.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / d as f64;
            for j in 0..d {
                let want = (xr[j] as f64 - mean) / (var + 1e-6).sqrt() * ln.weight[j] as f64 + ln.bias[j] as f64;
                assert!((yr[j] as f64 - want).abs() < 1e-5, "row {r} col {j}");
            }
            assert_eq!(ln.forward(xr), yr, "row {r} alone");
        }
    }
}
