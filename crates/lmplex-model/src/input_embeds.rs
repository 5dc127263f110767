//! Rows that stand in for the token embedding at chosen positions of a sequence: an image's
//! features at its placeholder tokens, in a vision-language model.
//!
//! Invariants: positions strictly increase and each has one `hidden`-wide row. In every chunk
//! that computes one of those positions, its row replaces the token's embedding (after any
//! embedding scale, as transformers splices image features into `inputs_embeds`), so chunked
//! prefill, batching and preemption give the same bits as one pass over the whole prompt.

use lmplex_core::{Error, Result};

/// A sequence's replacement rows, by position (`SeqChunk::embeds`).
#[derive(Debug, Clone, PartialEq)]
pub struct InputEmbeds {
    positions: Vec<usize>,
    rows: Vec<f32>,
    hidden: usize,
}

impl InputEmbeds {
    /// `rows` `[positions.len(), hidden]`, row `i` at `positions[i]` (strictly increasing).
    pub fn new(positions: Vec<usize>, rows: Vec<f32>, hidden: usize) -> Result<Self> {
        if hidden == 0 || rows.len() != positions.len() * hidden {
            return Err(Error::invalid(format!(
                "{} embedding values for {} positions of width {hidden}",
                rows.len(),
                positions.len()
            )));
        }
        if positions.windows(2).any(|w| w[0] >= w[1]) {
            return Err(Error::invalid("embedding positions must strictly increase"));
        }
        Ok(Self { positions, rows, hidden })
    }

    /// The rows of `rows` `[n, hidden]` at the `n` positions of `token_ids` that hold
    /// `placeholder`, in order: image features spliced at an image's placeholder tokens. The
    /// counts must agree.
    pub fn at_placeholders(token_ids: &[u32], placeholder: u32, rows: Vec<f32>, hidden: usize) -> Result<Self> {
        let positions: Vec<usize> = (0..token_ids.len()).filter(|&p| token_ids[p] == placeholder).collect();
        if hidden == 0 || rows.len() != positions.len() * hidden {
            return Err(Error::invalid(format!(
                "the prompt has {} image placeholder tokens (id {placeholder}) but the images give {} feature rows",
                positions.len(),
                rows.len() / hidden.max(1)
            )));
        }
        Self::new(positions, rows, hidden)
    }

    /// Width of each row.
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// Number of positions replaced.
    pub fn len(&self) -> usize {
        self.positions.len()
    }

    /// Whether no position is replaced.
    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    /// Bytes the rows take.
    pub fn size_in_bytes(&self) -> usize {
        self.rows.len() * 4 + self.positions.len() * size_of::<usize>()
    }

    /// The rows at positions in `start..end`, with their positions, in order.
    pub fn rows_between(&self, start: usize, end: usize) -> impl Iterator<Item = (usize, &[f32])> {
        let from = self.positions.partition_point(|&p| p < start);
        let to = self.positions.partition_point(|&p| p < end);
        (from..to).map(move |i| (self.positions[i], &self.rows[i * self.hidden..(i + 1) * self.hidden]))
    }

    /// Writes each row at a position in `start..start + x.len() / hidden` into `x`, the token
    /// rows of a chunk that starts at `start`.
    pub fn splice(&self, x: &mut [f32], start: usize) {
        let h = self.hidden;
        for (pos, row) in self.rows_between(start, start + x.len() / h) {
            let r = pos - start;
            x[r * h..(r + 1) * h].copy_from_slice(row);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splices_only_the_chunks_positions() {
        let e = InputEmbeds::at_placeholders(&[5, 9, 9, 5, 9], 9, vec![1., 1., 2., 2., 3., 3.], 2).unwrap();
        assert_eq!(e.len(), 3);
        // A chunk over positions 2..4 holds one placeholder (position 2: the second row).
        let mut x = vec![0.0; 4];
        e.splice(&mut x, 2);
        assert_eq!(x, vec![2., 2., 0., 0.]);
        let all: Vec<usize> = e.rows_between(0, 5).map(|(p, _)| p).collect();
        assert_eq!(all, vec![1, 2, 4]);
    }

    #[test]
    fn counts_must_agree() {
        let e = InputEmbeds::at_placeholders(&[9, 9], 9, vec![0.0; 6], 2).unwrap_err();
        assert!(e.to_string().contains("2 image placeholder tokens (id 9) but the images give 3"), "{e}");
        assert!(InputEmbeds::new(vec![3, 1], vec![0.0; 4], 2).is_err());
    }
}
