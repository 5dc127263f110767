//! `KvCacheManager`: each request's block table on one `BlockPool`, with prefix caching.
//!
//! The scheduler's calls, in order, for one request (vLLM v1's `KVCacheManager` protocol):
//! 1. `get_computed_blocks(id, tokens, salt)`: the longest cached prefix of full blocks; at
//!    least one token is always left to compute (its logits are needed).
//! 2. `allocate_slots(id, num_computed_tokens, num_new_tokens, &hit_blocks)`: takes the hit
//!    blocks (reference +1) and enough fresh blocks for `num_computed_tokens + num_new_tokens`
//!    tokens, or returns `None` and changes nothing when the pool is short.
//! 3. after the forward pass, `cache_computed_blocks(id, tokens, num_computed_tokens)`: the
//!    full blocks whose K/V are now written become prefix-cache entries.
//! 4. `free(id)` when it finishes, is cancelled or is preempted.
//!
//! Invariants: a request's table covers exactly the blocks it holds a reference to; a block
//! is cached only after its K/V are written (so a hit never reads unwritten memory); `free`
//! returns blocks tail first, so a request's prefix stays cached longer than its suffix; every
//! block of every request returns to the pool once all requests are freed.

use crate::block_pool::{BlockId, BlockPool};
use crate::hash::{extend_block_hashes, BlockHash};
use lmplex_core::{Error, Result, TokenId};
use std::collections::HashMap;

pub type ReqId = u64;

/// Prefix-cache counters (vLLM's `PrefixCacheStats`): lookups and tokens asked for and found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    pub requests: u64,
    pub queries: u64,
    pub hits: u64,
}

#[derive(Debug, Default)]
struct ReqState {
    blocks: Vec<BlockId>,
    hashes: Vec<BlockHash>,
    salt: Option<String>,
    num_cached_blocks: usize,
}

#[derive(Debug)]
pub struct KvCacheManager {
    pool: BlockPool,
    block_size: usize,
    reqs: HashMap<ReqId, ReqState>,
    stats: PrefixCacheStats,
}

impl KvCacheManager {
    pub fn new(num_blocks: usize, block_size: usize, enable_prefix_caching: bool) -> Self {
        assert!(block_size > 0);
        Self {
            pool: BlockPool::new(num_blocks, enable_prefix_caching),
            block_size,
            reqs: HashMap::new(),
            stats: PrefixCacheStats::default(),
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }
    pub fn stats(&self) -> PrefixCacheStats {
        self.stats
    }
    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free()
    }
    /// Fraction of blocks in use, 0.0 to 1.0.
    pub fn usage(&self) -> f64 {
        1.0 - self.pool.num_free() as f64 / self.pool.num_blocks().max(1) as f64
    }
    /// The block table of `id` (empty if it holds none).
    pub fn block_table(&self, id: ReqId) -> &[BlockId] {
        self.reqs.get(&id).map_or(&[], |r| &r.blocks)
    }
    pub fn num_requests(&self) -> usize {
        self.reqs.len()
    }

