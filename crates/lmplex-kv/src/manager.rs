//! `KvCacheManager`: each request's block table on one `BlockPool`, with prefix caching.
//!
//! The scheduler's calls, in order, for one request (vLLM v1's `KVCacheManager` protocol):
//! 1. `get_computed_blocks(id, tokens, num_prompt_tokens, salt)`: the longest cached prefix of
//!    full blocks (hashes record which tokens were generated, see `hash`); at least one token is
//!    always left to compute (its logits are needed).
//! 2. `allocate_slots(id, num_computed_tokens, num_new_tokens, &hit_blocks)`: takes the hit
//!    blocks (reference +1) and enough fresh blocks for `num_computed_tokens + num_new_tokens`
//!    tokens, or returns `None` and changes nothing when the pool is short.
//! 3. after the forward pass, `cache_computed_blocks(id, tokens, num_computed_tokens)`: the
//!    full blocks whose K/V are now written become prefix-cache entries.
//! 4. `free(id)` when it finishes, is cancelled or is preempted.
//!
//! Two tiers. The hot pool is the KV memory the forward pass reads (the device's). The warm
//! pool (host memory, optional) holds preempted requests: `swap_out(id, n)` moves the blocks of
//! the first `n` computed tokens to warm blocks and frees the hot ones; `swap_in(id)` moves them
//! back into fresh hot blocks. Each returns the `(from, to)` block pairs the runner must copy
//! before the next forward pass; the request keeps its prefix hashes and its computed tokens.
//! Costs: a swap copies `2 x blocks x bytes_per_block` (out and back); a recompute re-runs the
//! prefill of the tokens not held by other requests. The scheduler picks (see lmplex-sched).
//!
//! Invariants: a request's table covers exactly the blocks it holds a reference to; a request
//! holds hot blocks or warm blocks, never both; warm blocks are never prefix-cached; a block
//! is cached only after its K/V are written (so a hit never reads unwritten memory); `free`
//! returns blocks tail first, so a request's prefix stays cached longer than its suffix; every
//! block of every request, hot and warm, returns to its pool once all requests are freed.

use crate::block_pool::{BlockId, BlockPool};
use crate::hash::{extend_block_hashes, BlockHash};
use lmplex_core::{Error, Result, TokenId};
use std::collections::HashMap;

/// A request's id, as the scheduler and engine number requests.
pub type ReqId = u64;

/// Prefix-cache counters (vLLM's `PrefixCacheStats`): lookups and tokens asked for and found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Lookups (`get_computed_blocks` calls with caching on).
    pub requests: u64,
    /// Tokens looked up, summed over lookups.
    pub queries: u64,
    /// Tokens found cached (whole blocks), summed over lookups.
    pub hits: u64,
}

#[derive(Debug, Default)]
struct ReqState {
    blocks: Vec<BlockId>,
    hashes: Vec<BlockHash>,
    salt: Option<String>,
    /// Tokens from here on were generated (`None`: not told, all prompt).
    num_prompt_tokens: Option<usize>,
    num_cached_blocks: usize,
    /// Warm blocks holding the request while it is swapped out (then `blocks` is empty).
    swapped: Vec<BlockId>,
}

/// Every request's block table over the hot pool and warm tier, with prefix caching.
#[derive(Debug)]
pub struct KvCacheManager {
    pool: BlockPool,
    warm: BlockPool,
    block_size: usize,
    reqs: HashMap<ReqId, ReqState>,
    stats: PrefixCacheStats,
}

impl KvCacheManager {
    /// `num_blocks` hot blocks of `block_size` (> 0) tokens each, and no warm tier.
    pub fn new(num_blocks: usize, block_size: usize, enable_prefix_caching: bool) -> Self {
        assert!(block_size > 0);
        Self {
            pool: BlockPool::new(num_blocks, enable_prefix_caching),
            warm: BlockPool::new(0, false),
            block_size,
            reqs: HashMap::new(),
            stats: PrefixCacheStats::default(),
        }
    }

    /// Adds a warm tier of `num_blocks` host blocks for swapped-out requests.
    pub fn with_warm_tier(mut self, num_blocks: usize) -> Self {
        assert!(self.reqs.is_empty(), "the warm tier is set before any request");
        self.warm = BlockPool::new(num_blocks, false);
        self
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }
    /// The hot pool (the KV memory the forward pass reads).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }
    /// The warm tier (empty unless `with_warm_tier` gave it blocks).
    pub fn warm_pool(&self) -> &BlockPool {
        &self.warm
    }
    /// The prefix-cache counters so far.
    pub fn stats(&self) -> PrefixCacheStats {
        self.stats
    }
    /// Free hot blocks (including free ones still holding a cached prefix).
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
    /// Requests the manager tracks (looked up, holding blocks, or swapped out), until `free`.
    pub fn num_requests(&self) -> usize {
        self.reqs.len()
    }

