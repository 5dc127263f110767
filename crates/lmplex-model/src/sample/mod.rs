//! Picking the next token from a logits row: penalties, temperature, min-p, top-k, top-p,
//! greedy or seeded sampling, and log-probabilities. `Sampler` is one request's state; `pick`
//! holds the edits a row takes before the pick (penalties, bias, held-back endings) and `draw`
//! the pick itself (the argmax, or the seeded draw), both shared with the CUDA kernels.
//!
//! Invariants: the result depends only on the logits row, the request's parameters, its token
//! history, its seed (`seed`, else drawn from the OS once) and how many tokens it has made,
//! never on other requests. The draw itself is `draw`, which the CUDA kernel computes
//! bit for bit.
//! Greedy picks the lowest index among equal maxima. Reported logprobs are the model's raw
//! distribution (before penalties and temperature), as vLLM reports them, and are computed only
//! when the request asks for them.
//!
//! Cost: see `draw`; greedy picks make one pass over the row.

pub mod draw;
pub mod pick;

pub use draw::argmax;
use draw::DrawParams;
use lmplex_core::{SamplingParams, TokenId};
use pick::{apply_edits, LogitEdit, Pick};
use std::collections::HashMap;
use toktrie::SimpleVob;

/// One request's sampling state.
pub struct Sampler {
    params: SamplingParams,
    /// The draws' seed (`draw`): `params.seed`, else random.
    seed: u64,
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
        let seed = params.seed.unwrap_or_else(rand::random);
        let mut prompt_tokens = prompt.to_vec();
        prompt_tokens.sort_unstable();
        prompt_tokens.dedup();
        let enders = params.stop_token_ids.clone();
        Self { params, seed, prompt_tokens, output_counts: HashMap::new(), num_output: 0, enders }
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

    /// This step's edits of single logits: penalties, bias, and the endings `min_tokens` holds
    /// back (`pick`).
    fn edits(&self) -> Vec<LogitEdit> {
        let hold_end = self.num_output < self.params.min_tokens;
        let forbid = if hold_end { self.enders.as_slice() } else { &[] };
        pick::edits(&self.params, &self.prompt_tokens, &self.output_counts, forbid)
    }

    /// The next pick when nothing is reported (no logprobs): its edits and draw, which may be
    /// applied elsewhere (on the device, `Pick::pick` or its kernels) and the token given to
    /// [`Sampler::record`], with the same result as [`Sampler::sample`]. Structured output is
    /// the caller's to rule out.
    pub fn pick(&self) -> Option<Pick> {
        let p = &self.params;
        p.logprobs.is_none().then(|| Pick {
            draw: DrawParams {
                temperature: if p.is_greedy() { 0.0 } else { p.temperature },
                top_k: p.top_k,
                top_p: p.top_p,
                min_p: p.min_p,
                seed: self.seed,
                step: self.num_output as u64,
            },
            edits: self.edits(),
        })
    }

    /// Records `token_id`, picked with [`Sampler::pick`]: what `sample` returns and records
    /// then.
    pub fn record(&mut self, token_id: TokenId) -> Sampled {
        debug_assert!(self.pick().is_some());
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
        let edits = self.edits();
        let token_id = if edits.is_empty() && allowed.is_none() && self.params.is_greedy() {
            argmax(logits) // no copy: nothing changes the row
        } else {
            let mut l = logits.to_vec();
            apply_edits(&mut l, &edits);
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

    /// Temperature, then top-k, min-p and top-p, then one draw (`draw`) for this
    /// request's seed at its step (the number of tokens it has made).
    fn draw(&self, l: &[f32]) -> TokenId {
        draw::draw(l, &self.params, self.seed, self.num_output as u64)
    }
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

    #[test]
    fn a_pick_made_elsewhere_is_what_sample_picks_with_penalties_bias_and_held_back_endings() {
        let logits: Vec<f32> = (0..300).map(|i| ((i * 37 % 101) as f32) * 0.04 - 1.0).collect();
        let eos = argmax(&logits);
        for p in [
            params(|p| p.temperature = 0.0),
            params(|p| p.temperature = 0.9),
            params(|p| (p.temperature, p.top_k, p.top_p, p.min_p) = (0.7, 40, 0.9, 0.02)),
            params(|p| (p.temperature, p.repetition_penalty) = (0.0, 1.3)),
            params(|p| (p.temperature, p.presence_penalty, p.frequency_penalty) = (0.8, 0.5, 0.3)),
            params(|p| (p.temperature, p.logit_bias) = (0.0, [(5, 3.0), (299, -100.0)].into_iter().collect())),
            params(|p| (p.temperature, p.min_tokens) = (0.0, 3)),
        ] {
            let prompt = [3, 5, 7, 200];
            let mut a = Sampler::new(p.clone(), &prompt).with_eos(&[eos]);
            let mut b = Sampler::new(p, &prompt).with_eos(&[eos]);
            for _ in 0..20 {
                let pick = a.pick().expect("nothing is reported");
                let picked = a.record(pick.pick(&logits)).token_id;
                assert_eq!(picked, b.sample(&logits).token_id);
            }
            assert_eq!((a.output_counts, a.num_output), (b.output_counts, b.num_output));
        }
        assert!(Sampler::new(params(|p| p.logprobs = Some(1)), &[]).pick().is_none());
        // Greedy with nothing to edit: the device's plain argmax.
        let plain = Sampler::new(params(|p| p.temperature = 0.0), &[1, 2]).with_eos(&[2]).pick().unwrap();
        assert!(plain.edits.is_empty() && plain.draw.temperature == 0.0);
        let held = Sampler::new(params(|p| (p.temperature, p.min_tokens) = (0.0, 1)), &[]).with_eos(&[2]);
        assert_eq!(
            held.pick().unwrap().edits,
            vec![pick::LogitEdit { token: 2, repetition: None, subtract: None, add: None, forbid: true }]
        );
    }
}
