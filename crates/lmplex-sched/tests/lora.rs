//! `max_loras`: at most that many distinct LoRA adapters run at once; a request under another
//! adapter waits, later requests (of the base or of a running adapter) go ahead of it, and it
//! runs once an adapter's last request ends. Every request ends.

mod common;

use common::{create_request, fake_step, BS};
use lmplex_kv::KvCacheManager;
use lmplex_sched::{Policy, Scheduler, SchedulerConfig};
use std::collections::HashSet;
use std::time::Instant;

fn scheduler(max_loras: usize, policy: Policy) -> Scheduler {
    let cfg = SchedulerConfig { max_num_seqs: 8, max_loras, policy, ..Default::default() };
    Scheduler::new(cfg, KvCacheManager::new(256, BS, true))
}

#[test]
fn a_third_adapter_waits_while_two_run_and_others_go_ahead() {
    for policy in [Policy::Fcfs, Policy::Priority, Policy::Fair] {
        let mut s = scheduler(2, policy);
        let t = Instant::now();
        // ids 0..4 under adapters 1, 2, 3, the base, adapter 1; request 1 ends first.
        for (id, lora, out) in [(0, Some(1), 6), (1, Some(2), 2), (2, Some(3), 6), (3, None, 6), (4, Some(1), 6)] {
            let mut r = create_request(id, 8, out, t);
            r.lora = lora;
            s.add_request(r).unwrap();
        }
        let out = s.schedule(t).unwrap();
        let first: Vec<_> = out.scheduled.iter().map(|r| r.id).collect();
        assert_eq!(first, vec![0, 1, 3, 4], "{policy:?}: adapter 3 waits, the base and adapter 1 go ahead");
        let mut ran_with_3 = None;
        let mut steps = 0;
        fake_step(&mut s, &out);
        while s.has_unfinished() {
            let out = s.schedule(t).unwrap();
            let loras: HashSet<u64> = out.scheduled.iter().filter_map(|r| s.request(r.id).unwrap().lora).collect();
            assert!(loras.len() <= 2, "{policy:?}: {loras:?} run together");
            if ran_with_3.is_none() && out.scheduled.iter().any(|r| r.id == 2) {
                ran_with_3 = Some(loras);
            }
            fake_step(&mut s, &out);
            steps += 1;
            assert!(steps < 100, "{policy:?}: requests never end");
        }
        // Adapter 3 joined once adapter 2's one request ended, beside adapter 1.
        assert_eq!(ran_with_3, Some(HashSet::from([1, 3])), "{policy:?}");
    }
}

#[test]
fn no_limit_by_default() {
    let mut s = Scheduler::new(SchedulerConfig::default(), KvCacheManager::new(256, BS, true));
    let t = Instant::now();
    for id in 0..8 {
        let mut r = create_request(id, 4, 2, t);
        r.lora = Some(id);
        s.add_request(r).unwrap();
    }
    assert_eq!(s.schedule(t).unwrap().scheduled.len(), 8);
}
