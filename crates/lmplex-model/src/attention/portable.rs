//! The portable attention kernel: plain loops over the chunk's 16 keys (scores) and over
//! head_dim (values), with separate multiplies and adds (never fused), so the build compiled
//! with AVX2 (`run_avx2`, auto-vectorized across keys and dimensions) gives the same bits as
//! the plain one. Works for any block size and head_dim.

use super::{drive, ChunkAt, Kernel, PagedKv, Query, Scratch, CHUNK};

pub(super) struct Portable;

impl Kernel for Portable {
    #[inline(always)]
    unsafe fn scores(q: &[f32], n: usize, hd: usize, k: &[f32], at: &ChunkAt, s: &mut [f32]) {
        for (qr, sr) in q.chunks_exact(hd).zip(s.chunks_exact_mut(CHUNK)).take(n) {
            let mut acc = [0f32; CHUNK];
            for (d, &qd) in qr.iter().enumerate() {
                let o = d * at.kstride;
                if at.consecutive {
                    // Consecutive keys: one slice, so the loop vectorizes.
                    let kd = &k[at.k[0] + o..at.k[0] + o + CHUNK];
                    acc.iter_mut().zip(kd).for_each(|(a, &x)| *a += qd * x);
                } else {
                    acc.iter_mut().zip(&at.k).for_each(|(a, &kj)| *a += qd * k[kj + o]);
                }
            }
            sr.copy_from_slice(&acc);
        }
    }

    #[inline(always)]
    unsafe fn softmax(s: &mut [f32], valid: usize, m: &mut f32, l: &mut f32) -> f32 {
        let max = s[..valid].iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
        let mn = m.max(max);
        let mut sum = 0f32;
        for (j, x) in s.iter_mut().enumerate() {
            *x = if j < valid { (*x - mn).exp() } else { 0.0 };
            sum += *x;
        }
        let alpha = (*m - mn).exp();
        *l = *l * alpha + sum;
        *m = mn;
        alpha
    }

    #[inline(always)]
    unsafe fn values(
        acc: &mut [f32],
        p: &[f32],
        alpha: &[f32],
        valid: &[usize],
        n: usize,
        hd: usize,
        v: &[f32],
        at: &ChunkAt,
    ) {
        for r in 0..n {
            let a = &mut acc[r * hd..(r + 1) * hd];
            a.iter_mut().for_each(|x| *x *= alpha[r]);
            for j in 0..valid[r] {
                let (pj, vj) = (p[r * CHUNK + j], &v[at.v[j]..at.v[j] + hd]);
                a.iter_mut().zip(vj).for_each(|(x, &y)| *x += pj * y);
            }
        }
    }
}

pub(super) fn run(query: Query<'_>, kv: &PagedKv<'_>, scale: f32, out: &mut [f32], sc: &mut Scratch) {
    drive::<Portable>(query, kv, scale, out, sc)
}

/// The portable kernel compiled for AVX2/FMA (multiplies and adds stay separate: Rust never
/// contracts them into FMAs).
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn run_avx2(query: Query<'_>, kv: &PagedKv<'_>, scale: f32, out: &mut [f32], sc: &mut Scratch) {
    drive::<Portable>(query, kv, scale, out, sc)
}
