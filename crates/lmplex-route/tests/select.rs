//! `TierSet::select` on fixed signals: every mode, budgets, cooldowns, load and prefix
//! affinity; and, as a property, that no selection ever exceeds a budget.

use lmplex_core::{Error, Mode, Route, Tier};
use lmplex_route::{
    predict, step_at, Backlog, Deadline, Device, ModelFacts, ModelSignals, PromptFacts, RouteRequest, Signals, TierSet,
    Work,
};
use proptest::prelude::*;
use std::collections::HashMap;

fn facts(name: &str, quality: f64, price_in: f64, price_out: f64) -> ModelFacts {
    ModelFacts {
        name: name.into(),
        quality,
        price_per_million_input_tokens: price_in,
        price_per_million_output_tokens: price_out,
    }
}

/// An idle model: 8 slots, `tpot` seconds per output token, 1 ms per prompt token.
fn idle(tpot: f64) -> ModelSignals {
    ModelSignals {
        available: true,
        num_running: 0,
        num_waiting: 0,
        max_num_seqs: 8,
        kv_usage: 0.1,
        prefill_s_per_token: 0.001,
        time_per_output_token_s: tpot,
        batch_size: 1.0,
        step_s_per_seq: 0.0,
        backlog: Backlog::default(),
        device: Device::default(),
        calibration: 1.0,
    }
}

/// small (fast, cheap), mid (balanced), big (deep, best and dearest).
fn setup() -> (TierSet, Signals) {
    let tiers = TierSet {
        fast: vec!["small".into()],
        balanced: vec!["mid".into()],
        deep: vec!["big".into()],
        max: vec!["big".into()],
    };
    let mut s = Signals::default();
    for (f, tpot) in [
        (facts("small", 40.0, 0.05, 0.2), 0.01),
        (facts("mid", 50.0, 0.2, 0.8), 0.02),
        (facts("big", 60.0, 1.0, 4.0), 0.04),
    ] {
        s.models.insert(f.name.clone(), (f, idle(tpot)));
    }
    (tiers, s)
}

fn request(mode: Mode, tier: Option<Tier>, latency: Option<f64>, cost: Option<f64>) -> RouteRequest {
    let prompt = PromptFacts { prompt_tokens: 100, cached_tokens: 0 };
    RouteRequest {
        route: Route { mode: Some(mode), tier, max_latency_ms: latency, max_cost: cost },
        max_tokens: 50,
        prompts: ["small", "mid", "big"].iter().map(|m| (m.to_string(), prompt)).collect(),
    }
}

fn chosen(tiers: &TierSet, s: &Signals, r: &RouteRequest) -> String {
    tiers.select(r, s).unwrap().model
}

#[test]
fn each_mode_picks_by_its_rule() {
    let (tiers, s) = setup();
    // Predicted latency: 100 prompt tokens x 1 ms + 50 x tpot: small 600 ms, mid 1100, big 2100.
    // Cost bound: 100 x in + 50 x out per million: small 1.5e-5, mid 6e-5, big 3e-4.
    let sel = tiers.select(&request(Mode::Fixed, Some(Tier::Fast), None, None), &s).unwrap();
    assert_eq!((sel.model.as_str(), sel.tier), ("small", Tier::Fast));
    assert!((sel.predicted_latency_ms - 600.0).abs() < 1e-9 && (sel.max_cost - 1.5e-5).abs() < 1e-12);
    assert_eq!(chosen(&tiers, &s, &request(Mode::Fixed, Some(Tier::Deep), None, None)), "big");
    assert_eq!(chosen(&tiers, &s, &request(Mode::Balanced, None, None, None)), "small");
    let deep = tiers.select(&request(Mode::Deep, None, None, None), &s).unwrap();
    assert_eq!(
        (deep.model.as_str(), deep.tier, deep.fallbacks.clone()),
        ("big", Tier::Deep, vec!["mid".into(), "small".into()])
    );
    // Budgets move each mode down: deep under a cost cap, max under a latency cap.
    assert_eq!(chosen(&tiers, &s, &request(Mode::Deep, None, None, Some(1e-4))), "mid");
    assert_eq!(chosen(&tiers, &s, &request(Mode::Max, None, Some(1500.0), None)), "mid");
    assert_eq!(chosen(&tiers, &s, &request(Mode::Max, None, Some(1500.0), Some(2e-5))), "small");
    // A tier restricts every mode.
    assert_eq!(chosen(&tiers, &s, &request(Mode::Deep, Some(Tier::Balanced), None, None)), "mid");
}

