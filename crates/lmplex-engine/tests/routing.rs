//! `ModelHost::submit` of routed calls over real (tiny) engines: every mode on the engines' own
//! signals, budgets kept or refused, a tenant's default route, prefix affinity, the error
//! cooldown, load adaptation (a flooded deep model loses a latency-bound call to the fast
//! one, and wins it back once the flood ends), and that a routed call looks its tenant up once
//! and renders its prompt once per candidate.

mod common;

use common::{ids_request, write_tiny_llama};
use lmplex_core::{Error, Mode, ModelConfig, Route, SamplingParams, TenantConfig, Tier};
use lmplex_engine::{Call, Engine, ModelHost, Prompt, Request, Submitted, Target, Tenants};
use lmplex_route::{Backlog, PromptFacts, TierSet, Work};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// The tests measure time: one at a time, so one's load is not another's signal.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

/// "small" (fast tier, quality 40, cheap) and "big" (deep tier, quality 60, dear), the same
/// tiny checkpoint; big runs one request at a time.
fn host(tenants: Vec<TenantConfig>) -> (ModelHost, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(dir.path(), 7);
    let cfg = |name: &str, quality: f64, price: f64, seqs: usize| ModelConfig {
        served_model_name: Some(name.into()),
        max_model_len: Some(512),
        max_model_concurrency: seqs,
        quality,
        price_per_million_input_tokens: price,
        price_per_million_output_tokens: 2.0 * price,
        ..ModelConfig::new(dir.path().to_string_lossy())
    };
    let host = ModelHost::with_tenants(Some(1 << 30), Arc::new(Tenants::new(tenants).unwrap()));
    host.load_all(&[cfg("small", 40.0, 1.0, 8), cfg("big", 60.0, 10.0, 1)]).unwrap();
    let tiers = TierSet { fast: vec!["small".into()], deep: vec!["big".into()], ..Default::default() };
    host.set_tiers(tiers).unwrap();
    (host, dir)
}

fn req(n_prompt: u32, max_tokens: usize) -> Request {
    let params = SamplingParams { max_tokens, temperature: 0.0, ignore_eos: true, ..Default::default() };
    ids_request((3..3 + n_prompt).collect(), params)
}

fn route(mode: Mode, max_latency_ms: Option<f64>, max_cost: Option<f64>) -> Route {
    Route { mode: Some(mode), tier: None, max_latency_ms, max_cost }
}

/// `reqs` as one call of the tenant they name, under `r`.
fn call(host: &ModelHost, r: &Route, reqs: &[Request]) -> lmplex_core::Result<Call> {
    Call::by_name(host.tenants(), r, reqs.to_vec())
}

/// Submits `reqs` as one routed call under `r`.
fn submit_routed(host: &ModelHost, r: &Route, reqs: &[Request]) -> lmplex_core::Result<Submitted> {
    host.submit(&call(host, r, reqs)?, &Target::Routed)
}

/// `engine`'s predicted latency (ms) and cost bound for `reqs` under `r`, or its refusal.
fn check_budget(host: &ModelHost, engine: &Engine, r: &Route, reqs: &[Request]) -> lmplex_core::Result<(f64, f64)> {
    host.check_budget(engine, &call(host, r, reqs)?)
}

/// `req`'s prompt as `engine` sees it now.
fn prompt_facts(host: &ModelHost, engine: &Engine, req: &Request) -> PromptFacts {
    engine.prompt_facts(&engine.prepare(&call(host, &Route::default(), std::slice::from_ref(req)).unwrap()).unwrap())
}

/// Runs a routed call to the end; the model it ran on.
fn run(host: &ModelHost, r: &Route, reqs: &[Request]) -> lmplex_core::Result<String> {
    let routed = submit_routed(host, r, reqs)?;
    for h in routed.handles {
        h.collect_blocking()?;
    }
    Ok(routed.model)
}

