//! Prefix hashing: block `i` of a token sequence is named by
//! `h_i = H(h_{i-1}, tokens[i*bs .. (i+1)*bs], kind)`, with `h_{-1} = H(salt)`. Equal hashes
//! mean an equal salt, equal tokens from position 0 to the end of the block and the same split
//! into prompt and generated tokens (up to a 2^-64 collision chance per pair), so a cached
//! block can stand in for recomputing that prefix.
//!
//! Why the kind: the CPU model computes prompt tokens and generated tokens with different
//! matmul kernels (equal to the last bits, not bit for bit), so a generated token's K/V are not
//! those a prompt holding the same token would compute. A block that holds generated tokens is
//! therefore found only by a sequence that generated them at the same place (the same request
//! recomputed after preemption, or one with the same prompt and output); a new prompt that
//! repeats an earlier reply recomputes it, and keeps results independent of what was cached.
//!
//! Invariants: only full blocks are hashed; the hash depends on nothing but the salt, the
//! tokens and how many of them are prompt tokens (SipHash with fixed keys,
//! `DefaultHasher::new`; hashes never leave the process, so they need not be stable across Rust
//! releases); a block made only of prompt tokens hashes as `hash_block_tokens`;
//! requests of different tenants (different salts) never share a hash, so one tenant cannot
//! learn from its hit counters whether another sent a prompt.

use lmplex_core::TokenId;
use std::hash::{DefaultHasher, Hasher};

/// A prefix-cache key: one full block's tokens hashed, chained to earlier blocks and the salt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u64);

/// The hash that precedes block 0 for `salt` (`None`: no tenant isolation).
pub fn root_hash(salt: Option<&str>) -> BlockHash {
    let mut h = DefaultHasher::new();
    h.write_u8(0xA5);
    if let Some(s) = salt {
        h.write_u8(1);
        h.write(s.as_bytes());
        h.write_usize(s.len());
    }
    BlockHash(h.finish())
}

/// The hash of one full block, chained to its parent's.
pub fn hash_block_tokens(parent: BlockHash, tokens: &[TokenId]) -> BlockHash {
    let mut h = DefaultHasher::new();
    h.write_u64(parent.0);
    h.write_usize(tokens.len());
    for &t in tokens {
        h.write_u32(t);
    }
    BlockHash(h.finish())
}

/// Hashes of every full block of `tokens`, extending `hashes` (already computed for a prefix);
/// tokens from `num_prompt_tokens` on were generated.
pub fn extend_block_hashes(
    hashes: &mut Vec<BlockHash>,
    tokens: &[TokenId],
    num_prompt_tokens: usize,
    block_size: usize,
    salt: Option<&str>,
) {
    let full = tokens.len() / block_size;
    while hashes.len() < full {
        let i = hashes.len();
        let parent = hashes.last().copied().unwrap_or_else(|| root_hash(salt));
        let mut h = hash_block_tokens(parent, &tokens[i * block_size..(i + 1) * block_size]);
        if (i + 1) * block_size > num_prompt_tokens {
            let mut g = DefaultHasher::new();
            g.write_u64(h.0);
            g.write_u8(0x6E);
            g.write_usize(num_prompt_tokens.saturating_sub(i * block_size));
            h = BlockHash(g.finish());
        }
        hashes.push(h);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_depends_on_prefix_and_salt() {
        let a: Vec<u32> = (0..8).collect();
        let mut b = a.clone();
        b[0] = 99;
        let (mut ha, mut hb, mut hs) = (Vec::new(), Vec::new(), Vec::new());
        extend_block_hashes(&mut ha, &a, usize::MAX, 4, None);
        extend_block_hashes(&mut hb, &b, usize::MAX, 4, None);
        extend_block_hashes(&mut hs, &a, usize::MAX, 4, Some("tenant-1"));
        assert_eq!(ha.len(), 2);
        // Block 1 has equal tokens but a different prefix: a different hash.
        assert_ne!(ha[1], hb[1]);
        assert_ne!(ha[0], hs[0]);
        let mut again = Vec::new();
        extend_block_hashes(&mut again, &a[..6], usize::MAX, 4, None);
        assert_eq!(again, ha[..1]);
        extend_block_hashes(&mut again, &a, usize::MAX, 4, None);
        assert_eq!(again, ha);
        // The same tokens with generated ones from position 6: block 0 is all prompt and keeps
        // its hash, block 1 (positions 4..8) holds generated tokens and does not.
        let mut gen = Vec::new();
        extend_block_hashes(&mut gen, &a, 6, 4, None);
        assert_eq!(gen[0], ha[0]);
        assert_ne!(gen[1], ha[1]);
        let mut gen5 = Vec::new();
        extend_block_hashes(&mut gen5, &a, 5, 4, None);
        assert_ne!(gen5[1], gen[1]);
    }
}
