//! Row-wise operations of the forward pass on plain `[rows, width]` f32 buffers: RMSNorm, gate
//! activation (SiLU, GELU-tanh) times up (with a polynomial `exp`, also attention's, so its loop
//! vectorizes), residual add, bias add, soft-cap. Large buffers are split over the thread team
//! by rows; each row's arithmetic is sequential in a fixed order, so a row's result depends only
//! on that row (batch invariance) and not on the split.

use crate::thread_team::{parallel_for, Cells};

/// Elements below which an operation runs on the calling thread alone (a loop on the team
/// costs a few microseconds to start and end).
const PARALLEL_MIN: usize = 1 << 16;
/// The same for SiLU, about ten times the work per element (an `exp` and a division).
const PARALLEL_MIN_SILU: usize = 1 << 12;

/// `e^x` (within a few ulp for x in [-87, 88]; below about -104 it gives 0, NaN stays NaN):
/// Cephes' polynomial with separate multiplies and adds, and `2^n` built from exponent bits in
/// two halves so that every factor is a normal float. Plain float and integer operations, so
/// loops over it vectorize.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    let x = x.clamp(-104.0, 88.376_26);
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = x - n * 0.693_359_4;
    let r = r - n * -2.121_944_4e-4;
    let mut y = 1.987_569_1e-4f32;
    for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5] {
        y = y * r + c;
    }
    let y = y * (r * r) + (r + 1.0);
    // n is an integer in [-150, 128]: 2^n = 2^a * 2^b with a, b in [-75, 64]. Its i32 comes
    // from the bits of n + 1.5 * 2^23 (exact below 2^22), not `as i32`, whose saturating
    // semantics kept the loops from vectorizing (a NaN x gives a NaN y, so any n is fine).
    let n = (n + 12_582_912.0).to_bits() as i32 - 0x4B40_0000;
    let a = n >> 1;
    let pow2 = |e: i32| f32::from_bits(((e + 127) as u32) << 23);
    y * pow2(a) * pow2(n - a)
}

/// Applies `f(row index, row)` to every row of `x` (`width` values each), split over the team
/// in tasks of at least `min` elements.
fn by_rows_min(x: &mut [f32], width: usize, min: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let rows = x.len() / width.max(1);
    if x.len() < min || rows < 2 {
        x.chunks_exact_mut(width).enumerate().for_each(|(i, r)| f(i, r));
        return;
    }
    let per_task = (min / width).clamp(1, rows);
    let cells = Cells::new(x);
    parallel_for(rows.div_ceil(per_task), &|t| {
        let (r0, r1) = (t * per_task, ((t + 1) * per_task).min(rows));
        // SAFETY: task t owns rows r0..r1, a disjoint range of `x`.
        let chunk = unsafe { cells.slice(r0 * width, (r1 - r0) * width) };
        chunk.chunks_exact_mut(width).enumerate().for_each(|(i, r)| f(r0 + i, r));
    });
}

/// `by_rows_min` for operations of a few steps per element.
fn by_rows(x: &mut [f32], width: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    by_rows_min(x, width, PARALLEL_MIN, f)
}

/// `y = x / sqrt(mean(x^2) + eps) * w` per row of `w.len()` values.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let mut y = x.to_vec();
    rms_norm_in_place(&mut y, w, eps);
    y
}

/// As [`rms_norm`], overwriting `x`.
pub fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let d = w.len();
    by_rows(x, d, |_, r| {
        let ms = r.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        r.iter_mut().zip(w).for_each(|(v, wi)| *v = *v * inv * wi);
    });
}

/// The activation of a gated MLP's gate (`hidden_act` / `hidden_activation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(x)` (`silu`: Llama, Qwen, Mistral, Phi-3, the MoE families).
    Silu,
    /// GELU's tanh approximation (`gelu_pytorch_tanh`: Gemma), computed as
    /// `x * sigmoid(2 * sqrt(2 / pi) * (x + 0.044715 x^3))`, which equals `0.5 x (1 + tanh(..))`.
    GeluTanh,
    /// `x * sigmoid(1.702 x)` (`quick_gelu`: CLIP's and Qwen2-VL's vision towers).
    QuickGelu,
}

