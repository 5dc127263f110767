//! Speculative drafts: where they come from (`NgramProposer`, prompt lookup) and how many a
//! request drafts in a step (`Acceptance`, per request, adapting to what verification accepted).
//!
//! Invariants: a draft is only a guess: the engine verifies every drafted token against the
//! token plain decoding would pick at that position and keeps a draft only up to its first
//! mismatch, so nothing here can change a request's output, only how many tokens a step yields.
//! A draft never takes a request past `max_num_tokens` (`Scheduler::schedule` bounds it).

use lmplex_core::{SpeculativeConfig, SpeculativeMethod, TokenId};

/// Weight kept by the acceptance counts at each verification (older steps fade).
const DECAY: f64 = 0.9;
/// A request that drafts nothing (its acceptance too low for the step's cost) tries one
/// token again after this many steps, so a sequence that turns repetitive is noticed.
const PROBE_EVERY: u32 = 16;

/// Prompt lookup (vLLM's `ngram` method): the tokens that followed the latest earlier
/// occurrence of the sequence's last `n` tokens, for the longest `n` in `min..=max` that occurs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramProposer {
    /// Most tokens drafted per request and step.
    pub num_speculative_tokens: usize,
    min: usize,
    max: usize,
}

impl NgramProposer {
    /// The proposer a validated config describes.
    pub fn new(cfg: &SpeculativeConfig) -> Self {
        let SpeculativeMethod::Ngram = cfg.method;
        let (min, max) = cfg.lookup_range();
        Self { num_speculative_tokens: cfg.num_speculative_tokens, min: min.max(1), max: max.max(1) }
    }

    /// Up to `n` tokens to draft after `tokens` (nothing when no suffix recurs).
    pub fn propose(&self, tokens: &[TokenId], n: usize) -> Vec<TokenId> {
        let len = tokens.len();
        if n == 0 || len < 2 {
            return Vec::new();
        }
        let last = tokens[len - 1];
        for size in (self.min..=self.max.min(len - 1)).rev() {
            let suffix = &tokens[len - size..];
            // The latest start `i` before the suffix's own whose n-gram equals it.
            let hit = (0..len - size).rev().find(|&i| tokens[i + size - 1] == last && tokens[i..i + size] == *suffix);
            if let Some(i) = hit {
                let from = i + size;
                return tokens[from..(from + n).min(len)].to_vec();
            }
        }
        Vec::new()
    }
}

/// How well a request's drafts have fared: decayed counts of drafted tokens verified and
/// accepted, which set its next draft's length (`draft_len`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Acceptance {
    accepted: f64,
    tested: f64,
    idle: u32,
}

impl Default for Acceptance {
    /// The prior: one token of two accepted.
    fn default() -> Self {
        Self { accepted: 1.0, tested: 2.0, idle: 0 }
    }
}

impl Acceptance {
    /// The estimated chance that a drafted token is accepted, given the ones before it were.
    pub fn rate(&self) -> f64 {
        self.accepted / self.tested
    }

    /// Folds in a verification that drafted `drafted` tokens and accepted the first `accepted`:
    /// the tokens verified are the accepted ones and the first rejected one, if any.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        let tested = accepted + usize::from(accepted < drafted);
        self.accepted = self.accepted * DECAY + accepted as f64;
        self.tested = self.tested * DECAY + tested as f64;
        self.idle = 0;
    }

    /// The draft length for a step where a drafted token pays when its chance of being
    /// accepted (with all before it) exceeds `threshold`: the largest `j <= max` with
    /// `rate^j > threshold`. A request that would draft nothing drafts one token every
    /// `PROBE_EVERY` steps.
    pub fn draft_len(&mut self, max: usize, threshold: f64) -> usize {
        let p = self.rate();
        let mut j = 0;
        let mut chance = p;
        while j < max && chance > threshold {
            j += 1;
            chance *= p;
        }
        if j == 0 && max > 0 {
            self.idle += 1;
            if self.idle >= PROBE_EVERY {
                self.idle = 0;
                return 1;
            }
        }
        j
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ngram(k: usize, min: usize, max: usize) -> NgramProposer {
        NgramProposer::new(&SpeculativeConfig {
            prompt_lookup_min: Some(min),
            prompt_lookup_max: Some(max),
            ..SpeculativeConfig::ngram(k)
        })
    }

    #[test]
    fn proposes_what_followed_the_longest_latest_match() {
        let p = ngram(3, 1, 3);
        // "1 2 3 4 | 9 2 3 5 | 1 2 3": the 3-gram "1 2 3" recurs at 0 -> "4 9 2".
        assert_eq!(p.propose(&[1, 2, 3, 4, 9, 2, 3, 5, 1, 2, 3], 3), vec![4, 9, 2]);
        // Only the 2-gram "2 3" recurs; its latest occurrence is at 5 -> "5 7".
        assert_eq!(p.propose(&[1, 2, 3, 4, 9, 2, 3, 5, 7, 2, 3], 2), vec![5, 7]);
        // The continuation stops at the sequence's end.
        assert_eq!(p.propose(&[7, 8, 7], 4), vec![8, 7]);
        assert!(p.propose(&[1, 2, 3], 4).is_empty(), "no suffix recurs");
        assert!(ngram(3, 2, 2).propose(&[1, 2, 3, 1], 4).is_empty(), "too short a match");
        assert!(p.propose(&[1, 2, 1], 0).is_empty());
    }

    #[test]
    fn draft_length_follows_acceptance() {
        let mut a = Acceptance::default();
        assert_eq!(a.draft_len(4, 0.0), 4, "a free draft is always worth it");
        assert_eq!(a.draft_len(4, 0.2), 2, "0.5^2 > 0.2 > 0.5^3");
        for _ in 0..20 {
            a.record(4, 4);
        }
        assert!(a.rate() > 0.95, "{}", a.rate());
        assert_eq!(a.draft_len(4, 0.5), 4);
        for _ in 0..40 {
            a.record(2, 0);
        }
        assert!(a.rate() < 0.1, "{}", a.rate());
        let lens: Vec<usize> = (0..PROBE_EVERY).map(|_| a.draft_len(4, 0.1)).collect();
        assert_eq!(lens.iter().sum::<usize>(), 1, "one probe in {PROBE_EVERY} steps: {lens:?}");
    }
}