#[test]
fn nothing_fits_is_an_error_with_the_best_figures() {
    let (tiers, s) = setup();
    let e = tiers.select(&request(Mode::Deep, None, Some(500.0), None), &s).unwrap_err();
    assert!(matches!(e, Error::BudgetUnsatisfiable(_)), "{e}");
    assert_eq!(
        e.to_string(),
        "no model meets the budget: the best predicted latency is 600 ms and the lowest cost bound 0.000015"
    );
    let e = tiers.select(&request(Mode::Fixed, Some(Tier::Deep), None, Some(1e-4)), &s).unwrap_err();
    assert!(matches!(e, Error::BudgetUnsatisfiable(_)), "{e}");
    let empty = TierSet { fast: vec!["small".into()], ..Default::default() };
    let e = empty.select(&request(Mode::Fixed, Some(Tier::Max), None, None), &s).unwrap_err();
    assert!(matches!(&e, Error::Capacity(m) if m == "tier 'max' has no models"), "{e}");
}

#[test]
fn a_model_in_cooldown_is_skipped_and_the_next_candidate_used() {
    let (tiers, mut s) = setup();
    s.models.get_mut("big").unwrap().1.available = false;
    assert_eq!(chosen(&tiers, &s, &request(Mode::Deep, None, None, None)), "mid");
    for m in ["small", "mid"] {
        s.models.get_mut(m).unwrap().1.available = false;
    }
    let e = tiers.select(&request(Mode::Deep, None, None, None), &s).unwrap_err();
    assert!(matches!(e, Error::Capacity(_)), "{e}");
}

#[test]
fn a_flooded_model_loses_latency_bound_requests_until_the_flood_ends() {
    let (tiers, mut s) = setup();
    let bounded = request(Mode::Deep, None, Some(3000.0), None);
    assert_eq!(chosen(&tiers, &s, &bounded), "big");
    // Every slot runs a request that may generate 100 more tokens; 16 more wait, none budgeted.
    let big = &mut s.models.get_mut("big").unwrap().1;
    (big.num_running, big.num_waiting) = (8, 16);
    big.backlog.running_left = vec![100; 8];
    big.backlog.behind_deadlines = Work { requests: 16, prompt_tokens: 0, output_tokens: 1600 };
    // A budgeted call waits for the first slot only: 100 steps x 0.04 s, then 2.1 s of its own.
    assert_eq!(chosen(&tiers, &s, &bounded), "mid");
    let p = |s: &Signals, budget| predict(&s.models["big"].0, &s.models["big"].1, bounded.prompts["big"], 50, budget);
    assert!((p(&s, Some(3000.0)).latency_ms - 6100.0).abs() < 1e-9, "{:?}", p(&s, Some(3000.0)));
    // Without a budget it queues behind the 16: two rounds of 100 more steps.
    assert!((p(&s, None).latency_ms - 14100.0).abs() < 1e-9, "{:?}", p(&s, None));
    assert_eq!(chosen(&tiers, &s, &request(Mode::Deep, None, None, None)), "big", "no latency budget");
    // Budgeted requests waiting go before it as well: 16 x 100 tokens over 8 slots.
    let big = &mut s.models.get_mut("big").unwrap().1;
    (big.backlog.ahead, big.backlog.behind_deadlines) = (big.backlog.behind_deadlines, Work::default());
    assert!((p(&s, Some(3000.0)).latency_ms - 14100.0).abs() < 1e-9, "{:?}", p(&s, Some(3000.0)));
    // Their prompts are prefilled first: 800 tokens x 1 ms.
    s.models.get_mut("big").unwrap().1.backlog.ahead.prompt_tokens = 800;
    assert!((p(&s, Some(3000.0)).latency_ms - 14900.0).abs() < 1e-9, "{:?}", p(&s, Some(3000.0)));
    let big = &mut s.models.get_mut("big").unwrap().1;
    (big.num_running, big.num_waiting, big.backlog) =
        (2, 0, Backlog { running_left: vec![10, 10], ..Default::default() });
    assert_eq!(chosen(&tiers, &s, &bounded), "big");
    // KV nearly full counts as no free slot: the first running request ends within 10 steps.
    s.models.get_mut("big").unwrap().1.kv_usage = 0.97;
    let sel = tiers.select(&bounded, &s).unwrap();
    assert!((sel.predicted_latency_ms - 2500.0).abs() < 1e-9, "{sel:?}");
}

