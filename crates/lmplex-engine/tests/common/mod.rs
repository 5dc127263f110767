//! Shared by the engine tests: a tiny random llama checkpoint (an HF folder written on the fly)
//! and helpers to run requests alone. The fetched models are found by lmplex-model's test
//! helpers (`model_common`), not a copy of them.

#![allow(dead_code)]

pub mod spec;

use candle_core::{Device, Tensor};
use lmplex_core::{ModelConfig, RequestOutput, SamplingParams};
use lmplex_engine::{Engine, Prompt, Request};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

pub const VOCAB: usize = 256;

/// Writes a 2-layer llama (hidden 64, 4 heads / 2 KV heads) with random weights and a
/// word-level tokenizer (`t0`..`t255`); EOS is id 2.
pub fn write_tiny_llama(dir: &Path, seed: u64) {
    let (hidden, inter, layers, heads, kv_heads, head_dim) = (64, 128, 2, 4, 2, 16);
    let config = serde_json::json!({
        "model_type": "llama", "vocab_size": VOCAB, "hidden_size": hidden, "intermediate_size": inter,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "head_dim": head_dim, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 1024,
        "tie_word_embeddings": false, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let vocab: serde_json::Map<String, serde_json::Value> =
        (0..VOCAB).map(|i| (format!("t{i}"), serde_json::json!(i))).collect();
    let tokenizer = serde_json::json!({"version": "1.0", "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}});
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let dev = Device::Cpu;
    // Uniform values with the given standard deviation, from a seeded LCG (candle's CPU RNG
    // cannot be seeded).
    let state = std::cell::Cell::new(seed.wrapping_mul(2862933555777941757).wrapping_add(3037000493));
    let randn = |shape: &[usize], std: f32| {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|_| {
                let x = state.get().wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                state.set(x);
                ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * std * 3f32.sqrt()
            })
            .collect();
        Tensor::from_vec(v, shape, &dev).unwrap()
    };
    let mut t: HashMap<String, Tensor> = HashMap::new();
    t.insert("model.embed_tokens.weight".into(), randn(&[VOCAB, hidden], 1.0));
    t.insert("lm_head.weight".into(), randn(&[VOCAB, hidden], 0.5));
    t.insert("model.norm.weight".into(), Tensor::ones(hidden, candle_core::DType::F32, &dev).unwrap());
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        let w = |out: usize, inp: usize| randn(&[out, inp], 1.0 / (inp as f32).sqrt());
        t.insert(format!("{p}.self_attn.q_proj.weight"), w(heads * head_dim, hidden));
        t.insert(format!("{p}.self_attn.k_proj.weight"), w(kv_heads * head_dim, hidden));
        t.insert(format!("{p}.self_attn.v_proj.weight"), w(kv_heads * head_dim, hidden));
        t.insert(format!("{p}.self_attn.o_proj.weight"), w(hidden, heads * head_dim));
        t.insert(format!("{p}.mlp.gate_proj.weight"), w(inter, hidden));
        t.insert(format!("{p}.mlp.up_proj.weight"), w(inter, hidden));
        t.insert(format!("{p}.mlp.down_proj.weight"), w(hidden, inter));
        for n in ["input_layernorm", "post_attention_layernorm"] {
            t.insert(format!("{p}.{n}.weight"), Tensor::ones(hidden, candle_core::DType::F32, &dev).unwrap());
        }
    }
    candle_core::safetensors::save(&t, dir.join("model.safetensors")).unwrap();
}

/// A tiny engine over a fresh random checkpoint; `tweak` adjusts the config.
pub fn tiny_engine(tweak: impl FnOnce(&mut ModelConfig)) -> (Engine, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(dir.path(), 7);
    let mut cfg = ModelConfig::new(dir.path().to_string_lossy());
    tweak(&mut cfg);
    (Engine::new(cfg).unwrap(), dir)
}

pub fn ids_request(ids: Vec<u32>, params: SamplingParams) -> Request {
    Request::new(Prompt::TokenIds(ids), params)
}

/// A request's output when it runs alone on `engine`.
pub fn solo(engine: &Engine, req: &Request) -> RequestOutput {
    engine.generate(std::slice::from_ref(req)).unwrap().pop().unwrap()
}

/// Waits until the step loop reports every block free and nothing running or queued.
pub fn wait_until_idle(engine: &Engine) {
    let s = engine.stats();
    let t0 = Instant::now();
    loop {
        let free = s.num_free_kv_blocks.load(Ordering::Acquire);
        let busy = s.num_running.load(Ordering::Acquire) + s.num_waiting.load(Ordering::Acquire);
        let swap_free = s.num_free_swap_blocks.load(Ordering::Acquire) == s.num_swap_blocks.load(Ordering::Acquire);
        if free == engine.num_kv_blocks() && busy == 0 && s.num_queued.load(Ordering::Acquire) == 0 && swap_free {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "engine not idle: {free} of {} blocks free",
            engine.num_kv_blocks()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The repository's root (fixtures live under `tests/fixtures`).
pub fn repo_root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `tests/fixtures/vision/{name}.json`, a vision-language fixture (`scripts/make_*_fixtures.py`).
pub fn vision_fixture(name: &str) -> serde_json::Value {
    let path = repo_root().join(format!("tests/fixtures/vision/{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A vision fixture's model as an HF folder in `dir`: its `config.json`, its chat case's
/// tokenizer, and its weights regenerated bit for bit (`testing::fixture_tensors`); the caller
/// adds the tokenizer config and processor files its family needs.
pub fn write_vision_folder(dir: &Path, fx: &serde_json::Value) {
    write_vision_folder_where(dir, fx, |_| true);
}

/// `write_vision_folder` with only the tensors whose names `keep` holds.
pub fn write_vision_folder_where(dir: &Path, fx: &serde_json::Value, keep: impl Fn(&str) -> bool) {
    std::fs::write(dir.join("config.json"), fx["config_json"].to_string()).unwrap();
    std::fs::write(dir.join("tokenizer.json"), fx["chat"]["tokenizer_json"].to_string()).unwrap();
    let tensors: HashMap<String, Tensor> = lmplex_model::testing::fixture_tensors(fx)
        .into_iter()
        .filter(|t| keep(&t.name))
        .map(|t| (t.name, Tensor::from_vec(t.values, t.shape, &Device::Cpu).unwrap()))
        .collect();
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
}

/// Token ids from a JSON array.
pub fn json_ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// One user turn of the fixture image `name` (`tests/fixtures/images`) and `text`, greedy with
/// the top-3 log-probs, ignoring EOS.
pub fn image_turn(name: &str, text: &str, max_tokens: usize) -> Request {
    use lmplex_engine::{ChatMessage, ContentPart};
    let image = std::fs::read(repo_root().join("tests/fixtures/images").join(name)).unwrap();
    let parts = vec![ContentPart::Image(std::sync::Arc::from(image)), ContentPart::Text(text.into())];
    let params = SamplingParams { ignore_eos: true, logprobs: Some(3), ..SamplingParams::greedy(max_tokens) };
    Request::new(Prompt::Messages(vec![ChatMessage::with_parts("user", parts)]), params)
}

/// `reqs` (each with another image) sent together run their images through the tower in one
/// pass, and each gives the tokens and log-prob bits it gives alone on a fresh engine; under a
/// step budget (`max_num_batched_tokens`) below one image's tokens, each request's images pass
/// on their own; sent again, every image comes from the feature cache. `start(budget)` loads
/// the model.
pub fn check_images_batched(start: &dyn Fn(Option<usize>) -> Engine, reqs: &[Request]) {
    let alone: Vec<RequestOutput> = reqs.iter().map(|r| solo(&start(None), r)).collect();
    let engine = start(None);
    let together = engine.generate(reqs).unwrap();
    let s = engine.stats().snapshot();
    assert_eq!((s.num_encoder_passes, s.num_images_encoded), (1, reqs.len() as u64), "one pass for all");
    for (i, (got, want)) in together.iter().zip(&alone).enumerate() {
        assert_eq!(got.token_ids, want.token_ids, "request {i}: tokens differ from alone");
        let (a, b) = (got.logprobs.as_ref().unwrap(), want.logprobs.as_ref().unwrap());
        for (x, y) in a.iter().zip(b) {
            assert_eq!(x.logprob.to_bits(), y.logprob.to_bits(), "request {i}: a log-prob differs from alone");
            assert_eq!(x.top, y.top);
        }
    }
    let again = engine.generate(reqs).unwrap();
    assert_eq!(engine.stats().snapshot().num_encoder_passes, 1, "cached images ran the tower again");
    assert!(again.iter().zip(&together).all(|(a, b)| a.token_ids == b.token_ids));
    let small = start(Some(5));
    let one_by_one = small.generate(reqs).unwrap();
    assert_eq!(small.stats().snapshot().num_encoder_passes, reqs.len() as u64, "a pass over the budget");
    assert!(one_by_one.iter().zip(&together).all(|(a, b)| a.token_ids == b.token_ids));
}
