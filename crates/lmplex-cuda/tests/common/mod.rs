//! Helpers of the forward-pass tests: token ids that cover the tiny vocabulary, and a chunk of a
//! sequence scored by the model.

use lmplex_model::testing::VOCAB;
use lmplex_model::{LogitsSelect, SeqChunk};

/// `n` token ids spread over the tiny vocabulary, different for each `salt`.
pub fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + salt * 11 + 5) % VOCAB as u32).collect()
}

/// `ids` at `start_pos` of the sequence in `block_table` (every token a prompt token), no adapter.
pub fn chunk<'a>(ids: &'a [u32], start_pos: usize, block_table: &'a [u32], logits: LogitsSelect) -> SeqChunk<'a> {
    SeqChunk { token_ids: ids, start_pos, block_table, logits, num_prompt_tokens: usize::MAX, lora: None, embeds: None }
}
