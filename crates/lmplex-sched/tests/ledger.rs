//! One device's ledger shared by the schedulers of two models: the lift across models, service
//! charged in each model's device time, the turn going to the least-served tenant's step, short
//! steps while the other model has work, a dropped seat's backlog leaving with it, and the
//! device guard holding an idle model back.

mod common;

use common::{create_request, fake_step, BS};
use lmplex_kv::KvCacheManager;
use lmplex_sched::{
    CostModel, DeviceLedger, Policy, PreemptionMode, Scheduler, SchedulerConfig, SchedulerRequest, StepCost,
    TenantShare,
};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

fn model(ledger: &Arc<DeviceLedger>, s_per_token: f64) -> Scheduler {
    let cfg = SchedulerConfig {
        max_num_seqs: 4,
        policy: Policy::Fair,
        preemption_mode: PreemptionMode::Recompute,
        ..Default::default()
    };
    let mut s = Scheduler::new(cfg, KvCacheManager::new(64, BS, true)).with_ledger(ledger);
    s.set_cost_model(CostModel { recompute_s_per_token: s_per_token, ..s.cost_model() });
    s
}

fn request(id: u64, tenant: &str, prompt: usize, out: usize) -> SchedulerRequest {
    let mut r = create_request(id, prompt, out, Instant::now());
    r.tenant = TenantShare { name: Arc::from(tenant), weight: 1.0 };
    r
}

fn run_to_end(s: &mut Scheduler) {
    while s.has_unfinished() {
        let out = s.schedule(Instant::now()).unwrap();
        fake_step(s, &out);
    }
}

#[test]
fn both_models_charge_one_counter_in_their_own_device_time() {
    let ledger = Arc::new(DeviceLedger::default());
    let (mut slow, mut fast) = (model(&ledger, 0.004), model(&ledger, 0.001));
    slow.add_request(request(1, "t", 10, 4)).unwrap();
    fast.add_request(request(1, "t", 10, 4)).unwrap(); // the same id on another model
    run_to_end(&mut slow);
    run_to_end(&mut fast);
    // 10 prompt tokens and 4 generated (2 each) on each model, at 4 ms and 1 ms a token.
    let want = 18.0 * 0.004 + 18.0 * 0.001;
    assert!((ledger.counter("t") - want).abs() < 1e-12, "{} != {want}", ledger.counter("t"));
    assert_eq!(fast.fairness().counter("t"), slow.fairness().counter("t"));
}

#[test]
fn a_tenant_new_to_one_model_is_lifted_to_the_tenants_backlogged_on_the_other() {
    let ledger = Arc::new(DeviceLedger::default());
    let (mut a, mut b) = (model(&ledger, 0.001), model(&ledger, 0.001));
    for id in 1..=3 {
        a.add_request(request(id, "heavy", 32, 64)).unwrap();
    }
    for _ in 0..20 {
        let out = a.schedule(Instant::now()).unwrap();
        fake_step(&mut a, &out);
    }
    let heavy = ledger.counter("heavy");
    assert!(heavy > 0.05, "{heavy}");
    b.add_request(request(1, "light", 8, 2)).unwrap();
    // light banks no credit on model B for the time heavy was served on model A.
    assert_eq!(ledger.counter("light"), heavy);
}

#[test]
fn the_turn_goes_to_the_step_of_the_least_served_tenant_not_the_first_to_ask() {
    let ledger = Arc::new(DeviceLedger::default());
    let (holder, heavy, light) = (ledger.seat(), ledger.seat(), ledger.seat());
    heavy.charge(&Arc::from("heavy"), 1.0, 5.0);
    let held = holder.turn(vec![(0, Arc::from("heavy"))]);
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|scope| {
        for (seat, tenant) in [(&heavy, "heavy"), (&light, "light")] {
            let tx = tx.clone();
            scope.spawn(move || {
                let _turn = seat.turn(vec![(0, Arc::from(tenant))]);
                tx.send(tenant).unwrap();
                std::thread::sleep(Duration::from_millis(20));
            });
            std::thread::sleep(Duration::from_millis(50)); // heavy asks first
        }
        drop(held);
    });
    let order: Vec<_> = rx.try_iter().collect();
    assert_eq!(order, ["light", "heavy"]);
}

#[test]
fn a_model_between_two_steps_is_waited_for_when_its_tenant_is_less_served() {
    for rule in [true, false] {
        // Model B hands the turn back and asks again 20 ms later (its host-side work); model A,
        // serving the more-served tenant, asks in between.
        let between = if rule { Duration::from_millis(500) } else { Duration::ZERO };
        let ledger = Arc::new(DeviceLedger::new(between));
        let (a, b) = (ledger.seat(), ledger.seat());
        a.arrive(&Arc::from("heavy"));
        b.arrive(&Arc::from("light"));
        a.charge(&Arc::from("heavy"), 1.0, 5.0);
        let (tx, rx) = mpsc::channel();
        let held = b.turn(vec![(0, Arc::from("light"))]);
        std::thread::scope(|scope| {
            let tx2 = tx.clone();
            scope.spawn(move || {
                let _turn = a.turn(vec![(0, Arc::from("heavy"))]);
                tx2.send("heavy").unwrap();
            });
            std::thread::sleep(Duration::from_millis(20)); // a asks, and waits for the turn
            drop(held);
            std::thread::sleep(Duration::from_millis(20));
            let _turn = b.turn(vec![(0, Arc::from("light"))]);
            tx.send("light").unwrap();
        });
        let order: Vec<_> = rx.try_iter().collect();
        let want = if rule { ["light", "heavy"] } else { ["heavy", "light"] };
        assert_eq!(order, want, "between steps counted for {between:?}");
    }
}

