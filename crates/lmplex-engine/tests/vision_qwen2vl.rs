//! Qwen2-VL and Qwen2.5-VL through the engine, against transformers: the tiny models of
//! `tests/fixtures/vision/qwen2_vl.json` and `qwen2_5_vl.json` (`scripts/make_qwen2vl_fixtures.py`;
//! weights regenerated bit for bit, `testing::fixture_tensors`), their tokenizer, chat template and
//! processor settings, and the image `tests/fixtures/images/rgb.png`. One user turn of that image
//! and text renders, expands (`<|image_pad|>` to one token per merged 2x2 patch) and tokenizes to
//! transformers' prompt ids, and greedy decoding gives transformers' tokens: the tower's features
//! at the image tokens, M-RoPE positions from the image's grid, decoding on from their largest.
//!
//! Also: a 5-token step budget (chunks through the image) gives the same tokens.

mod common;

use candle_core::{Device, Tensor};
use lmplex_core::{ModelConfig, SamplingParams};
use lmplex_engine::{ChatMessage, ContentPart, Engine, Prompt, Request};
use lmplex_model::testing::fixture_tensors;
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture(family: &str) -> Value {
    let path = root().join(format!("tests/fixtures/vision/{family}.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The fixture's model as an HF folder in `dir`, with the chat case's tokenizer, template and
/// processor settings.
fn write_folder(dir: &Path, fx: &Value) {
    let chat = &fx["chat"];
    std::fs::write(dir.join("config.json"), fx["config_json"].to_string()).unwrap();
    std::fs::write(dir.join("tokenizer.json"), chat["tokenizer_json"].to_string()).unwrap();
    let tok_cfg = serde_json::json!({"chat_template": chat["chat_template"], "unk_token": "t0"});
    std::fs::write(dir.join("tokenizer_config.json"), tok_cfg.to_string()).unwrap();
    std::fs::write(dir.join("preprocessor_config.json"), chat["preprocessor_config"].to_string()).unwrap();
    let tensors: HashMap<String, Tensor> = fixture_tensors(fx)
        .into_iter()
        .map(|t| (t.name, Tensor::from_vec(t.values, t.shape, &Device::Cpu).unwrap()))
        .collect();
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn start(dir: &Path, budget: Option<usize>) -> Engine {
    let mut cfg = ModelConfig::new(dir.to_string_lossy());
    cfg.device = lmplex_core::DeviceKind::Cpu;
    cfg.max_num_batched_tokens = budget;
    Engine::new(cfg).unwrap()
}

#[test]
fn an_image_turn_gives_transformers_prompt_and_tokens() {
    for family in ["qwen2_vl", "qwen2_5_vl"] {
        let fx = fixture(family);
        let chat = &fx["chat"];
        let dir = tempfile::tempdir().unwrap();
        write_folder(dir.path(), &fx);
        let image = std::fs::read(root().join(chat["image"].as_str().unwrap())).unwrap();
        let text = ContentPart::Text(chat["messages_text"].as_str().unwrap().into());
        let parts = vec![ContentPart::Image(Arc::from(image)), text];
        // transformers' `min_new_tokens` bans EOS until then: `min_tokens`, as vLLM names it.
        let params = SamplingParams { ignore_eos: true, min_tokens: 6, ..SamplingParams::greedy(6) };
        let req = Request::new(Prompt::Messages(vec![ChatMessage::with_parts("user", parts)]), params);
        let engine = start(dir.path(), None);
        let out = engine.generate(std::slice::from_ref(&req)).unwrap().pop().unwrap();
        let want_prompt = ids(&chat["prompt_ids"]);
        assert_eq!(engine.tokenizer().encode(&out.prompt, false).unwrap(), want_prompt, "{family}: prompt ids");
        assert_eq!(out.token_ids, ids(&chat["generated"]), "{family}: greedy tokens");
        let small = start(dir.path(), Some(5)).generate(&[req]).unwrap().pop().unwrap();
        assert_eq!(small.token_ids, out.token_ids, "{family}: a 5-token step budget");
    }
}
