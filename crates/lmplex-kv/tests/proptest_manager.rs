//! Property test: random interleavings of admit (with prefix lookup), grow (decode or a
//! prefill chunk), cache, preempt-and-readmit, swap out, swap in, cancel and finish over one
//! `KvCacheManager` with a warm tier. After every operation both pools' invariants hold and
//! reference counts equal what the block tables hold; a swapped-in request gets back a table
//! as long as the one it left; at the end every block of both tiers is free.

use lmplex_kv::manager::ReqId;
use lmplex_kv::KvCacheManager;
use proptest::prelude::*;
use std::collections::BTreeMap;

#[derive(Debug, Clone)]
enum Op {
    /// A new request: a shared prefix (one of 3) of `prefix_blocks` blocks and `tail` own tokens.
    Admit { family: u8, prefix_blocks: u8, tail: u8 },
    /// Compute `n` more tokens of the request at `pick` (mod the running ones).
    Grow { pick: u8, n: u8 },
    /// Free and admit again from scratch (recompute preemption).
    Preempt { pick: u8 },
    /// Swap the running request at `pick` out to the warm tier.
    SwapOut { pick: u8 },
    /// Swap the swapped-out request at `pick` back in.
    SwapIn { pick: u8 },
    /// Finish or cancel: free it (running or swapped out).
    Free { pick: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..3, 0u8..6, 1u8..40).prop_map(|(family, prefix_blocks, tail)| Op::Admit { family, prefix_blocks, tail }),
        (any::<u8>(), 1u8..20).prop_map(|(pick, n)| Op::Grow { pick, n }),
        any::<u8>().prop_map(|pick| Op::Preempt { pick }),
        any::<u8>().prop_map(|pick| Op::SwapOut { pick }),
        any::<u8>().prop_map(|pick| Op::SwapIn { pick }),
        any::<u8>().prop_map(|pick| Op::Free { pick }),
    ]
}

struct Req {
    tokens: Vec<u32>,
    computed: usize,
}

const BS: usize = 4;

fn admit(m: &mut KvCacheManager, id: ReqId, r: &mut Req) -> bool {
    let (hit, n) = m.get_computed_blocks(id, &r.tokens, usize::MAX, None);
    assert!(n < r.tokens.len());
    match m.allocate_slots(id, n, r.tokens.len() - n, &hit).unwrap() {
        Some(_) => {
            r.computed = r.tokens.len();
            m.cache_computed_blocks(id, &r.tokens, r.computed);
            true
        }
        None => {
            m.free(id).unwrap(); // drops the lookup's state; holds no blocks
            false
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn no_leaks_no_double_frees(
        num_blocks in 4usize..64,
        num_warm in 0usize..32,
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let mut m = KvCacheManager::new(num_blocks, BS, true).with_warm_tier(num_warm);
        let mut running: BTreeMap<ReqId, Req> = BTreeMap::new();
        let mut swapped: BTreeMap<ReqId, Req> = BTreeMap::new();
        let mut next_id: ReqId = 0;
        for op in ops {
            let ids: Vec<ReqId> = running.keys().copied().collect();
            let out: Vec<ReqId> = swapped.keys().copied().collect();
            match op {
                Op::Admit { family, prefix_blocks, tail } => {
                    let mut tokens: Vec<u32> = (0..prefix_blocks as u32 * BS as u32).map(|i| family as u32 * 1000 + i).collect();
                    tokens.extend((0..tail as u32).map(|i| 50_000 + next_id as u32 * 100 + i));
                    let mut r = Req { tokens, computed: 0 };
                    if admit(&mut m, next_id, &mut r) {
                        running.insert(next_id, r);
                    }
                    next_id += 1;
                }
                Op::Grow { pick, n } if !ids.is_empty() => {
                    let id = ids[pick as usize % ids.len()];
                    let r = running.get_mut(&id).unwrap();
                    let n = n as usize;
                    let before = m.block_table(id).len();
                    match m.allocate_slots(id, r.computed, n, &[]).unwrap() {
                        Some(new) => {
                            prop_assert_eq!(m.block_table(id).len(), before + new.len());
                            r.tokens.extend((0..n as u32).map(|i| 90_000 + i));
                            r.computed += n;
                            m.cache_computed_blocks(id, &r.tokens, r.computed);
                        }
                        None => prop_assert_eq!(m.block_table(id).len(), before),
                    }
                    prop_assert!(m.block_table(id).len() * BS >= r.computed);
                }
                Op::Preempt { pick } if !ids.is_empty() => {
                    let id = ids[pick as usize % ids.len()];
                    m.free(id).unwrap();
                    let mut r = running.remove(&id).unwrap();
                    r.computed = 0;
                    if admit(&mut m, id, &mut r) {
                        running.insert(id, r);
                    }
                }
                Op::SwapOut { pick } if !ids.is_empty() => {
                    let id = ids[pick as usize % ids.len()];
                    let r = &running[&id];
                    if m.can_swap_out(id, r.computed) {
                        let warm_free = m.warm_pool().num_free();
                        let pairs = m.swap_out(id, r.computed).unwrap();
                        prop_assert_eq!(pairs.len(), r.computed.div_ceil(BS));
                        prop_assert_eq!(m.warm_pool().num_free(), warm_free - pairs.len());
                        prop_assert!(m.is_swapped(id) && m.block_table(id).is_empty());
                        swapped.insert(id, running.remove(&id).unwrap());
                    } else {
                        prop_assert!(m.swap_out(id, r.computed).is_err(), "refused, and nothing changes");
                    }
                }
                Op::SwapIn { pick } if !out.is_empty() => {
                    let id = out[pick as usize % out.len()];
                    let want = swapped[&id].computed.div_ceil(BS);
                    if let Some(pairs) = m.swap_in(id).unwrap() {
                        prop_assert_eq!(pairs.len(), want);
                        prop_assert_eq!(m.block_table(id).len(), want);
                        let r = swapped.remove(&id).unwrap();
                        m.cache_computed_blocks(id, &r.tokens, r.computed);
                        running.insert(id, r);
                    } else {
                        prop_assert!(m.num_free_blocks() < want);
                    }
                }
                Op::Free { pick } if !ids.is_empty() || !out.is_empty() => {
                    let all: Vec<ReqId> = ids.iter().chain(&out).copied().collect();
                    let id = all[pick as usize % all.len()];
                    m.free(id).unwrap();
                    running.remove(&id);
                    swapped.remove(&id);
                }
                _ => {}
            }
            m.check_invariants().map_err(TestCaseError::fail)?;
        }
        for id in running.keys().chain(swapped.keys()) {
            m.free(*id).unwrap();
        }
        m.check_invariants().map_err(TestCaseError::fail)?;
        prop_assert_eq!(m.num_free_blocks(), num_blocks);
        prop_assert_eq!(m.warm_pool().num_free(), num_warm);
        prop_assert_eq!(m.num_requests(), 0);
        for b in 0..num_blocks as u32 {
            prop_assert_eq!(m.pool().ref_cnt(b), 0);
        }
    }
}
