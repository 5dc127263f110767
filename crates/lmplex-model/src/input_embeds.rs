//! Rows that stand in for the token embedding at chosen positions of a sequence: an image's
//! features at its placeholder tokens, in a vision-language model.
//!
//! Invariants: positions strictly increase and each has one `hidden`-wide row. In every chunk
//! that computes one of those positions, its row replaces the token's embedding (after any
//! embedding scale, as transformers splices image features into `inputs_embeds`), so chunked
//! prefill, batching and preemption give the same bits as one pass over the whole prompt.
//!
//! Bidirectional blocks (Gemma 3's images, `bidirectional`): each maximal run of consecutive
//! positions is one block, and a row in a block attends to every key up to the block's end
//! (`context_len`), as transformers' `token_type_ids` mask does; every other row stays causal.
//! A chunk must therefore hold the rest of any block it enters (`splits`): the scheduler ends
//! chunks at block boundaries, and the model refuses a chunk that does not.
//!
//! Multimodal rope (Qwen2-VL's M-RoPE, `with_mrope`): each position's temporal, height and
//! width rope positions (`rope_position`), as transformers' `get_rope_index` gives them: text
//! tokens count on from the last position, an image's tokens take its grid's row and column
//! offsets from there, and the text after an image goes on from the largest of those plus one;
//! past the prompt every position goes on from the prompt's last, one a token (`rope_deltas`).

use lmplex_core::{Error, Result};
use std::ops::Range;