#[test]
fn a_request_waits_for_a_running_deadline_it_would_break() {
    let (tiers, mut s) = setup();
    let big = &mut s.models.get_mut("big").unwrap().1;
    big.step_s_per_seq = 0.01; // 0.04 s a step at batch 1, 0.05 at 2
    (big.num_running, big.backlog.running_left) = (1, vec![40]);
    // 40 tokens left: 1.6 s at batch 1, 2.0 s at 2. With 1.8 s to its deadline, joining breaks it.
    big.backlog.deadlines = vec![Deadline { left: 40, slack_s: 1.8 }];
    let p = |s: &Signals, budget| predict(&s.models["big"].0, &s.models["big"].1, PromptFacts::default(), 10, budget);
    // A newcomer, whatever its budget, waits until it ends: 1.6 s, then 10 tokens at batch 2.
    for budget in [Some(5000.0), Some(1000.0), None] {
        assert!((p(&s, budget).latency_ms - (1600.0 + 10.0 * 50.0)).abs() < 1e-9, "{:?}", p(&s, budget));
    }
    // With room to spare (or already late) the running request does not hold anyone back.
    for slack_s in [2.5, 1.0] {
        s.models.get_mut("big").unwrap().1.backlog.deadlines[0].slack_s = slack_s;
        assert!((p(&s, None).latency_ms - 500.0).abs() < 1e-9, "{slack_s}: {:?}", p(&s, None));
    }
    assert_eq!(tiers.select(&request(Mode::Fixed, Some(Tier::Deep), None, None), &s).unwrap().model, "big");
}

#[test]
fn an_idle_model_starts_after_a_guarded_deadline_on_its_device_and_shares_it_after() {
    let f = facts("m", 1.0, 0.0, 0.0);
    let prompt = PromptFacts { prompt_tokens: 100, cached_tokens: 0 };
    // Alone: 100 ms of prefill and 10 tokens of 20 ms.
    let mut s = idle(0.02);
    let alone = predict(&f, &s, prompt, 10, Some(1e4));
    assert!((alone.latency_ms - 300.0).abs() < 1e-9, "{alone:?}");
    // Another model guards a deadline for 0.5 s and stays busy 0.1 s after it, during which
    // this one runs 3x slower: 0.1 s of shared time does 1/30 s of its work.
    s.device = Device { shared_factor: 3.0, others_busy_s: 0.6, guarded_s: 0.5 };
    let p = predict(&f, &s, prompt, 10, Some(1e4));
    let expected = 500.0 + 300.0 + 100.0 * (1.0 - 1.0 / 3.0);
    assert!((p.latency_ms - expected).abs() < 1e-9, "{p:?} vs {expected}");
    // What calibration measures against adds up to the same.
    assert!((1e3 * (p.queue_and_prefill_s + 10.0 * p.time_per_output_token_s) - expected).abs() < 1e-9);
    // A model already running is not held by the guard (it shares the device already): its
    // 0.3 s alone take 0.6 s shared, 0.2 s of its work, and 0.1 s alone.
    s.num_running = 1;
    s.backlog.running_left = vec![5];
    let p = predict(&f, &s, prompt, 10, Some(1e4));
    assert!((p.latency_ms - 700.0).abs() < 1e-9, "{p:?}");
}

