//! `PoolingParams`: how one embedding request's pooled vector is shaped (vLLM's
//! `PoolingParams`; the OpenAI server maps `dimensions` onto it).
//!
//! Invariant: `validate` is the only gate: `dimensions`, when set, is at least 1 and at most the
//! model's hidden size; the vector is truncated to `dimensions` first and normalized after
//! (Matryoshka truncation, as vLLM and sentence-transformers do).

use crate::{Error, Result};
use serde::{Deserialize, Serialize};

/// How an embedding request's vector is shaped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolingParams {
    /// Keep the first `dimensions` elements (`None`: all of them, the model's hidden size).
    pub dimensions: Option<usize>,
    /// Scale the (truncated) vector to unit L2 norm.
    pub normalize: bool,
}

impl Default for PoolingParams {
    /// Every element, normalized (OpenAI's and vLLM's default for embeddings).
    fn default() -> Self {
        Self { dimensions: None, normalize: true }
    }
}

impl PoolingParams {
    /// Checks `dimensions` against a model of `hidden` elements per vector.
    pub fn validate(&self, hidden: usize) -> Result<()> {
        match self.dimensions {
            Some(d) if d == 0 || d > hidden => Err(Error::invalid(format!(
                "dimensions must be between 1 and the model's embedding size {hidden}, got {d}"
            ))),
            _ => Ok(()),
        }
    }

    /// `pooled` (the model's hidden size) shaped as asked: truncated, then normalized (a zero
    /// vector stays zero).
    pub fn apply(&self, mut pooled: Vec<f32>) -> Vec<f32> {
        if let Some(d) = self.dimensions {
            pooled.truncate(d);
        }
        if self.normalize {
            let norm = pooled.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>().sqrt();
            if norm > 0.0 {
                pooled.iter_mut().for_each(|v| *v = (f64::from(*v) / norm) as f32);
            }
        }
        pooled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncates_then_normalizes() {
        let p = PoolingParams { dimensions: Some(2), normalize: true };
        assert_eq!(p.apply(vec![3.0, 4.0, 100.0]), vec![0.6, 0.8]);
        assert_eq!(PoolingParams { normalize: false, ..p.clone() }.apply(vec![3.0, 4.0, 1.0]), vec![3.0, 4.0]);
        assert_eq!(PoolingParams::default().apply(vec![0.0, 0.0]), vec![0.0, 0.0]);
        let e = p.validate(1).unwrap_err().to_string();
        assert_eq!(e, "dimensions must be between 1 and the model's embedding size 1, got 2");
        assert!(PoolingParams { dimensions: Some(0), normalize: true }.validate(8).is_err());
        p.validate(2).unwrap();
    }
}
