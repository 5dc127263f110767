//! Q4_K and Q5_K blocks made as ggml's reference quantizer makes them (`quantize_row_q4_K_ref`,
//! `quantize_row_q5_K_ref`, what `llama-quantize` runs without an importance matrix): per
//! 32-value sub-block, a weighted least-squares search for scale and min (`make_qkx2_quants`,
//! weights `rms(sub-block) + |x|`), then 6-bit sub-block scales and mins against two f16 block
//! factors, and the values requantized against the rounded factors.
//!
//! Invariant: the bytes are ggml's block layout (`block_q4_K`: d, dmin, scales[12], qs[128];
//! `block_q5_K`: d, dmin, scales[12], qh[32], qs[128]), so llama.cpp, gguf-py and lmplex's own
//! loader read them. The arithmetic follows the C source's f32 operations in order (no fused
//! multiply-adds), so the levels match ggml's wherever its build does not contract them either.

use half::f16;
use rayon::prelude::*;

/// Values per super-block.
pub const QK_K: usize = 256;
/// Bytes of one Q4_K block.
pub const Q4K_BYTES: usize = 144;
/// Bytes of one Q5_K block.
pub const Q5K_BYTES: usize = 176;

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