impl Activation {
    /// `act(x)`: `x * sigmoid(z)` for the activation's `z(x)`, with the polynomial `exp`.
    #[inline(always)]
    fn apply(self, x: f32) -> f32 {
        let z = match self {
            Self::Silu => x,
            Self::GeluTanh => 1.595_769 * (x + 0.044_715 * (x * x * x)),
            Self::QuickGelu => 1.702 * x,
        };
        x / (1.0 + exp(-z))
    }
}

/// `x = act(x)` elementwise over rows of `width` (an ungated MLP's activation: the vision
/// towers'), vectorized as [`gated`] is, split over the team by rows.
pub fn activate_in_place(act: Activation, x: &mut [f32], width: usize) {
    #[inline(always)]
    fn body(act: Activation, r: &mut [f32]) {
        // One loop per variant, so that each loop is branch-free and vectorizes.
        match act {
            Activation::Silu => r.iter_mut().for_each(|v| *v = Activation::Silu.apply(*v)),
            Activation::GeluTanh => r.iter_mut().for_each(|v| *v = Activation::GeluTanh.apply(*v)),
            Activation::QuickGelu => r.iter_mut().for_each(|v| *v = Activation::QuickGelu.apply(*v)),
        }
    }
    by_rows_min(x, width, PARALLEL_MIN_SILU, |_, r| {
        #[cfg(target_arch = "x86_64")]
        if crate::qmatmul::Isa::detect() == crate::qmatmul::Isa::Avx512 {
            #[target_feature(enable = "avx512f,avx2,fma")]
            unsafe fn avx512(act: Activation, r: &mut [f32]) {
                body(act, r)
            }
            // SAFETY: the AVX-512 family is chosen only where the CPU has AVX-512F, AVX2 and FMA.
            return unsafe { avx512(act, r) };
        }
        #[cfg(target_arch = "x86_64")]
        if crate::qmatmul::has_avx2() {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2(act: Activation, r: &mut [f32]) {
                body(act, r)
            }
            // SAFETY: AVX2 and FMA were detected at run time.
            return unsafe { avx2(act, r) };
        }
        body(act, r)
    });
}

/// `act(gate) * up`, where row i of `gu` is `[gate | up]` (`2 * width` values) when `up` is
/// `None`, else `gu` is the gate and `up` the up projection. Returns `[rows, width]`.
pub fn gated(act: Activation, gate: Vec<f32>, up: Option<&[f32]>, width: usize) -> Vec<f32> {
    match up {
        Some(up) => {
            let mut g = gate;
            by_rows_min(&mut g, width, PARALLEL_MIN_SILU, |i, r| {
                let u = &up[i * width..(i + 1) * width];
                gated_rows(act, r, None, u);
            });
            g
        }
        None => {
            let rows = gate.len() / (2 * width);
            let mut out = vec![0f32; rows * width];
            by_rows_min(&mut out, width, PARALLEL_MIN_SILU, |i, r| {
                let (g, u) = gate[i * 2 * width..(i + 1) * 2 * width].split_at(width);
                gated_rows(act, r, Some(g), u);
            });
            out
        }
    }
}

/// Gate and up rows alternate in runs of this many in an interleaved gated matrix
/// (`DenseWeight::interleave_halves`).
pub const GATE_RUN: usize = 16;

