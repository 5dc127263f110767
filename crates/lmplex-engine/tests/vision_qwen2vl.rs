//! Qwen2-VL and Qwen2.5-VL through the engine, against transformers: the tiny models of
//! `tests/fixtures/vision/qwen2_vl.json` and `qwen2_5_vl.json` (`scripts/make_qwen2vl_fixtures.py`;
//! weights regenerated bit for bit, `testing::fixture_tensors`), their tokenizer, chat template and
//! processor settings, and the image `tests/fixtures/images/rgb.png`. One user turn of that image
//! and text renders, expands (`<|image_pad|>` to one token per merged 2x2 patch) and tokenizes to
//! transformers' prompt ids, and greedy decoding gives transformers' tokens: the tower's features
//! at the image tokens, M-RoPE positions from the image's grid, decoding on from their largest.
//!
//! Also: a 5-token step budget (chunks through the image) gives the same tokens; images of
//! requests sent together run through the tower in one pass (`common::check_images_batched`).

mod common;

use lmplex_core::{ModelConfig, SamplingParams};
use lmplex_engine::{ChatMessage, ContentPart, Engine, Prompt, Request};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;

/// The fixture's model as an HF folder in `dir`, with the chat case's tokenizer, template and
/// processor settings.
fn write_folder(dir: &Path, fx: &Value) {
    common::write_vision_folder(dir, fx);
    let chat = &fx["chat"];
    let tok_cfg = serde_json::json!({"chat_template": chat["chat_template"], "unk_token": "t0"});
    std::fs::write(dir.join("tokenizer_config.json"), tok_cfg.to_string()).unwrap();
    std::fs::write(dir.join("preprocessor_config.json"), chat["preprocessor_config"].to_string()).unwrap();
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
        let fx = common::vision_fixture(family);
        let chat = &fx["chat"];
        let dir = tempfile::tempdir().unwrap();
        write_folder(dir.path(), &fx);
        let image = std::fs::read(common::repo_root().join(chat["image"].as_str().unwrap())).unwrap();
        let text = ContentPart::Text(chat["messages_text"].as_str().unwrap().into());
        let parts = vec![ContentPart::Image(Arc::from(image)), text];
        // transformers' `min_new_tokens` bans EOS until then: `min_tokens`, as vLLM names it.
        let params = SamplingParams { ignore_eos: true, min_tokens: 6, ..SamplingParams::greedy(6) };
        let req = Request::new(Prompt::Messages(vec![ChatMessage::with_parts("user", parts)]), params);
        let engine = start(dir.path(), None);
        let out = engine.generate(std::slice::from_ref(&req)).unwrap().pop().unwrap();
        let want_prompt = common::json_ids(&chat["prompt_ids"]);
        assert_eq!(engine.tokenizer().encode(&out.prompt, false).unwrap(), want_prompt, "{family}: prompt ids");
        assert_eq!(out.token_ids, common::json_ids(&chat["generated"]), "{family}: greedy tokens");
        let small = start(dir.path(), Some(5)).generate(&[req]).unwrap().pop().unwrap();
        assert_eq!(small.token_ids, out.token_ids, "{family}: a 5-token step budget");
    }
}

#[test]
fn images_sent_together_share_one_tower_pass_and_keep_their_tokens() {
    for family in ["qwen2_vl", "qwen2_5_vl"] {
        let fx = common::vision_fixture(family);
        let dir = tempfile::tempdir().unwrap();
        write_folder(dir.path(), &fx);
        let text = fx["chat"]["messages_text"].as_str().unwrap();
        // Three grids of other shapes (and so other windows) in one pass.
        let reqs: Vec<Request> =
            ["rgb.png", "rgba.png", "wide.png"].iter().map(|n| common::image_turn(n, text, 4)).collect();
        common::check_images_batched(&|budget| start(dir.path(), budget), &reqs);
    }
}
