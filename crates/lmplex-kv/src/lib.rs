//! lmplex-kv: which KV blocks hold what, for whom. Bookkeeping only: no tensors, no requests,
//! no model. The runner owns the memory a `BlockId` names; the scheduler asks this crate for
//! blocks and tells it when tokens are computed or a request leaves.
//!
//! - [`BlockPool`]: fixed-size blocks, a free queue in LRU order, reference counts, and the map
//!   from a full block's prefix hash to the block that holds it.
//! - [`hash`]: the hash chain over full blocks of token ids (with an optional per-tenant salt).
//! - [`KvCacheManager`]: per-request block tables on top of the pool: prefix-cache lookup,
//!   `can_allocate`/`allocate_slots`, `free`, hit counters, and the warm (host) tier that
//!   preempted requests swap to (`swap_out`/`swap_in`).

#![warn(missing_docs)]

pub mod block_pool;
pub mod hash;
pub mod manager;

pub use block_pool::{BlockId, BlockPool};
pub use hash::{hash_block_tokens, BlockHash};
pub use manager::{KvCacheManager, PrefixCacheStats};