/// [`gated`] for rows laid out as an interleaved gated matrix's product (`[rows, 2 * width]`,
/// runs of `GATE_RUN` gate values then the same outputs' up values): each row's gate and up
/// are gathered, then computed exactly as `gated` computes them.
pub fn gated_interleaved(act: Activation, y: &[f32], width: usize) -> Vec<f32> {
    assert!(width.is_multiple_of(GATE_RUN) && y.len().is_multiple_of(2 * width.max(1)), "interleaved rows of {width}");
    let rows = y.len() / (2 * width).max(1);
    let mut out = vec![0f32; rows * width];
    thread_local! {
        /// One row's up values (reused: this runs once per layer and decode step).
        static UP: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    by_rows_min(&mut out, width, PARALLEL_MIN_SILU, |i, o| {
        UP.with_borrow_mut(|up| {
            up.clear();
            up.resize(width, 0.0);
            for ((o, u), run) in o
                .chunks_exact_mut(GATE_RUN)
                .zip(up.chunks_exact_mut(GATE_RUN))
                .zip(y[i * 2 * width..].chunks_exact(2 * GATE_RUN))
            {
                o.copy_from_slice(&run[..GATE_RUN]);
                u.copy_from_slice(&run[GATE_RUN..]);
            }
            gated_rows(act, o, None, up);
        });
    });
    out
}

/// [`gated`] with SiLU.
pub fn silu_mul(gate: Vec<f32>, up: Option<&[f32]>, width: usize) -> Vec<f32> {
    gated(Activation::Silu, gate, up, width)
}

/// `o[i] = act(g[i]) * u[i]` (`g: None`: `o` holds the gate, in place), with the polynomial
/// `exp` so that the loop vectorizes (16 lanes with AVX-512, 8 with AVX2: the same operations,
/// so the same bits).
pub(crate) fn gated_rows(act: Activation, o: &mut [f32], g: Option<&[f32]>, u: &[f32]) {
    #[inline(always)]
    fn each(o: &mut [f32], g: Option<&[f32]>, u: &[f32], f: impl Fn(f32, f32) -> f32) {
        match g {
            Some(g) => o.iter_mut().zip(g).zip(u).for_each(|((o, &g), &u)| *o = f(g, u)),
            None => o.iter_mut().zip(u).for_each(|(o, &u)| *o = f(*o, u)),
        }
    }
    #[inline(always)]
    fn body(act: Activation, o: &mut [f32], g: Option<&[f32]>, u: &[f32]) {
        // One loop per variant, so that each loop is branch-free and vectorizes.
        match act {
            Activation::Silu => each(o, g, u, |g, u| Activation::Silu.apply(g) * u),
            Activation::GeluTanh => each(o, g, u, |g, u| Activation::GeluTanh.apply(g) * u),
            Activation::QuickGelu => each(o, g, u, |g, u| Activation::QuickGelu.apply(g) * u),
        }
    }
    #[cfg(target_arch = "x86_64")]
    if crate::qmatmul::Isa::detect() == crate::qmatmul::Isa::Avx512 {
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn avx512(act: Activation, o: &mut [f32], g: Option<&[f32]>, u: &[f32]) {
            body(act, o, g, u)
        }
        // SAFETY: the AVX-512 family is chosen only where the CPU has AVX-512F, AVX2 and FMA.
        return unsafe { avx512(act, o, g, u) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::qmatmul::has_avx2() {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2(act: Activation, o: &mut [f32], g: Option<&[f32]>, u: &[f32]) {
            body(act, o, g, u)
        }
        // SAFETY: AVX2 and FMA were detected at run time.
        return unsafe { avx2(act, o, g, u) };
    }
    body(act, o, g, u)
}

/// `x = cap * tanh(x / cap)` elementwise (Gemma 2's final-logit soft-cap).
pub fn softcap_in_place(x: &mut [f32], cap: f32) {
    x.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
}

/// `x *= c` elementwise.
pub fn scale_in_place(x: &mut [f32], c: f32) {
    x.iter_mut().for_each(|v| *v *= c);
}

/// `x += y` elementwise.
pub fn add_in_place(x: &mut [f32], y: &[f32], width: usize) {
    by_rows(x, width, |i, r| {
        r.iter_mut().zip(&y[i * width..(i + 1) * width]).for_each(|(a, b)| *a += b);
    });
}

/// `x[row] += b` for every row.
pub fn add_bias(x: &mut [f32], b: &[f32]) {
    by_rows(x, b.len(), |_, r| r.iter_mut().zip(b).for_each(|(a, bi)| *a += bi));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SiLU-times-up within a few ulp of the f64 formula, fused or not (below about -88, where
    /// `exp` saturates, within 1e-30 of it).
    #[test]
    fn silu_mul_matches_the_formula() {
        let width = 300; // not a multiple of 8 or 256
        let g: Vec<f32> = (0..2 * width).map(|i| (i as f32 - 300.0) * 0.37).collect();
        let u: Vec<f32> = (0..2 * width).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        let want: Vec<f64> = g.iter().zip(&u).map(|(&g, &u)| g as f64 / (1.0 + (-g as f64).exp()) * u as f64).collect();
        let sep = silu_mul(g.clone(), Some(&u), width);
        let mut joined = Vec::new();
        for r in 0..2 {
            joined.extend_from_slice(&g[r * width..(r + 1) * width]);
            joined.extend_from_slice(&u[r * width..(r + 1) * width]);
        }
        let fused = silu_mul(joined, None, width);
        assert_eq!(sep, fused);
        for (i, (&got, &w)) in sep.iter().zip(&want).enumerate() {
            assert!((got as f64 - w).abs() <= 4e-7 * w.abs() + 1e-30, "{i}: {got} vs {w}");
        }
    }

    /// GELU (tanh form) times up within 1e-6 relative of the f64 formula `0.5 x (1 + tanh(..))`.
    #[test]
    fn gelu_tanh_matches_the_formula() {
        let width = 300;
        let g: Vec<f32> = (0..width).map(|i| (i as f32 - 150.0) * 0.07).collect();
        let u: Vec<f32> = (0..width).map(|i| 1.0 + (i % 5) as f32 * 0.5).collect();
        let got = gated(Activation::GeluTanh, g.clone(), Some(&u), width);
        for (i, ((&x, &up), &y)) in g.iter().zip(&u).zip(&got).enumerate() {
            let x = x as f64;
            let want =
                0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh()) * up as f64;
            assert!((y as f64 - want).abs() <= 1e-6 * want.abs() + 1e-7, "{i}: {y} vs {want}");
        }
    }

    /// The ungated activations within 1e-6 relative of their f64 formulas, split or not.
    #[test]
    fn activations_match_their_formulas() {
        type Formula = fn(f64) -> f64;
        let cases: [(Activation, Formula); 3] = [
            (Activation::Silu, |x| x / (1.0 + (-x).exp())),
            (Activation::QuickGelu, |x| x / (1.0 + (-1.702 * x).exp())),
            (Activation::GeluTanh, |x| {
                0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
            }),
        ];
        for (act, f) in cases {
            let x: Vec<f32> = (0..(1 << 14)).map(|i| (i as f32 - 8192.0) * 0.002).collect();
            let mut y = x.clone();
            activate_in_place(act, &mut y, 64);
            for (i, (&x, &y)) in x.iter().zip(&y).enumerate() {
                let want = f(x as f64);
                assert!((y as f64 - want).abs() <= 1e-6 * want.abs() + 1e-7, "{act:?} {i}: {y} vs {want}");
            }
        }
    }

    /// `exp` within 3 ulp of f64's over its range, 0 far below it, NaN for NaN.
    #[test]
    fn exp_is_close_everywhere() {
        for i in 0..=200_000 {
            let x = -87.0 + i as f32 * (175.0 / 200_000.0);
            let (got, want) = (exp(x) as f64, (x as f64).exp());
            assert!((got - want).abs() <= 3.0 * f32::EPSILON as f64 * want, "exp({x}) = {got}, not {want}");
        }
        assert_eq!(exp(-200.0), 0.0);
        assert!(exp(f32::NAN).is_nan());
    }

    /// The interleaved layout gives `gated`'s bits.
    #[test]
    fn gated_interleaved_matches_gated() {
        let (width, rows) = (48, 3);
        let y: Vec<f32> = (0..rows * 2 * width).map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 5.0).collect();
        let mut joined = Vec::new();
        for row in y.chunks_exact(2 * width) {
            let runs: Vec<&[f32]> = row.chunks_exact(GATE_RUN).collect();
            joined.extend(runs.iter().step_by(2).flat_map(|r| r.iter()));
            joined.extend(runs.iter().skip(1).step_by(2).flat_map(|r| r.iter()));
        }
        for act in [Activation::Silu, Activation::GeluTanh] {
            assert_eq!(gated_interleaved(act, &y, width), gated(act, joined.clone(), None, width));
        }
    }

    /// Rows are computed alone and in a large (parallel) buffer alike.
    #[test]
    fn rows_do_not_depend_on_the_buffer() {
        let (w, rows) = (96, 2000); // 192k values: split over the team
        let x: Vec<f32> = (0..w * rows).map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0).collect();
        let nw: Vec<f32> = (0..w).map(|i| 0.5 + i as f32 / w as f32).collect();
        let all = rms_norm(&x, &nw, 1e-6);
        let act = silu_mul(x.clone(), None, w / 2);
        for i in [0, 777, rows - 1] {
            assert_eq!(rms_norm(&x[i * w..(i + 1) * w], &nw, 1e-6), all[i * w..(i + 1) * w]);
            assert_eq!(silu_mul(x[i * w..(i + 1) * w].to_vec(), None, w / 2), act[i * w / 2..(i + 1) * w / 2]);
        }
        let r = &x[..w];
        let ms = r.iter().map(|v| v * v).sum::<f32>() / w as f32;
        assert!((all[3] - r[3] / (ms + 1e-6).sqrt() * nw[3]).abs() < 1e-6);
    }
}
