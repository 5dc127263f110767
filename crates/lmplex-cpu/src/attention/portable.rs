//! The portable attention kernel: plain loops over the chunk's 16 keys (scores, `exp`) and
//! over 64 dimensions at a time held in a local array (values), which LLVM vectorizes (f16
//! keys and values included: `KvElem::to_f32` is plain integer and float steps). Multiplies
//! and adds stay separate (never fused), so the build compiled with AVX2 (`run_avx2`) gives the
//! same bits as the plain one. Works for any block size and head_dim.

use super::{drive, AttnOpts, ChunkAt, Kernel, PagedKv, Query, Rows, Scratch, CHUNK};
use crate::kv_elem::KvElem;
use crate::rowops::exp;

pub(super) struct Portable;

impl Kernel for Portable {
    #[inline(always)]
    unsafe fn scores<T: KvElem>(q: &[f32], n: usize, hd: usize, k: &[T], at: &ChunkAt, s: &mut [f32]) {
        for (qr, sr) in q.chunks_exact(hd).zip(s.chunks_exact_mut(CHUNK)).take(n) {
            let mut acc = [0f32; CHUNK];
            for (d, &qd) in qr.iter().enumerate() {
                let o = d * at.kstride;
                if at.consecutive {
                    // Consecutive keys: one slice, so the loop vectorizes.
                    let kd = &k[at.k[0] + o..at.k[0] + o + CHUNK];
                    acc.iter_mut().zip(kd).for_each(|(a, &x)| *a += qd * x.to_f32());
                } else {
                    acc.iter_mut().zip(&at.k).for_each(|(a, &kj)| *a += qd * k[kj + o].to_f32());
                }
            }
            sr.copy_from_slice(&acc);
        }
    }

    #[inline(always)]
    unsafe fn softmax(s: &mut [f32], lo: usize, valid: usize, m: &mut f32, l: &mut f32) -> f32 {
        let max = s[lo..valid].iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
        let mn = m.max(max);
        // All 16 lanes at once (so the loop vectorizes), then the sum in key order.
        for (j, x) in s[..CHUNK].iter_mut().enumerate() {
            let e = exp(*x - mn);
            *x = if (lo..valid).contains(&j) { e } else { 0.0 };
        }
        let sum = s[..CHUNK].iter().fold(0f32, |a, &x| a + x);
        let alpha = exp(*m - mn);
        *l = *l * alpha + sum;
        *m = mn;
        alpha
    }

    #[inline(always)]
    unsafe fn values<T: KvElem>(rows: Rows<'_>, hd: usize, v: &[T], at: &ChunkAt) {
        let Rows { acc, p, alpha, valid, n } = rows;
        // 64 dimensions at a time in a local array (registers, once vectorized).
        for r in 0..n {
            for c0 in (0..hd).step_by(64) {
                let w = (hd - c0).min(64);
                let mut a = [0f32; 64];
                for (x, &y) in a.iter_mut().zip(&acc[r * hd + c0..r * hd + c0 + w]) {
                    *x = y * alpha[r];
                }
                for j in 0..valid[r] {
                    let (pj, vj) = (p[r * CHUNK + j], &v[at.v[j] + c0..at.v[j] + c0 + w]);
                    if w == 64 {
                        let vj: &[T; 64] = vj.try_into().expect("64 values");
                        a.iter_mut().zip(vj).for_each(|(x, &y)| *x += pj * y.to_f32());
                    } else {
                        a.iter_mut().zip(vj).for_each(|(x, &y)| *x += pj * y.to_f32());
                    }
                }
                acc[r * hd + c0..r * hd + c0 + w].copy_from_slice(&a[..w]);
            }
        }
    }
}

pub(super) fn run<T: KvElem>(
    query: Query<'_>,
    kv: &PagedKv<'_, T>,
    opts: &AttnOpts,
    out: &mut [f32],
    sc: &mut Scratch,
) {
    drive::<Portable, T>(query, kv, opts, out, sc)
}

/// The portable kernel compiled for AVX2/FMA: the loops vectorize to 8 lanes, multiplies and
/// adds stay separate (Rust never contracts them into FMAs), so the bits equal the plain build's.
/// (Fusing them measured no faster.)
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn run_avx2<T: KvElem>(
    query: Query<'_>,
    kv: &PagedKv<'_, T>,
    opts: &AttnOpts,
    out: &mut [f32],
    sc: &mut Scratch,
) {
    drive::<Portable, T>(query, kv, opts, out, sc)
}
