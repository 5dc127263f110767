//! Picking the next token from a logits row: penalties, temperature, min-p, top-k, top-p,
//! greedy or seeded sampling, and log-probabilities.
//!
//! Invariants: the result depends only on the logits row, the request's parameters, its token
//! history and its own RNG (`StdRng`, seeded from `seed` when given), never on other requests.
//! Greedy picks the lowest index among equal maxima. Reported logprobs are the model's raw
//! distribution (before penalties and temperature), as vLLM reports them, and are computed only
//! when the request asks for them.
//!
//! Cost: the vocabulary is never sorted whole. Sampling makes one pass for the weights and
//! their sum (in index order), then sorts only as long a head of the distribution as top-p or
//! min-p needs (found by selection, growing 4x at a time); plain temperature sampling walks the
//! weights in index order without sorting.

use lmplex_core::{SamplingParams, TokenId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use toktrie::SimpleVob;

/// One request's sampling state.
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// Tokens seen in the prompt (for repetition_penalty).
    prompt_tokens: Vec<TokenId>,
    /// Counts of generated tokens (presence/frequency/repetition penalties).
    output_counts: HashMap<TokenId, u32>,
    /// Tokens generated so far.
    num_output: usize,
    /// The tokens that would end the output (EOS, `stop_token_ids`): never picked before
    /// `min_tokens` tokens are out.
    enders: Vec<TokenId>,
}

/// The outcome of one sampling step: the token and, if asked for, its logprobs.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The token picked.
    pub token_id: TokenId,
    /// Raw log-probability of the chosen token.
    pub logprob: f32,
    /// The `logprobs` most likely tokens, most likely first (empty when not asked for).
    pub top: Vec<(TokenId, f32)>,
}

