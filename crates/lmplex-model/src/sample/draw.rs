//! The seeded draw of one token from a logits row: temperature, top-k, min-p and top-p, then
//! an inverse-CDF pick. Defined so that the CUDA kernel (`sampling.cu`) computes the same token
//! from the same row, parameters, seed and step, bit for bit, whatever order its threads run:
//!
//! 1. `w_i = exp_fixed((l_i - max) * (1 / T))`: a fixed sequence of IEEE f32 operations
//!    (`exp_fixed`), so both sides get the same bits; the largest weight is exactly 1. NaN and
//!    `-inf` logits get 0.
//! 2. Order: `w` descending, then the index ascending (`key`).
//! 3. Masses are integers, `q_i = trunc(w_i * 2^40)`, summed exactly in u64, so no sum depends on
//!    its order. (A token whose weight is under 2^-40 of the top token's is never drawn.)
//! 4. top-k keeps the `k` first tokens in that order; min-p keeps `w_i >= min_p`; top-p keeps
//!    the shortest head (in that order) whose mass reaches `top_p` of the top-k set's mass, as
//!    vLLM normalises before min-p. Each keeps at least the top token.
//! 5. `r = splitmix64(seed ^ splitmix64(step))`; `u = (r * total) >> 64` (uniform in
//!    `[0, total)`); the pick is the first kept index, in index order, whose running mass
//!    exceeds `u`.
//!
//! Invariant: the result depends only on the row, the parameters, `seed` and `step`.

use lmplex_core::{SamplingParams, TokenId};

/// One row's draw as a backend takes it (the CUDA kernel's per-row arguments): `temperature`
/// 0 means greedy (the argmax of the row).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DrawParams {
    /// 0 for greedy.
    pub temperature: f32,
    /// 0 for no cut.
    pub top_k: usize,
    /// 1 for no cut.
    pub top_p: f32,
    /// 0 for no cut.
    pub min_p: f32,
    /// The request's seed.
    pub seed: u64,
    /// Tokens the request has made so far.
    pub step: u64,
}

impl DrawParams {
    /// The token this row gives: the argmax when greedy, else `draw`.
    pub fn pick(&self, l: &[f32]) -> TokenId {
        if self.temperature == 0.0 {
            return argmax(l);
        }
        let p = SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            ..Default::default()
        };
        draw(l, &p, self.seed, self.step)
    }
}

/// Fixed-point scale of the integer masses.
const MASS_SCALE: f32 = (1u64 << 40) as f32;