    /// Blocks needed to hold `num_tokens` tokens.
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size)
    }

    /// The cached blocks that hold the longest prefix of `tokens` (full blocks only, leaving at
    /// least one token to compute), and the number of tokens they cover. Counts the lookup.
    pub fn get_computed_blocks(
        &mut self,
        id: ReqId,
        tokens: &[TokenId],
        num_prompt_tokens: usize,
        salt: Option<&str>,
    ) -> (Vec<BlockId>, usize) {
        self.lookup(id, tokens, num_prompt_tokens, salt, true)
    }

    /// As `get_computed_blocks` for a request that computes every token (it reads no cached
    /// block, and the lookup is not counted); its blocks are still cached once computed.
    pub fn skip_computed_blocks(
        &mut self,
        id: ReqId,
        tokens: &[TokenId],
        num_prompt_tokens: usize,
        salt: Option<&str>,
    ) {
        self.lookup(id, tokens, num_prompt_tokens, salt, false);
    }

    fn lookup(
        &mut self,
        id: ReqId,
        tokens: &[TokenId],
        num_prompt_tokens: usize,
        salt: Option<&str>,
        read: bool,
    ) -> (Vec<BlockId>, usize) {
        let st = self.reqs.entry(id).or_default();
        if st.hashes.is_empty() {
            st.salt = salt.map(str::to_string);
            st.num_prompt_tokens = Some(num_prompt_tokens);
        }
        let np = st.num_prompt_tokens.unwrap_or(usize::MAX);
        extend_block_hashes(&mut st.hashes, tokens, np, self.block_size, st.salt.as_deref());
        let mut hit = Vec::new();
        if read && self.pool.caching_enabled() {
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
        if !st.swapped.is_empty() {
            return Err(Error::internal(format!("request {id} is swapped out: swap it in first")));
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
        let np = st.num_prompt_tokens.unwrap_or(usize::MAX);
        extend_block_hashes(&mut st.hashes, &tokens[..full * self.block_size], np, self.block_size, st.salt.as_deref());
        for i in st.num_cached_blocks..full {
            self.pool.cache_block(st.blocks[i], st.hashes[i]);
        }
        st.num_cached_blocks = full;
    }

    /// Keeps the blocks of `id`'s first `num_tokens` tokens and frees the rest, tail first: the
    /// blocks a step allocated for drafted tokens that verification rejected. The kept blocks
    /// must still hold every cached one (a cached block is full of computed tokens).
    pub fn truncate(&mut self, id: ReqId, num_tokens: usize) -> Result<()> {
        let keep = self.blocks_for(num_tokens);
        let Some(st) = self.reqs.get_mut(&id).filter(|st| st.blocks.len() > keep) else { return Ok(()) };
        if st.num_cached_blocks > keep {
            return Err(Error::internal(format!(
                "request {id}: truncating to {num_tokens} tokens drops cached blocks"
            )));
        }
        let rev: Vec<BlockId> = st.blocks.drain(keep..).rev().collect();
        st.hashes.truncate(keep);
        self.pool.free(&rev)
    }

    /// Releases every block of `id` (hot or warm), tail first; unknown ids are a no-op.
    pub fn free(&mut self, id: ReqId) -> Result<()> {
        let Some(st) = self.reqs.remove(&id) else { return Ok(()) };
        let rev: Vec<BlockId> = st.swapped.iter().rev().copied().collect();
        self.warm.free(&rev)?;
        let rev: Vec<BlockId> = st.blocks.iter().rev().copied().collect();
        self.pool.free(&rev)
    }

    /// Whether `id` is swapped out (holds warm blocks).
    pub fn is_swapped(&self, id: ReqId) -> bool {
        self.reqs.get(&id).is_some_and(|r| !r.swapped.is_empty())
    }

    /// Tokens at the start of `id`'s table in blocks another request also holds: they stay
    /// resident if `id` is preempted, so recomputing them costs nothing (a prefix hit).
    pub fn num_shared_prefix_tokens(&self, id: ReqId) -> usize {
        let table = self.block_table(id);
        table.iter().take_while(|&&b| self.pool.ref_cnt(b) > 1).count() * self.block_size
    }

    /// Can the first `num_computed_tokens` tokens of `id` be swapped out now?
    pub fn can_swap_out(&self, id: ReqId, num_computed_tokens: usize) -> bool {
        let n = self.blocks_for(num_computed_tokens);
        n > 0 && n <= self.warm.num_free() && self.block_table(id).len() >= n
    }

    /// Moves the blocks of `id`'s first `num_computed_tokens` tokens to the warm tier and frees
    /// all its hot blocks (tail first; they keep their cached prefixes). Returns the
    /// `(hot, warm)` pairs to copy before the next forward pass writes any freed block.
    pub fn swap_out(&mut self, id: ReqId, num_computed_tokens: usize) -> Result<Vec<(BlockId, BlockId)>> {
        if !self.can_swap_out(id, num_computed_tokens) || self.is_swapped(id) {
            return Err(Error::internal(format!("request {id} cannot be swapped out")));
        }
        let n = self.blocks_for(num_computed_tokens);
        let warm = self.warm.allocate(n)?;
        let st = self.reqs.get_mut(&id).expect("it holds blocks");
        let hot = std::mem::take(&mut st.blocks);
        st.num_cached_blocks = 0;
        st.swapped = warm.clone();
        let pairs = hot.iter().copied().zip(warm).collect();
        let rev: Vec<BlockId> = hot.iter().rev().copied().collect();
        self.pool.free(&rev)?;
        Ok(pairs)
    }

    /// Moves swapped-out `id` back into fresh hot blocks, or returns `None` (nothing changed)
    /// when the hot pool is short. Returns the `(warm, hot)` pairs to copy before the forward
    /// pass; full blocks become prefix-cache entries again at the next `cache_computed_blocks`.
    pub fn swap_in(&mut self, id: ReqId) -> Result<Option<Vec<(BlockId, BlockId)>>> {
        let Some(st) = self.reqs.get(&id).filter(|r| !r.swapped.is_empty()) else {
            return Err(Error::internal(format!("request {id} is not swapped out")));
        };
        if st.swapped.len() > self.pool.num_free() {
            return Ok(None);
        }
        let hot = self.pool.allocate(st.swapped.len())?;
        let st = self.reqs.get_mut(&id).expect("checked above");
        let warm = std::mem::take(&mut st.swapped);
        st.blocks = hot.clone();
        let rev: Vec<BlockId> = warm.iter().rev().copied().collect();
        self.warm.free(&rev)?;
        Ok(Some(warm.into_iter().zip(hot).collect()))
    }

    /// Checks the pool's invariants and that reference counts equal the tables' holdings.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        self.pool.check_invariants()?;
        self.warm.check_invariants()?;
        if let Some((id, _)) = self.reqs.iter().find(|(_, r)| !r.blocks.is_empty() && !r.swapped.is_empty()) {
            return Err(format!("request {id} holds hot and warm blocks"));
        }
        for (pool, tier) in [(&self.pool, "hot"), (&self.warm, "warm")] {
            let mut refs = vec![0u32; pool.num_blocks()];
            for st in self.reqs.values() {
                for &b in if tier == "hot" { &st.blocks } else { &st.swapped } {
                    refs[b as usize] += 1;
                }
            }
            for (b, &n) in refs.iter().enumerate() {
                if pool.ref_cnt(b as BlockId) != n {
                    return Err(format!(
                        "{tier} block {b}: ref_cnt {} but {n} tables hold it",
                        pool.ref_cnt(b as BlockId)
                    ));
                }
            }
        }
        if self.warm.num_cached() != 0 {
            return Err("a warm block is prefix-cached".into());
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
        let (hit, n) = m.get_computed_blocks(1, &a, usize::MAX, None);
        assert_eq!((hit.len(), n), (0, 0));
        m.allocate_slots(1, 0, a.len(), &hit).unwrap().unwrap();
        m.cache_computed_blocks(1, &a, a.len());
        let mut b = shared.clone();
        b.extend(2000..2030);
        let (hit, n) = m.get_computed_blocks(2, &b, usize::MAX, None);
        assert_eq!(n, 512, "all 32 full blocks of the shared prefix");
        assert_eq!(&hit[..], &m.block_table(1)[..32]);
        let new = m.allocate_slots(2, n, b.len() - n, &hit).unwrap().unwrap();
        assert_eq!(new.len(), 2); // 30 more tokens
        assert_eq!(m.pool().ref_cnt(hit[0]), 2);
        // Another tenant sees nothing.
        let (hit, _) = m.get_computed_blocks(3, &b, usize::MAX, Some("other"));
        assert!(hit.is_empty());
        m.check_invariants().unwrap();
        for id in [1, 2, 3] {
            m.free(id).unwrap();
        }
        assert_eq!(m.num_free_blocks(), 100);
        m.check_invariants().unwrap();
        assert_eq!(m.stats().hits, 512);
    }

    /// Blocks holding generated tokens are hits for the same request recomputed, never for a
    /// new prompt made of the same tokens (the model computes the two kinds with different
    /// kernels, so reusing them would make the new request depend on the cache).
    #[test]
    fn generated_blocks_serve_only_the_same_split() {
        let bs = 4;
        let mut m = KvCacheManager::new(20, bs, true);
        let t: Vec<u32> = (0..14).collect(); // 6 prompt tokens, then 8 generated
        m.get_computed_blocks(1, &t[..6], 6, None);
        m.allocate_slots(1, 0, 14, &[]).unwrap().unwrap();
        m.cache_computed_blocks(1, &t, 14);
        // The same request after preemption (same split): all three full blocks.
        let (_, n) = m.get_computed_blocks(2, &t, 6, None);
        assert_eq!(n, 12);
        m.free(2).unwrap();
        // A prompt of all 14 tokens: only block 0 (positions 0..4, prompt tokens in both).
        let (_, n) = m.get_computed_blocks(3, &t, 14, None);
        assert_eq!(n, 4);
        m.free(3).unwrap();
        m.free(1).unwrap();
        m.check_invariants().unwrap();
    }

    #[test]
    fn swap_out_and_in_keeps_the_request() {
        let mut m = KvCacheManager::new(6, 4, true).with_warm_tier(4);
        let t: Vec<u32> = (0..10).collect();
        m.get_computed_blocks(1, &t, usize::MAX, None);
        let hot = m.allocate_slots(1, 0, 10, &[]).unwrap().unwrap();
        m.cache_computed_blocks(1, &t, 10);
        assert!(m.can_swap_out(1, 10));
        let out = m.swap_out(1, 10).unwrap();
        assert_eq!(out.iter().map(|p| p.0).collect::<Vec<_>>(), hot);
        assert!(m.is_swapped(1) && m.block_table(1).is_empty());
        assert_eq!((m.num_free_blocks(), m.warm_pool().num_free()), (6, 1));
        assert_eq!(m.pool().num_cached_free(), 2, "freed hot blocks keep their prefixes");
        m.check_invariants().unwrap();
        // Another request takes most of the hot pool: swap-in must wait, changing nothing.
        m.allocate_slots(2, 0, 16, &[]).unwrap().unwrap();
        assert_eq!(m.swap_in(1).unwrap(), None);
        m.free(2).unwrap();
        let back = m.swap_in(1).unwrap().unwrap();
        assert_eq!(back.iter().map(|p| p.0).collect::<Vec<_>>(), out.iter().map(|p| p.1).collect::<Vec<_>>());
        assert_eq!(m.block_table(1), back.iter().map(|p| p.1).collect::<Vec<_>>());
        assert_eq!(m.warm_pool().num_free(), 4);
        // It grows from its computed tokens, and re-caches its full blocks.
        m.allocate_slots(1, 10, 3, &[]).unwrap().unwrap();
        m.cache_computed_blocks(1, &t, 10);
        m.check_invariants().unwrap();
        m.free(1).unwrap();
        assert_eq!((m.num_free_blocks(), m.warm_pool().num_free()), (6, 4));
        m.check_invariants().unwrap();
    }

    #[test]
    fn whole_prompt_hit_leaves_one_token_to_compute() {
        let mut m = KvCacheManager::new(10, 4, true);
        let t: Vec<u32> = (0..8).collect();
        m.get_computed_blocks(1, &t, usize::MAX, None);
        m.allocate_slots(1, 0, 8, &[]).unwrap().unwrap();
        m.cache_computed_blocks(1, &t, 8);
        let (hit, n) = m.get_computed_blocks(2, &t, usize::MAX, None);
        assert_eq!((hit.len(), n), (1, 4));
    }

    #[test]
    fn truncate_frees_the_drafted_tail() {
        let mut m = KvCacheManager::new(8, 4, true);
        m.allocate_slots(1, 0, 5, &[]).unwrap().unwrap();
        m.cache_computed_blocks(1, &[1, 2, 3, 4, 5], 5);
        m.allocate_slots(1, 5, 6, &[]).unwrap().unwrap(); // 11 tokens: 3 blocks
        assert_eq!((m.block_table(1).len(), m.num_free_blocks()), (3, 5));
        m.truncate(1, 6).unwrap(); // 6 computed tokens need 2 blocks
        assert_eq!((m.block_table(1).len(), m.num_free_blocks()), (2, 6));
        m.truncate(1, 9).unwrap(); // nothing past the table: unchanged
        assert_eq!(m.block_table(1).len(), 2);
        assert!(m.truncate(1, 0).is_err(), "the cached first block stays");
        m.check_invariants().unwrap();
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