#[test]
fn a_step_gives_way_between_layers_to_a_less_served_tenants_step_and_then_goes_on() {
    let ledger = Arc::new(DeviceLedger::default());
    let (heavy, light) = (ledger.seat(), ledger.seat());
    heavy.charge(&Arc::from("heavy"), 1.0, 5.0);
    let turn = heavy.turn(vec![(0, Arc::from("heavy"))]);
    turn.give_way(); // nobody asks: it keeps the turn
    assert_eq!(turn.gave_way(), Duration::ZERO);
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|scope| {
        let tx2 = tx.clone();
        scope.spawn(move || {
            let _turn = light.turn(vec![(0, Arc::from("light"))]);
            std::thread::sleep(Duration::from_millis(30)); // light's whole step
            tx2.send("light's step").unwrap();
        });
        while ledger.num_asking() == 0 {
            std::thread::yield_now();
        }
        turn.give_way(); // a layer boundary of heavy's step
        tx.send("heavy's next layer").unwrap();
    });
    assert_eq!(rx.try_iter().collect::<Vec<_>>(), ["light's step", "heavy's next layer"]);
    assert!(turn.gave_way() >= Duration::from_millis(25), "{:?}", turn.gave_way());
}

#[test]
fn a_higher_priority_step_takes_the_turn_before_a_less_served_tenant() {
    let ledger = Arc::new(DeviceLedger::default());
    let (holder, urgent, light) = (ledger.seat(), ledger.seat(), ledger.seat());
    urgent.charge(&Arc::from("busy"), 1.0, 5.0);
    let held = holder.turn(vec![]);
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|scope| {
        for (seat, priority, tenant) in [(&light, 0, "light"), (&urgent, -1, "busy")] {
            let tx = tx.clone();
            scope.spawn(move || {
                let _turn = seat.turn(vec![(priority, Arc::from(tenant))]);
                tx.send(tenant).unwrap();
            });
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(held);
    });
    assert_eq!(rx.try_iter().collect::<Vec<_>>(), ["busy", "light"]);
}

#[test]
fn a_step_stays_short_while_the_other_model_has_work() {
    let ledger = Arc::new(DeviceLedger::default());
    let (mut a, mut b) = (model(&ledger, 0.001), model(&ledger, 0.001));
    a.set_step_cost(StepCost { base_s: 0.0, s_per_token: 0.001 }); // budget: 2 x batch, >= batch + 16
    a.add_request(request(1, "heavy", 300, 8)).unwrap();
    let alone = a.schedule(Instant::now()).unwrap();
    assert_eq!(alone.num_batched_tokens, 300, "nothing else on the device: one step for the prompt");
    fake_step(&mut a, &alone);
    a.add_request(request(2, "heavy", 300, 8)).unwrap();
    b.add_request(request(1, "light", 8, 2)).unwrap();
    let out = a.schedule(Instant::now()).unwrap();
    // One decode of request 1 and 16 prompt tokens of request 2, not its 300.
    assert_eq!(out.num_batched_tokens, 1 + 16);
    fake_step(&mut a, &out);
    run_to_end(&mut b);
    let out = a.schedule(Instant::now()).unwrap();
    assert_eq!(out.num_batched_tokens, 1 + 300 - 16, "model B is done: the budget is whole again");
}

#[test]
fn a_dropped_model_takes_its_backlog_with_it() {
    let ledger = Arc::new(DeviceLedger::default());
    let mut a = model(&ledger, 0.001);
    a.add_request(request(1, "served", 32, 64)).unwrap();
    for _ in 0..10 {
        let out = a.schedule(Instant::now()).unwrap();
        fake_step(&mut a, &out);
    }
    {
        let mut gone = model(&ledger, 0.001);
        gone.add_request(request(1, "never-served", 8, 2)).unwrap();
        assert!(a.fairness().seat().others_busy());
    }
    assert!(!a.fairness().seat().others_busy());
    // With the dropped model's request still counted, "never-served" (counter 0) would be the
    // floor a newcomer is lifted to; gone with its model, the floor is "served"'s counter.
    a.add_request(request(2, "new", 8, 2)).unwrap();
    assert!(ledger.counter("served") > 0.0);
    assert_eq!(ledger.counter("new"), ledger.counter("served"));
}

#[test]
fn a_model_with_nothing_running_starts_nothing_while_another_guards_the_device() {
    let ledger = Arc::new(DeviceLedger::default());
    let (mut a, mut b) = (model(&ledger, 0.001), model(&ledger, 0.001));
    let now = Instant::now();
    let until = now + Duration::from_millis(200);
    a.guard_device(Some(until));
    let (a_seat, b_seat) = (a.fairness().seat().id(), b.fairness().seat().id());
    assert_eq!(ledger.guarded_for(b_seat, now), Some(until));
    assert_eq!(ledger.guarded_for(a_seat, now), None, "its own guard holds no seat back");
    assert_eq!(ledger.guarded_for(b_seat, until), None, "a guard ends at its instant");
    // b is idle: its waiting request waits for the guard, and says until when.
    b.add_request(request(1, "t", 10, 4)).unwrap();
    let out = b.schedule(now).unwrap();
    assert!(out.scheduled.is_empty(), "{out:?}");
    assert_eq!(out.wait_until, Some(until));
    // a's own guard never holds a back.
    a.add_request(request(1, "t", 10, 4)).unwrap();
    assert_eq!(a.schedule(now).unwrap().scheduled.len(), 1);
    // Once the guard is over, or lifted, b starts.
    assert_eq!(b.schedule(until).unwrap().scheduled.len(), 1);
    a.guard_device(None);
    assert_eq!(ledger.guarded_for(b_seat, now), None);
}
