//! The attention kernel of the CPU backend: one query token against its sequence's cached
//! keys and values, for a run of query heads that share one KV head (GQA), so each key and
//! value row is loaded once for all of them.
//!
//! Invariants: a head's output depends only on its query vector and the context rows, and is
//! computed in a fixed order (scores in key order, an eight-lane dot per score, softmax with
//! the maximum subtracted, values accumulated in key order), whatever the run of heads it is
//! computed with. The AVX-512, AVX2/FMA and portable builds may differ in the last bits; the
//! choice is made once per process (`qmatmul::Isa`).

/// Where one KV head's rows of a sequence live: row `j` starts at `base(j)` in `k` and `v`.
pub struct Context<'a, F: Fn(usize) -> usize> {
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub base: F,
    /// Number of context rows (positions 0..len).
    pub len: usize,
}

/// `out[h] = softmax(q[h] . K^T * scale) V` for each head h of `q` (`[heads, head_dim]`).
/// `scores` is scratch space.
pub fn attend<F: Fn(usize) -> usize>(
    q: &[f32],
    ctx: &Context<'_, F>,
    head_dim: usize,
    scale: f32,
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    let heads = q.len() / head_dim;
    scores.clear();
    scores.resize(heads * ctx.len, 0.0);
    #[cfg(target_arch = "x86_64")]
    if head_dim.is_multiple_of(16) && crate::qmatmul::Isa::detect() == crate::qmatmul::Isa::Avx512 {
        // SAFETY: `Isa::detect` found AVX-512 F/BW/VL/DQ, AVX2, FMA and F16C at run time; every
        // row is in bounds (checked by the slicing in `row`) and head_dim is a multiple of 16.
        unsafe { avx512::attend(q, ctx, head_dim, scale, out, scores) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if head_dim.is_multiple_of(8) && crate::qmatmul::has_avx2() {
        // SAFETY: avx2 and fma were detected at run time; every row is in bounds (checked
        // by the slicing in `row`) and head_dim is a multiple of 8.
        unsafe { avx2::attend(q, ctx, head_dim, scale, out, scores) };
        return;
    }
    portable(q, ctx, head_dim, scale, out, scores);
}

fn row(buf: &[f32], base: usize, head_dim: usize) -> &[f32] {
    &buf[base..base + head_dim]
}

/// Turns each head's scores (`[heads, len]`) into probabilities, in place.
fn softmax(scores: &mut [f32], len: usize) {
    for s in scores.chunks_exact_mut(len) {
        let max = s.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let mut sum = 0f32;
        for x in s.iter_mut() {
            *x = (*x - max).exp();
            sum += *x;
        }
        let inv = 1.0 / sum;
        s.iter_mut().for_each(|x| *x *= inv);
    }
}

fn portable<F: Fn(usize) -> usize>(
    q: &[f32],
    ctx: &Context<'_, F>,
    hd: usize,
    scale: f32,
    out: &mut [f32],
    scores: &mut [f32],
) {
    let len = ctx.len;
    for j in 0..len {
        let k = row(ctx.k, (ctx.base)(j), hd);
        for (h, qh) in q.chunks_exact(hd).enumerate() {
            scores[h * len + j] = crate::qmatmul::portable_dot(qh, k) * scale;
        }
    }
    softmax(scores, len);
    out.fill(0.0);
    for (h, o) in out.chunks_exact_mut(hd).enumerate() {
        for j in 0..len {
            let (p, v) = (scores[h * len + j], row(ctx.v, (ctx.base)(j), hd));
            o.iter_mut().zip(v).for_each(|(oi, vi)| *oi += p * vi);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{row, softmax, Context};
    use std::arch::x86_64::*;

    /// Lane i: the sum of the eight lanes of `a[i]`, as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)).
    #[inline(always)]
    pub(super) unsafe fn sum8x8(a: &[__m256; 8]) -> __m256 {
        let t0 = _mm256_hadd_ps(a[0], a[1]);
        let t1 = _mm256_hadd_ps(a[2], a[3]);
        let t2 = _mm256_hadd_ps(a[4], a[5]);
        let t3 = _mm256_hadd_ps(a[6], a[7]);
        let u0 = _mm256_hadd_ps(t0, t1);
        let u1 = _mm256_hadd_ps(t2, t3);
        _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31))
    }

    /// Values are accumulated 64 dimensions (eight registers) at a time.
    const CHUNK: usize = 64;

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn attend<F: Fn(usize) -> usize>(
        q: &[f32],
        ctx: &Context<'_, F>,
        hd: usize,
        scale: f32,
        out: &mut [f32],
        scores: &mut [f32],
    ) {
        let (len, heads) = (ctx.len, q.len() / hd);
        // Scores eight keys at a time: eight accumulators, then one transposing reduction.
        // A key past the end repeats the last key and its score is dropped, so every score
        // is reduced the same way wherever its key falls.
        for j0 in (0..len).step_by(8) {
            let keys: [*const f32; 8] =
                std::array::from_fn(|i| row(ctx.k, (ctx.base)((j0 + i).min(len - 1)), hd).as_ptr());
            for h in 0..heads {
                let qh = q.as_ptr().add(h * hd);
                let mut acc = [_mm256_setzero_ps(); 8];
                for c in (0..hd).step_by(8) {
                    let qv = _mm256_loadu_ps(qh.add(c));
                    for (a, k) in acc.iter_mut().zip(&keys) {
                        *a = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k.add(c)), *a);
                    }
                }
                let s = _mm256_mul_ps(sum8x8(&acc), _mm256_set1_ps(scale));
                let mut tmp = [0f32; 8];
                _mm256_storeu_ps(tmp.as_mut_ptr(), s);
                let n = (len - j0).min(8);
                scores[h * len + j0..h * len + j0 + n].copy_from_slice(&tmp[..n]);
            }
        }
        softmax(scores, len);
        for h in 0..heads {
            let p = &scores[h * len..(h + 1) * len];
            for c0 in (0..hd).step_by(CHUNK) {
                let n = (hd - c0).min(CHUNK) / 8;
                let mut acc = [_mm256_setzero_ps(); CHUNK / 8];
                for (j, &pj) in p.iter().enumerate() {
                    let v = row(ctx.v, (ctx.base)(j), hd).as_ptr().add(c0);
                    let w = _mm256_set1_ps(pj);
                    for (i, a) in acc.iter_mut().enumerate().take(n) {
                        *a = _mm256_fmadd_ps(w, _mm256_loadu_ps(v.add(8 * i)), *a);
                    }
                }
                let o = out.as_mut_ptr().add(h * hd + c0);
                for (i, a) in acc.iter().enumerate().take(n) {
                    _mm256_storeu_ps(o.add(8 * i), *a);
                }
            }
        }
    }
}

