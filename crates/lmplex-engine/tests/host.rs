//! `ModelHost`: two models under one budget, a third refused with the numbers, unload frees
//! the reservation, the plan made from headers matches what the engine reports, and keep-alive
//! unloads an idle model that its next use reloads; the models on one device charge one
//! service ledger.

mod common;

use common::write_tiny_llama;
use lmplex_core::{Error, ModelConfig, SamplingParams, SpeculativeConfig};
use lmplex_engine::{place, EnginePlan, ModelHost, ModelState};
use std::sync::Arc;
use std::time::Duration;

/// `config` served as `name`.
fn named(name: &str, config: ModelConfig) -> ModelConfig {
    ModelConfig { served_model_name: Some(name.into()), ..config }
}

#[test]
fn models_share_one_budget_and_a_model_that_does_not_fit_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(dir.path(), 7);
    let cfg = |n: usize| {
        let mut c = ModelConfig::new(dir.path().to_string_lossy());
        c.max_model_len = Some(256);
        c.max_model_concurrency = n;
        c
    };
    let plan = EnginePlan::new(&cfg(4)).unwrap();
    let host = ModelHost::new(Some(2 * plan.device_bytes() + plan.device_bytes() / 2));
    let a = host.load(named("a", cfg(4))).unwrap();
    // The plan from headers is what the loaded engine reports.
    let mem = a.memory();
    assert_eq!(mem.kv_cache, plan.kv.kv_cache_bytes());
    assert_eq!(mem.weights, plan.model.weight_bytes, "safetensors f32 estimate");
    host.load(named("b", cfg(4))).unwrap();
    assert_eq!(host.names(), ["a", "b"]);
    assert_eq!(host.reserved(), 2 * plan.device_bytes());
    let Err(e) = host.load(named("c", cfg(4))) else { panic!("a third model fits") };
    let Error::Capacity(msg) = &e else { panic!("{e}") };
    assert!(msg.contains("model 'c' needs") && msg.contains("KV pool") && msg.contains("2 model(s)"), "{msg}");
    assert!(host.get("c").is_none());
    assert!(matches!(host.load(named("a", cfg(1))), Err(Error::InvalidRequest(_))), "name taken");
    // Unloading gives the room back.
    host.unload("b").unwrap();
    host.load(named("c", cfg(4))).unwrap();
    let memory = host.memory();
    assert_eq!(memory.reserved, 2 * plan.device_bytes());
    assert_eq!(memory.free, plan.device_bytes() / 2);
    assert_eq!(memory.models.keys().collect::<Vec<_>>(), ["a", "c"]);
    assert_eq!(memory.models["a"], host.get("a").unwrap().memory());
    assert!(host.unload("b").is_err());
    // A loaded model serves (it ran its warm-up step already).
    let out = host.get("c").unwrap().generate(&[common::ids_request(vec![5, 6, 7], Default::default())]);
    assert!(!out.unwrap()[0].token_ids.is_empty());
}

#[test]
fn a_bad_checkpoint_releases_its_reservation() {
    let host = ModelHost::new(Some(1 << 30));
    let Err(e) = host.load(named("x", ModelConfig::new("/nonexistent"))) else { panic!("loaded nothing") };
    assert!(matches!(e, Error::ModelLoad(_)), "{e}");
    assert_eq!(host.reserved(), 0);
}

#[test]
fn keep_alive_unloads_an_idle_model_and_the_next_use_reloads_it() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(dir.path(), 7);
    let mut cfg = ModelConfig::new(dir.path().to_string_lossy());
    cfg.max_model_len = Some(128);
    let plan = EnginePlan::new(&cfg).unwrap();
    let host = ModelHost::new(Some(2 * plan.device_bytes()));
    let keep = Duration::from_millis(100);
    host.load(ModelConfig { keep_alive_s: Some(keep.as_secs_f64()), ..named("m", cfg.clone()) }).unwrap();
    host.load(named("pinned", cfg.clone())).unwrap();
    let req = common::ids_request(vec![5, 6, 7], lmplex_core::SamplingParams::greedy(8));
    let first = host.acquire("m").unwrap().generate(std::slice::from_ref(&req)).unwrap();

    // Held by a caller: never unloaded, however long.
    let held = host.acquire("m").unwrap();
    std::thread::sleep(keep * 2);
    assert!(host.unload_idle().is_empty());
    drop(held);
    // The idle time restarted when the host saw it in use.
    assert!(host.unload_idle().is_empty());
    std::thread::sleep(keep + Duration::from_millis(20));
    assert_eq!(host.unload_idle(), ["m"], "idle past keep_alive; 'pinned' has none");
    assert_eq!(host.state("m"), Some(ModelState::Idle));
    assert!(host.get("m").is_none());
    assert_eq!(host.reserved(), plan.device_bytes(), "an idle model reserves nothing");
    assert_eq!(host.names(), ["m", "pinned"], "still served by name");
    assert_eq!(host.memory().idle_models, 1);

    // While it is idle, its room can go to another model, and then it cannot come back.
    host.load(named("other", cfg.clone())).unwrap();
    assert!(matches!(host.acquire("m"), Err(Error::Capacity(_))));
    assert_eq!(host.state("m"), Some(ModelState::Idle));
    host.unload("other").unwrap();

    // The next use reloads it, and it answers as before.
    let again = host.acquire("m").unwrap().generate(std::slice::from_ref(&req)).unwrap();
    assert_eq!(again[0].token_ids, first[0].token_ids);
    assert_eq!((host.state("m"), host.num_loads("m")), (Some(ModelState::Ready), 2));
    assert_eq!(host.reserved(), 2 * plan.device_bytes());
    let ready = host.ready_seconds("m").unwrap();
    assert!(ready > 0.0 && ready < 60.0, "the reload took {ready} s");
    assert_eq!(host.ready_seconds("nope"), None);
    assert!(matches!(host.acquire("nope"), Err(Error::InvalidRequest(_))));
}

