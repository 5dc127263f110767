//! The host-side description of one forward batch in the layout the kernels read, padded to
//! whole GEMM tiles, packed into one buffer for a single upload.
//!
//! Per token row (padded to `padded`, a multiple of `GEMM_ROWS`): `ids` (u32), `positions` (i64),
//! `slots` (i64; slot = block_table[pos / block_size] * block_size + pos % block_size, -1 for
//! padding, so padding writes no KV), `row_seq` (u32, the row's sequence) and `row_ctx` (u32,
//! positions the row attends to: pos + 1, causal; 0 for padding, so padding attends to nothing
//! and its output is 0). Per sequence: its block table, padded with 0 to `max_blocks`. Per
//! logits row (padded to a whole tile): the token row it comes from. The attention tiles
//! (`tiles`, u32 pairs `(first row, rows)`): each sequence's rows cut at its ends and at every
//! multiple of `TILE_ROWS`, so a run of rows starting at such a multiple holds whole tiles (a
//! decode row is a tile of one).
//!
//! A pure decode step may instead be laid out for a captured CUDA graph ([`BatchMeta::for_graph`]):
//! the same rows, with block tables padded to every padded row at a power-of-two stride and the
//! row-wise kernels run over a power-of-two number of rows, so the buffer's layout and the
//! launches depend only on [`GraphKey`].
//!
//! Invariant: the values of a real row depend only on its own sequence, never on the batch's
//! other sequences or its padding; the graph layout changes no real row's values (the extra
//! rows attend to nothing and the extra attention partitions start past every row's context).

use crate::gpu::GEMM_ROWS;
use crate::kernels::paged_attention::TILE_ROWS;
use lmplex_model::sample::draw::DrawParams;
use lmplex_model::sample::pick::Pick;
use lmplex_model::{ForwardBatch, LogitsSelect};

/// Most sequences a captured decode step holds.
pub const GRAPH_MAX_SEQS: usize = 256;

/// What a captured decode step is replayed for: its padded rows and its block-table stride.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphKey {
    /// `BatchMeta::rows`.
    pub rows: usize,
    pub padded: usize,
    pub max_blocks: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchMeta {
    pub num_tokens: usize,
    /// Rows the row-wise kernels and attention run over: `num_tokens`, or in the graph layout
    /// `num_tokens` rounded up to a power of two (at most `GEMM_ROWS`) or to whole tiles.
    pub rows: usize,
    pub padded: usize,
    pub ids: Vec<u32>,
    pub positions: Vec<i64>,
    pub slots: Vec<i64>,
    pub row_seq: Vec<u32>,
    pub row_ctx: Vec<u32>,
    pub max_blocks: usize,
    pub block_tables: Vec<u32>,
    pub num_logit_rows: usize,
    /// Rows a quantized head multiplies: `num_logit_rows`, or `rows` in the graph layout (a
    /// graph's shape must not depend on how many of its rows are real).
    pub head_rows: usize,
    pub logit_rows: Vec<u32>,
    pub max_ctx: usize,
    /// Attention tiles as `(first row, rows)` pairs (the module header); in the graph layout one
    /// per padded row, so the layout depends only on the key.
    pub tiles: Vec<u32>,
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
    pub tiles: usize,
}