#[test]
fn modes_and_budgets_choose_from_the_engines_own_signals() {
    let _serial = serial();
    let (host, _dir) = host(vec![]);
    for name in ["small", "big"] {
        let s = host.get(name).unwrap().route_signals();
        assert!(s.available && s.prefill_s_per_token > 0.0 && s.time_per_output_token_s > 0.0, "{name}: {s:?}");
        assert!(s.max_num_seqs >= 1 && s.backlog == Backlog::default(), "idle: no work ahead: {s:?}");
    }
    let call = [req(20, 8)];
    assert_eq!(run(&host, &route(Mode::Deep, None, None), &call).unwrap(), "big");
    assert_eq!(run(&host, &route(Mode::Balanced, None, None), &call).unwrap(), "small", "the cheaper");
    let fixed = Route { tier: Some(Tier::Fast), ..Default::default() };
    let routed = submit_routed(&host, &fixed, &call).unwrap();
    let how = routed.routed.unwrap();
    assert_eq!((routed.model.as_str(), how.tier, how.fallbacks), ("small", Tier::Fast, 0));
    // Cost bound: 20 x in + 8 x out per million. big: 20e-5 + 16e-5 = 3.6e-4; small 3.6e-5.
    let deep = submit_routed(&host, &route(Mode::Deep, None, None), &call).unwrap();
    let how = deep.routed.unwrap();
    assert!((how.max_cost - 3.6e-4).abs() < 1e-12, "{}", how.max_cost);
    assert!(how.predicted_latency_ms > 0.0);
    drop(deep);
    assert_eq!(run(&host, &route(Mode::Deep, None, Some(1e-4)), &call).unwrap(), "small", "big is over budget");
    let Err(Error::BudgetUnsatisfiable(m)) = submit_routed(&host, &route(Mode::Deep, None, Some(1e-5)), &call) else {
        panic!("a budget below every model's cost is refused")
    };
    assert!(m.contains("lowest cost bound 0.000036"), "{m}");
    let Err(Error::BudgetUnsatisfiable(m)) = submit_routed(&host, &route(Mode::Max, Some(0.0), None), &call) else {
        panic!("a zero latency budget is refused")
    };
    assert!(m.contains("best predicted latency"), "{m}");
    // The named model's own check.
    let big = host.get("big").unwrap();
    assert!(matches!(
        check_budget(&host, &big, &route(Mode::Deep, None, Some(1e-4)), &call),
        Err(Error::BudgetUnsatisfiable(_))
    ));
    let (latency, cost) = check_budget(&host, &big, &Route::default(), &call).unwrap();
    assert!(latency > 0.0 && (cost - 3.6e-4).abs() < 1e-12);
    // A call shaped for a longer context is predicted as this model runs it: 512 - 20 tokens at most.
    let (_, cost) = check_budget(&host, &big, &Route::default(), &[req(20, 10_000)]).unwrap();
    assert!((cost - (20.0 * 10.0 + 492.0 * 20.0) / 1e6).abs() < 1e-12, "{cost}");
    // Bad routes and tiers name the value.
    let e = submit_routed(&host, &route(Mode::Deep, Some(-1.0), None), &call).err().unwrap();
    assert_eq!(e.to_string(), "max_latency_ms must be a number >= 0, got -1");
    let e = submit_routed(&host, &Route { tier: Some(Tier::Max), ..Default::default() }, &call).err().unwrap();
    assert_eq!(e.to_string(), "tier 'max' has no models");
    let e = host.set_tiers(TierSet { max: vec!["huge".into()], ..Default::default() }).unwrap_err();
    assert!(e.to_string().contains("tiers.max: 'huge' is not a served model"), "{e}");
}

#[test]
fn a_tenants_default_route_fills_what_the_call_leaves_out() {
    let tenant = TenantConfig {
        route: Some(Route { mode: Some(Mode::Deep), max_cost: Some(1e-4), ..Default::default() }),
        ..TenantConfig::new("acme")
    };
    let _serial = serial();
    let (host, _dir) = host(vec![tenant]);
    let call = [Request { tenant: Some("acme".into()), ..req(20, 8) }];
    assert_eq!(run(&host, &Route::default(), &call).unwrap(), "small", "deep, but big is over the default cost");
    let own = Route { max_cost: Some(1.0), ..Default::default() };
    assert_eq!(run(&host, &own, &call).unwrap(), "big", "the call's budget wins");
}