/// `exp(x)` for `x <= 0` (0 below -86, where the result would leave f32's normal range), as a
/// fixed sequence of f32 operations (Cephes' `expf`: `x = n ln2 + r`, a degree-6 polynomial in
/// `r` by fused multiply-adds, times `2^n`): 1-2 ulp from the true value, the same bits on any
/// IEEE machine. `exp_fixed(0) == 1`.
pub fn exp_fixed(x: f32) -> f32 {
    // Cephes' constants, as f32 bits (the kernel uses the same bits).
    let c = |bits: u32| f32::from_bits(bits);
    if x.is_nan() || x < -86.0 {
        return 0.0;
    }
    let x = x.min(0.0);
    let n = (x * c(0x3fb8_aa3b)).round_ties_even();
    let r = (-n).mul_add(c(0x3f31_8000), x);
    let r = (-n).mul_add(c(0xb95e_8083), r);
    let mut p = c(0x3950_6967).mul_add(r, c(0x3ab7_43ce));
    p = p.mul_add(r, c(0x3c08_8908));
    p = p.mul_add(r, c(0x3d2a_a9c1));
    p = p.mul_add(r, c(0x3e2a_aaaa));
    p = p.mul_add(r, c(0x3f00_0000));
    let y = p.mul_add(r * r, r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// SplitMix64's output function of `x`.
pub fn splitmix64(x: u64) -> u64 {
    let mut x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The weights `w` of a row at temperature `t` (step 1).
pub fn weights(l: &[f32], t: f32) -> Vec<f32> {
    let max = l.iter().copied().filter(|x| !x.is_nan()).fold(f32::NEG_INFINITY, f32::max);
    let inv_t = 1.0 / t;
    l.iter().map(|&x| exp_fixed((x - max) * inv_t)).collect()
}

/// A key whose ascending order is `w` descending, then the index ascending (`w >= 0`).
fn key(w: f32, i: usize) -> u64 {
    (u64::from(!w.to_bits()) << 32) | i as u64
}

fn mass(w: f32) -> u64 {
    (w * MASS_SCALE) as u64
}

/// Draws from `l` with `p`'s temperature (> 0), top-k, min-p and top-p, for `seed` at `step`.
pub fn draw(l: &[f32], p: &SamplingParams, seed: u64, step: u64) -> TokenId {
    let w = weights(l, p.temperature);
    let mut keys = kept(&w, p);
    pick(&w, &mut keys, seed, step)
}

/// The keys of the tokens top-k, min-p and top-p keep (step 4): the head of the order, or
/// every token (in no particular order) when nothing cuts. Sorts only as long a head as the
/// cuts need, grown 4x at a time.
fn kept(w: &[f32], p: &SamplingParams) -> Vec<u64> {
    let n = w.len();
    let mut keys: Vec<u64> = w.iter().enumerate().map(|(i, &x)| key(x, i)).collect();
    let mut kept = n;
    if p.top_k > 0 && p.top_k < n {
        keys.select_nth_unstable(p.top_k - 1);
        kept = p.top_k;
    }
    let cut_p = p.top_p < 1.0;
    if p.min_p > 0.0 || cut_p {
        // The head in order, grown until both cuts fall inside it (or it is the whole set).
        let (mut head, mut cum, mut done) = (256.min(kept), 0u64, 0usize);
        // Only top-p needs the top-k set's mass (one more pass over it).
        let top_k_mass: u64 = if cut_p { keys[..kept].iter().map(|&k| mass(w[k as u32 as usize])).sum() } else { 0 };
        let target = ((f64::from(p.top_p) * top_k_mass as f64) as u64).max(1);
        loop {
            if head < kept {
                keys[done..kept].select_nth_unstable(head - done - 1);
            }
            keys[done..head].sort_unstable();
            let mut stop = None;
            for (j, &k) in keys[..head].iter().enumerate().skip(done) {
                let x = w[k as u32 as usize];
                if p.min_p > 0.0 && x < p.min_p {
                    stop = Some(j.max(1));
                    break;
                }
                cum += mass(x);
                if cut_p && cum >= target {
                    stop = Some(j + 1);
                    break;
                }
            }
            if let Some(s) = stop {
                kept = s;
                break;
            }
            if head == kept {
                break;
            }
            (done, head) = (head, (head * 4).min(kept));
        }
    }
    keys.truncate(kept);
    keys
}

/// The inverse-CDF pick among `kept` (keys), in index order (step 5).
fn pick(w: &[f32], kept: &mut [u64], seed: u64, step: u64) -> TokenId {
    let total: u64 = kept.iter().map(|&k| mass(w[k as u32 as usize])).sum();
    let Some(&top) = kept.iter().min() else { return 0 };
    if total == 0 {
        return top as u32;
    }
    let r = splitmix64(seed ^ splitmix64(step));
    let u = ((u128::from(r) * u128::from(total)) >> 64) as u64;
    if kept.len() == w.len() {
        // Nothing cut: walk the row itself.
        let mut acc = 0u64;
        for (i, &x) in w.iter().enumerate() {
            acc += mass(x);
            if u < acc {
                return i as u32;
            }
        }
    }
    kept.sort_unstable_by_key(|&k| k as u32);
    let mut acc = 0u64;
    for &k in kept.iter() {
        acc += mass(w[k as u32 as usize]);
        if u < acc {
            return k as u32;
        }
    }
    top as u32
}

/// The first index of the row's largest value (greedy decoding). NaNs are never picked, but an
/// empty row or one starting with NaN gives 0.
pub fn argmax(l: &[f32]) -> TokenId {
    // The first index of the largest value, NaNs never chosen (and index 0 when the row starts
    // with one, as a scan keeping the first strictly greater value would give). Two passes that
    // vectorize: the maximum in 16 lanes, then the first 16-value chunk holding it.
    const L: usize = 16;
    let Some(&first) = l.first() else { return 0 };
    if first.is_nan() {
        return 0;
    }
    let mut acc = [first; L];
    let chunks = l.chunks_exact(L);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = if x > *a { x } else { *a };
        }
    }
    let m = acc.iter().chain(rest).fold(first, |m, &x| if x > m { x } else { m });
    let at = l.chunks(L).position(|c| c.iter().fold(false, |hit, &x| hit | (x == m))).unwrap_or(0);
    (at * L + l[at * L..].iter().position(|&x| x == m).unwrap_or(0)) as TokenId
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_fixed_is_within_two_ulp_of_exp_and_exact_at_zero() {
        assert_eq!(exp_fixed(0.0), 1.0);
        assert_eq!((exp_fixed(f32::NEG_INFINITY), exp_fixed(f32::NAN), exp_fixed(-86.5)), (0.0, 0.0, 0.0));
        let mut worst = 0f64;
        for i in 0..=85_990 {
            let x = -(i as f32) * 1e-3;
            let (got, want) = (f64::from(exp_fixed(x)), f64::from(x).exp());
            let ulp = f64::from(f32::EPSILON) * want;
            worst = worst.max((got - want).abs() / ulp);
        }
        assert!(worst <= 2.0, "{worst} ulp");
    }

    fn sp(t: f32, k: usize, p: f32, min_p: f32) -> SamplingParams {
        SamplingParams { temperature: t, top_k: k, top_p: p, min_p, ..Default::default() }
    }

    #[test]
    fn draws_stay_in_the_cut_and_follow_the_weights() {
        // ln of 0.5, 0.25, 0.125, 0.0625, 0.0625 and three impossible tokens.
        let l: Vec<f32> = [0.5f32, 0.25, 0.125, 0.0625, 0.0625]
            .iter()
            .map(|x| x.ln())
            .chain([f32::NEG_INFINITY, f32::NAN, -200.0])
            .collect();
        let count = |p: &SamplingParams| {
            let mut c = [0usize; 8];
            (0..4000).for_each(|s| c[draw(&l, p, 11, s) as usize] += 1);
            c
        };
        let all = count(&sp(1.0, 0, 1.0, 0.0));
        assert_eq!(all[5..], [0, 0, 0]);
        for (i, share) in [0.5, 0.25, 0.125, 0.0625, 0.0625].iter().enumerate() {
            assert!((all[i] as f64 / 4000.0 - share).abs() < 0.03, "{all:?}");
        }
        assert_eq!(count(&sp(1.0, 2, 1.0, 0.0))[2..], [0; 6]);
        assert_eq!(count(&sp(1.0, 0, 0.6, 0.0))[2..], [0; 6], "top-p 0.6 keeps 0.5 + 0.25");
        assert_eq!(count(&sp(1.0, 0, 0.45, 0.0))[1..], [0; 7], "top-p 0.45 keeps the top token");
        assert_eq!(count(&sp(1.0, 0, 1.0, 0.3))[2..], [0; 6], "min-p 0.3 keeps w >= 0.3 of the top");
        assert_eq!(count(&sp(1.0, 3, 0.1, 0.9))[1..], [0; 7]);
        // Ties at the top-k boundary keep the lower index.
        let c = count(&sp(1.0, 4, 1.0, 0.0));
        assert!(c[3] > 0 && c[4] == 0, "{c:?}");
    }

    #[test]
    fn the_same_seed_and_step_give_the_same_token() {
        let l: Vec<f32> = (0..1000).map(|i| ((i * 37 % 101) as f32) * 0.05).collect();
        let p = sp(0.8, 40, 0.9, 0.05);
        let a: Vec<u32> = (0..50).map(|s| draw(&l, &p, 5, s)).collect();
        assert_eq!(a, (0..50).map(|s| draw(&l, &p, 5, s)).collect::<Vec<_>>());
        assert_ne!(a, (0..50).map(|s| draw(&l, &p, 6, s)).collect::<Vec<_>>());
    }

    /// The head `kept` sorts is the definition's, computed by a full sort: the same tokens for
    /// every cut. Logits have ties and a wide range.
    #[test]
    fn kept_matches_a_full_sort() {
        let l: Vec<f32> = (0..5000).map(|i| ((i * 7919 % 1013) as f32 / 97.0).floor() * 0.8 - 6.0).collect();
        for (temperature, top_k, min_p, top_p) in [
            (1.0, 0, 0.0, 0.9),
            (0.7, 0, 0.0, 0.5),
            (1.3, 0, 0.0, 0.999),
            (1.0, 0, 0.05, 1.0),
            (1.0, 0, 0.3, 0.95),
            (0.8, 40, 0.0, 0.9),
            (1.0, 3000, 0.01, 0.99),
            (1.0, 0, 0.0, 1.0),
            (1.0, 100, 0.0, 1.0),
        ] {
            let p = sp(temperature, top_k, top_p, min_p);
            let w = weights(&l, temperature);
            let mut order: Vec<u64> = w.iter().enumerate().map(|(i, &x)| key(x, i)).collect();
            order.sort_unstable();
            order.truncate(if top_k > 0 { top_k } else { order.len() });
            let target =
                (f64::from(top_p) * order.iter().map(|&k| mass(w[k as u32 as usize])).sum::<u64>() as f64) as u64;
            let mut n = order.iter().take_while(|&&k| w[k as u32 as usize] >= min_p).count().max(1);
            if top_p < 1.0 {
                let mut cum = 0;
                if let Some(j) = order[..n].iter().position(|&k| {
                    cum += mass(w[k as u32 as usize]);
                    cum >= target
                }) {
                    n = j + 1;
                }
            }
            let mut got = kept(&w, &p);
            got.sort_unstable();
            assert_eq!(got, order[..n], "T={temperature} top_k={top_k} min_p={min_p} top_p={top_p}");
        }
    }
}