impl BatchMeta {
    pub fn new(batch: &ForwardBatch, block_size: usize) -> Self {
        let n = batch.num_tokens();
        let padded = pad(n);
        let max_blocks = batch.seqs.iter().map(|s| s.end_pos().div_ceil(block_size)).max().unwrap_or(1).max(1);
        let mut m = Self {
            num_tokens: n,
            rows: n,
            padded,
            ids: Vec::with_capacity(padded),
            positions: Vec::with_capacity(padded),
            slots: Vec::with_capacity(padded),
            row_seq: Vec::with_capacity(padded),
            row_ctx: Vec::with_capacity(padded),
            max_blocks,
            block_tables: vec![0; batch.seqs.len() * max_blocks],
            num_logit_rows: 0,
            head_rows: 0,
            logit_rows: Vec::new(),
            max_ctx: 0,
            tiles: Vec::new(),
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
            let mut first = row;
            while first < row + len {
                let end = (row + len).min((first / TILE_ROWS as u32 + 1) * TILE_ROWS as u32);
                m.tiles.extend([first, end - first]);
                first = end;
            }
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
        m.head_rows = m.num_logit_rows;
        m.logit_rows.resize(pad(m.num_logit_rows), 0);
        m
    }

    /// A pure decode step (each sequence one token and its logits, at most `GRAPH_MAX_SEQS`)
    /// in the graph layout, with its key; `None` for any other batch.
    pub fn for_graph(batch: &ForwardBatch, block_size: usize) -> Option<(Self, GraphKey)> {
        let decode = |s: &lmplex_model::SeqChunk| s.token_ids.len() == 1 && matches!(s.logits, LogitsSelect::Last);
        if batch.seqs.is_empty() || batch.seqs.len() > GRAPH_MAX_SEQS || !batch.seqs.iter().all(decode) {
            return None;
        }
        let mut m = Self::new(batch, block_size);
        let stride = m.max_blocks.next_power_of_two();
        let mut tables = vec![0; m.padded * stride];
        for (dst, src) in tables.chunks_exact_mut(stride).zip(m.block_tables.chunks_exact(m.max_blocks)) {
            dst[..m.max_blocks].copy_from_slice(src);
        }
        m.block_tables = tables;
        m.max_blocks = stride;
        m.tiles = (0..m.padded as u32).flat_map(|r| [r, 1]).collect();
        m.max_ctx = stride * block_size;
        m.rows = if m.num_tokens <= GEMM_ROWS { m.num_tokens.next_power_of_two() } else { m.padded };
        m.head_rows = m.rows;
        let key = GraphKey { rows: m.rows, padded: m.padded, max_blocks: stride };
        Some((m, key))
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
            tiles: part(u32s(&self.tiles)),
        };
        (out, o)
    }
}

/// Bytes `pack_draws` takes for `rows` rows, at most.
pub fn draws_bytes(rows: usize) -> usize {
    4 * (4 * rows).next_multiple_of(8) + 16 * rows
}

/// The rows' draw parameters as the sampling kernel reads them: temperature (f32), top_k (i32),
/// top_p, min_p (f32), seed, step (u64), one array each, 8-byte aligned; with each array's
/// offset.
pub fn pack_draws(draws: &[DrawParams]) -> (Vec<u8>, [usize; 6]) {
    let mut out: Vec<u8> = Vec::with_capacity(draws_bytes(draws.len()));
    let mut offsets = [0; 6];
    let parts: [Vec<u8>; 6] = [
        draws.iter().flat_map(|d| d.temperature.to_le_bytes()).collect(),
        draws.iter().flat_map(|d| (d.top_k.min(i32::MAX as usize) as i32).to_le_bytes()).collect(),
        draws.iter().flat_map(|d| d.top_p.to_le_bytes()).collect(),
        draws.iter().flat_map(|d| d.min_p.to_le_bytes()).collect(),
        draws.iter().flat_map(|d| d.seed.to_le_bytes()).collect(),
        draws.iter().flat_map(|d| d.step.to_le_bytes()).collect(),
    ];
    for (o, p) in offsets.iter_mut().zip(parts) {
        out.resize(out.len().next_multiple_of(8), 0);
        *o = out.len();
        out.extend(p);
    }
    (out, offsets)
}