    /// Blocks needed to hold `num_tokens` tokens.
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size)
    }

    /// The cached blocks that hold the longest prefix of `tokens` (full blocks only, leaving at
    /// least one token to compute), and the number of tokens they cover. Counts the lookup.
    pub fn get_computed_blocks(&mut self, id: ReqId, tokens: &[TokenId], salt: Option<&str>) -> (Vec<BlockId>, usize) {
        let st = self.reqs.entry(id).or_default();
        if st.hashes.is_empty() {
            st.salt = salt.map(str::to_string);
        }
        extend_block_hashes(&mut st.hashes, tokens, self.block_size, st.salt.as_deref());
        let mut hit = Vec::new();
        if self.pool.caching_enabled() {
            let max_blocks = tokens.len().saturating_sub(1) / self.block_size;
            for h in st.hashes.iter().take(max_blocks) {
                match self.pool.get_cached(*h) {
                    Some(b) => hit.push(b),
                    None => break,
                }
            }
            self.stats.requests += 1;
            self.stats.queries += tokens.len() as u64;
            self.stats.hits += (hit.len() * self.block_size) as u64;
        }
        let n = hit.len() * self.block_size;
        (hit, n)
    }

    /// Can `num_new_blocks` fresh blocks plus the prefix `hit` be taken now?
    pub fn can_allocate(&self, num_new_blocks: usize, hit: &[BlockId]) -> bool {
        let revived = hit.iter().filter(|&&b| self.pool.ref_cnt(b) == 0).count();
        num_new_blocks + revived <= self.pool.num_free()
    }

    /// Grows `id`'s table to hold `num_computed_tokens + num_new_tokens` tokens, first taking
    /// `hit` (from `get_computed_blocks`, only on the request's first allocation). Returns the
    /// new blocks, or `None` (nothing changed) when the pool cannot supply them.
    pub fn allocate_slots(
        &mut self,
        id: ReqId,
        num_computed_tokens: usize,
        num_new_tokens: usize,
        hit: &[BlockId],
    ) -> Result<Option<Vec<BlockId>>> {
        let st = self.reqs.entry(id).or_default();
        if !hit.is_empty() && !st.blocks.is_empty() {
            return Err(Error::internal(format!("request {id}: prefix hit on a request that holds blocks")));
        }
        let need_total = (num_computed_tokens + num_new_tokens).div_ceil(self.block_size);
        let have = st.blocks.len() + hit.len();
        let fresh = need_total.saturating_sub(have);
        let revived = hit.iter().filter(|&&b| self.pool.ref_cnt(b) == 0).count();
        if fresh + revived > self.pool.num_free() {
            return Ok(None);
        }
        self.pool.touch(hit);
        let new = self.pool.allocate(fresh)?;
        let st = self.reqs.get_mut(&id).expect("entry made above");
        st.blocks.extend_from_slice(hit);
        if !hit.is_empty() {
            st.num_cached_blocks = hit.len(); // hit blocks hold cached prefixes already
        }
        st.blocks.extend_from_slice(&new);
        Ok(Some(new))
    }

    /// Makes the full blocks of `tokens[..num_computed_tokens]` prefix-cache entries; call
    /// after the forward pass wrote their K/V. `tokens` is the request's whole sequence so far.
    pub fn cache_computed_blocks(&mut self, id: ReqId, tokens: &[TokenId], num_computed_tokens: usize) {
        if !self.pool.caching_enabled() {
            return;
        }
        let Some(st) = self.reqs.get_mut(&id) else { return };
        let full = (num_computed_tokens.min(tokens.len()) / self.block_size).min(st.blocks.len());
        if full <= st.num_cached_blocks {
            return;
        }
        extend_block_hashes(&mut st.hashes, &tokens[..full * self.block_size], self.block_size, st.salt.as_deref());
        for i in st.num_cached_blocks..full {
            self.pool.cache_block(st.blocks[i], st.hashes[i]);
        }
        st.num_cached_blocks = full;
    }

    /// Releases every block of `id`, tail first; unknown ids are a no-op.
    pub fn free(&mut self, id: ReqId) -> Result<()> {
        let Some(st) = self.reqs.remove(&id) else { return Ok(()) };
        let rev: Vec<BlockId> = st.blocks.iter().rev().copied().collect();
        self.pool.free(&rev)
    }

    /// Checks the pool's invariants and that reference counts equal the tables' holdings.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        self.pool.check_invariants()?;
        let mut refs = vec![0u32; self.pool.num_blocks()];
        for st in self.reqs.values() {
            for &b in &st.blocks {
                refs[b as usize] += 1;
            }
        }
        for (b, &n) in refs.iter().enumerate() {
            if self.pool.ref_cnt(b as BlockId) != n {
                return Err(format!("block {b}: ref_cnt {} but {n} tables hold it", self.pool.ref_cnt(b as BlockId)));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_request_reuses_a_shared_prefix() {
        let bs = 16;
        let mut m = KvCacheManager::new(100, bs, true);
        let shared: Vec<u32> = (0..512).collect();
        let mut a = shared.clone();
        a.extend(1000..1010);
        let (hit, n) = m.get_computed_blocks(1, &a, None);
        assert_eq!((hit.len(), n), (0, 0));
        m.allocate_slots(1, 0, a.len(), &hit).unwrap().unwrap();
        m.cache_computed_blocks(1, &a, a.len());
        let mut b = shared.clone();
        b.extend(2000..2030);
        let (hit, n) = m.get_computed_blocks(2, &b, None);
        assert_eq!(n, 512, "all 32 full blocks of the shared prefix");
        assert_eq!(&hit[..], &m.block_table(1)[..32]);
        let new = m.allocate_slots(2, n, b.len() - n, &hit).unwrap().unwrap();
        assert_eq!(new.len(), 2); // 30 more tokens
        assert_eq!(m.pool().ref_cnt(hit[0]), 2);
        // Another tenant sees nothing.
        let (hit, _) = m.get_computed_blocks(3, &b, Some("other"));
        assert!(hit.is_empty());
        m.check_invariants().unwrap();
        for id in [1, 2, 3] {
            m.free(id).unwrap();
        }
        assert_eq!(m.num_free_blocks(), 100);
        m.check_invariants().unwrap();
        assert_eq!(m.stats().hits, 512);
    }

    #[test]
    fn whole_prompt_hit_leaves_one_token_to_compute() {
        let mut m = KvCacheManager::new(10, 4, true);
        let t: Vec<u32> = (0..8).collect();
        m.get_computed_blocks(1, &t, None);
        m.allocate_slots(1, 0, 8, &[]).unwrap().unwrap();
        m.cache_computed_blocks(1, &t, 8);
        let (hit, n) = m.get_computed_blocks(2, &t, None);
        assert_eq!((hit.len(), n), (1, 4));
    }

    #[test]
    fn short_pool_changes_nothing() {
        let mut m = KvCacheManager::new(3, 4, true);
        assert!(m.allocate_slots(1, 0, 13, &[]).unwrap().is_none());
        assert_eq!(m.num_free_blocks(), 3);
        assert!(m.block_table(1).is_empty());
        m.check_invariants().unwrap();
    }
}