#[test]
fn callers_of_a_reloading_model_wait_for_the_one_reload() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(dir.path(), 7);
    let cfg = ModelConfig::new(dir.path().to_string_lossy());
    let host = Arc::new(ModelHost::new(None));
    host.load(ModelConfig { keep_alive_s: Some(0.0), ..named("m", cfg) }).unwrap();
    assert_eq!(host.unload_idle(), ["m"]);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let host = host.clone();
            std::thread::spawn(move || host.acquire("m").map(|e| Arc::as_ptr(&e) as usize))
        })
        .collect();
    let engines: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap().unwrap()).collect();
    assert!(engines.windows(2).all(|w| w[0] == w[1]), "one engine for all callers");
    assert_eq!(host.num_loads("m"), 2);
}

#[test]
fn load_all_reserves_in_order_and_a_refusal_loads_nothing() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(dir.path(), 7);
    let cfg = ModelConfig::new(dir.path().to_string_lossy());
    let need = EnginePlan::new(&cfg).unwrap().device_bytes();
    let spec = |n: &str| named(n, cfg.clone());
    let host = ModelHost::new(Some(2 * need + need / 2));
    let Err(Error::Capacity(msg)) = host.load_all(&[spec("a"), spec("b"), spec("c")]) else { panic!("c fits") };
    assert!(msg.contains("model 'c' needs"), "{msg}");
    assert_eq!((host.reserved(), host.names().len()), (0, 0));
    host.load_all(&[spec("a"), spec("b")]).unwrap();
    assert_eq!(host.names(), ["a", "b"]);
    assert!(host.get("a").is_some() && host.get("b").is_some());
}

#[test]
fn the_models_on_one_device_charge_one_ledger_and_a_lone_engine_its_own() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(dir.path(), 7);
    let mut cfg = ModelConfig::new(dir.path().to_string_lossy());
    cfg.max_model_len = Some(128);
    let host = ModelHost::new(Some(1 << 30));
    let (a, b) = (host.load(named("a", cfg.clone())).unwrap(), host.load(named("b", cfg.clone())).unwrap());
    let ledger = host.tenants().ledger(place(cfg.device));
    let params = SamplingParams { max_tokens: 4, temperature: 0.0, ignore_eos: true, ..Default::default() };
    let mut req = common::ids_request(vec![5, 6, 7, 8], params);
    req.tenant = Some("t".into());
    let warm = ledger.counter("t");
    a.generate(std::slice::from_ref(&req)).unwrap();
    let after_a = ledger.counter("t");
    b.generate(std::slice::from_ref(&req)).unwrap();
    let after_b = ledger.counter("t");
    // Each model charged the same call in its own device time, to the one counter.
    assert!(warm < after_a && after_a < after_b, "{warm} {after_a} {after_b}");
    let (lone, _dir) = common::tiny_engine(|_| {});
    lone.generate(std::slice::from_ref(&req)).unwrap();
    assert_eq!(ledger.counter("t"), after_b, "an engine of its own keeps its own ledger");
}

#[test]
fn a_draft_model_counts_in_its_targets_plan_and_budget() {
    let (target, draft) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write_tiny_llama(target.path(), 7);
    write_tiny_llama(draft.path(), 8);
    let cfg = |spec: bool| {
        let mut c = ModelConfig::new(target.path().to_string_lossy());
        c.max_model_len = Some(128);
        c.max_model_concurrency = 4;
        if spec {
            c.speculative = Some(SpeculativeConfig::draft(draft.path().to_string_lossy().into_owned(), 4));
        }
        c
    };
    let (plain, spec) = (EnginePlan::new(&cfg(false)).unwrap(), EnginePlan::new(&cfg(true)).unwrap());
    assert_eq!(plain.draft_bytes, 0);
    // The draft has the target's shapes: its weights, and a KV pool of the target's blocks.
    assert_eq!(spec.draft_bytes, plain.model.weight_bytes + plain.kv.kv_cache_bytes());
    assert_eq!(spec.device_bytes(), plain.device_bytes() + spec.draft_bytes);
    // A budget that holds the target but not its draft refuses it, naming the draft.
    let host = ModelHost::new(Some(spec.device_bytes() - 1));
    let Err(Error::Capacity(msg)) = host.load(named("s", cfg(true))) else { panic!("the draft fitted") };
    assert!(msg.contains(" draft model)"), "{msg}");
    let p = host.load(named("p", cfg(false))).unwrap();
    // Loaded, the draft takes what was planned, and its rope tables (a small share of it).
    let host = ModelHost::new(Some(spec.device_bytes()));
    let s = host.load(named("s", cfg(true))).unwrap();
    assert_eq!(host.reserved(), spec.device_bytes());
    let loaded = s.memory().other - p.memory().other;
    assert!(spec.draft_bytes <= loaded && loaded - spec.draft_bytes < spec.draft_bytes / 20, "{loaded}");
}