#[test]
fn a_request_is_predicted_at_the_batch_it_will_join() {
    let (tiers, mut s) = setup();
    let big = &mut s.models.get_mut("big").unwrap().1;
    big.step_s_per_seq = 0.01; // measured at batch 1
    (big.num_running, big.num_waiting) = (3, 0); // it joins a batch of 4: 0.04 + 3 x 0.01 s a token
    let sel = tiers.select(&request(Mode::Fixed, Some(Tier::Deep), None, None), &s).unwrap();
    assert!((sel.predicted_latency_ms - (100.0 + 50.0 * 70.0)).abs() < 1e-9, "{sel:?}");
    let big = &mut s.models.get_mut("big").unwrap().1;
    (big.num_running, big.num_waiting, big.batch_size) = (6, 9, 4.0); // full: a batch of 8, 4 above
    big.backlog.running_left = vec![20, 20, 40, 40, 60, 60];
    big.backlog.behind_deadlines = Work { requests: 9, prompt_tokens: 0, output_tokens: 270 };
    let sel = tiers.select(&request(Mode::Fixed, Some(Tier::Deep), None, None), &s).unwrap();
    // Slots free at steps 0, 0, 20, 20, 40, 40, 60, 60; the 9 waiting take 30 steps each from
    // the first to free: its slot frees at step 50. Then 50 tokens, all at 0.08 s a step.
    let expected = 50.0 * 80.0 + 100.0 + 50.0 * 80.0;
    assert!((sel.predicted_latency_ms - expected).abs() < 1e-9, "{sel:?} vs {expected}");
    // Another model on the device busy for longer than this request: every step and the
    // prefill take twice as long.
    s.models.get_mut("big").unwrap().1.device = Device { shared_factor: 2.0, others_busy_s: 1e6, guarded_s: 0.0 };
    let sel = tiers.select(&request(Mode::Fixed, Some(Tier::Deep), None, None), &s).unwrap();
    assert!((sel.predicted_latency_ms - 2.0 * expected).abs() < 1e-6, "{sel:?} vs {expected}");
    // Busy for 2 s only: those 2 s do 1 s of this request's work; the rest runs alone.
    s.models.get_mut("big").unwrap().1.device.others_busy_s = 2.0;
    let sel = tiers.select(&request(Mode::Fixed, Some(Tier::Deep), None, None), &s).unwrap();
    assert!((sel.predicted_latency_ms - (expected + 1000.0)).abs() < 1e-6, "{sel:?} vs {expected}");
    s.models.get_mut("big").unwrap().1.device = Device::default();
    // Recent requests ran 1.5x over their predictions: the whole prediction is scaled.
    s.models.get_mut("big").unwrap().1.calibration = 1.5;
    let sel = tiers.select(&request(Mode::Fixed, Some(Tier::Deep), None, None), &s).unwrap();
    assert!((sel.predicted_latency_ms - 1.5 * expected).abs() < 1e-6, "{sel:?}");
}

#[test]
fn prefix_affinity_and_load_break_ties_between_equal_models() {
    let tiers = TierSet { balanced: vec!["a".into(), "b".into()], ..Default::default() };
    let mut s = Signals::default();
    for n in ["a", "b"] {
        s.models.insert(n.into(), (facts(n, 50.0, 0.1, 0.1), idle(0.01)));
    }
    let mut r = request(Mode::Balanced, None, None, None);
    r.prompts =
        ["a", "b"].iter().map(|m| (m.to_string(), PromptFacts { prompt_tokens: 100, cached_tokens: 0 })).collect();
    assert_eq!(chosen(&tiers, &s, &r), "a", "ties end on the name");
    r.prompts.get_mut("b").unwrap().cached_tokens = 96; // b holds the prefix: 96 ms less prefill
    assert_eq!(chosen(&tiers, &s, &r), "b");
    // Fixed: the least-loaded model of the tier.
    let mut fixed = r.clone();
    (fixed.route.mode, fixed.route.tier) = (Some(Mode::Fixed), Some(Tier::Balanced));
    s.models.get_mut("b").unwrap().1.num_running = 3;
    assert_eq!(chosen(&tiers, &s, &fixed), "a");
}

