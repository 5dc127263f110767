//! Batch invariance on a real checkpoint: SmolLM2-135M-Instruct (GGUF, Q4_1/Q8_0). Each of 64
//! requests of different lengths, greedy or seeded, arriving at different times, gives
//! bit-identical tokens and logprobs to its solo run, with 1, 8 and 64 running together.

mod common;
#[path = "../../lmplex-model/tests/common.rs"]
mod model_common;

use lmplex_core::{ModelConfig, SamplingParams};
use lmplex_engine::{ChatMessage, Engine, Prompt, Request};
use std::time::Duration;

const TOPICS: [&str; 8] = [
    "the moon",
    "why the sky is blue, in detail, for a curious ten-year-old who asked twice",
    "bread",
    "a short poem about rivers and the sea",
    "how a CPU cache works",
    "three facts about cats",
    "what is 17 times 23? Show the steps.",
    "the history of the printing press, the people involved and its effect on literacy in Europe",
];

#[test]
fn smollm2_batched_equals_solo_bit_for_bit() {
    let Some(path) = model_common::smollm2_gguf() else { return };
    let mut cfg = ModelConfig::new(path.to_string_lossy());
    cfg.max_model_len = Some(512);
    cfg.max_model_concurrency = 64;
    cfg.max_num_batched_tokens = Some(256);
    let engine = Engine::new(cfg).unwrap();
    let reqs: Vec<Request> = (0..64)
        .map(|i| {
            let msgs =
                vec![ChatMessage::new("user", format!("Request {i}: tell me about {}.", TOPICS[i % TOPICS.len()]))];
            let mut p = SamplingParams { max_tokens: 6 + (i * 7) % 15, logprobs: Some(2), ..Default::default() };
            if i.is_multiple_of(3) {
                p.temperature = 0.0;
            } else {
                p.temperature = 0.8;
                p.seed = Some(1000 + i as u64);
            }
            Request::new(Prompt::Messages(msgs), p)
        })
        .collect();
    let alone: Vec<_> = reqs.iter().map(|r| common::solo(&engine, r)).collect();
    for n in [1usize, 8, 64] {
        let mut handles = Vec::new();
        for (i, r) in reqs.iter().take(n).enumerate() {
            handles.push(engine.submit(r).unwrap());
            if i % 8 == 7 {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        for (i, h) in handles.into_iter().enumerate() {
            let got = h.collect_blocking().unwrap();
            assert_eq!(got.token_ids, alone[i].token_ids, "request {i} among {n}");
            let bits = |o: &lmplex_core::RequestOutput| -> Vec<u32> {
                o.logprobs.as_ref().unwrap().iter().map(|l| l.logprob.to_bits()).collect()
            };
            assert_eq!(bits(&got), bits(&alone[i]), "request {i} among {n}: logprobs");
            assert_eq!(got.text, alone[i].text);
        }
    }
    common::wait_until_idle(&engine);
}
