//! `ModelHost`: two models under one budget, a third refused with the numbers, unload frees
//! the reservation, and the plan made from headers matches what the engine reports.

mod common;

use common::write_tiny_llama;
use lmplex_core::{Error, ModelConfig};
use lmplex_engine::{EnginePlan, ModelHost};

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
    let plan = EnginePlan::new(&cfg(4), dir.path()).unwrap();
    let host = ModelHost::new(Some(2 * plan.device_bytes() + plan.device_bytes() / 2));
    let a = host.load("a", cfg(4), dir.path()).unwrap();
    // The plan from headers is what the loaded engine reports.
    let mem = a.memory();
    assert_eq!(mem["kv_cache"], plan.kv.kv_cache_bytes());
    assert_eq!(mem["weights"], plan.model.weight_bytes, "safetensors f32 estimate");
    host.load("b", cfg(4), dir.path()).unwrap();
    assert_eq!(host.names(), ["a", "b"]);
    assert_eq!(host.reserved(), 2 * plan.device_bytes());
    let Err(e) = host.load("c", cfg(4), dir.path()) else { panic!("a third model fits") };
    let Error::Capacity(msg) = &e else { panic!("{e}") };
    assert!(msg.contains("model 'c' needs") && msg.contains("KV pool") && msg.contains("2 model(s)"), "{msg}");
    assert!(host.get("c").is_none());
    assert!(matches!(host.load("a", cfg(1), dir.path()), Err(Error::InvalidRequest(_))), "name taken");
    // Unloading gives the room back.
    host.unload("b").unwrap();
    host.load("c", cfg(4), dir.path()).unwrap();
    let memory = host.memory();
    assert_eq!(memory["host"]["reserved"], 2 * plan.device_bytes());
    assert_eq!(memory["host"]["free"], plan.device_bytes() / 2);
    assert!(memory.contains_key("a") && memory.contains_key("c"));
    assert!(host.unload("b").is_err());
    // A loaded model serves (it ran its warm-up step already).
    let out = host.get("c").unwrap().generate(&[common::ids_request(vec![5, 6, 7], Default::default())]);
    assert!(!out.unwrap()[0].token_ids.is_empty());
}

#[test]
fn a_bad_checkpoint_releases_its_reservation() {
    let host = ModelHost::new(Some(1 << 30));
    let path = std::path::Path::new("/nonexistent");
    let Err(e) = host.load("x", ModelConfig::new("/nonexistent"), path) else { panic!("loaded nothing") };
    assert!(matches!(e, Error::ModelLoad(_)), "{e}");
    assert_eq!(host.reserved(), 0);
}
