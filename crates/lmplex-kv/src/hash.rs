//! Prefix hashing: block `i` of a token sequence is named by
//! `h_i = H(h_{i-1}, tokens[i*bs .. (i+1)*bs])`, with `h_{-1} = H(salt)`. Equal hashes mean an
//! equal salt and equal tokens from position 0 to the end of the block (up to a 2^-64 collision
//! chance per pair), so a cached block can stand in for recomputing that prefix.
//!
//! Invariants: only full blocks are hashed; the hash depends on nothing but the salt and the
//! tokens (SipHash with fixed keys, `DefaultHasher::new`; hashes never leave the process, so
//! they need not be stable across Rust releases);
//! requests of different tenants (different salts) never share a hash, so one tenant cannot
//! learn from its hit counters whether another sent a prompt.

use lmplex_core::TokenId;
use std::hash::{DefaultHasher, Hasher};

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

/// Hashes of every full block of `tokens`, extending `hashes` (already computed for a prefix).
pub fn extend_block_hashes(hashes: &mut Vec<BlockHash>, tokens: &[TokenId], block_size: usize, salt: Option<&str>) {
    let full = tokens.len() / block_size;
    while hashes.len() < full {
        let i = hashes.len();
        let parent = hashes.last().copied().unwrap_or_else(|| root_hash(salt));
        hashes.push(hash_block_tokens(parent, &tokens[i * block_size..(i + 1) * block_size]));
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
        extend_block_hashes(&mut ha, &a, 4, None);
        extend_block_hashes(&mut hb, &b, 4, None);
        extend_block_hashes(&mut hs, &a, 4, Some("tenant-1"));
        assert_eq!(ha.len(), 2);
        // Block 1 has equal tokens but a different prefix: a different hash.
        assert_ne!(ha[1], hb[1]);
        assert_ne!(ha[0], hs[0]);
        let mut again = Vec::new();
        extend_block_hashes(&mut again, &a[..6], 4, None);
        assert_eq!(again, ha[..1]);
        extend_block_hashes(&mut again, &a, 4, None);
        assert_eq!(again, ha);
    }
}