impl Sampler {
    /// A sampler for one request with `params`; `prompt` feeds `repetition_penalty`. Its RNG is
    /// seeded from `params.seed`, else from the OS.
    pub fn new(params: SamplingParams, prompt: &[TokenId]) -> Self {
        let rng = match params.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_os_rng(),
        };
        let mut prompt_tokens = prompt.to_vec();
        prompt_tokens.sort_unstable();
        prompt_tokens.dedup();
        let enders = params.stop_token_ids.clone();
        Self { params, rng, prompt_tokens, output_counts: HashMap::new(), num_output: 0, enders }
    }

    /// Also never picks these end-of-sequence tokens before `min_tokens` tokens are out.
    pub fn with_eos(mut self, eos: &[TokenId]) -> Self {
        self.enders.extend_from_slice(eos);
        self
    }

    /// The request's sampling parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Whether nothing changes the raw logits before the pick: no held-back ending, penalty or
    /// bias (structured output is the caller's to add).
    fn untouched(&self) -> bool {
        let p = &self.params;
        let hold_end = self.num_output < p.min_tokens && !self.enders.is_empty();
        !hold_end
            && p.repetition_penalty == 1.0
            && p.presence_penalty == 0.0
            && p.frequency_penalty == 0.0
            && p.logit_bias.is_empty()
    }

    /// Whether the next pick is the raw logits' argmax with nothing reported (greedy, untouched,
    /// no logprobs): then the argmax may be taken elsewhere (on the device) and given to
    /// [`Sampler::record`], with the same result as [`Sampler::sample`].
    pub fn plain_greedy(&self) -> bool {
        self.params.is_greedy() && self.params.logprobs.is_none() && self.untouched()
    }

    /// Records `token_id`, the raw logits' argmax (lowest index among equal maxima), as picked
    /// when [`Sampler::plain_greedy`] held: what `sample` returns and records then.
    pub fn record(&mut self, token_id: TokenId) -> Sampled {
        debug_assert!(self.plain_greedy());
        *self.output_counts.entry(token_id).or_insert(0) += 1;
        self.num_output += 1;
        Sampled { token_id, logprob: f32::NAN, top: Vec::new() }
    }

    /// Picks a token from `logits` (one row, vocabulary-sized) and records it.
    pub fn sample(&mut self, logits: &[f32]) -> Sampled {
        self.sample_allowed(logits, None)
    }

    /// As `sample`, among the tokens `allowed` lets through (structured output). Logprobs stay
    /// the model's raw distribution. `allowed` must let at least one token through.
    /// `logprob` and `top` are filled only when the request asks for logprobs (`logprob` is NaN
    /// otherwise).
    pub fn sample_allowed(&mut self, logits: &[f32], allowed: Option<&SimpleVob>) -> Sampled {
        let p = &self.params;
        let hold_end = self.num_output < p.min_tokens && !self.enders.is_empty();
        let untouched = allowed.is_none() && self.untouched();
        let token_id = if untouched && p.is_greedy() {
            argmax(logits) // no copy: nothing changes the row
        } else {
            let mut l = logits.to_vec();
            self.apply_penalties(&mut l);
            if hold_end {
                for &t in &self.enders {
                    if let Some(x) = l.get_mut(t as usize) {
                        *x = f32::NEG_INFINITY;
                    }
                }
            }
            if let Some(mask) = allowed {
                for (i, x) in l.iter_mut().enumerate() {
                    if !mask.is_allowed(i as TokenId) {
                        *x = f32::NEG_INFINITY;
                    }
                }
            }
            if self.params.is_greedy() {
                argmax(&l)
            } else {
                self.draw(&l)
            }
        };
        let (logprob, top) = match self.params.logprobs {
            Some(n) => logprobs_of(logits, token_id, n),
            None => (f32::NAN, Vec::new()),
        };
        *self.output_counts.entry(token_id).or_insert(0) += 1;
        self.num_output += 1;
        Sampled { token_id, logprob, top }
    }

    fn apply_penalties(&self, l: &mut [f32]) {
        let p = &self.params;
        if p.repetition_penalty != 1.0 {
            let seen = self.prompt_tokens.iter().copied().chain(self.output_counts.keys().copied());
            let mut done = std::collections::HashSet::new();
            for t in seen {
                if done.insert(t) {
                    if let Some(x) = l.get_mut(t as usize) {
                        *x = if *x > 0.0 { *x / p.repetition_penalty } else { *x * p.repetition_penalty };
                    }
                }
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&t, &c) in &self.output_counts {
                if let Some(x) = l.get_mut(t as usize) {
                    *x -= p.frequency_penalty * c as f32 + p.presence_penalty;
                }
            }
        }
        for (&t, &b) in &p.logit_bias {
            if let Some(x) = l.get_mut(t as usize) {
                *x += b;
            }
        }
    }

    /// Temperature, then top-k, min-p and top-p, then one draw.
    fn draw(&mut self, l: &[f32]) -> TokenId {
        let (idx, weights, total) = candidates(&self.params, l);
        let mut u = self.rng.random::<f32>() * total;
        for (&i, &w) in idx.iter().zip(&weights) {
            if u < w {
                return i;
            }
            u -= w;
        }
        *idx.last().expect("at least one candidate")
    }
}

/// The tokens a draw chooses among, with their unnormalised weights `exp((l - max) / T)` and
/// the weights' sum: every token (in index order) when nothing cuts the distribution, else the
/// head that top-k, min-p and top-p keep, most likely first (`descending_key` order).
///
/// Normalising is against the sum over all tokens top-k keeps, summed in a fixed order, so
/// top-p and min-p cut where a full sort would.
fn candidates(p: &SamplingParams, l: &[f32]) -> (Vec<TokenId>, Vec<f32>, f32) {
    let inv_t = 1.0 / p.temperature;
    let mut keys: Vec<u64> = l.iter().enumerate().map(|(i, &x)| descending_key(x, i as u32)).collect();
    if p.top_k > 0 && p.top_k < keys.len() {
        keys.select_nth_unstable(p.top_k - 1);
        keys.truncate(p.top_k);
    }
    let first = *keys.iter().min().expect("a non-empty vocabulary");
    let max = l[first as u32 as usize] * inv_t;
    let weight = |k: u64| (l[k as u32 as usize] * inv_t - max).exp();
    // Sums in f64: a running f32 sum over 150k weights drifts by up to 1e-3 of the total.
    if p.min_p <= 0.0 && p.top_p >= 1.0 {
        let w: Vec<f32> = keys.iter().map(|&k| weight(k)).collect();
        let sum: f64 = w.iter().map(|&x| f64::from(x)).sum();
        return (keys.iter().map(|&k| k as u32).collect(), w, sum as f32);
    }
    let sum: f64 = keys.iter().map(|&k| f64::from(weight(k))).sum();
    // The sorted head, grown until a cut falls inside it (or it is everything).
    let mut head = 256.min(keys.len());
    loop {
        if head < keys.len() {
            keys.select_nth_unstable(head - 1);
        }
        keys[..head].sort_unstable();
        let w: Vec<f32> = keys[..head].iter().map(|&k| weight(k)).collect();
        let mut keep = head;
        let mut cut = head == keys.len();
        if p.min_p > 0.0 {
            let floor = f64::from(p.min_p) * f64::from(w[0]);
            let above = w.iter().take_while(|&&x| f64::from(x) >= floor).count();
            if above < head {
                (keep, cut) = (above.max(1), true);
            }
        }
        if p.top_p < 1.0 {
            let (mut cum, target) = (0f64, f64::from(p.top_p) * sum);
            if let Some(n) = w[..keep].iter().position(|&x| {
                cum += f64::from(x);
                cum >= target
            }) {
                (keep, cut) = (n + 1, true);
            }
        }
        if cut {
            let total = w[..keep].iter().sum();
            return (keys[..keep].iter().map(|&k| k as u32).collect(), w[..keep].to_vec(), total);
        }
        head = (head * 4).min(keys.len());
    }
}