#[test]
fn configs_and_requests_are_checked() {
    let (tiers, _) = setup();
    assert!(tiers.validate(&["small", "mid", "big"]).is_ok());
    let e = tiers.validate(&["small", "mid"]).unwrap_err().to_string();
    assert_eq!(e, "tiers.deep: 'big' is not a served model (served: [\"small\", \"mid\"])");
    let twice = TierSet { fast: vec!["small".into(), "small".into()], ..Default::default() };
    assert_eq!(twice.validate(&["small"]).unwrap_err().to_string(), "tiers.fast: 'small' is listed twice");
    assert_eq!(Tier::parse("slow").unwrap_err().to_string(), "unknown tier 'slow': use fast, balanced, deep or max");
    assert_eq!(Mode::parse("cheap").unwrap_err().to_string(), "unknown mode 'cheap': use fixed, balanced, deep or max");
    let e = request(Mode::Deep, None, Some(-1.0), None).validate().unwrap_err().to_string();
    assert_eq!(e, "max_latency_ms must be a number >= 0, got -1");
    assert_eq!(request(Mode::Fixed, None, None, None).validate().unwrap_err().to_string(), "mode 'fixed' needs a tier");
    // TOML and JSON share the derive: missing tiers are empty, an unknown one is refused.
    let read: TierSet = serde_json::from_str(r#"{"fast": ["x"], "max": ["x"]}"#).unwrap();
    assert_eq!(read.tiers_of("x"), vec![Tier::Fast, Tier::Max]);
    let e = serde_json::from_str::<TierSet>(r#"{"slow": ["x"]}"#).unwrap_err().to_string();
    assert!(e.contains("unknown field `slow`"), "{e}");
}

#[test]
fn a_route_defaults_its_mode_and_merges_field_by_field() {
    let r: Route = serde_json::from_str(r#"{"tier": "fast", "max_cost": 0.001}"#).unwrap();
    assert_eq!((r.mode(), r.tier, r.max_cost), (Mode::Fixed, Some(Tier::Fast), Some(0.001)));
    assert_eq!(Route::default().mode(), Mode::Balanced);
    let tenant = Route { mode: Some(Mode::Deep), max_latency_ms: Some(900.0), max_cost: Some(0.5), tier: None };
    let merged = Route { max_cost: Some(0.01), ..Default::default() }.or(&tenant);
    assert_eq!(merged, Route { mode: Some(Mode::Deep), tier: None, max_latency_ms: Some(900.0), max_cost: Some(0.01) });
    let e = serde_json::from_str::<Route>(r#"{"mode": "cheap"}"#).unwrap_err().to_string();
    assert!(e.contains("unknown variant `cheap`"), "{e}");
    let e = serde_json::from_str::<Route>(r#"{"budget": 1}"#).unwrap_err().to_string();
    assert!(e.contains("unknown field `budget`"), "{e}");
}

fn arb_signals() -> impl Strategy<Value = ModelSignals> {
    (any::<bool>(), 0usize..16, 0usize..64, 1usize..16, 0.0..1.0f64, 0.0..0.01f64, 0.0..0.2f64, 0usize..500).prop_map(
        |(available, num_running, num_waiting, max_num_seqs, kv_usage, prefill, tpot, left)| ModelSignals {
            available,
            num_running,
            num_waiting,
            max_num_seqs,
            kv_usage,
            prefill_s_per_token: prefill,
            time_per_output_token_s: tpot,
            batch_size: 1.0 + kv_usage * 4.0,
            step_s_per_seq: tpot / 4.0,
            backlog: Backlog {
                running_left: (0..num_running.min(max_num_seqs)).map(|i| left * i / 16).collect(),
                ahead: Work {
                    requests: num_waiting / 3,
                    prompt_tokens: 40 * num_waiting,
                    output_tokens: left * num_waiting,
                },
                behind_deadlines: Work {
                    requests: num_waiting - num_waiting / 3,
                    prompt_tokens: 7,
                    output_tokens: left,
                },
                deadlines: vec![Deadline { left: left / 2, slack_s: tpot * left as f64 }],
            },
            device: Device {
                shared_factor: 1.0 + max_num_seqs as f64 / 8.0,
                others_busy_s: tpot * left as f64,
                guarded_s: prefill * left as f64,
            },
            calibration: 1.0 + kv_usage,
        },
    )
}

type ArbModel = (ModelSignals, f64, f64, f64, usize, usize);

proptest! {
    #[test]
    fn a_selection_never_exceeds_a_budget(
        models in prop::collection::vec(
            (arb_signals(), 0.0..100.0f64, 0.0..10.0f64, 0.0..40.0f64, 1usize..4000, 0usize..4000), 1..6),
        mode in prop::sample::select(vec![Mode::Fixed, Mode::Balanced, Mode::Deep, Mode::Max]),
        tier in prop::option::of(prop::sample::select(Tier::ALL.to_vec())),
        max_latency_ms in prop::option::of(0.0..60_000.0f64),
        max_cost in prop::option::of(0.0..0.05f64),
        max_tokens in 1usize..2000,
    ) {
        let tier = if mode == Mode::Fixed { Some(tier.unwrap_or(Tier::Fast)) } else { tier };
        let route = Route { mode: Some(mode), tier, max_latency_ms, max_cost };
        let r = RouteRequest { route, max_tokens, prompts: HashMap::new() };
        check_budgets(models, r)?;
    }
}

/// Models `m0..` in two of every three tiers each; the selection and its fallbacks all fit.
fn check_budgets(models: Vec<ArbModel>, mut r: RouteRequest) -> Result<(), TestCaseError> {
    let mut tiers = TierSet::default();
    let mut s = Signals::default();
    for (i, (sig, quality, pin, pout, prompt, cached)) in models.into_iter().enumerate() {
        let name = format!("m{i}");
        for t in Tier::ALL {
            if !(i + t as usize).is_multiple_of(3) {
                let list = match t {
                    Tier::Fast => &mut tiers.fast,
                    Tier::Balanced => &mut tiers.balanced,
                    Tier::Deep => &mut tiers.deep,
                    Tier::Max => &mut tiers.max,
                };
                list.push(name.clone());
            }
        }
        r.prompts.insert(name.clone(), PromptFacts { prompt_tokens: prompt, cached_tokens: cached });
        s.models.insert(name.clone(), (facts(&name, quality, pin, pout), sig));
    }
    prop_assert!(r.validate().is_ok());
    let Ok(sel) = tiers.select(&r, &s) else { return Ok(()) };
    let within = |v: f64, budget: Option<f64>| budget.is_none_or(|b| v <= b);
    prop_assert!(within(sel.max_cost, r.route.max_cost) && within(sel.predicted_latency_ms, r.route.max_latency_ms));
    for m in std::iter::once(&sel.model).chain(&sel.fallbacks) {
        let (f, sig) = &s.models[m];
        let p = predict(f, sig, r.prompts[m], r.max_tokens, r.route.max_latency_ms);
        prop_assert!(sig.available, "{m} is cooling down");
        prop_assert!(within(p.max_cost, r.route.max_cost), "{m}: cost {} > {:?}", p.max_cost, r.route.max_cost);
        let b = r.route.max_latency_ms;
        prop_assert!(within(p.latency_ms, b), "{m}: {} ms > {:?}", p.latency_ms, b);
        if let Some(t) = r.route.tier {
            prop_assert!(tiers.models(t).contains(m), "{m} is not in {t:?}");
        }
    }
    Ok(())
}

#[test]
fn a_step_below_the_measured_batch_follows_the_line_but_never_under_its_share() {
    // Steps of 24 ms at 8 requests, growing 2 ms a request: 10 ms alone (the line).
    assert!((step_at(0.024, 8.0, 0.002, 1.0) - 0.010).abs() < 1e-12);
    assert!((step_at(0.024, 8.0, 0.002, 10.0) - 0.028).abs() < 1e-12, "above: the line");
    // A growth too steep for the line: each request keeps at least its share, 3 ms at 8.
    assert!((step_at(0.024, 8.0, 0.010, 1.0) - 0.003).abs() < 1e-12);
    assert!((step_at(0.024, 0.0, 0.002, 1.0) - 0.026).abs() < 1e-12, "no batch measured yet: the line");
}
