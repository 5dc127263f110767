//! What a pick from one logits row needs besides the row: the draw (`super::draw`) and the edits
//! that a request's penalties, logit bias and held-back endings make to single logits first.
//! The host sampler applies them with [`apply_edits`]; the CUDA kernel `logit_edits_f32` makes
//! the same f32 operations on the device, so both pick the same token from the same logits.
//!
//! Invariants: a request's edits hold at most one edit per token, in token order; an edit's
//! steps run in the sampler's order (repetition, frequency and presence, bias, then forbidding),
//! each one correctly rounded f32 operation (never fused), so the result is the same bits
//! wherever it is computed.

use super::draw::DrawParams;
use lmplex_core::{SamplingParams, TokenId};
use std::collections::{BTreeMap, HashMap};

/// The changes to one token's logit before a pick.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogitEdit {
    /// The token whose logit changes.
    pub token: TokenId,
    /// `repetition_penalty` (the token was in the prompt or the output): a positive logit is
    /// divided by it, any other multiplied.
    pub repetition: Option<f32>,
    /// `frequency_penalty * count + presence_penalty` (the token was in the output), subtracted.
    pub subtract: Option<f32>,
    /// The request's `logit_bias` for the token, added.
    pub add: Option<f32>,
    /// An ending held back by `min_tokens`: the logit becomes −∞.
    pub forbid: bool,
}

impl LogitEdit {
    fn new(token: TokenId) -> Self {
        Self { token, repetition: None, subtract: None, add: None, forbid: false }
    }

    /// The edited logit.
    pub fn apply(&self, mut x: f32) -> f32 {
        if let Some(r) = self.repetition {
            x = if x > 0.0 { x / r } else { x * r };
        }
        if let Some(s) = self.subtract {
            x -= s;
        }
        if let Some(b) = self.add {
            x += b;
        }
        if self.forbid {
            x = f32::NEG_INFINITY;
        }
        x
    }
}

/// Applies `edits` to one logits row (an edit for a token past the row changes nothing).
pub fn apply_edits(l: &mut [f32], edits: &[LogitEdit]) {
    for e in edits {
        if let Some(x) = l.get_mut(e.token as usize) {
            *x = e.apply(*x);
        }
    }
}

/// One request's edits at one step: `seen` (sorted, deduplicated prompt tokens) and
/// `output_counts` feed the penalties, `forbid` lists the endings held back.
pub fn edits(
    p: &SamplingParams,
    seen: &[TokenId],
    output_counts: &HashMap<TokenId, u32>,
    forbid: &[TokenId],
) -> Vec<LogitEdit> {
    fn at(m: &mut BTreeMap<TokenId, LogitEdit>, t: TokenId) -> &mut LogitEdit {
        m.entry(t).or_insert_with(|| LogitEdit::new(t))
    }
    let mut by_token = BTreeMap::new();
    if p.repetition_penalty != 1.0 {
        for &t in seen.iter().chain(output_counts.keys()) {
            at(&mut by_token, t).repetition = Some(p.repetition_penalty);
        }
    }
    if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
        for (&t, &c) in output_counts {
            at(&mut by_token, t).subtract = Some(p.frequency_penalty * c as f32 + p.presence_penalty);
        }
    }
    for (&t, &b) in &p.logit_bias {
        at(&mut by_token, t).add = Some(b);
    }
    for &t in forbid {
        at(&mut by_token, t).forbid = true;
    }
    by_token.into_values().collect()
}

/// Everything one row's pick needs: the edits to apply, then the draw.
#[derive(Clone, Debug, PartialEq)]
pub struct Pick {
    /// The argmax (temperature 0) or the seeded draw.
    pub draw: DrawParams,
    /// Applied first, at most one per token, in token order.
    pub edits: Vec<LogitEdit>,
}

impl Pick {
    /// Greedy decoding's pick: the argmax (the first of equal maxima), no edits.
    pub fn greedy() -> Self {
        let draw = DrawParams { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 0, step: 0 };
        Self { draw, edits: Vec::new() }
    }

    /// The token picked from `row`: the edits, then `DrawParams::pick`.
    pub fn pick(&self, row: &[f32]) -> TokenId {
        if self.edits.is_empty() {
            return self.draw.pick(row);
        }
        let mut l = row.to_vec();
        apply_edits(&mut l, &self.edits);
        self.draw.pick(&l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_merge_per_token_in_the_samplers_order() {
        let p = SamplingParams {
            repetition_penalty: 2.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            logit_bias: [(7, 1.0), (3, -2.0)].into_iter().collect(),
            ..Default::default()
        };
        let counts: HashMap<TokenId, u32> = [(3, 2), (9, 1)].into_iter().collect();
        let e = edits(&p, &[1, 3], &counts, &[9, 40]);
        assert_eq!(e.iter().map(|e| e.token).collect::<Vec<_>>(), vec![1, 3, 7, 9, 40]);
        // Token 3: in the prompt and twice in the output, with a bias.
        assert_eq!(
            e[1],
            LogitEdit { token: 3, repetition: Some(2.0), subtract: Some(1.0), add: Some(-2.0), forbid: false }
        );
        assert_eq!(e[1].apply(4.0), 4.0 / 2.0 - 1.0 - 2.0);
        assert_eq!(e[1].apply(-4.0), -4.0 * 2.0 - 1.0 - 2.0);
        assert_eq!(e[3].apply(1.0), f32::NEG_INFINITY, "a held-back ending");
        assert_eq!((e[2].repetition, e[2].add), (None, Some(1.0)), "bias alone");
        let mut row = vec![1.0f32; 10];
        apply_edits(&mut row, &e);
        assert_eq!((row[0], row[1], row[7], row[9]), (1.0, 0.5, 2.0, f32::NEG_INFINITY));
        // Neutral settings make no edits.
        assert!(edits(&SamplingParams::default(), &[1, 2], &counts, &[]).is_empty());
    }
}
