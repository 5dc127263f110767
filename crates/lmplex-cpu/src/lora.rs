//! The low-rank delta of a LoRA adapter's projection, one row at a time:
//! `y[cols(o)] += scale * sum_j B[o, j] * (A x)[j]`, with `A: [rank, in]` and `B: [out, rank]`.
//!
//! Layout: `A` row-major and `B` transposed (`B^T: [rank, out]`, row-major), each in the element
//! type it was stored in (f32, or bf16 kept as bits), unpadded: a held adapter takes its weights'
//! bytes and no more. `A x` is `rank` dot products of `in` values; `B (A x)` is `rank` scaled
//! row additions over `out` values, so both stream contiguous memory.
//!
//! Invariant: a row's delta depends on that row alone, with a summation order fixed by the
//! shapes (the dot products in 16 running sums over `in`, then a fixed tree; the additions in
//! rank order), whatever the batch, the thread or the kernel family (the same operations, in
//! the same order, whether the compiler vectorizes them for AVX-512, AVX2 or not at all: no
//! fused multiply-add is asked for).

use crate::thread_team::{parallel_for, Cells};

/// One matrix's values as stored.
enum Elems {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
}

impl Elems {
    fn bytes(&self) -> usize {
        match self {
            Self::F32(v) => v.len() * 4,
            Self::Bf16(v) => v.len() * 2,
        }
    }
}

/// One adapted projection's `A` and `B`.
pub struct LowRank {
    a: Elems,
    bt: Elems,
    rank: usize,
    in_features: usize,
    out_features: usize,
}

/// `b` (`[out, rank]` row-major) transposed to `[rank, out]`.
fn transpose<T: Copy + Default>(b: &[T], rank: usize) -> Vec<T> {
    let out = b.len() / rank.max(1);
    let mut t = vec![T::default(); b.len()];
    for (o, row) in b.chunks_exact(rank.max(1)).enumerate() {
        for (j, &v) in row.iter().enumerate() {
            t[j * out + o] = v;
        }
    }
    t
}

impl LowRank {
    /// From f32 `a` (`[rank, in]`) and `b` (`[out, rank]`), both row-major.
    pub fn f32(a: Vec<f32>, b: &[f32], rank: usize) -> Self {
        let (in_features, out_features) = (a.len() / rank.max(1), b.len() / rank.max(1));
        Self { a: Elems::F32(a), bt: Elems::F32(transpose(b, rank)), rank, in_features, out_features }
    }

    /// From bf16 bits `a` (`[rank, in]`) and `b` (`[out, rank]`), both row-major.
    pub fn bf16(a: Vec<u16>, b: &[u16], rank: usize) -> Self {
        let (in_features, out_features) = (a.len() / rank.max(1), b.len() / rank.max(1));
        Self { a: Elems::Bf16(a), bt: Elems::Bf16(transpose(b, rank)), rank, in_features, out_features }
    }

    /// Bytes held.
    pub fn size_in_bytes(&self) -> usize {
        self.a.bytes() + self.bt.bytes()
    }

    /// The rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// `A`'s values (`[rank, in]`, row-major) and `B^T`'s (`[rank, out]`), widened to f32.
    pub fn values(&self) -> (Vec<f32>, Vec<f32>) {
        let widen = |e: &Elems| match e {
            Elems::F32(v) => v.clone(),
            Elems::Bf16(v) => v.iter().map(|&b| bf16_to_f32(b)).collect(),
        };
        (widen(&self.a), widen(&self.bt))
    }

    /// Input and output widths.
    pub fn shape(&self) -> (usize, usize) {
        (self.in_features, self.out_features)
    }

