//! A Gemma 3 vision-language model through the engine, against transformers' whole pipeline:
//! the tiny Gemma 3 of `tests/fixtures/vision/gemma3.json` (`scripts/make_gemma3_vlm_fixtures.py`;
//! weights regenerated bit for bit, `testing::fixture_tensors`), its tokenizer, chat template
//! and processor settings, and the image `tests/fixtures/images/rgba.png`. One user turn of that
//! image and text renders, expands (`<start_of_image>` to the processor's image sequence) and
//! tokenizes to transformers' prompt ids, and greedy decoding gives transformers' tokens: the
//! image's tokens attend to each other bidirectionally, as the processor's token type ids ask.
//!
//! Also: a token budget smaller than the prompt chunks it at the image's edges (never through
//! it) and gives the same tokens, alone and beside another request.

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
    let mut tok_cfg = chat["tokenizer_config"].clone();
    tok_cfg["chat_template"] = chat["chat_template"].clone();
    std::fs::write(dir.join("tokenizer_config.json"), tok_cfg.to_string()).unwrap();
    std::fs::write(dir.join("preprocessor_config.json"), chat["preprocessor_config"].to_string()).unwrap();
    std::fs::write(dir.join("processor_config.json"), chat["processor_config"].to_string()).unwrap();
}

fn turn(image: Vec<u8>, text: &str) -> Request {
    let parts = vec![ContentPart::Image(Arc::from(image)), ContentPart::Text(text.into())];
    // transformers' `min_new_tokens` bans EOS until then: `min_tokens`, as vLLM names it.
    let params = SamplingParams { ignore_eos: true, min_tokens: 8, ..SamplingParams::greedy(8) };
    Request::new(Prompt::Messages(vec![ChatMessage::with_parts("user", parts)]), params)
}

fn start(dir: &Path, budget: Option<usize>) -> Engine {
    let mut cfg = ModelConfig::new(dir.to_string_lossy());
    cfg.device = lmplex_core::DeviceKind::Cpu;
    if let Some(b) = budget {
        cfg.max_num_batched_tokens = Some(b);
    }
    Engine::new(cfg).unwrap()
}

#[test]
fn an_image_turn_gives_transformers_prompt_and_tokens() {
    let fx = common::vision_fixture("gemma3");
    let chat = &fx["chat"];
    let dir = tempfile::tempdir().unwrap();
    write_folder(dir.path(), &fx);
    let engine = start(dir.path(), None);
    let image = std::fs::read(common::repo_root().join(chat["image"].as_str().unwrap())).unwrap();
    let req = turn(image.clone(), chat["messages_text"].as_str().unwrap());
    let out = engine.generate(std::slice::from_ref(&req)).unwrap().pop().unwrap();
    let want_prompt = common::json_ids(&chat["prompt_ids"]);
    assert_eq!(engine.tokenizer().encode(&out.prompt, false).unwrap(), want_prompt, "prompt ids");
    assert_eq!(out.usage.prompt_tokens, want_prompt.len());
    assert_eq!(out.token_ids, common::json_ids(&chat["generated"]), "greedy tokens");
    // The image's tokens are where the processor's token type ids mark them.
    let types = common::json_ids(&chat["token_type_ids"]);
    let marked = (0..want_prompt.len()).filter(|&p| types[p] == 1).count();
    assert_eq!(marked, 4);

    // A budget of 3 tokens a step: chunks end at the image's edges (its 4 tokens in one
    // chunk, past the budget), and the tokens are the same, alone and beside a text request.
    let small = start(dir.path(), Some(3));
    let text = Request::new(
        Prompt::Messages(vec![ChatMessage::new("user", "t9 t8 t7 t6 t5")]),
        SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) },
    );
    let both = small.generate(&[req.clone(), text.clone()]).unwrap();
    assert_eq!(both[0].token_ids, out.token_ids, "chunked through a small budget");
    let alone = engine.generate(&[text]).unwrap().pop().unwrap();
    assert_eq!(both[1].token_ids, alone.token_ids, "the text request beside it");
}

#[test]
fn images_sent_together_share_one_tower_pass_and_keep_their_tokens() {
    let fx = common::vision_fixture("gemma3");
    let dir = tempfile::tempdir().unwrap();
    write_folder(dir.path(), &fx);
    let text = fx["chat"]["messages_text"].as_str().unwrap();
    let reqs: Vec<Request> =
        ["rgb.png", "rgba.png", "gray.png"].iter().map(|n| common::image_turn(n, text, 4)).collect();
    common::check_images_batched(&|budget| start(dir.path(), budget), &reqs);
}
