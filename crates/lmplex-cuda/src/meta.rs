//! The host-side description of one forward batch in the layout the kernels read, padded to
//! whole GEMM tiles, packed into one buffer for a single upload.
//!
//! Per token row (padded to `padded`, a multiple of `GEMM_ROWS`): `ids` (u32), `positions` (i64),
//! `slots` (i64; slot = block_table[pos / block_size] * block_size + pos % block_size, -1 for
//! padding, so padding writes no KV), `row_seq` (u32, the row's sequence) and `row_ctx` (u32,
//! positions the row attends to: pos + 1, causal; 0 for padding, so padding attends to nothing
//! and its output is 0). Per sequence: its block table, padded with 0 to `max_blocks`. Per
//! logits row (padded to a whole tile): the token row it comes from.
//!
//! Invariant: the values of a real row depend only on its own sequence, never on the batch's
//! other sequences or its padding.

use crate::gpu::GEMM_ROWS;
use lmplex_model::{ForwardBatch, LogitsSelect};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchMeta {
    pub num_tokens: usize,
    pub padded: usize,
    pub ids: Vec<u32>,
    pub positions: Vec<i64>,
    pub slots: Vec<i64>,
    pub row_seq: Vec<u32>,
    pub row_ctx: Vec<u32>,
    pub max_blocks: usize,
    pub block_tables: Vec<u32>,
    pub num_logit_rows: usize,
    pub logit_rows: Vec<u32>,
    pub max_ctx: usize,
}

fn pad(n: usize) -> usize {
    n.div_ceil(GEMM_ROWS).max(1) * GEMM_ROWS
}

/// Byte offsets of each part in the packed buffer (8-byte aligned).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Offsets {
    pub ids: usize,
    pub positions: usize,
    pub slots: usize,
    pub row_seq: usize,
    pub row_ctx: usize,
    pub block_tables: usize,
    pub logit_rows: usize,
}

impl BatchMeta {
    pub fn new(batch: &ForwardBatch, block_size: usize) -> Self {
        let n = batch.num_tokens();
        let padded = pad(n);
        let max_blocks = batch.seqs.iter().map(|s| s.end_pos().div_ceil(block_size)).max().unwrap_or(1).max(1);
        let mut m = Self {
            num_tokens: n,
            padded,
            ids: Vec::with_capacity(padded),
            positions: Vec::with_capacity(padded),
            slots: Vec::with_capacity(padded),
            row_seq: Vec::with_capacity(padded),
            row_ctx: Vec::with_capacity(padded),
            max_blocks,
            block_tables: vec![0; batch.seqs.len() * max_blocks],
            num_logit_rows: 0,
            logit_rows: Vec::new(),
            max_ctx: 0,
        };
        let mut row = 0u32;
        for (si, s) in batch.seqs.iter().enumerate() {
            let need = s.end_pos().div_ceil(block_size);
            m.block_tables[si * max_blocks..si * max_blocks + need].copy_from_slice(&s.block_table[..need]);
            for (j, &id) in s.token_ids.iter().enumerate() {
                let pos = s.start_pos + j;
                m.ids.push(id);
                m.positions.push(pos as i64);
                m.slots.push((s.block_table[pos / block_size] as usize * block_size + pos % block_size) as i64);
                m.row_seq.push(si as u32);
                m.row_ctx.push(pos as u32 + 1);
            }
            let len = s.token_ids.len() as u32;
            match s.logits {
                LogitsSelect::None => {}
                LogitsSelect::Last => m.logit_rows.push(row + len - 1),
                LogitsSelect::All => m.logit_rows.extend(row..row + len),
            }
            row += len;
            m.max_ctx = m.max_ctx.max(s.end_pos());
        }
        m.ids.resize(padded, 0);
        m.positions.resize(padded, 0);
        m.slots.resize(padded, -1);
        m.row_seq.resize(padded, 0);
        m.row_ctx.resize(padded, 0);
        m.num_logit_rows = m.logit_rows.len();
        m.logit_rows.resize(pad(m.num_logit_rows), 0);
        m
    }

    /// The packed bytes and where each part starts.
    pub fn pack(&self) -> (Vec<u8>, Offsets) {
        let mut out = Vec::new();
        let mut part = |bytes: Vec<u8>| {
            out.resize(out.len().next_multiple_of(8), 0);
            let at = out.len();
            out.extend(bytes);
            at
        };
        let u32s = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let i64s = |v: &[i64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let o = Offsets {
            ids: part(u32s(&self.ids)),
            positions: part(i64s(&self.positions)),
            slots: part(i64s(&self.slots)),
            row_seq: part(u32s(&self.row_seq)),
            row_ctx: part(u32s(&self.row_ctx)),
            block_tables: part(u32s(&self.block_tables)),
            logit_rows: part(u32s(&self.logit_rows)),
        };
        (out, o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmplex_model::SeqChunk;

    #[test]
    fn rows_slots_and_logit_rows_follow_the_block_tables_and_padding_is_inert() {
        // Sequence 0: a 3-token prefill chunk at positions 14..17 over blocks [7, 2];
        // sequence 1: one decode token at position 0 in block 5.
        let (a, b) = ([11u32, 12, 13], [21u32]);
        let batch = ForwardBatch {
            seqs: vec![
                SeqChunk {
                    token_ids: &a,
                    start_pos: 14,
                    block_table: &[7, 2, 9],
                    logits: LogitsSelect::Last,
                    num_prompt_tokens: usize::MAX,
                },
                SeqChunk {
                    token_ids: &b,
                    start_pos: 0,
                    block_table: &[5],
                    logits: LogitsSelect::All,
                    num_prompt_tokens: usize::MAX,
                },
            ],
        };
        let m = BatchMeta::new(&batch, 16);
        assert_eq!((m.num_tokens, m.padded, m.max_blocks, m.max_ctx), (4, GEMM_ROWS, 2, 17));
        assert_eq!(&m.ids[..5], &[11, 12, 13, 21, 0]);
        assert_eq!(&m.positions[..4], &[14, 15, 16, 0]);
        assert_eq!(&m.slots[..5], &[7 * 16 + 14, 7 * 16 + 15, 2 * 16, 5 * 16, -1]);
        assert_eq!(&m.row_seq[..4], &[0, 0, 0, 1]);
        assert_eq!(&m.row_ctx[..5], &[15, 16, 17, 1, 0]);
        assert_eq!(m.block_tables, vec![7, 2, 5, 0]);
        assert_eq!(m.num_logit_rows, 2);
        assert_eq!(&m.logit_rows[..2], &[2, 3]);
        assert_eq!(m.logit_rows.len(), GEMM_ROWS);
        let (bytes, o) = m.pack();
        let at = |off: usize| u32::from_le_bytes(bytes[off..off + 4].try_into().unwrap());
        assert_eq!((at(o.ids), at(o.row_ctx + 8), at(o.block_tables + 4), at(o.logit_rows + 4)), (11, 17, 2, 3));
        assert!([o.positions, o.slots, o.row_seq, o.block_tables, o.logit_rows].iter().all(|x| x % 8 == 0));
        assert_eq!(i64::from_le_bytes(bytes[o.slots + 32..o.slots + 40].try_into().unwrap()), -1);
    }
}
