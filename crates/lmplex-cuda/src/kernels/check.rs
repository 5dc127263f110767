//! What a kernel's check cases are made of (each kernel's cases are in its own file; the runner
//! is `crate::kernel_check`): a case launches the kernel on an executor, the whole batch or one
//! row alone, and names the reference its output is held to; inputs come from a seeded
//! generator and are rounded to the storage type the kernel reads.

use crate::dtype::Dt;
use crate::gpu::{DevBuf, Gpu};
use crate::quant::QFormat;
use candle_core::quantized::QTensor;
use candle_core::{Device, Tensor};
use lmplex_core::{Error, Result};

/// The storage types of a typed kernel's instances.
pub(crate) const DTS: [Dt; 3] = [Dt::F32, Dt::F16, Dt::Bf16];

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

/// One kernel instance (an entry point, e.g. `rope_bf16`) with its tolerance and cases.
pub struct Instance {
    pub kernel: String,
    pub tol: f64,
    pub cases: Vec<Case>,
}

/// The instances `{stem}_{dtype}` of a typed kernel whose name contains `filter`, each with the
/// cases `build(dtype)` at the dtype's tolerance (cases are built only for those kept).
pub(crate) fn typed(stem: &str, filter: &str, dts: &[Dt], build: impl Fn(Dt) -> Vec<Case>) -> Vec<Instance> {
    dts.iter()
        .map(|&dt| (format!("{stem}_{}", dt.suffix()), dt))
        .filter(|(kernel, _)| kernel.contains(filter))
        .map(|(kernel, dt)| Instance { kernel, tol: tolerance(dt), cases: build(dt) })
        .collect()
}

/// The instance `kernel`, checked exactly (tolerance 0), when its name contains `filter`.
pub(crate) fn exact(kernel: &str, filter: &str, build: fn() -> Vec<Case>) -> Vec<Instance> {
    match kernel.contains(filter) {
        true => vec![Instance { kernel: kernel.into(), tol: 0.0, cases: build() }],
        false => Vec::new(),
    }
}

/// A case checked against the kernel's twin.
pub(crate) fn against_twin(
    label: String,
    rows: usize,
    run: impl Fn(&Gpu, Option<usize>) -> Result<Vec<f32>> + 'static,
) -> Case {
    Case { label, rows, run: Box::new(run), reference: Reference::Twin }
}

/// The rows a launch takes of `v` (rows of `width`): all, or row `sel` alone.
pub(crate) fn rows_of<T: Copy>(v: &[T], width: usize, sel: Option<usize>) -> Vec<T> {
    match sel {
        None => v.to_vec(),
        Some(r) => v[r * width..(r + 1) * width].to_vec(),
    }
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

/// Reads `n` u32 values (ids) as f32.
pub(crate) fn get_u32(g: &Gpu, b: &DevBuf, n: usize) -> Result<Vec<f32>> {
    let mut v = vec![0u32; n];
    g.dtoh(&mut v, b.ptr)?;
    Ok(v.into_iter().map(|i| i as f32).collect())
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

/// A case whose setup failed (a library call outside the kernels): it fails with `why`.
pub(crate) fn failed(label: String, why: String) -> Vec<Case> {
    let run =
        move |_: &Gpu, _: Option<usize>| -> Result<Vec<f32>> { Err(Error::internal(format!("case setup: {why}"))) };
    vec![Case { label, rows: 1, run: Box::new(run), reference: Reference::Values(Vec::new()) }]
}

/// GGUF bytes of random `[n, k]` weights in `format`, and their values dequantized by candle
/// (ggml's layouts, an outside oracle).
pub(crate) fn quantized(
    format: QFormat,
    n: usize,
    k: usize,
    rng: &mut Rng,
) -> candle_core::Result<(Vec<u8>, Vec<f32>)> {
    let w: Vec<f32> = (0..n * k).map(|_| rng.unit()).collect();
    let q = QTensor::quantize(&Tensor::from_vec(w, (n, k), &Device::Cpu)?, format.ggml())?;
    Ok((q.data()?.to_vec(), q.dequantize(&Device::Cpu)?.flatten_all()?.to_vec1()?))
}

/// The float64 product a matmul kernel should write: `y[r, c] = x[r] · w[c]` for `c < n`, 0 in
/// the gap of each row of `ldy`.
fn matmul_reference(x: &[f32], w: &[f32], (m, n, k, ldy): (usize, usize, usize, usize)) -> Vec<f64> {
    (0..m * ldy)
        .map(|o| {
            let (r, c) = (o / ldy, o % ldy);
            if c >= n {
                return 0.0;
            }
            (0..k).map(|j| x[r * k + j] as f64 * w[c * k + j] as f64).sum()
        })
        .collect()
}

/// A matmul kernel's launch in a case: weights, x and y addresses, then `(m, ldy, y_f32)`.
pub(crate) trait MatmulLaunch: Fn(&Gpu, [u64; 3], (usize, usize, bool)) -> Result<()> + Clone + 'static {}
impl<F: Fn(&Gpu, [u64; 3], (usize, usize, bool)) -> Result<()> + Clone + 'static> MatmulLaunch for F {}

/// The cases of a matmul kernel over the weights `raw` (as stored; `w` their `[n, k]` values as
/// the kernel multiplies them): one per `(m, ldy, y_f32)` of `shapes` against float64 (`what`
/// names that reference), then `twin`'s shape against the kernel's twin. Rows of y are `ldy`
/// apart, in `dt` or f32; the gap between rows stays zero.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_cases(
    rng: &mut Rng,
    dt: Dt,
    (raw, w): (Vec<u8>, Vec<f32>),
    (n, k): (usize, usize),
    shapes: &[(usize, usize, bool)],
    twin: (usize, usize, bool),
    what: &str,
    launch: impl MatmulLaunch,
) -> Vec<Case> {
    let case = |(m, ldy, y_f32): (usize, usize, bool), reference: Option<Vec<f64>>, x: Vec<f32>| {
        let (raw, launch) = (raw.clone(), launch.clone());
        let out = if y_f32 { Dt::F32 } else { dt };
        let run = move |g: &Gpu, sel: Option<usize>| {
            let rows = sel.map_or(m, |_| 1);
            let xs = rows_of(&x, k, sel);
            let (wb, xb, yb) = (put_raw(g, &raw)?, put(g, dt, &xs)?, put(g, out, &vec![0.0; rows * ldy])?);
            launch(g, [wb.ptr, xb.ptr, yb.ptr], (rows, ldy, y_f32))?;
            get(g, out, &yb, rows * ldy)
        };
        let shape = format!("{m} rows, ldy {ldy}, f32 out {y_f32}");
        let (label, reference) = match reference {
            Some(want) => (format!("{n}x{k} weights, {shape} ({what})"), Reference::Values(want)),
            None => (format!("{shape} (vs its twin)"), Reference::Twin),
        };
        Case { label, rows: m, run: Box::new(run), reference }
    };
    let mut cases = Vec::new();
    for &(m, ldy, y_f32) in shapes {
        let x = rng.values(m * k, 1.0, dt);
        let want = matmul_reference(&x, &w, (m, n, k, ldy));
        cases.push(case((m, ldy, y_f32), Some(want), x));
    }
    let x = rng.values(twin.0 * k, 1.0, dt);
    cases.push(case(twin, None, x));
    cases
}
