//! Portable kernels (no target features): the path on CPUs without AVX2, and the reference
//! for the vector builds. Each unit of a packed row (`pack::unit`) is exact integers `v` with
//! scales `c` and a minimum `mn`; its dot with a quantized activation block `(q, d, s)` is
//! `c * d * sum(v * q) + mn * s`, the integer sum being exact (Q6_K: one sum per half, each
//! with its own `c`).
//!
//! Units accumulate in 16 float lanes (lane = unit % 16, as the AVX-512 build), reduced in a
//! fixed order, so the result depends only on the weight row and the activation row.

#![allow(clippy::needless_range_loop)] // index loops mirror the SIMD lane layout

use super::acts::QRow;
use super::formats::{Format, Scales};
use super::pack;

/// `[dot(row, xs[r]) for r]` for one packed row of `units` units of format `F`.
pub(super) fn qdot<F: Format, const R: usize>(row: &[u8], units: usize, xs: &[QRow; R]) -> [f32; R] {
    let mut acc = [[0f32; 16]; R];
    let mut off = [[0f32; 16]; R];
    for u in 0..units {
        let un = pack::unit::<F>(row, units, u);
        let (g, j) = (u / 16, u % 16);
        for r in 0..R {
            let q = &xs[r].q[512 * g + 2 * j..];
            let mut isum = [0i32; 2];
            for e in 0..32 {
                isum[e / 16] += un.v[e] * q[32 * (e / 2) + e % 2] as i32;
            }
            let ad = xs[r].d[u];
            if F::SCALES == Scales::K6 {
                acc[r][j] += isum[0] as f32 * (un.c[0] * ad);
                acc[r][j] += isum[1] as f32 * (un.c[1] * ad);
            } else {
                acc[r][j] += (isum[0] + isum[1]) as f32 * (un.c[0] * ad);
            }
            if F::MIN {
                off[r][j] += un.mn * xs[r].s[u];
            }
        }
    }
    std::array::from_fn(|r| sum16(acc[r]) + sum16(off[r]))
}

fn sum16(a: [f32; 16]) -> f32 {
    sum8(std::array::from_fn(|l| a[l] + a[l + 8]))
}

#[inline(always)]
fn sum8(acc: [f32; 8]) -> f32 {
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

/// f32 dot product with eight lanes (lane = index % 8), reduced as `sum8`.
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = sum8(acc);
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}