/// A key whose ascending order is `x` descending by `f32::total_cmp`, then `i` ascending.
fn descending_key(x: f32, i: u32) -> u64 {
    let bits = x.to_bits();
    // total_cmp's order as an unsigned integer: flip every bit of negatives, the sign of positives.
    let ordered = if bits >> 31 == 1 { !bits } else { bits | 0x8000_0000 };
    (u64::from(!ordered) << 32) | u64::from(i)
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

/// `token`'s log-probability under the raw distribution `logits`, and the `n` most likely
/// tokens' (most likely first, ties by lower id).
pub fn logprobs_of(logits: &[f32], token: TokenId, n: usize) -> (f32, Vec<(TokenId, f32)>) {
    let lse = log_sum_exp(logits);
    let top = if n == 0 { Vec::new() } else { top_n(logits, n) };
    let top = top.into_iter().map(|i| (i, logits[i as usize] - lse)).collect();
    (logits[token as usize] - lse, top)
}

fn log_sum_exp(l: &[f32]) -> f32 {
    let m = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    m + l.iter().map(|&x| (x - m).exp()).sum::<f32>().ln()
}

fn top_n(l: &[f32], n: usize) -> Vec<TokenId> {
    let mut idx: Vec<u32> = (0..l.len() as u32).collect();
    let n = n.min(idx.len());
    let cmp = |a: &u32, b: &u32| l[*b as usize].total_cmp(&l[*a as usize]).then(a.cmp(b));
    if n < idx.len() {
        idx.select_nth_unstable_by(n - 1, cmp);
        idx.truncate(n);
    }
    idx.sort_unstable_by(cmp);
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams { seed: Some(7), ..Default::default() };
        f(&mut p);
        p
    }

    #[test]
    fn min_tokens_holds_back_eos_and_stop_tokens_then_lets_them_through() {
        let logits = [0.0, 1.0, 5.0, 4.0, 2.0]; // EOS (2), then a stop token (3), are likeliest
        let p = params(|p| {
            p.temperature = 0.0;
            p.min_tokens = 2;
            p.stop_token_ids = vec![3];
            p.logprobs = Some(0);
        });
        let mut s = Sampler::new(p, &[]).with_eos(&[2]);
        let first = s.sample(&logits);
        assert_eq!(first.token_id, 4);
        assert!((first.logprob - (2.0 - log_sum_exp(&logits))).abs() < 1e-6, "logprobs stay the model's");
        assert_eq!(s.sample(&logits).token_id, 4);
        assert_eq!(s.sample(&logits).token_id, 2);
    }

    #[test]
    fn greedy_takes_the_first_maximum_and_reports_logprobs() {
        let mut s = Sampler::new(
            params(|p| {
                p.temperature = 0.0;
                p.logprobs = Some(2)
            }),
            &[],
        );
        let out = s.sample(&[1.0, 3.0, 3.0, 0.0]);
        assert_eq!(out.token_id, 1);
        assert_eq!(out.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2]);
        let z = (1f32.exp() + 2.0 * 3f32.exp() + 1.0).ln();
        assert!((out.logprob - (3.0 - z)).abs() < 1e-6);
    }

    #[test]
    fn plain_greedy_holds_only_when_sample_would_take_the_raw_argmax_and_record_matches_it() {
        let logits = [0.0, 1.0, 5.0, 4.0, 2.0];
        let greedy = |f: fn(&mut SamplingParams)| {
            params(move |p| {
                p.temperature = 0.0;
                f(p)
            })
        };
        let plain = Sampler::new(greedy(|_| {}), &[]).with_eos(&[2]);
        assert!(plain.plain_greedy());
        for not_plain in [
            greedy(|p| p.logprobs = Some(0)),
            greedy(|p| p.repetition_penalty = 1.1),
            greedy(|p| p.presence_penalty = 0.5),
            greedy(|p| p.frequency_penalty = 0.5),
            greedy(|p| p.logit_bias = [(1, 2.0)].into_iter().collect()),
            params(|p| p.temperature = 0.7),
        ] {
            assert!(!Sampler::new(not_plain, &[]).plain_greedy());
        }
        // min_tokens holds EOS back for two tokens: not plain until then.
        let mut held = Sampler::new(greedy(|p| p.min_tokens = 2), &[]).with_eos(&[2]);
        let mut sampled = Sampler::new(greedy(|p| p.min_tokens = 2), &[]).with_eos(&[2]);
        for _ in 0..2 {
            assert!(!held.plain_greedy());
            assert_eq!(held.sample(&logits).token_id, sampled.sample(&logits).token_id);
        }
        assert!(held.plain_greedy());
        let recorded = held.record(argmax(&logits));
        assert_eq!((recorded.token_id, recorded.top.len()), (2, 0));
        assert_eq!(recorded.token_id, sampled.sample(&logits).token_id);
        assert_eq!(held.output_counts, sampled.output_counts);
        assert_eq!(held.num_output, sampled.num_output);
    }

    /// The vectorized argmax picks what a scan keeping the first strictly greater value picks:
    /// ties, NaNs (skipped, or index 0 when first), signed zeros, infinities, any length.
    #[test]
    fn argmax_matches_the_scan() {
        let scan = |l: &[f32]| {
            let mut best = 0;
            for (i, &x) in l.iter().enumerate() {
                if x > l[best] {
                    best = i;
                }
            }
            best as TokenId
        };
        let pool = [0.5f32, -0.0, 0.0, -1.5, f32::INFINITY, f32::NEG_INFINITY, 3.0, 3.0, f32::NAN, -7.0];
        let mut seed = 17u64;
        for len in [0usize, 1, 2, 15, 16, 17, 31, 33, 100, 257] {
            for _ in 0..200 {
                let l: Vec<f32> = (0..len)
                    .map(|_| {
                        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        pool[(seed >> 33) as usize % pool.len()]
                    })
                    .collect();
                if len > 0 {
                    assert_eq!(argmax(&l), scan(&l), "{l:?}");
                }
            }
        }
        assert_eq!(argmax(&[]), 0);
    }

    /// The packed keys sort exactly as the comparator `total_cmp` descending, then index.
    #[test]
    fn packed_keys_order_like_total_cmp() {
        let vals = [0.5f32, -0.0, 0.0, -1.5, f32::INFINITY, f32::NEG_INFINITY, 0.5, 3.0, -1e-30, 1e-30, f32::NAN];
        let mut want: Vec<u32> = (0..vals.len() as u32).collect();
        want.sort_by(|a, b| vals[*b as usize].total_cmp(&vals[*a as usize]).then(a.cmp(b)));
        let mut keys: Vec<u64> = vals.iter().enumerate().map(|(i, &x)| descending_key(x, i as u32)).collect();
        keys.sort_unstable();
        assert_eq!(keys.iter().map(|&k| k as u32).collect::<Vec<_>>(), want);
    }

    #[test]
    fn same_seed_same_tokens_and_cuts_are_respected() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let run = |seed| {
            let mut s = Sampler::new(params(|p| p.seed = Some(seed)), &[]);
            (0..40).map(|_| s.sample(&logits).token_id).collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
        // top_k = 3 only ever yields the three largest logits.
        let top3 = top_n(&logits, 3);
        let mut s = Sampler::new(params(|p| p.top_k = 3), &[]);
        for _ in 0..100 {
            assert!(top3.contains(&s.sample(&logits).token_id));
        }
        // a tiny top_p keeps only the most likely token.
        let mut s = Sampler::new(params(|p| p.top_p = 1e-6), &[]);
        assert!((0..50).all(|_| s.sample(&logits).token_id == top3[0]));
        // min_p close to 1 keeps only the most likely token.
        let mut s = Sampler::new(params(|p| p.min_p = 0.999), &[]);
        assert!((0..50).all(|_| s.sample(&logits).token_id == top3[0]));
    }

    /// The head `candidates` sorts is the one a full sort gives: the same tokens, in order, for
    /// every cut; with no cut, every token. Logits have ties and a wide range.
    #[test]
    fn candidates_match_a_full_sort() {
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
            let p = params(|p| {
                (p.temperature, p.top_k, p.min_p, p.top_p) = (temperature, top_k, min_p, top_p);
            });
            // The reference: everything sorted and normalised (in f64).
            let mut order: Vec<u32> = (0..l.len() as u32).collect();
            order.sort_by(|a, b| l[*b as usize].total_cmp(&l[*a as usize]).then(a.cmp(b)));
            if top_k > 0 {
                order.truncate(top_k);
            }
            let max = l[order[0] as usize] / temperature;
            let probs: Vec<f64> = order.iter().map(|&i| ((l[i as usize] / temperature - max) as f64).exp()).collect();
            let sum: f64 = probs.iter().sum();
            let (mut got, w, total) = candidates(&p, &l);
            let case = format!("T={temperature} top_k={top_k} min_p={min_p} top_p={top_p}: kept {}", got.len());
            assert_eq!(got.len(), w.len());
            assert!((total - w.iter().sum::<f32>()).abs() <= 1e-3 * total, "{case}");
            if min_p <= 0.0 && top_p >= 1.0 {
                got.sort_unstable();
                order.sort_unstable();
                assert!(got == order, "{case}: not every token");
                continue;
            }
            // A head of the full order, cut where min-p and top-p say (top-p up to the rounding
            // of f32 weights: within 1e-6 of the boundary).
            assert!(got == order[..got.len()], "{case}: not the sorted head");
            let above = probs.iter().take_while(|&&x| x >= min_p as f64 * probs[0]).count();
            let cum = |n: usize| probs[..n].iter().sum::<f64>() / sum;
            let n = got.len();
            if top_p >= 1.0 {
                assert_eq!(n, above, "{case}");
            } else {
                assert!(n <= above, "{case}");
                let ends_top_p = cum(n) >= top_p as f64 - 1e-6 && cum(n - 1) < top_p as f64 + 1e-6;
                assert!(n == above || ends_top_p, "{case}: cumulative {} at the cut", cum(n));
            }
        }
    }

    #[test]
    fn logprobs_only_when_asked() {
        let mut s = Sampler::new(params(|p| p.temperature = 0.0), &[]);
        let out = s.sample(&[1.0, 3.0, 2.0]);
        assert_eq!((out.token_id, out.top.len()), (1, 0));
        assert!(out.logprob.is_nan());
        let mut s = Sampler::new(params(|p| p.logprobs = Some(0)), &[]);
        let out = s.sample(&[1.0, 3.0, 2.0]);
        assert!(out.logprob.is_finite() && out.logprob < 0.0 && out.top.is_empty());
    }

    #[test]
    fn penalties_push_away_repeated_tokens() {
        let logits = [2.0, 1.9, -1.0];
        let mut s = Sampler::new(
            params(|p| {
                p.temperature = 0.0;
                p.frequency_penalty = 0.5
            }),
            &[],
        );
        assert_eq!(s.sample(&logits).token_id, 0);
        assert_eq!(s.sample(&logits).token_id, 1); // 2.0 - 0.5 < 1.9
        let mut s = Sampler::new(
            params(|p| {
                p.temperature = 0.0;
                p.repetition_penalty = 2.0
            }),
            &[0],
        );
        assert_eq!(s.sample(&logits).token_id, 1); // 2.0 / 2 < 1.9
        let mut s = Sampler::new(
            params(|p| {
                p.temperature = 0.0;
                p.presence_penalty = 1.0
            }),
            &[],
        );
        assert_eq!(s.sample(&logits).token_id, 0);
        assert_eq!(s.sample(&logits).token_id, 1);
    }
}
