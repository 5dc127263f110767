//! `BlockPool`: the KV blocks of one model, their reference counts, the free queue and the
//! prefix cache (full-block hash -> block).
//!
//! Invariants:
//! - every block is either *in use* (`ref_cnt > 0`, not in the free queue) or *free*
//!   (`ref_cnt == 0`, in the free queue exactly once); `num_free() + in-use blocks == num_blocks`;
//! - a free block may still hold a cached prefix (its hash stays in `cached`) until it is
//!   handed out again: blocks are only truly evicted when reallocated (mistral.rs, vLLM v1);
//! - `cached[h] == b` iff `blocks[b].hash == Some(h)`; one block per hash;
//! - the free queue is in eviction order: `allocate` takes from the front, `free` appends to
//!   the back, so the least recently freed block goes first, and a caller freeing a request's
//!   blocks tail-first makes its prefix outlive its suffix.
//!
//! Cost: `allocate`, `free`, `touch` and cache lookups are O(1) per block (an intrusive
//! doubly linked list over block ids, and a hash map).

use crate::hash::BlockHash;
use lmplex_core::{Error, Result};
use std::collections::HashMap;

/// Index of a KV block in its pool, `0..num_blocks`; it also indexes the runner's KV cache.
pub type BlockId = u32;

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Meta {
    ref_cnt: u32,
    hash: Option<BlockHash>,
    prev: u32,
    next: u32,
    in_free: bool,
}

/// The KV blocks of one model (or one warm tier): reference counts, the free queue in eviction
/// order, the prefix cache.
#[derive(Debug)]
pub struct BlockPool {
    blocks: Vec<Meta>,
    head: u32,
    tail: u32,
    num_free: usize,
    cached: HashMap<BlockHash, BlockId>,
    enable_caching: bool,
    /// Bumped whenever `cached` changes (for readers that copy the cached set).
    generation: u64,
}

impl BlockPool {
    /// `num_blocks` free blocks, queued by ascending id; `enable_caching` turns on the prefix cache.
    pub fn new(num_blocks: usize, enable_caching: bool) -> Self {
        assert!(num_blocks < NIL as usize, "too many blocks");
        let mut pool = Self {
            blocks: vec![Meta { ref_cnt: 0, hash: None, prev: NIL, next: NIL, in_free: false }; num_blocks],
            head: NIL,
            tail: NIL,
            num_free: 0,
            cached: HashMap::new(),
            enable_caching,
            generation: 0,
        };
        for b in 0..num_blocks as u32 {
            pool.push_back(b);
        }
        pool
    }

