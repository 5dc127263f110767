//! Speculative drafts: where they come from (`Drafter`: `NgramProposer`, prompt lookup, or a
//! draft model the engine runs, its `Proposal`s handed in before each step), how likely each
//! request's next drafted token is to be accepted (`Acceptance`, per request, adapting to what
//! verification accepted), and what a pass of so many generated rows costs (`RowCosts`,
//! measured), from which `Scheduler::schedule` adds a draft only while it raises the step's
//! expected tokens a second.
//!
//! Invariants: a draft is only a guess: the engine verifies every drafted token against the
//! token plain decoding would pick at that position and keeps a draft only up to its first
//! mismatch, so nothing here can change a request's output, only how many tokens a step yields.
//! A draft never takes a request past `max_num_tokens` (`Scheduler::schedule` bounds it).

use lmplex_core::{SpeculativeConfig, SpeculativeMethod, TokenId};

/// Weight kept by the acceptance counts at each verification (older steps fade).
const DECAY: f64 = 0.9;

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
    /// The proposer a validated config describes (its lookup sizes; the method is not read).
    pub fn new(cfg: &SpeculativeConfig) -> Self {
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

/// Where a scheduler's drafts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drafter {
    /// Prompt lookup, run by the scheduler itself.
    Ngram(NgramProposer),
    /// A draft model the engine runs before each step on the requests `Scheduler::draft_requests`
    /// lists, handing its tokens in with `Scheduler::set_proposals`.
    Model {
        /// Most tokens drafted per request and step.
        num_speculative_tokens: usize,
    },
}

impl Drafter {
    /// The drafter a validated config describes.
    pub fn new(cfg: &SpeculativeConfig) -> Self {
        match cfg.method {
            SpeculativeMethod::Ngram => Self::Ngram(NgramProposer::new(cfg)),
            SpeculativeMethod::Draft => Self::Model { num_speculative_tokens: cfg.num_speculative_tokens },
        }
    }

    /// Most tokens drafted per request and step.
    pub fn num_speculative_tokens(&self) -> usize {
        match self {
            Self::Ngram(p) => p.num_speculative_tokens,
            Self::Model { num_speculative_tokens } => *num_speculative_tokens,
        }
    }
}

/// A request a draft model may draft for this step (`Scheduler::draft_requests`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftRequest<'a> {
    /// The request.
    pub id: lmplex_kv::manager::ReqId,
    /// Its tokens so far, prompt and output.
    pub tokens: &'a [TokenId],
    /// How many of `tokens` are the prompt's (they take the prompt kernels, the rest decode's).
    pub num_prompt_tokens: usize,
    /// Most tokens worth drafting for it (0: none this step).
    pub n: usize,
}

/// Tokens a draft model proposes after a request's first `at` tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    /// The request's length the draft continues (a proposal for another length is dropped).
    pub at: usize,
    /// The drafted tokens, in order.
    pub tokens: Vec<TokenId>,
}

/// How well a request's drafts have fared: decayed counts of drafted tokens verified and
/// accepted, which say how much its next drafted token is worth (`rate`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Acceptance {
    accepted: f64,
    tested: f64,
}

impl Default for Acceptance {
    /// The prior: one token of two accepted.
    fn default() -> Self {
        Self { accepted: 1.0, tested: 2.0 }
    }
}

impl Acceptance {
    /// The estimated chance that a drafted token is accepted, given the ones before it were.
    pub fn rate(&self) -> f64 {
        self.accepted / self.tested
    }

    /// How many tokens are worth drafting, at most `max`: up to the first whose chance of being
    /// reached (`rate^j`) falls under a quarter, and at least one.
    pub fn draft_len(&self, max: usize) -> usize {
        let p = self.rate();
        (1..=max).take_while(|&j| j == 1 || p.powi(j as i32 - 1) >= 0.25).count()
    }

    /// Folds in a verification that drafted `drafted` tokens and accepted the first `accepted`:
    /// the tokens verified are the accepted ones and the first rejected one, if any.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        let tested = accepted + usize::from(accepted < drafted);
        self.accepted = self.accepted * DECAY + accepted as f64;
        self.tested = self.tested * DECAY + tested as f64;
    }
}

