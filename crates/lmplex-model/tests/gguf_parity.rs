//! Real GGUF checkpoints: lmplex's greedy tokens equal candle-transformers' on the same file, for
//! 32 tokens on several chat prompts. SmolLM2-135M-Instruct (Q4_1, llama) against
//! `quantized_llama`; Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, qwen2 with q/k/v biases) against
//! `quantized_qwen2`. (Gemma-3-270m is checked against transformers instead:
//! `tests/test_hf_fixtures.py`; candle's `quantized_gemma3` leaves transformers' greedy path on
//! that file within six tokens where lmplex keeps it.)
//!
//! candle runs with `CANDLE_DEQUANTIZE_ALL=1`: its default CPU path quantizes activations to
//! 8 bits (ggml's Q8_1), which moves logits by up to ~1 and flips greedy choices within a few
//! tokens, whereas lmplex multiplies f32 activations by the GGUF blocks (see `qmatmul.rs`).
//! Both then compute the dequantized model, and must agree.

mod common;

use candle_core::{Device, Tensor};
use candle_transformers::models::{quantized_llama, quantized_qwen2};
use lmplex_model::ChatMessage;
use std::path::Path;

const PROMPTS: [&str; 4] = [
    "Write a haiku about GPUs.",
    "What is the capital of France? Answer in one sentence.",
    "List three prime numbers greater than 10.",
    "Explain what a KV cache is in a language model.",
];

/// candle's two GGUF models, behind one `forward(tokens, pos) -> last logits`.
enum Candle {
    Llama(quantized_llama::ModelWeights),
    Qwen2(quantized_qwen2::ModelWeights),
}

impl Candle {
    fn open(path: &Path) -> Self {
        // Read by candle once per thread, when its first QMatMul is built (below).
        std::env::set_var("CANDLE_DEQUANTIZE_ALL", "1");
        let mut f = std::fs::File::open(path).unwrap();
        let content = candle_core::quantized::gguf_file::Content::read(&mut f).unwrap();
        let arch = content.metadata["general.architecture"].to_string().unwrap().clone();
        match arch.as_str() {
            "llama" => Self::Llama(quantized_llama::ModelWeights::from_gguf(content, &mut f, &Device::Cpu).unwrap()),
            "qwen2" => Self::Qwen2(quantized_qwen2::ModelWeights::from_gguf(content, &mut f, &Device::Cpu).unwrap()),
            other => panic!("no candle oracle for {other}"),
        }
    }

    fn forward(&mut self, x: &Tensor, pos: usize) -> Tensor {
        match self {
            Self::Llama(m) => m.forward(x, pos).unwrap(),
            Self::Qwen2(m) => m.forward(x, pos).unwrap(),
        }
    }
}

fn candle_greedy(path: &Path, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut m = Candle::open(path);
    let mut out = Vec::new();
    let mut input = prompt.to_vec();
    let mut pos = 0;
    for _ in 0..n {
        let x = Tensor::new(input.as_slice(), &Device::Cpu).unwrap().unsqueeze(0).unwrap();
        let logits = m.forward(&x, pos).squeeze(0).unwrap().to_vec1::<f32>().unwrap();
        pos += input.len();
        let next = lmplex_model::sample::argmax(&logits);
        out.push(next);
        input = vec![next];
    }
    out
}

fn greedy_tokens_equal_candle(path: &Path) {
    let loaded = lmplex_model::load(path, Some(1024)).unwrap();
    let tok = &loaded.tokenizer;
    for p in PROMPTS {
        let text = tok.apply_chat_template(&[ChatMessage::new("user", p)], true).unwrap();
        let ids = tok.encode(&text, false).unwrap();
        assert!(ids.len() > 10);
        let (ours, _) = common::greedy_with(&loaded.model, &ids, 32, loaded.kv_dtype);
        let theirs = candle_greedy(path, &ids, 32);
        assert_eq!(
            ours,
            theirs,
            "prompt {p:?}: lmplex {:?} vs candle {:?}",
            tok.decode(&ours, false),
            tok.decode(&theirs, false)
        );
    }
}

#[test]
fn smollm2_greedy_tokens_equal_candle_quantized_llama() {
    let Some(path) = common::smollm2_gguf() else { return };
    greedy_tokens_equal_candle(&path);
}

#[test]
fn qwen25_greedy_tokens_equal_candle_quantized_qwen2() {
    let Some(path) = common::qwen05_gguf() else { return };
    greedy_tokens_equal_candle(&path);
}

/// Gemma's SentencePiece vocabulary from the GGUF splits text as transformers' Gemma tokenizer
/// does (ids from transformers 5.24 on the same file), with BOS, and without a space prefix.
#[test]
fn gemma3_tokenizer_matches_transformers() {
    let Some(path) = common::gemma3_gguf() else { return };
    let loaded = lmplex_model::load(&path, Some(256)).unwrap();
    let tok = &loaded.tokenizer;
    let cases: [(&str, &[u32]); 4] = [
        ("Hello world", &[2, 9259, 1902]),
        ("The capital of France is", &[2, 818, 5279, 529, 7001, 563]),
        ("  two  spaces\nnewline", &[2, 138, 13498, 138, 35220, 107, 73481]),
        ("Write a haiku about GPUs.", &[2, 6974, 496, 678, 20517, 1003, 118418, 236761]),
    ];
    for (text, want) in cases {
        assert_eq!(tok.encode(text, true).unwrap(), want, "{text:?}");
    }
    // The GGUF has no chat template: Gemma's own is used, and <end_of_turn> ends a turn.
    let text = tok.apply_chat_template(&[ChatMessage::new("user", "Hi")], true).unwrap();
    assert_eq!(text, "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
    assert!(tok.eos_token_ids.contains(&106) && tok.eos_token_ids.contains(&1), "{:?}", tok.eos_token_ids);
}

#[test]
fn gguf_tokenizer_matches_known_ids_and_honours_add_bos() {
    let Some(path) = common::smollm2_gguf() else { return };
    let loaded = lmplex_model::load(&path, Some(256)).unwrap();
    let tok = &loaded.tokenizer;
    // The GGUF says add_bos_token = false: no BOS even with special tokens on.
    let ids = tok.encode("Hello world", true).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), "Hello world");
    assert_ne!(ids.first(), tok.bos_token_id.as_ref());
    // Digits are split one by one (the "smollm" pre-tokenizer), special tokens stay whole.
    let ids = tok.encode("<|im_start|>2024", false).unwrap();
    assert_eq!(ids.len(), 5, "{ids:?}");
    assert_eq!(ids[0], 1);
    assert!(tok.eos_token_ids.contains(&2), "<|im_end|> ends a turn: {:?}", tok.eos_token_ids);
}