    /// `d[i] = B (A x_i)` for each of up to `ROWS_PER_TASK` rows of `x` (rows of `in`; `d` rows
    /// of `out`). `t` is scratch of `ROWS_PER_TASK * rank` values.
    fn rows(&self, x: &[f32], t: &mut [f32], d: &mut [f32]) {
        #[inline(always)]
        fn body(lr: &LowRank, x: &[f32], t: &mut [f32], d: &mut [f32]) {
            let (k, n, r) = (lr.in_features, lr.out_features, lr.rank);
            let m = x.len() / k.max(1);
            // t[i][j] = A_j . x_i: each row of A read once for every row of x.
            for j in 0..r {
                for (i, xi) in x.chunks_exact(k).enumerate() {
                    t[i * r + j] = match &lr.a {
                        Elems::F32(a) => dot(&a[j * k..(j + 1) * k], xi, |v| v),
                        Elems::Bf16(a) => dot(&a[j * k..(j + 1) * k], xi, bf16_to_f32),
                    };
                }
            }
            // d[i][o] = sum_j t[i][j] B^T[j][o], j ascending, 16 outputs at a time in registers.
            let mut acc = [[0f32; 16]; ROWS_PER_TASK];
            for o0 in (0..n).step_by(16) {
                let w = (n - o0).min(16);
                acc.iter_mut().for_each(|a| *a = [0.0; 16]);
                for j in 0..r {
                    let at = j * n + o0;
                    for (i, a) in acc.iter_mut().enumerate().take(m) {
                        let tj = t[i * r + j];
                        match &lr.bt {
                            Elems::F32(b) => axpy(&mut a[..w], &b[at..at + w], tj, |v| v),
                            Elems::Bf16(b) => axpy(&mut a[..w], &b[at..at + w], tj, bf16_to_f32),
                        }
                    }
                }
                for (i, a) in acc.iter().enumerate().take(m) {
                    d[i * n + o0..i * n + o0 + w].copy_from_slice(&a[..w]);
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        if crate::qmatmul::Isa::detect() == crate::qmatmul::Isa::Avx512 {
            #[target_feature(enable = "avx512f,avx512bw,avx2")]
            unsafe fn avx512(lr: &LowRank, x: &[f32], t: &mut [f32], d: &mut [f32]) {
                body(lr, x, t, d)
            }
            // SAFETY: the AVX-512 family is chosen only where the CPU has AVX-512F/BW and AVX2.
            return unsafe { avx512(self, x, t, d) };
        }
        #[cfg(target_arch = "x86_64")]
        if crate::qmatmul::has_avx2() {
            #[target_feature(enable = "avx2")]
            unsafe fn avx2(lr: &LowRank, x: &[f32], t: &mut [f32], d: &mut [f32]) {
                body(lr, x, t, d)
            }
            // SAFETY: AVX2 was detected at run time.
            return unsafe { avx2(self, x, t, d) };
        }
        body(self, x, t, d)
    }
}

#[inline(always)]
fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// `sum a[i] * x[i]`: 16 running sums over `a`'s chunks of 16, then a fixed tree, then the tail.
#[inline(always)]
fn dot<T: Copy>(a: &[T], x: &[f32], f: impl Fn(T) -> f32) -> f32 {
    let mut acc = [0f32; 16];
    let (ac, xc) = (a.chunks_exact(16), x.chunks_exact(16));
    let tail: f32 = ac.remainder().iter().zip(xc.remainder()).fold(0.0, |s, (&w, &v)| s + f(w) * v);
    for (w, v) in ac.zip(xc) {
        for l in 0..16 {
            acc[l] += f(w[l]) * v[l];
        }
    }
    let mut width = 8;
    while width > 0 {
        for l in 0..width {
            acc[l] += acc[l + width];
        }
        width /= 2;
    }
    acc[0] + tail
}

/// `d += s * b`, element by element.
#[inline(always)]
fn axpy<T: Copy>(d: &mut [f32], b: &[T], s: f32, f: impl Fn(T) -> f32) {
    for (v, &w) in d.iter_mut().zip(b) {
        *v += s * f(w);
    }
}

/// Rows of one batch that take one projection's delta under one adapter.
pub struct DeltaRows<'a> {
    /// The rows, ascending.
    pub rows: &'a [usize],
    /// Their projection's `A` and `B`.
    pub lr: &'a LowRank,
    /// Their scale.
    pub scale: f32,
}

/// Rows per task of `add_deltas`: each task reads its adapter's `A` and `B` once for all of its
/// rows; small enough to spread one adapter's rows over the team.
const ROWS_PER_TASK: usize = 4;

/// Adds each group's `scale * B (A x)` into its rows of `y` (rows of `y_width`), the delta's
/// column `o` at `col(o)`; `x` holds rows of `x_width`. The groups' rows are disjoint; a task
/// takes up to `ROWS_PER_TASK` rows of one group, and every row's delta is computed alone
/// (module docs), so how rows are grouped never changes a bit.
pub fn add_deltas<F: Fn(usize) -> usize + Sync>(
    groups: &[DeltaRows<'_>],
    x: &[f32],
    x_width: usize,
    y: &mut [f32],
    y_width: usize,
    col: F,
) {
    let tasks: Vec<(usize, &[usize])> =
        groups.iter().enumerate().flat_map(|(g, d)| d.rows.chunks(ROWS_PER_TASK).map(move |r| (g, r))).collect();
    let cells = Cells::new(y);
    parallel_for(tasks.len(), &|i| {
        let (g, rows) = tasks[i];
        let d = &groups[g];
        let out = d.lr.out_features;
        let xs: Vec<f32> = rows.iter().flat_map(|&r| &x[r * x_width..(r + 1) * x_width]).copied().collect();
        let (mut t, mut delta) = (vec![0f32; ROWS_PER_TASK * d.lr.rank], vec![0f32; rows.len() * out]);
        d.lr.rows(&xs, &mut t, &mut delta);
        for (&r, dr) in rows.iter().zip(delta.chunks_exact(out)) {
            // SAFETY: row `r` belongs to this task alone (the groups' rows are disjoint).
            let yr = unsafe { cells.slice(r * y_width, y_width) };
            for (o, &v) in dr.iter().enumerate() {
                yr[col(o)] += d.scale * v;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(a: &[f32], b: &[f32], rank: usize, x: &[f32]) -> Vec<f32> {
        let k = x.len();
        let t: Vec<f64> = (0..rank).map(|j| (0..k).map(|i| f64::from(a[j * k + i]) * f64::from(x[i])).sum()).collect();
        b.chunks_exact(rank)
            .map(|row| row.iter().zip(&t).map(|(&w, &v)| f64::from(w) * v).sum::<f64>() as f32)
            .collect()
    }

    #[test]
    fn a_row_is_b_times_a_x_in_f32_and_bf16() {
        let (rank, k, n) = (3, 37, 21);
        let a: Vec<f32> = (0..rank * k).map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5).collect();
        let b: Vec<f32> = (0..n * rank).map(|i| ((i * 104_729) % 89) as f32 / 89.0 - 0.5).collect();
        let x: Vec<f32> = (0..k).map(|i| ((i * 31) % 17) as f32 / 17.0 - 0.5).collect();
        let want = reference(&a, &b, rank, &x);
        let delta = |lr: &LowRank| {
            let (mut t, mut d) = (vec![0f32; ROWS_PER_TASK * rank], vec![0f32; n]);
            lr.rows(&x, &mut t, &mut d);
            d
        };
        let d = delta(&LowRank::f32(a.clone(), &b, rank));
        for (g, w) in d.iter().zip(&want) {
            assert!((g - w).abs() < 1e-5, "{g} vs {w}");
        }
        let bits = |v: &[f32]| v.iter().map(|&x| half::bf16::from_f32(x).to_bits()).collect::<Vec<u16>>();
        let round = |v: &[f32]| v.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect::<Vec<f32>>();
        let want = reference(&round(&a), &round(&b), rank, &x);
        let d = delta(&LowRank::bf16(bits(&a), &bits(&b), rank));
        for (g, w) in d.iter().zip(&want) {
            assert!((g - w).abs() < 1e-5, "{g} vs {w}");
        }
    }

    #[test]
    fn a_rows_delta_does_not_depend_on_its_group() {
        let (rank, k, n) = (4, 40, 24);
        let lr = LowRank::f32((0..rank * k).map(|i| (i % 13) as f32 * 0.1).collect(), &vec![0.3; n * rank], rank);
        let x: Vec<f32> = (0..9 * k).map(|i| ((i * 7) % 11) as f32 * 0.05).collect();
        let run = |groups: &[DeltaRows<'_>]| {
            let mut y = vec![1.0f32; 9 * n];
            add_deltas(groups, &x, k, &mut y, n, |o| o);
            y
        };
        let every: Vec<usize> = (0..9).collect();
        let all = run(&[DeltaRows { rows: &every, lr: &lr, scale: 0.5 }]);
        let parts = run(&[
            DeltaRows { rows: &[0, 3, 8], lr: &lr, scale: 0.5 },
            DeltaRows { rows: &[1, 2, 4, 5, 6, 7], lr: &lr, scale: 0.5 },
        ]);
        assert_eq!(all, parts);
        let one = run(&[DeltaRows { rows: &[5], lr: &lr, scale: 0.5 }]);
        assert_eq!(one[5 * n..6 * n], all[5 * n..6 * n]);
        assert!(one[..5 * n].iter().all(|&v| v == 1.0));
    }
}
