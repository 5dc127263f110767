//! Portable kernels (no target features): the reference the AVX2 kernels mirror, and the path
//! on CPUs without AVX2. Each weight block decodes into 32-value units of exact integers `w`
//! with a float scale `c` and an additive-minimum coefficient `mn`, so that the unit's weights
//! are `c * w + mn`; a unit's dot with a quantized activation block `(q, d, s)` is
//! `c * d * sum(w * q) + mn * s`, the integer sum being exact.
//!
//! The integer sum is kept in eight lanes laid out as AVX2's `vpmaddwd` leaves them (lane `l`
//! holds elements `2l, 2l+1, 16+2l, 17+2l`), and lanes are reduced in a fixed order, so the
//! result depends only on the weight row and the activation row.

#![allow(clippy::needless_range_loop)] // index loops mirror the SIMD lane layout

use super::acts::QRow;
use super::formats::*;
use half::f16;

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// The scale and minimum of K-quant sub-block `j` (6 bits each, packed in 12 bytes).
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// Decodes one block into units: `f(unit, w, c, mn)`, units in value order.
pub(super) trait Decode: Format {
    fn decode(b: &[u8], f: impl FnMut(usize, &[i16; 32], f32, f32));
}

fn nibbles(qs: &[u8], offset: i16) -> [i16; 32] {
    let mut w = [0i16; 32];
    for j in 0..16 {
        w[j] = (qs[j] & 0xF) as i16 - offset;
        w[j + 16] = (qs[j] >> 4) as i16 - offset;
    }
    w
}

/// Q5_0/Q5_1 values: nibbles plus a fifth bit from `qh` (bit i for value i).
fn five_bits(qh: &[u8], qs: &[u8], offset: i16) -> [i16; 32] {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut w = nibbles(qs, offset);
    for (i, wi) in w.iter_mut().enumerate() {
        *wi += (((qh >> i) & 1) << 4) as i16;
    }
    w
}

impl Decode for Q4_0 {
    fn decode(b: &[u8], mut f: impl FnMut(usize, &[i16; 32], f32, f32)) {
        f(0, &nibbles(&b[2..18], 8), f16_at(b, 0), 0.0)
    }
}

impl Decode for Q4_1 {
    fn decode(b: &[u8], mut f: impl FnMut(usize, &[i16; 32], f32, f32)) {
        f(0, &nibbles(&b[4..20], 0), f16_at(b, 0), f16_at(b, 2))
    }
}

impl Decode for Q5_0 {
    fn decode(b: &[u8], mut f: impl FnMut(usize, &[i16; 32], f32, f32)) {
        f(0, &five_bits(&b[2..6], &b[6..22], 16), f16_at(b, 0), 0.0)
    }
}

impl Decode for Q5_1 {
    fn decode(b: &[u8], mut f: impl FnMut(usize, &[i16; 32], f32, f32)) {
        f(0, &five_bits(&b[4..8], &b[8..24], 0), f16_at(b, 0), f16_at(b, 2))
    }
}

impl Decode for Q8_0 {
    fn decode(b: &[u8], mut f: impl FnMut(usize, &[i16; 32], f32, f32)) {
        f(0, &std::array::from_fn(|j| b[2 + j] as i8 as i16), f16_at(b, 0), 0.0)
    }
}

impl Decode for Q4K {
    fn decode(b: &[u8], mut f: impl FnMut(usize, &[i16; 32], f32, f32)) {
        let (d, dmin, scales, qs) = (f16_at(b, 0), f16_at(b, 2), &b[4..16], &b[16..144]);
        for j in 0..4 {
            let q = &qs[32 * j..32 * j + 32];
            for h in 0..2 {
                let (sc, m) = scale_min_k4(2 * j + h, scales);
                let w = std::array::from_fn(|l| ((q[l] >> (4 * h)) & 0xF) as i16);
                f(2 * j + h, &w, d * sc as f32, -dmin * m as f32);
            }
        }
    }
}

impl Decode for Q5K {
    fn decode(b: &[u8], mut f: impl FnMut(usize, &[i16; 32], f32, f32)) {
        let (d, dmin, scales, qh, qs) = (f16_at(b, 0), f16_at(b, 2), &b[4..16], &b[16..48], &b[48..176]);
        for j in 0..4 {
            let q = &qs[32 * j..32 * j + 32];
            for h in 0..2 {
                let u = 2 * j + h;
                let (sc, m) = scale_min_k4(u, scales);
                let w = std::array::from_fn(|l| (((q[l] >> (4 * h)) & 0xF) | (((qh[l] >> u) & 1) << 4)) as i16);
                f(u, &w, d * sc as f32, -dmin * m as f32);
            }
        }
    }
}

impl Decode for Q6K {
    fn decode(b: &[u8], mut f: impl FnMut(usize, &[i16; 32], f32, f32)) {
        let (ql, qh, sc, d) = (&b[0..128], &b[128..192], &b[192..208], f16_at(b, 208));
        for n in 0..2 {
            let (ql, qh, sc) = (&ql[64 * n..], &qh[32 * n..], &sc[8 * n..]);
            for u in 0..4 {
                // Unit u: the low (u < 2) or high nibbles of ql[32 * (u % 2)..], with bits
                // 2u and 2u+1 of qh on top; its halves have scales sc[2u] and sc[2u + 1].
                let (lo, shift) = (32 * (u % 2), 4 * (u / 2));
                let w = std::array::from_fn(|l| {
                    let v = ((ql[lo + l] >> shift) & 0xF) | (((qh[l] >> (2 * u)) & 3) << 4);
                    (v as i16 - 32) * sc[2 * u + l / 16] as i8 as i16
                });
                f(4 * n + u, &w, d, 0.0);
            }
        }
    }
}

/// `[dot(row, xs[r]) for r]` for one weight row of format `F`.
pub(super) fn qdot<F: Decode, const R: usize>(row: &[u8], xs: &[QRow; R]) -> [f32; R] {
    let mut acc = [[0f32; 8]; R];
    let mut off = [0f32; R];
    for (bi, b) in row.chunks_exact(F::BYTES).enumerate() {
        F::decode(b, |u, w, c, mn| {
            let idx = bi * F::UNITS + u;
            for r in 0..R {
                let x = &xs[r].q[idx * 32..idx * 32 + 32];
                let cd = c * xs[r].d[idx];
                for l in 0..8 {
                    let p = |j: usize| w[j] as i32 * x[j] as i32;
                    let lane = (p(2 * l) + p(2 * l + 1)) + (p(16 + 2 * l) + p(17 + 2 * l));
                    acc[r][l] += lane as f32 * cd;
                }
                if F::MIN {
                    off[r] += mn * xs[r].s[idx];
                }
            }
        });
    }
    std::array::from_fn(|r| sum8(acc[r]) + off[r])
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
