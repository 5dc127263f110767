//! Q4_K, Q5_K and Q6_K blocks made as ggml's reference quantizer makes them
//! (`quantize_row_q{4,5,6}_K_ref`, what `llama-quantize` runs without an importance matrix):
//! - Q4_K/Q5_K: per 32-value sub-block, a weighted least-squares search for scale and min
//!   (`make_qkx2_quants`, weights `rms(sub-block) + |x|`), then 6-bit sub-block scales and mins
//!   against two f16 block factors, and the values requantized against the rounded factors.
//! - Q6_K: per 16-value sub-block, a symmetric scale searched over 19 trial scales
//!   (`make_qx_quants`, weights `x^2`), then 8-bit sub-block scales against one f16 factor.
//!
//! Invariant: the bytes are ggml's block layouts (`block_q4_K`: d, dmin, scales[12], qs[128];
//! `block_q5_K`: d, dmin, scales[12], qh[32], qs[128]; `block_q6_K`: ql[128], qh[64],
//! scales[16], d), so llama.cpp, gguf-py and lmplex's own loader read them. The arithmetic follows the C source's f32 operations in order (no fused
//! multiply-adds), so the levels match ggml's wherever its build does not contract them either.

use half::f16;
use rayon::prelude::*;

/// Values per super-block.
pub const QK_K: usize = 256;
/// Bytes of one Q4_K block.
pub const Q4K_BYTES: usize = 144;
/// Bytes of one Q5_K block.
pub const Q5K_BYTES: usize = 176;
/// Bytes of one Q6_K block.
pub const Q6K_BYTES: usize = 210;
/// ggml's threshold below which a group counts as all zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: round half to even through the f32 mantissa (valid for |x| < 2^22).
pub(super) fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// `make_qkx2_quants`: levels `l` in `0..=nmax` (into `l`) for `x` with scale and min fitted by
/// weighted least squares over `nstep + 1` trial scales; returns `(scale, -min)`.
#[allow(clippy::too_many_arguments)]
fn make_qkx2(nmax: i32, x: &[f32], w: &[f32], l: &mut [u8], rmin: f32, rdelta: f32, nstep: i32) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = w[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        min = min.min(x[i]);
        max = max.max(x[i]);
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best = 0f32;
    for i in 0..n {
        l[i] = nearest_int(iscale * (x[i] - min)).clamp(0, nmax) as u8;
        let diff = scale * l[i] as f32 + min - x[i];
        best += w[i] * (diff * diff);
    }
    let mut aux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let li = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            aux[i] = li as u8;
            let lf = li as f32;
            sum_l += w[i] * lf;
            sum_l2 += w[i] * lf * lf;
            sum_xl += w[i] * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut err = 0f32;
            for i in 0..n {
                let diff = this_scale * aux[i] as f32 + this_min - x[i];
                err += w[i] * (diff * diff);
            }
            if err < best {
                l[..n].copy_from_slice(&aux[..n]);
                best = err;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Sub-block `j`'s 6-bit scale and min from the packed `scales` (ggml's `get_scale_min_k4`).
fn scale_min(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// One super-block's levels (`nmax` 15 or 31) with its d, dmin and packed scales.
fn levels(x: &[f32], nmax: i32, rmin: f32, nstep: i32) -> ([u8; QK_K], f16, f16, [u8; 12]) {
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..QK_K / 32 {
        let xs = &x[32 * j..32 * j + 32];
        let sum_x2: f32 = xs.iter().fold(0.0, |s, &v| s + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        let w: Vec<f32> = xs.iter().map(|&v| av_x + v.abs()).collect();
        (scales[j], mins[j]) = make_qkx2(nmax, xs, &w, &mut l[32 * j..32 * j + 32], rmin, 0.1, nstep);
        max_scale = max_scale.max(scales[j]);
        max_min = max_min.max(mins[j]);
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; 12];
    for j in 0..QK_K / 32 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let (d, dmin) = (f16::from_f32(max_scale / 63.0), f16::from_f32(max_min / 63.0));
    for j in 0..QK_K / 32 {
        let (sc, m) = scale_min(j, &packed);
        let dj = d.to_f32() * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * m as f32;
        for i in 32 * j..32 * j + 32 {
            l[i] = nearest_int((x[i] + dm) / dj).clamp(0, nmax) as u8;
        }
    }
    (l, d, dmin, packed)
}

/// `x` (a multiple of 256 values) as Q4_K blocks (blocks in parallel on rayon's pool).
pub fn quantize_q4_k(x: &[f32]) -> Vec<u8> {
    assert!(x.len().is_multiple_of(QK_K), "Q4_K takes whole blocks of {QK_K}");
    x.par_chunks_exact(QK_K).flat_map_iter(block_q4_k).collect()
}

fn block_q4_k(xb: &[f32]) -> [u8; Q4K_BYTES] {
    let (l, d, dmin, scales) = levels(xb, 15, -1.0, 20);
    let mut out = [0u8; Q4K_BYTES];
    out[..2].copy_from_slice(&d.to_le_bytes());
    out[2..4].copy_from_slice(&dmin.to_le_bytes());
    out[4..16].copy_from_slice(&scales);
    for (k, j) in (0..QK_K).step_by(64).enumerate() {
        for i in 0..32 {
            out[16 + 32 * k + i] = l[j + i] | (l[j + i + 32] << 4);
        }
    }
    out
}

/// `x` (a multiple of 256 values) as Q5_K blocks (blocks in parallel on rayon's pool).
pub fn quantize_q5_k(x: &[f32]) -> Vec<u8> {
    assert!(x.len().is_multiple_of(QK_K), "Q5_K takes whole blocks of {QK_K}");
    x.par_chunks_exact(QK_K).flat_map_iter(block_q5_k).collect()
}

fn block_q5_k(xb: &[f32]) -> [u8; Q5K_BYTES] {
    {
        let (l, d, dmin, scales) = levels(xb, 31, -0.5, 15);
        let (mut qh, mut ql) = ([0u8; 32], [0u8; 128]);
        let (mut m1, mut m2) = (1u8, 2u8);
        for (k, n) in (0..QK_K).step_by(64).enumerate() {
            for j in 0..32 {
                let (mut l1, mut l2) = (l[n + j], l[n + j + 32]);
                if l1 > 15 {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                if l2 > 15 {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[32 * k + j] = l1 | (l2 << 4);
            }
            m1 <<= 2;
            m2 <<= 2;
        }
        let mut out = [0u8; Q5K_BYTES];
        out[..2].copy_from_slice(&d.to_le_bytes());
        out[2..4].copy_from_slice(&dmin.to_le_bytes());
        out[4..16].copy_from_slice(&scales);
        out[16..48].copy_from_slice(&qh);
        out[48..].copy_from_slice(&ql);
        out
    }
}

/// ggml's `make_qx_quants` with `rmse_type` 1 and no importance weights: levels
/// `l + nmax` in `l` for `x`, the scale from a search over 19 trial scales; returns the scale.
fn make_qx(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let mut iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (li, &v) in l.iter_mut().zip(x) {
        let q = level(iscale, v);
        *li = (q + nmax) as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (mut slx, mut sl2) = (0f32, 0f32);
        for &v in x {
            let q = level(iscale, v) as f32;
            let w = v * v;
            slx += w * v * q;
            sl2 += w * q * q;
        }
        if sl2 > 0.0 && slx * slx > best * sl2 {
            for (li, &v) in l.iter_mut().zip(x) {
                *li = (nmax + level(iscale, v)) as i8;
            }
            scale = slx / sl2;
            best = scale * slx;
        }
    }
    scale
}

/// `x` (a multiple of 256 values) as Q6_K blocks (blocks in parallel on rayon's pool).
pub fn quantize_q6_k(x: &[f32]) -> Vec<u8> {
    assert!(x.len().is_multiple_of(QK_K), "Q6_K takes whole blocks of {QK_K}");
    x.par_chunks_exact(QK_K).flat_map_iter(block_q6_k).collect()
}

fn block_q6_k(xb: &[f32]) -> [u8; Q6K_BYTES] {
    let mut out = [0u8; Q6K_BYTES];
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    let (mut max_scale, mut max_abs) = (0f32, 0f32);
    for (ib, s) in scales.iter_mut().enumerate() {
        *s = make_qx(32, &xb[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16]);
        if s.abs() > max_abs {
            max_abs = s.abs();
            max_scale = *s;
        }
    }
    if max_abs < GROUP_MAX_EPS {
        return out; // all zero, d = 0
    }
    let iscale = -128.0 / max_scale;
    let d = f16::from_f32(1.0 / iscale);
    let mut sc = [0i8; QK_K / 16];
    for (q, &s) in sc.iter_mut().zip(&scales) {
        *q = nearest_int(iscale * s).min(127) as i8;
    }
    for (j, &q) in sc.iter().enumerate() {
        let dj = d.to_f32() * q as f32;
        if dj == 0.0 {
            continue;
        }
        for i in 16 * j..16 * j + 16 {
            l[i] = (nearest_int(xb[i] / dj).clamp(-32, 31) + 32) as i8;
        }
    }
    let (ql, rest) = out.split_at_mut(QK_K / 2);
    let (qh, rest) = rest.split_at_mut(QK_K / 4);
    let u = |i: usize| l[i] as u8;
    for (k, j) in (0..QK_K).step_by(128).enumerate() {
        for i in 0..32 {
            let (q1, q2, q3, q4) = (u(j + i) & 0xf, u(j + i + 32) & 0xf, u(j + i + 64) & 0xf, u(j + i + 96) & 0xf);
            ql[64 * k + i] = q1 | (q3 << 4);
            ql[64 * k + i + 32] = q2 | (q4 << 4);
            qh[32 * k + i] = (u(j + i) >> 4)
                | ((u(j + i + 32) >> 4) << 2)
                | ((u(j + i + 64) >> 4) << 4)
                | ((u(j + i + 96) >> 4) << 6);
        }
    }
    for (o, &q) in rest[..QK_K / 16].iter_mut().zip(&sc) {
        *o = q as u8;
    }
    rest[QK_K / 16..].copy_from_slice(&d.to_le_bytes());
    out
}
