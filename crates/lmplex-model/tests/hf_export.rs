//! The Hugging Face folder path on real checkpoints: SmolLM2-135M and Qwen2.5-Coder-0.5B GGUFs
//! exported by `export::gguf_to_hf` (dequantized, llama q/k rows un-permuted, tokenizer and chat
//! template written out) and loaded back through `config.json`, safetensors and `tokenizer.json`.
//!
//! - f32, one file: the same logits as the GGUF itself within 2e-2 over a 70+ token prompt (the
//!   GGUF kernels round activations to 16 bits; the folder multiplies in f32), and the same
//!   greedy tokens, chat text and eos ids.
//! - bf16, several shards with their index: the same logits as candle-transformers' `llama` /
//!   `qwen2` on the same folder (computing in f32) within 2e-3, and equal greedy tokens.

mod common;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use lmplex_model::export::gguf_to_hf;
use lmplex_model::{ChatMessage, LoadedModel};
use std::path::{Path, PathBuf};

const TOL: f32 = 2e-3;
/// GGUF weights against the same weights dequantized to an f32 folder: the GGUF kernels also
/// round activations to 16 bits per 32-value block (`qmatmul::acts`), which moves logits (of
/// magnitude ~20 here) by up to ~1e-2; measured 0.010 on SmolLM2.
const GGUF_TOL: f32 = 2e-2;
const PROMPT: &str = "Explain, in two short paragraphs, why a paged KV cache lets an inference server run more \
    requests at once than a contiguous one, and what a block table is.";

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)
}

fn chat_ids(m: &LoadedModel) -> (String, Vec<u32>) {
    let text = m.tokenizer.apply_chat_template(&[ChatMessage::new("user", PROMPT)], true).unwrap();
    let ids = m.tokenizer.encode(&text, false).unwrap();
    assert!(ids.len() >= 40, "{}", ids.len());
    (text, ids)
}

fn f32_folder_matches_gguf(gguf: &Path) {
    let dir = tempfile::tempdir().unwrap();
    let out = gguf_to_hf(gguf, dir.path(), DType::F32, usize::MAX).unwrap();
    assert!(dir.path().join("model.safetensors").exists(), "{:?}", out.files);
    let a = lmplex_model::load(gguf, Some(512)).unwrap();
    let b = lmplex_model::load(dir.path(), Some(512)).unwrap();
    assert_eq!(b.info.format, "safetensors");
    let (text_a, ids_a) = chat_ids(&a);
    let (text_b, ids_b) = chat_ids(&b);
    assert_eq!(text_a, text_b);
    assert_eq!(ids_a, ids_b);
    assert_eq!(a.tokenizer.eos_token_ids, b.tokenizer.eos_token_ids);
    assert_eq!(a.tokenizer.encode("Hello world", true).unwrap(), b.tokenizer.encode("Hello world", true).unwrap());
    let la = common::prefill_all_logits(&a.model, &ids_a);
    let lb = common::prefill_all_logits(&b.model, &ids_a);
    for (i, (x, y)) in la.iter().zip(&lb).enumerate() {
        let d = max_diff(x, y);
        assert!(d < GGUF_TOL, "position {i}: max |logit diff| {d}");
    }
    let (ga, _) = common::greedy(&a.model, &ids_a, 16);
    let (gb, _) = common::greedy(&b.model, &ids_a, 16);
    assert_eq!(ga, gb);
}

/// candle-transformers' logits for the last token after `prompt`, then after each of `next`.
fn candle_logits(dir: &Path, arch: &str, files: &[PathBuf], prompt: &[u32], next: &[u32]) -> Vec<Vec<f32>> {
    use candle_transformers::models::{llama, qwen2};
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let dev = Device::Cpu;
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(files, DType::F32, &dev) }.unwrap();
    let mut chunks = vec![prompt.to_vec()];
    chunks.extend(next.iter().map(|&t| vec![t]));
    let mut pos = 0;
    let mut out = Vec::new();
    match arch {
        "llama" => {
            let c = serde_json::from_str::<llama::LlamaConfig>(&cfg).unwrap().into_config(false);
            let m = llama::Llama::load(vb, &c).unwrap();
            let mut cache = llama::Cache::new(true, DType::F32, &c, &dev).unwrap();
            for ch in &chunks {
                let x = Tensor::new(ch.as_slice(), &dev).unwrap().unsqueeze(0).unwrap();
                out.push(m.forward(&x, pos, &mut cache).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap());
                pos += ch.len();
            }
        }
        _ => {
            let mut m = qwen2::ModelForCausalLM::new(&serde_json::from_str(&cfg).unwrap(), vb).unwrap();
            for ch in &chunks {
                let x = Tensor::new(ch.as_slice(), &dev).unwrap().unsqueeze(0).unwrap();
                // ModelForCausalLM returns the last position's logits only.
                out.push(m.forward(&x, pos).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap());
                pos += ch.len();
            }
        }
    }
    out
}

fn bf16_shards_match_candle(gguf: &Path, arch: &str, shard_bytes: usize) {
    let dir = tempfile::tempdir().unwrap();
    let out = gguf_to_hf(gguf, dir.path(), DType::BF16, shard_bytes).unwrap();
    let shards: Vec<PathBuf> =
        out.files.iter().filter(|f| f.extension().is_some_and(|e| e == "safetensors")).cloned().collect();
    assert!(shards.len() >= 2, "expected several shards: {:?}", out.files);
    assert!(dir.path().join("model.safetensors.index.json").exists());
    let ours = lmplex_model::load(dir.path(), Some(512)).unwrap();
    // A bf16 folder: `auto` stores K/V in f16 (an all-f32 one keeps f32: tiny_parity).
    assert_eq!(ours.kv_dtype, lmplex_model::KvDtype::F16);
    let (_, ids) = chat_ids(&ours);
    let (greedy, step_logits) = common::greedy(&ours.model, &ids, 8);
    let theirs = candle_logits(dir.path(), arch, &shards, &ids, &greedy[..7]);
    for (i, (x, y)) in step_logits.iter().zip(&theirs).enumerate() {
        let d = max_diff(x, y);
        assert!(d < TOL, "step {i}: max |logit diff| {d}");
        assert_eq!(lmplex_model::sample::argmax(x), lmplex_model::sample::argmax(y), "step {i}");
    }
}

#[test]
fn smollm2_f32_folder_matches_gguf() {
    let Some(path) = common::smollm2_gguf() else { return };
    f32_folder_matches_gguf(&path);
}

#[test]
fn smollm2_bf16_shards_match_candle_llama() {
    let Some(path) = common::smollm2_gguf() else { return };
    bf16_shards_match_candle(&path, "llama", 100 << 20);
}

#[test]
fn qwen25_bf16_shards_match_candle_qwen2() {
    let Some(path) = common::qwen05_gguf() else { return };
    bf16_shards_match_candle(&path, "qwen2", 400 << 20);
}
