//! `Stats`: the counters the step loop publishes for `memory()`, metrics and tests (and
//! `StatsSnapshot`, the same counters read once), and `QueueSlots`, the bounded queue's
//! admission count and the work of what it holds.
//!
//! Names follow vLLM: the host-memory tier preempted requests wait in is the swap space
//! (`num_swap_blocks`, `kv_swap_bytes`, `memory().kv_swap`).
//!
//! Invariants: the step loop writes every counter but `num_queued`, which only `QueueSlots`
//! changes: a `QueueSlot` is taken when `Engine::submit` accepts a request and given back
//! (dropped) when the request is first scheduled, or leaves before that (aborted, dropped,
//! refused by the scheduler, failed, or the loop stopped), so an idle engine reads 0.

use lmplex_core::{Error, Result};
use lmplex_route::Work;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Declares `Stats` (the counters, and `alive`) and `StatsSnapshot` (the counters read once,
/// as numbers), field for field, so the two cannot drift apart.
macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident: $ty:ty, )*) => {
        /// Counters the step loop publishes after every turn (read one with `load`, or all with
        /// `snapshot`).
        #[derive(Default)]
        pub struct Stats {
            $( $(#[$doc])* pub $name: $ty, )*
            /// The step loop is running (false once it has stopped, or panicked).
            pub alive: AtomicBool,
        }

        /// `Stats`' counters read once, by the same names (Python's `Engine.stats()`).
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
        pub struct StatsSnapshot {
            $( $(#[$doc])* pub $name: u64, )*
        }

        impl Stats {
            /// Every counter now (each read on its own, not at one atomic moment).
            pub fn snapshot(&self) -> StatsSnapshot {
                StatsSnapshot { $( $name: Counter::value(&self.$name), )* }
            }
        }
    };
}

counters! {
    /// Blocks in the KV pool (fixed at load).
    num_kv_blocks: AtomicUsize,
    /// KV pool blocks no request holds (cached prefixes included).
    num_free_kv_blocks: AtomicUsize,
    /// Of `num_free_kv_blocks`, those still holding a reusable prefix.
    num_cached_free_kv_blocks: AtomicUsize,
    /// Requests the scheduler is running (holding KV blocks).
    num_running: AtomicUsize,
    /// Requests in the scheduler's waiting queue (new, preempted or swapped out).
    num_waiting: AtomicUsize,
    /// Requests accepted by `submit` and not yet scheduled once (the bounded queue).
    num_queued: QueueSlots,
    /// Steps that ran a forward pass.
    num_steps: AtomicU64,
    /// Requests preempted to make room (by swap or recompute; each preemption counts once).
    num_preemptions: AtomicU64,
    /// Prompt tokens looked up in the prefix cache (vLLM's `PrefixCacheStats.queries`).
    prefix_cache_queries: AtomicU64,
    /// Of `prefix_cache_queries`, the tokens found cached.
    prefix_cache_hits: AtomicU64,
    /// Blocks in the swap space, the host-memory tier preempted requests swap to (fixed at load).
    num_swap_blocks: AtomicUsize,
    /// Swap-space blocks no swapped-out request holds.
    num_free_swap_blocks: AtomicUsize,
    /// Requests swapped out to the swap space (each swap-out counts once).
    num_swaps: AtomicU64,
    /// Decode chunks that verified drafted tokens (vLLM's `spec_decode_num_drafts`).
    spec_decode_num_drafts: AtomicU64,
    /// Tokens drafted and verified (vLLM's `spec_decode_num_draft_tokens`).
    spec_decode_num_draft_tokens: AtomicU64,
    /// Of those, the tokens accepted: each the token plain decoding picks there.
    spec_decode_num_accepted_tokens: AtomicU64,
    /// Passes of the vision tower, each over the images of every request waiting for it.
    num_encoder_passes: AtomicU64,
    /// Images run through the vision tower (those found in the feature cache not counted).
    num_images_encoded: AtomicU64,
}

/// A counter's value as a number.
trait Counter {
    fn value(&self) -> u64;
}

impl Counter for AtomicUsize {
    fn value(&self) -> u64 {
        self.load(Ordering::Relaxed) as u64
    }
}

impl Counter for AtomicU64 {
    fn value(&self) -> u64 {
        self.load(Ordering::Relaxed)
    }
}

impl Counter for QueueSlots {
    fn value(&self) -> u64 {
        self.load(Ordering::Relaxed) as u64
    }
}

/// The bounded queue's admission count: requests accepted by `submit` and not yet scheduled
/// once, and their work (for the router's `Backlog`), apart for those with a deadline and
/// those without. Only `try_reserve` raises them and only a `QueueSlot`'s drop lowers them.
#[derive(Debug, Default)]
pub struct QueueSlots(Arc<Queued>);

#[derive(Debug, Default)]
struct Queued {
    count: AtomicUsize,
    /// Indexed by whether the requests have a deadline.
    work: [WorkCounter; 2],
}

#[derive(Debug, Default)]
struct WorkCounter {
    requests: AtomicUsize,
    prompt_tokens: AtomicUsize,
    output_tokens: AtomicUsize,
}

impl WorkCounter {
    fn add(&self, w: Work) {
        self.requests.fetch_add(w.requests, Ordering::AcqRel);
        self.prompt_tokens.fetch_add(w.prompt_tokens, Ordering::AcqRel);
        self.output_tokens.fetch_add(w.output_tokens, Ordering::AcqRel);
    }
    fn sub(&self, w: Work) {
        self.requests.fetch_sub(w.requests, Ordering::AcqRel);
        self.prompt_tokens.fetch_sub(w.prompt_tokens, Ordering::AcqRel);
        self.output_tokens.fetch_sub(w.output_tokens, Ordering::AcqRel);
    }
    fn load(&self) -> Work {
        Work {
            requests: self.requests.load(Ordering::Acquire),
            prompt_tokens: self.prompt_tokens.load(Ordering::Acquire),
            output_tokens: self.output_tokens.load(Ordering::Acquire),
        }
    }
}

impl QueueSlots {
    /// Places taken now.
    pub fn load(&self, order: Ordering) -> usize {
        self.0.count.load(order)
    }

    /// The work of the queued requests with a deadline (`deadline`) or without.
    pub fn work(&self, deadline: bool) -> Work {
        self.0.work[usize::from(deadline)].load()
    }

    /// Takes one place for a request of `work` (with a deadline or not) if fewer than `max`
    /// are taken, else a `Capacity` error.
    pub(crate) fn try_reserve(&self, max: usize, work: Work, deadline: bool) -> Result<QueueSlot> {
        self.0
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
            .map(|_| {
                self.0.work[usize::from(deadline)].add(work);
                QueueSlot { queued: self.0.clone(), work, deadline }
            })
            .map_err(|n| {
                Error::capacity(format!("{n} requests are already waiting (max_queue_len={max}): retry later"))
            })
    }
}

/// One place in the bounded queue, held by a request from `submit` until it is first
/// scheduled or leaves; dropping it gives the place (and its work) back.
#[must_use = "dropping the slot gives the place back at once"]
#[derive(Debug)]
pub(crate) struct QueueSlot {
    queued: Arc<Queued>,
    work: Work,
    deadline: bool,
}

impl Drop for QueueSlot {
    fn drop(&mut self) {
        self.queued.work[usize::from(self.deadline)].sub(self.work);
        self.queued.count.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_bounded_and_given_back_on_drop() {
        let q = QueueSlots::default();
        let a = q.try_reserve(2, Work::one(10, 5), false).unwrap();
        let b = q.try_reserve(2, Work::one(3, 7), true).unwrap();
        assert_eq!((q.work(false), q.work(true)), (Work::one(10, 5), Work::one(3, 7)));
        let e = q.try_reserve(2, Work::one(1, 1), false).unwrap_err();
        assert_eq!(q.work(false), Work::one(10, 5), "a refused place adds no work");
        assert!(e.to_string().contains("max_queue_len=2"), "{e}");
        assert_eq!(q.load(Ordering::Acquire), 2);
        drop(a);
        assert_eq!(q.load(Ordering::Acquire), 1);
        assert_eq!(q.work(false), Work::default());
        let c = q.try_reserve(2, Work::one(4, 4), true).unwrap();
        assert_eq!(q.work(true), Work::one(3, 7) + Work::one(4, 4));
        drop((b, c));
        assert_eq!((q.load(Ordering::Acquire), q.work(true)), (0, Work::default()));
    }
}