#[test]
fn a_cached_prefix_and_the_error_cooldown_are_seen() {
    let _serial = serial();
    let (host, _dir) = host(vec![]);
    let (small, big) = (host.get("small").unwrap(), host.get("big").unwrap());
    let long = req(100, 1);
    big.generate(std::slice::from_ref(&long)).unwrap();
    let t = Instant::now();
    while prompt_facts(&host, &big, &long).cached_tokens == 0 {
        assert!(t.elapsed() < Duration::from_secs(5), "the prefix set is published once the loop is idle");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(prompt_facts(&host, &big, &long).cached_tokens, 96, "6 whole blocks of 16; one token computed");
    assert_eq!(prompt_facts(&host, &small, &long).cached_tokens, 0);
    // A model that failed is skipped until its cooldown ends.
    big.live_signals().start_cooldown();
    assert!(!big.route_signals().available);
    assert_eq!(run(&host, &route(Mode::Deep, None, None), &[req(20, 4)]).unwrap(), "small");
}

#[test]
fn a_flooded_deep_model_loses_latency_bound_calls_until_the_flood_ends() {
    let _serial = serial();
    let (host, _dir) = host(vec![]);
    let big = host.get("big").unwrap();
    let call = [req(20, 16)];
    let idle_ms = check_budget(&host, &big, &Route::default(), &call).unwrap().0;
    let small = host.get("small").unwrap();
    let small_ms = check_budget(&host, &small, &Route::default(), &call).unwrap().0;
    // Room for small's prediction beside the flood: its steps at the shared factor (2 until
    // measured) while big stays busy, and these tiny models' step times vary by far more.
    let budget = 10.0 * idle_ms.max(small_ms);
    let bound = route(Mode::Deep, Some(budget), None);
    assert_eq!(run(&host, &bound, &call).unwrap(), "big");
    // Flood big (one slot) with 40 long requests (256 tokens each) whose deadlines come before
    // the bound call's: it would queue behind all of them. (Requests without a deadline would
    // not hold it back: it goes before them, and a tiny model's running request is too short.)
    let urgent = Route { max_latency_ms: Some(1.0), ..Default::default() };
    let flood: Vec<_> = (0..40)
        .flat_map(|i| {
            big.submit_prepared(big.prepare(&self::call(&host, &urgent, &[req(30 + i, 256)]).unwrap()).unwrap())
                .unwrap()
        })
        .collect();
    let t = Instant::now();
    while check_budget(&host, &big, &bound, &call).is_ok() {
        assert!(t.elapsed() < Duration::from_secs(10), "the queue shows in big's prediction");
        std::thread::sleep(Duration::from_millis(2));
    }
    let s = big.route_signals();
    assert!(s.backlog.ahead.requests > 0 && s.backlog.behind_deadlines == Work::default(), "{s:?}");
    let routed = submit_routed(&host, &bound, &call).unwrap();
    assert_eq!(routed.model, "small", "big's queue is over the budget");
    assert!(routed.routed.unwrap().predicted_latency_ms <= budget);
    drop(routed);
    for h in flood {
        h.collect_blocking().unwrap();
    }
    let t = Instant::now();
    while check_budget(&host, &big, &bound, &call).is_err() {
        assert!(t.elapsed() < Duration::from_secs(10), "big's queue drains");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(run(&host, &bound, &call).unwrap(), "big", "back once the flood ends");
}

#[test]
fn a_budgeted_call_goes_before_queued_calls_without_one() {
    let _serial = serial();
    let (host, _dir) = host(vec![]);
    let big = host.get("big").unwrap();
    let flood: Vec<_> = (0..12).map(|i| big.submit(&req(30 + i, 256)).unwrap()).collect();
    let t = Instant::now();
    while big.stats().num_running.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        assert!(t.elapsed() < Duration::from_secs(10), "the flood starts");
        std::thread::sleep(Duration::from_millis(1));
    }
    let budgeted = Route { max_latency_ms: Some(1e9), ..Default::default() };
    let named = host.submit(&call(&host, &budgeted, &[req(20, 8)]).unwrap(), &Target::Named("big".into())).unwrap();
    for h in named.handles {
        h.collect_blocking().unwrap();
    }
    // It waited for the request running when it came (and perhaps the next), not for the queue.
    let waiting = big.stats().num_waiting.load(std::sync::atomic::Ordering::Relaxed);
    assert!(waiting >= 6, "{waiting} of 12 still wait");
    drop(flood);
}

#[test]
fn a_routed_call_looks_its_tenant_up_once_and_renders_once_per_candidate() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(dir.path(), 11);
    let template = "{% for m in messages %}{{ m.content }} {% endfor %}";
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        serde_json::json!({"chat_template": template}).to_string(),
    )
    .unwrap();
    let cfg = |name: &str, quality: f64| ModelConfig {
        served_model_name: Some(name.into()),
        max_model_len: Some(256),
        quality,
        ..ModelConfig::new(dir.path().to_string_lossy())
    };
    let tenants = Arc::new(Tenants::new(vec![TenantConfig::new("acme")]).unwrap());
    let host = ModelHost::with_tenants(Some(1 << 30), tenants.clone());
    host.load_all(&[cfg("a", 1.0), cfg("b", 2.0), cfg("c", 3.0)]).unwrap();
    let tiers =
        TierSet { fast: vec!["a".into()], balanced: vec!["b".into()], deep: vec!["c".into()], ..Default::default() };
    host.set_tiers(tiers).unwrap();
    let engines: Vec<_> = ["a", "b", "c"].iter().map(|n| host.get(n).unwrap()).collect();
    let renders = || engines.iter().map(|e| e.num_prompt_renders()).sum::<u64>();
    let (lookups0, renders0) = (tenants.num_lookups(), renders());

    let messages = vec![lmplex_engine::ChatMessage::new("user", "t5 t6 t7 t8")];
    let params = SamplingParams { max_tokens: 4, temperature: 0.0, ignore_eos: true, ..Default::default() };
    let req = Request { tenant: Some("acme".into()), ..Request::new(Prompt::Messages(messages), params) };
    let call = Call::by_name(&tenants, &route(Mode::Deep, None, None), vec![req]).unwrap().with_samples(2);
    let s = host.submit(&call, &Target::Routed).unwrap();
    assert_eq!(s.model, "c", "deep: the highest quality");
    assert_eq!(s.handles.len(), 2, "n = 2 samples of one prompt");
    let outs: Vec<_> = s.handles.into_iter().map(|h| h.collect_blocking().unwrap()).collect();
    assert_eq!(outs[0].token_ids, outs[1].token_ids, "greedy samples agree");
    let rendered = (outs[0].prompt.as_str(), outs[0].usage.prompt_tokens);
    assert_eq!(rendered, ("t5 t6 t7 t8 ", 4), "the template rendered the message");
    assert_eq!(tenants.num_lookups() - lookups0, 1, "the tenant is looked up once, when the call is made");
    assert_eq!(renders() - renders0, 3, "one render per candidate, none again on the chosen one");
    assert_eq!(tenants.get(Some("acme")).unwrap().usage().unwrap().requests, 1, "one admission for the call");

    let other = Request { tenant: Some("zeta".into()), ..Request::new(Prompt::TokenIds(vec![3]), Default::default()) };
    let mixed = vec![Request { tenant: Some("acme".into()), ..other.clone() }, other];
    let e = Call::by_name(&tenants, &Route::default(), mixed).unwrap_err();
    assert_eq!(e.to_string(), "the requests of one call name one tenant: 'acme' and 'zeta'");
}

#[test]
fn warm_up_measures_steps_at_a_batch_before_traffic() {
    let (host, _dir) = host(vec![]);
    // small warms up with a batch of 8 after its request alone: its signals know steps at more
    // than one request, and how much a step grows per request.
    let small = host.get("small").unwrap();
    let s = small.live_signals();
    assert!(s.batch_size() > 1.0, "batch {}", s.batch_size());
    assert!(s.step_s_per_seq() > 0.0);
    // big runs one request at a time: its batch is 1.
    assert_eq!(host.get("big").unwrap().live_signals().batch_size(), 1.0);
}