/// The rows' logit edits as `logit_edits_f32` reads them: `row_start` (u32, one per row and one
/// past the last) at offset 0, then at the returned offset five words per edit (token, flags,
/// repetition, subtract, add; flags 1, 2, 4, 8 for repetition, subtract, add, forbid).
pub fn pack_edits(picks: &[Pick]) -> (Vec<u8>, usize) {
    let mut starts = vec![0u32];
    for p in picks {
        starts.push(starts[starts.len() - 1] + p.edits.len() as u32);
    }
    let mut out: Vec<u8> = starts.iter().flat_map(|x| x.to_le_bytes()).collect();
    out.resize(out.len().next_multiple_of(8), 0);
    let at = out.len();
    for e in picks.iter().flat_map(|p| &p.edits) {
        let flags = e.repetition.is_some() as u32
            | (e.subtract.is_some() as u32) << 1
            | (e.add.is_some() as u32) << 2
            | (e.forbid as u32) << 3;
        let bits = |v: Option<f32>| v.unwrap_or(0.0).to_bits();
        for w in [e.token, flags, bits(e.repetition), bits(e.subtract), bits(e.add)] {
            out.extend(w.to_le_bytes());
        }
    }
    (out, at)
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
                    lora: None,
                    embeds: None,
                },
                SeqChunk {
                    token_ids: &b,
                    start_pos: 0,
                    block_table: &[5],
                    logits: LogitsSelect::All,
                    num_prompt_tokens: usize::MAX,
                    lora: None,
                    embeds: None,
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
        assert_eq!(m.tiles, vec![0, 3, 3, 1]);
        assert!(BatchMeta::for_graph(&batch, 16).is_none(), "a prefill chunk is not a decode step");
    }

    #[test]
    fn the_graph_layout_depends_only_on_its_key_and_keeps_every_real_value() {
        let ids = [[5u32], [6], [7]];
        let tables: [&[u32]; 3] = [&[3, 4, 8], &[1], &[2, 6]];
        let starts = [40, 3, 20];
        let batch = |n: usize| ForwardBatch {
            seqs: (0..n)
                .map(|i| SeqChunk {
                    token_ids: &ids[i],
                    start_pos: starts[i],
                    block_table: tables[i],
                    logits: LogitsSelect::Last,
                    num_prompt_tokens: usize::MAX,
                    lora: None,
                    embeds: None,
                })
                .collect(),
        };
        let (full, exact) = (batch(3), BatchMeta::new(&batch(3), 16));
        let (g, key) = BatchMeta::for_graph(&full, 16).unwrap();
        assert_eq!(key, GraphKey { rows: 4, padded: GEMM_ROWS, max_blocks: 4 });
        assert_eq!((g.rows, g.max_ctx, g.num_logit_rows), (4, 64, 3));
        assert_eq!(
            (&g.ids, &g.positions, &g.slots, &g.row_ctx),
            (&exact.ids, &exact.positions, &exact.slots, &exact.row_ctx)
        );
        assert_eq!(&g.block_tables[..12], &[3, 4, 8, 0, 1, 0, 0, 0, 2, 6, 0, 0]);
        assert_eq!(g.block_tables.len(), GEMM_ROWS * 4);
        assert_eq!((g.tiles.len(), &g.tiles[..6]), (2 * GEMM_ROWS, &[0, 1, 1, 1, 2, 1][..]), "a tile per row");
        // Two sequences: two rows, the same packed layout.
        let (g2, key2) = BatchMeta::for_graph(&batch(2), 16).unwrap();
        assert_eq!(key2, GraphKey { rows: 2, padded: GEMM_ROWS, max_blocks: 4 });
        let ((b1, o1), (b2, o2)) = (g.pack(), g2.pack());
        assert_eq!((b1.len(), o1), (b2.len(), o2));
    }

    #[test]
    fn tiles_cut_each_sequence_at_its_ends_and_at_multiples_of_tile_rows() {
        // 5 rows, then 13 (rows 5..18), then 1: cuts at 8 and 16 as well as at each sequence.
        let ids: [Vec<u32>; 3] = [vec![1; 5], vec![2; 13], vec![3]];
        let table: Vec<u32> = (0..4).collect();
        let batch = ForwardBatch {
            seqs: ids
                .iter()
                .map(|t| SeqChunk {
                    token_ids: t,
                    start_pos: 0,
                    block_table: &table,
                    logits: LogitsSelect::Last,
                    num_prompt_tokens: usize::MAX,
                    lora: None,
                    embeds: None,
                })
                .collect(),
        };
        let m = BatchMeta::new(&batch, 16);
        assert_eq!(m.tiles, vec![0, 5, 5, 3, 8, 8, 16, 2, 18, 1]);
        let (bytes, o) = m.pack();
        assert_eq!(u32::from_le_bytes(bytes[o.tiles + 12..o.tiles + 16].try_into().unwrap()), 3);
        assert!(8 * (5 * m.padded + m.logit_rows.len()) + 64 * 1024 >= bytes.len(), "the planned meta bytes");
    }
}
