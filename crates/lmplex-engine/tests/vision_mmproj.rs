//! A vision tower from a llama.cpp multimodal projector file (`ModelConfig::mmproj`, llama-server's
//! `--mmproj`), through the engine, against transformers' whole pipeline: the text models of the
//! tiny Idefics3 and Gemma 3 fixtures (`tests/fixtures/vision/{idefics3,gemma3}.json`) as HF
//! folders holding no vision tensor and no processor config, beside the mmproj files llama.cpp's
//! converter made of the same towers (`tests/fixtures/vision/*.mmproj.gguf`,
//! `scripts/make_mmproj_fixtures.py`). The processor comes from what the mmproj records (mean,
//! std, sizes, tokens per tile) and transformers' defaults; one user turn of an image and text
//! gives transformers' prompt ids and greedy tokens.
//!
//! Also: a text model whose vocabulary lacks the family's image token is a load error naming it.

mod common;

use lmplex_core::{Error, ModelConfig, SamplingParams};
use lmplex_engine::{ChatMessage, ContentPart, Engine, Prompt, Request};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;

/// `family`'s fixture model as a text-only HF folder in `dir` (its tokenizer, chat template and
/// text weights), and the engine over it with the family's mmproj.
fn start(dir: &Path, family: &str, fx: &Value) -> Engine {
    let vision = ["vision_model", "connector", "vision_tower", "multi_modal_projector"];
    common::write_vision_folder_where(dir, fx, |name| !vision.iter().any(|v| name.contains(v)));
    let chat = &fx["chat"];
    let mut tok_cfg = chat.get("tokenizer_config").cloned().unwrap_or_else(|| serde_json::json!({"unk_token": "t0"}));
    tok_cfg["chat_template"] = chat["chat_template"].clone();
    std::fs::write(dir.join("tokenizer_config.json"), tok_cfg.to_string()).unwrap();
    let mut cfg = ModelConfig::new(dir.to_string_lossy());
    cfg.device = lmplex_core::DeviceKind::Cpu;
    let mmproj = common::repo_root().join(format!("tests/fixtures/vision/{family}.mmproj.gguf"));
    cfg.mmproj = Some(mmproj.to_string_lossy().into_owned());
    Engine::new(cfg).unwrap()
}

fn turn(image: Vec<u8>, text: &str) -> Request {
    let parts = vec![ContentPart::Image(Arc::from(image)), ContentPart::Text(text.into())];
    // transformers' `min_new_tokens` bans EOS until then: `min_tokens`, as vLLM names it.
    let params = SamplingParams { ignore_eos: true, min_tokens: 8, ..SamplingParams::greedy(8) };
    Request::new(Prompt::Messages(vec![ChatMessage::with_parts("user", parts)]), params)
}

#[test]
fn an_mmproj_tower_gives_transformers_prompt_and_tokens() {
    for family in ["idefics3", "gemma3"] {
        let fx = common::vision_fixture(family);
        let chat = &fx["chat"];
        let dir = tempfile::tempdir().unwrap();
        let engine = start(dir.path(), family, &fx);
        let image = std::fs::read(common::repo_root().join(chat["image"].as_str().unwrap())).unwrap();
        let out = engine.generate(&[turn(image, chat["messages_text"].as_str().unwrap())]).unwrap().pop().unwrap();
        let want_prompt = common::json_ids(&chat["prompt_ids"]);
        assert_eq!(engine.tokenizer().encode(&out.prompt, false).unwrap(), want_prompt, "{family}: prompt ids");
        assert_eq!(out.token_ids, common::json_ids(&chat["generated"]), "{family}: greedy tokens");
    }
}

#[test]
fn a_vocabulary_without_the_image_token_is_a_load_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    common::write_tiny_llama(dir.path(), 7);
    let mut cfg = ModelConfig::new(dir.path().to_string_lossy());
    cfg.device = lmplex_core::DeviceKind::Cpu;
    let mmproj = common::repo_root().join("tests/fixtures/vision/idefics3.mmproj.gguf");
    cfg.mmproj = Some(mmproj.to_string_lossy().into_owned());
    match Engine::new(cfg) {
        Err(Error::ModelLoad(m)) => assert!(m.contains("no '<image>'"), "{m}"),
        Err(e) => panic!("expected a load error, got {e:?}"),
        Ok(_) => panic!("loaded an mmproj beside a vocabulary without '<image>'"),
    }
}