/// Weight of a new measurement in a row count's cost.
const ROW_COST_EMA: f64 = 0.2;
/// Row counts past this are not tracked (their cost is extrapolated).
const MAX_TRACKED_ROWS: usize = 512;
/// Beyond the largest row count measured, a row is assumed to cost this share of a measured
/// row's mean: optimistic, so a larger pass gets tried and measured.
const UNMEASURED_ROW_SHARE: f64 = 0.25;

/// Seconds of a forward pass of generated rows only (decodes and their drafts) by its number
/// of rows, as measured (a moving average per row count). A pass is not linear in its rows
/// (kernels change their blocking with the row count), so each count keeps its own figure.
#[derive(Debug, Clone, Default)]
pub struct RowCosts {
    secs: Vec<f64>,
}

impl RowCosts {
    /// A pass of `rows` generated rows took `secs`.
    pub fn observe(&mut self, rows: usize, secs: f64) {
        if rows == 0 || rows >= MAX_TRACKED_ROWS || !secs.is_finite() || secs <= 0.0 {
            return;
        }
        if self.secs.len() <= rows {
            self.secs.resize(rows + 1, 0.0);
        }
        let c = &mut self.secs[rows];
        *c = if *c == 0.0 { secs } else { *c + ROW_COST_EMA * (secs - *c) };
    }

    /// The seconds a pass of `rows` rows is expected to take: measured; else interpolated
    /// between the nearest measured counts; else, past the largest, that one's plus an
    /// optimistic `UNMEASURED_ROW_SHARE` of its mean row cost per extra row; else, below the
    /// smallest, the smallest's. `None` before any measurement.
    pub fn cost(&self, rows: usize) -> Option<f64> {
        let measured = |r: usize| self.secs.get(r).copied().filter(|&c| c > 0.0);
        if let Some(c) = measured(rows) {
            return Some(c);
        }
        let below = (1..rows.min(self.secs.len())).rev().find_map(|r| measured(r).map(|c| (r, c)));
        let above = (rows + 1..self.secs.len()).find_map(|r| measured(r).map(|c| (r, c)));
        match (below, above) {
            (Some((r0, c0)), Some((r1, c1))) => Some(c0 + (c1 - c0) * (rows - r0) as f64 / (r1 - r0) as f64),
            (Some((r0, c0)), None) => Some(c0 + (rows - r0) as f64 * UNMEASURED_ROW_SHARE * c0 / r0 as f64),
            (None, Some((_, c1))) => Some(c1),
            (None, None) => None,
        }
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
    fn acceptance_follows_verification() {
        let mut a = Acceptance::default();
        assert_eq!(a.rate(), 0.5);
        for _ in 0..20 {
            a.record(4, 4);
        }
        assert!(a.rate() > 0.95, "{}", a.rate());
        assert_eq!(a.draft_len(8), 8);
        for _ in 0..40 {
            a.record(2, 0);
        }
        assert!(a.rate() < 0.1, "{}", a.rate());
        assert_eq!(a.draft_len(8), 1);
        assert_eq!(Acceptance::default().draft_len(8), 3, "0.5, then 0.25 to reach the third");
    }

    #[test]
    fn row_costs_are_measured_interpolated_and_extrapolated() {
        let mut c = RowCosts::default();
        assert_eq!(c.cost(3), None);
        c.observe(1, 0.010);
        c.observe(5, 0.020);
        assert_eq!(c.cost(1), Some(0.010));
        assert!((c.cost(3).unwrap() - 0.015).abs() < 1e-12, "halfway between 1 and 5");
        // Past 5 rows: 0.020 + 0.25 * (0.020 / 5) a row.
        assert!((c.cost(7).unwrap() - 0.022).abs() < 1e-12);
        c.observe(5, 0.030);
        assert!((c.cost(5).unwrap() - 0.022).abs() < 1e-12, "a moving average");
        c.observe(0, 1.0);
        c.observe(2, f64::NAN);
        assert!((c.cost(2).unwrap() - 0.013).abs() < 1e-12, "nothing recorded for 0 rows or NaN");
    }
}
