//! A vision-language model through the engine, against transformers' whole pipeline: the tiny
//! Idefics3 of `tests/fixtures/vision/idefics3.json` (`scripts/make_vlm_fixtures.py`; weights
//! regenerated bit for bit, `testing::fixture_tensors`), its chat template, the processor settings
//! of `tests/fixtures/images/small` and the image `tests/fixtures/images/rgb.png`. One user turn
//! of that image and text renders, expands and tokenizes to transformers' prompt ids, and
//! greedy decoding gives transformers' tokens.
//!
//! Also: the same image a second time comes from the feature cache with the same tokens, a
//! different image changes the reply, a bad image and an image sent to a text model are
//! `InvalidRequest`s naming the problem.

mod common;

use lmplex_core::{Error, ModelConfig, SamplingParams};
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
    let processor = common::repo_root().join(chat["processor"].as_str().unwrap());
    for f in ["preprocessor_config.json", "processor_config.json"] {
        std::fs::copy(processor.join(f), dir.join(f)).unwrap();
    }
}

fn turn(image: Vec<u8>, text: &str) -> Request {
    let parts = vec![ContentPart::Image(Arc::from(image)), ContentPart::Text(text.into())];
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) };
    Request::new(Prompt::Messages(vec![ChatMessage::with_parts("user", parts)]), params)
}

#[test]
fn an_image_turn_gives_transformers_prompt_and_tokens() {
    let fx = common::vision_fixture("idefics3");
    let chat = &fx["chat"];
    let dir = tempfile::tempdir().unwrap();
    write_folder(dir.path(), &fx);
    let mut cfg = ModelConfig::new(dir.path().to_string_lossy());
    cfg.device = lmplex_core::DeviceKind::Cpu;
    let engine = Engine::new(cfg).unwrap();
    let image = std::fs::read(common::repo_root().join(chat["image"].as_str().unwrap())).unwrap();
    let req = turn(image.clone(), chat["messages_text"].as_str().unwrap());
    let out = engine.generate(std::slice::from_ref(&req)).unwrap().pop().unwrap();
    let want_prompt = common::json_ids(&chat["prompt_ids"]);
    assert_eq!(engine.tokenizer().encode(&out.prompt, false).unwrap(), want_prompt, "prompt ids");
    assert_eq!(out.usage.prompt_tokens, want_prompt.len());
    assert_eq!(out.token_ids, common::json_ids(&chat["generated"]), "greedy tokens");
    // Again: the features come from the cache, and the prefix cache may serve the prompt.
    let again = engine.generate(std::slice::from_ref(&req)).unwrap().pop().unwrap();
    assert_eq!(again.token_ids, out.token_ids);
    // Another image, same text: the same prompt ids (same split) but other features.
    let other = std::fs::read(common::repo_root().join("tests/fixtures/images/rgba.png")).unwrap();
    let changed = engine.generate(&[turn(other, chat["messages_text"].as_str().unwrap())]).unwrap().pop().unwrap();
    assert_ne!(changed.token_ids, out.token_ids, "a different image gave the same reply");
    // Nine images in one turn are more than a prompt may hold.
    let nine: Vec<ContentPart> = (0..9).map(|_| ContentPart::Image(Arc::from(image.clone()))).collect();
    let params = SamplingParams::greedy(1);
    let many = Request::new(Prompt::Messages(vec![ChatMessage::with_parts("user", nine)]), params);
    let e = engine.generate(&[many]).unwrap_err();
    assert!(e.to_string().contains("at most 8 images (limit_mm_per_prompt), got 9"), "{e}");
    // A limit of 2 refuses a third image; a limit of 0 loads no tower and refuses any image.
    let mut other_bytes = Vec::new();
    for (limit, want) in [(2, "at most 2 images (limit_mm_per_prompt), got 3"), (0, "limit_mm_per_prompt.image is 0")] {
        let mut cfg = ModelConfig::new(dir.path().to_string_lossy());
        cfg.device = lmplex_core::DeviceKind::Cpu;
        cfg.limit_mm_per_prompt.image = limit;
        let limited = Engine::new(cfg).unwrap();
        other_bytes.push(limited.memory().other);
        let three: Vec<ContentPart> = (0..3).map(|_| ContentPart::Image(Arc::from(image.clone()))).collect();
        let req =
            Request::new(Prompt::Messages(vec![ChatMessage::with_parts("user", three)]), SamplingParams::greedy(1));
        let e = limited.generate(&[req]).unwrap_err();
        assert!(e.to_string().contains(want), "limit {limit}: {e}");
    }
    // The tower's weights count in the model's memory only where it is loaded: at least the
    // fixture's vision tensors in f32 (panels pad a matrix's rows), not twice them.
    let tower: usize = lmplex_model::testing::fixture_tensors(&fx)
        .iter()
        .filter(|t| t.name.contains("vision_model") || t.name.contains("connector"))
        .map(|t| t.values.len() * 4)
        .sum();
    let saved = other_bytes[0] - other_bytes[1];
    assert!(tower <= saved && saved < 2 * tower, "limit 0 saved {saved} bytes; the tower's tensors are {tower}");
    // A truncated image is refused, naming the image.
    let bad = engine.generate(&[turn(image[..image.len() / 2].to_vec(), "t5")]).unwrap_err();
    assert!(matches!(bad, Error::InvalidRequest(_)) && bad.to_string().contains("image 0"), "{bad}");
}

#[test]
fn a_text_model_refuses_images() {
    let (engine, _dir) = common::tiny_engine(|_| {});
    let image = std::fs::read(common::repo_root().join("tests/fixtures/images/rgb.png")).unwrap();
    let e = engine.generate(&[turn(image, "hi")]).unwrap_err();
    assert!(e.to_string().contains("is a text model: it takes no images"), "{e}");
}

#[test]
fn images_sent_together_share_one_tower_pass_and_keep_their_tokens() {
    let fx = common::vision_fixture("idefics3");
    let dir = tempfile::tempdir().unwrap();
    write_folder(dir.path(), &fx);
    let start = |budget: Option<usize>| {
        let mut cfg = ModelConfig::new(dir.path().to_string_lossy());
        cfg.device = lmplex_core::DeviceKind::Cpu;
        cfg.max_num_batched_tokens = budget;
        Engine::new(cfg).unwrap()
    };
    let text = fx["chat"]["messages_text"].as_str().unwrap();
    // Images split into other numbers of tiles, in one pass.
    let reqs: Vec<Request> =
        ["rgb.png", "rgba.png", "wide.png"].iter().map(|n| common::image_turn(n, text, 4)).collect();
    common::check_images_batched(&start, &reqs);
}