    /// Blocks in the pool, in use or free.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }
    /// Blocks with no user (some may hold a cached prefix).
    pub fn num_free(&self) -> usize {
        self.num_free
    }
    /// Blocks that hold a cached prefix (in use or free).
    pub fn num_cached(&self) -> usize {
        self.cached.len()
    }
    /// Free blocks that still hold a cached prefix.
    pub fn num_cached_free(&self) -> usize {
        self.cached.values().filter(|&&b| self.blocks[b as usize].ref_cnt == 0).count()
    }
    /// The hashes the prefix cache holds (blocks in use or free), in no order.
    pub fn cached_hashes(&self) -> impl Iterator<Item = BlockHash> + '_ {
        self.cached.keys().copied()
    }
    /// A number that changes whenever the set of `cached_hashes` does.
    pub fn cache_generation(&self) -> u64 {
        self.generation
    }
    /// Users (requests) of block `b`; 0 when free.
    pub fn ref_cnt(&self, b: BlockId) -> u32 {
        self.blocks[b as usize].ref_cnt
    }
    /// The full-block hash `b` is cached under, if any (kept while free until it is reallocated).
    pub fn block_hash(&self, b: BlockId) -> Option<BlockHash> {
        self.blocks[b as usize].hash
    }
    /// Whether full blocks are recorded in the prefix cache.
    pub fn caching_enabled(&self) -> bool {
        self.enable_caching
    }

    fn push_back(&mut self, b: u32) {
        let m = &mut self.blocks[b as usize];
        debug_assert!(!m.in_free);
        m.in_free = true;
        m.prev = self.tail;
        m.next = NIL;
        if self.tail == NIL {
            self.head = b;
        } else {
            self.blocks[self.tail as usize].next = b;
        }
        self.tail = b;
        self.num_free += 1;
    }

    fn unlink(&mut self, b: u32) {
        let (prev, next) = {
            let m = &mut self.blocks[b as usize];
            debug_assert!(m.in_free);
            m.in_free = false;
            (std::mem::replace(&mut m.prev, NIL), std::mem::replace(&mut m.next, NIL))
        };
        if prev == NIL {
            self.head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        self.num_free -= 1;
    }

    /// The block that holds prefix `h`, if cached (in use or free).
    pub fn get_cached(&self, h: BlockHash) -> Option<BlockId> {
        self.cached.get(&h).copied()
    }

    /// Takes `n` free blocks (evicting their cached prefixes), each with `ref_cnt == 1`; an
    /// error, and no change, when fewer than `n` are free.
    pub fn allocate(&mut self, n: usize) -> Result<Vec<BlockId>> {
        if n > self.num_free {
            return Err(Error::capacity(format!("{n} KV blocks needed, {} free", self.num_free)));
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let b = self.head;
            self.unlink(b);
            let m = &mut self.blocks[b as usize];
            if let Some(h) = m.hash.take() {
                self.cached.remove(&h);
                self.generation += 1;
            }
            m.ref_cnt = 1;
            out.push(b);
        }
        Ok(out)
    }

    /// One more user for each of `blocks` (a prefix-cache hit): free ones leave the free queue.
    pub fn touch(&mut self, blocks: &[BlockId]) {
        for &b in blocks {
            if self.blocks[b as usize].ref_cnt == 0 {
                self.unlink(b);
            }
            self.blocks[b as usize].ref_cnt += 1;
        }
    }

    /// One user fewer for each of `blocks`, in order; a block whose count reaches zero joins
    /// the back of the free queue (keeping its cached prefix). Freeing a free block is an
    /// internal error and changes nothing.
    pub fn free(&mut self, blocks: &[BlockId]) -> Result<()> {
        let mut drops: HashMap<BlockId, u32> = HashMap::with_capacity(blocks.len());
        for &b in blocks {
            let n = drops.entry(b).or_default();
            *n += 1;
            if self.blocks.get(b as usize).is_none_or(|m| m.ref_cnt < *n) {
                return Err(Error::internal(format!("block {b} freed more often than it is used")));
            }
        }
        for &b in blocks {
            let m = &mut self.blocks[b as usize];
            m.ref_cnt -= 1;
            if m.ref_cnt == 0 {
                self.push_back(b);
            }
        }
        Ok(())
    }

    /// Records that in-use block `b` now holds the full block named `h`. If another block
    /// already holds `h`, `b` stays uncached (the first copy wins).
    pub fn cache_block(&mut self, b: BlockId, h: BlockHash) {
        if !self.enable_caching || self.cached.contains_key(&h) || self.blocks[b as usize].hash.is_some() {
            return;
        }
        self.blocks[b as usize].hash = Some(h);
        self.cached.insert(h, b);
        self.generation += 1;
    }

    /// Drops every cached prefix (e.g. after weights change); fails if a block is in use.
    pub fn reset_prefix_cache(&mut self) -> bool {
        if self.num_free != self.blocks.len() {
            return false;
        }
        self.cached.clear();
        self.generation += 1;
        for m in &mut self.blocks {
            m.hash = None;
        }
        true
    }

    /// Checks every invariant in the module header (tests and debug builds).
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let mut seen = vec![false; self.blocks.len()];
        let (mut b, mut prev, mut n) = (self.head, NIL, 0usize);
        while b != NIL {
            let m = &self.blocks[b as usize];
            if seen[b as usize] {
                return Err(format!("block {b} twice in the free queue"));
            }
            seen[b as usize] = true;
            if !m.in_free || m.ref_cnt != 0 || m.prev != prev {
                return Err(format!("free block {b} inconsistent: {m:?}"));
            }
            prev = b;
            b = m.next;
            n += 1;
        }
        if prev != self.tail || n != self.num_free {
            return Err(format!("free queue length {n} vs num_free {}", self.num_free));
        }
        for (i, m) in self.blocks.iter().enumerate() {
            if m.in_free != seen[i] || (m.ref_cnt == 0) != m.in_free {
                return Err(format!("block {i}: in_free {} ref_cnt {}", m.in_free, m.ref_cnt));
            }
            if let Some(h) = m.hash {
                if self.cached.get(&h) != Some(&(i as u32)) {
                    return Err(format!("block {i} has a hash the cache does not map to it"));
                }
            }
        }
        if self.cached.iter().any(|(h, &b)| self.blocks[b as usize].hash != Some(*h)) {
            return Err("cache maps a hash to a block that does not hold it".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_order_and_eviction() {
        let mut p = BlockPool::new(4, true);
        let a = p.allocate(2).unwrap();
        assert_eq!(a, vec![0, 1]);
        p.cache_block(0, BlockHash(10));
        p.cache_block(1, BlockHash(11));
        // Freed tail-first: block 1 goes before block 0.
        p.free(&[a[1], a[0]]).unwrap();
        assert_eq!(p.num_free(), 4);
        assert_eq!(p.num_cached_free(), 2);
        // Uncached 2 and 3 go first, then 1 (evicting its hash), and 0 survives.
        let b = p.allocate(3).unwrap();
        assert_eq!(b, vec![2, 3, 1]);
        assert_eq!(p.get_cached(BlockHash(11)), None);
        assert_eq!(p.get_cached(BlockHash(10)), Some(0));
        // A hit takes the free cached block out of the queue.
        p.touch(&[0]);
        assert_eq!(p.num_free(), 0);
        assert!(p.allocate(1).is_err());
        p.check_invariants().unwrap();
        assert!(p.free(&[2, 2]).is_err(), "double free is an error");
        assert_eq!(p.ref_cnt(2), 1, "and changes nothing");
    }
}