/// The AVX2 build's structure with 16-lane vectors: eight keys scored at a time (each
/// accumulator folded to eight lanes, then the AVX2 transposing reduction), values accumulated
/// 128 dimensions (eight registers) at a time.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::avx2::sum8x8;
    use super::{row, softmax, Context};
    use std::arch::x86_64::*;

    const CHUNK: usize = 128;

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    pub(super) unsafe fn attend<F: Fn(usize) -> usize>(
        q: &[f32],
        ctx: &Context<'_, F>,
        hd: usize,
        scale: f32,
        out: &mut [f32],
        scores: &mut [f32],
    ) {
        let (len, heads) = (ctx.len, q.len() / hd);
        // As in the AVX2 build: a key past the end repeats the last key, its score dropped.
        for j0 in (0..len).step_by(8) {
            let keys: [*const f32; 8] =
                std::array::from_fn(|i| row(ctx.k, (ctx.base)((j0 + i).min(len - 1)), hd).as_ptr());
            for h in 0..heads {
                let qh = q.as_ptr().add(h * hd);
                let mut acc = [_mm512_setzero_ps(); 8];
                for c in (0..hd).step_by(16) {
                    let qv = _mm512_loadu_ps(qh.add(c));
                    for (a, k) in acc.iter_mut().zip(&keys) {
                        *a = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k.add(c)), *a);
                    }
                }
                let half = acc.map(|a| _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1)));
                let s = _mm256_mul_ps(sum8x8(&half), _mm256_set1_ps(scale));
                let mut tmp = [0f32; 8];
                _mm256_storeu_ps(tmp.as_mut_ptr(), s);
                let n = (len - j0).min(8);
                scores[h * len + j0..h * len + j0 + n].copy_from_slice(&tmp[..n]);
            }
        }
        softmax(scores, len);
        for h in 0..heads {
            let p = &scores[h * len..(h + 1) * len];
            for c0 in (0..hd).step_by(CHUNK) {
                let n = (hd - c0).min(CHUNK) / 16;
                let mut acc = [_mm512_setzero_ps(); CHUNK / 16];
                for (j, &pj) in p.iter().enumerate() {
                    let v = row(ctx.v, (ctx.base)(j), hd).as_ptr().add(c0);
                    let w = _mm512_set1_ps(pj);
                    for (i, a) in acc.iter_mut().enumerate().take(n) {
                        *a = _mm512_fmadd_ps(w, _mm512_loadu_ps(v.add(16 * i)), *a);
                    }
                }
                let o = out.as_mut_ptr().add(h * hd + c0);
                for (i, a) in acc.iter().enumerate().take(n) {
                    _mm512_storeu_ps(o.add(16 * i), *a);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each head's output equals a naive softmax-attention, and is bit-identical whether the
    /// head runs alone or with the rest of its group.
    #[test]
    fn matches_naive_and_heads_are_independent() {
        // 72: the AVX2 build; 64: the AVX-512 build where the CPU has it.
        for (hd, heads, len) in [(72usize, 3usize, 37usize), (64, 3, 37)] {
            let gen = |n: usize, s: usize| -> Vec<f32> {
                (0..n).map(|i| (((i * 7919 + s) % 1009) as f32 / 504.0) - 1.0).collect()
            };
            let (q, k, v) = (gen(heads * hd, 1), gen(len * 2 * hd, 2), gen(len * 2 * hd, 3));
            // Rows interleave two KV heads; this context is KV head 1.
            let ctx = Context { k: &k, v: &v, base: |j| j * 2 * hd + hd, len };
            let scale = 1.0 / (hd as f32).sqrt();
            let mut out = vec![0f32; heads * hd];
            attend(&q, &ctx, hd, scale, &mut out, &mut Vec::new());
            for h in 0..heads {
                let qh = &q[h * hd..(h + 1) * hd];
                let s: Vec<f32> =
                    (0..len).map(|j| (0..hd).map(|c| qh[c] * k[j * 2 * hd + hd + c]).sum::<f32>() * scale).collect();
                let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f32 = e.iter().sum();
                for c in 0..hd {
                    let want: f32 = (0..len).map(|j| e[j] / z * v[j * 2 * hd + hd + c]).sum();
                    assert!((want - out[h * hd + c]).abs() < 1e-5, "h{h} c{c}");
                }
                let mut alone = vec![0f32; hd];
                attend(qh, &ctx, hd, scale, &mut alone, &mut Vec::new());
                assert_eq!(alone, out[h * hd..(h + 1) * hd], "head {h} changes with its group");
            }
        }
    }
}