/// A sequence's replacement rows, by position (`SeqChunk::embeds`).
#[derive(Debug, Clone, PartialEq)]
pub struct InputEmbeds {
    positions: Vec<usize>,
    rows: Vec<f32>,
    hidden: usize,
    /// With bidirectional blocks: per position, the end of its block (exclusive); else empty.
    block_end: Vec<usize>,
    /// With M-RoPE: the prompt's rope positions, and the first position after the prompt.
    mrope: Option<(Vec<[u32; 3]>, usize)>,
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
        Ok(Self { positions, rows, hidden, block_end: Vec::new(), mrope: None })
    }

    /// The same rows, each run of consecutive positions one bidirectional block (the module's
    /// docs).
    pub fn bidirectional(mut self) -> Self {
        let mut end = vec![0; self.positions.len()];
        for i in (0..self.positions.len()).rev() {
            let next = self.positions.get(i + 1).filter(|&&n| n == self.positions[i] + 1);
            end[i] = next.map_or(self.positions[i] + 1, |_| end[i + 1]);
        }
        self.block_end = end;
        self
    }

    /// The keys row `pos` attends to are `0..context_len(pos)`: its block's end for a row in a
    /// bidirectional block, else `pos + 1`.
    pub fn context_len(&self, pos: usize) -> usize {
        match self.positions.binary_search(&pos) {
            Ok(i) if !self.block_end.is_empty() => self.block_end[i],
            _ => pos + 1,
        }
    }

    /// The bidirectional blocks, in order (none unless `bidirectional`).
    pub fn blocks(&self) -> Vec<Range<usize>> {
        if self.block_end.is_empty() {
            return Vec::new();
        }
        self.runs()
    }

    /// The runs of consecutive positions (an image's tokens), in order.
    fn runs(&self) -> Vec<Range<usize>> {
        let mut out: Vec<Range<usize>> = Vec::new();
        for &p in &self.positions {
            match out.last_mut() {
                Some(r) if r.end == p => r.end += 1,
                _ => out.push(p..p + 1),
            }
        }
        out
    }

    /// The same rows with M-RoPE positions (the module's docs) for a prompt of `prompt_len`
    /// tokens whose runs of positions are images of `grids` (temporal, height, width in merged
    /// tokens), in order. A run whose length is not its grid's, a count of runs that is not the
    /// grids', or a temporal size other than 1 (video) is `InvalidRequest`.
    pub fn with_mrope(mut self, prompt_len: usize, grids: &[[usize; 3]]) -> Result<Self> {
        let runs = self.runs();
        if runs.len() != grids.len() || runs.last().is_some_and(|r| r.end > prompt_len) {
            return Err(Error::invalid(format!("{} runs of image tokens for {} image grids", runs.len(), grids.len())));
        }
        let (mut out, mut cur, mut p) = (Vec::with_capacity(prompt_len), 0usize, 0usize);
        // Text tokens `p..end`: one position each, all three equal.
        let text = |out: &mut Vec<[u32; 3]>, cur: &mut usize, n: usize| {
            out.extend((0..n).map(|i| [(*cur + i) as u32; 3]));
            *cur += n;
        };
        for (run, &[t, h, w]) in runs.iter().zip(grids) {
            if t != 1 || run.len() != h * w {
                return Err(Error::invalid(format!("{} image tokens for a grid of {t}x{h}x{w}", run.len())));
            }
            text(&mut out, &mut cur, run.start - p);
            out.extend((0..h * w).map(|i| [cur as u32, (cur + i / w) as u32, (cur + i % w) as u32]));
            cur += h.max(w);
            p = run.end;
        }
        text(&mut out, &mut cur, prompt_len - p);
        self.mrope = Some((out, cur));
        Ok(self)
    }

    /// The rope position of `pos` (temporal, height, width): its M-RoPE position
    /// (`with_mrope`), else `pos` for all three.
    pub fn rope_position(&self, pos: usize) -> [usize; 3] {
        match &self.mrope {
            Some((prompt, _)) if pos < prompt.len() => prompt[pos].map(|x| x as usize),
            Some((prompt, next)) => [next + pos - prompt.len(); 3],
            None => [pos; 3],
        }
    }

    /// Whether a chunk ending at `end` (exclusive) stops inside a bidirectional block: its last
    /// rows would attend to keys not yet computed.
    pub fn splits(&self, end: usize) -> bool {
        end > 0 && self.context_len(end - 1) > end
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
    fn bidirectional_blocks_are_runs_of_positions() {
        let ids = [1, 9, 9, 9, 2, 9, 9, 3];
        let e = InputEmbeds::at_placeholders(&ids, 9, vec![0.0; 10], 2).unwrap();
        assert_eq!((0..8).map(|p| e.context_len(p)).collect::<Vec<_>>(), [1, 2, 3, 4, 5, 6, 7, 8]);
        assert!(e.blocks().is_empty() && !e.splits(2));
        let e = e.bidirectional();
        assert_eq!((0..8).map(|p| e.context_len(p)).collect::<Vec<_>>(), [1, 4, 4, 4, 5, 7, 7, 8]);
        assert_eq!(e.blocks(), [1..4, 5..7]);
        let splits: Vec<usize> = (0..=8).filter(|&end| e.splits(end)).collect();
        assert_eq!(splits, [2, 3, 6]);
    }

    /// transformers' `get_rope_index` for text, a 2x3 image, text, a 1x2 image: positions
    /// computed by hand from its rules.
    #[test]
    fn mrope_positions_follow_get_rope_index() {
        let ids = [1, 2, 9, 9, 9, 9, 9, 9, 3, 9, 9, 4];
        let e = InputEmbeds::at_placeholders(&ids, 9, vec![0.0; 8], 1).unwrap().with_mrope(12, &[[1, 2, 3], [1, 1, 2]]);
        let e = e.unwrap();
        let got: Vec<[usize; 3]> = (0..14).map(|p| e.rope_position(p)).collect();
        let want = [
            [0, 0, 0],
            [1, 1, 1],
            [2, 2, 2],
            [2, 2, 3],
            [2, 2, 4],
            [2, 3, 2],
            [2, 3, 3],
            [2, 3, 4],
            [5, 5, 5], // 2 + max(2, 3)
            [6, 6, 6],
            [6, 6, 7],
            [8, 8, 8], // 6 + max(1, 2)
            [9, 9, 9], // decoding goes on
            [10, 10, 10],
        ];
        assert_eq!(got, want);
        let plain = InputEmbeds::at_placeholders(&ids, 9, vec![0.0; 8], 1).unwrap();
        assert_eq!(plain.rope_position(7), [7, 7, 7]);
        assert!(plain.clone().with_mrope(12, &[[1, 2, 3]]).is_err());
        assert!(plain.clone().with_mrope(12, &[[1, 2, 2], [1, 1, 2]]).is_err());
        assert!(plain.with_mrope(12, &[[2, 1, 3], [1, 1, 2]]).is_err());
    }

    #[test]
    fn counts_must_agree() {
        let e = InputEmbeds::at_placeholders(&[9, 9], 9, vec![0.0; 6], 2).unwrap_err();
        assert!(e.to_string().contains("2 image placeholder tokens (id 9) but the images give 3"), "{e}");
        assert!(InputEmbeds::new(vec![3, 1], vec![0.0; 4], 2).is_err());
    }
}
