//! Helpers shared by the integration tests: finding the offline models, the family fixtures
//! (`tests/fixtures/families`) and minimal runners over the paged KV cache (one sequence,
//! blocks 0..n).

#![allow(dead_code)]

use lmplex_model::testing::write_word_tokenizer;
use lmplex_model::{ForwardBatch, KvCache, KvDtype, LogitsSelect, Model, SeqChunk};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A GGUF fetched by `lmplex models fetch <alias>` into the lmplex cache (or named by the
/// environment variable `env`). `None` skips the test, unless `LMPLEX_REQUIRE_MODELS=1` (CI).
pub fn fetched_gguf(alias: &str, file: &str, env: &str) -> Option<PathBuf> {
    let path = match std::env::var_os(env) {
        Some(p) => PathBuf::from(p),
        None => {
            let cache = std::env::var_os("LMPLEX_CACHE_DIR").map(PathBuf::from).unwrap_or_else(|| {
                let base = std::env::var_os("XDG_CACHE_HOME")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache"));
                base.join("lmplex").join("models")
            });
            cache.join(file)
        }
    };
    if path.exists() {
        return Some(path);
    }
    if std::env::var("LMPLEX_REQUIRE_MODELS").is_ok_and(|v| v == "1") {
        panic!("{} is missing: run `lmplex models fetch {alias}`", path.display());
    }
    eprintln!("skipped: {} is missing (run `lmplex models fetch {alias}`)", path.display());
    None
}

/// SmolLM2-135M-Instruct, Q4_1 (`LMPLEX_SMOLLM2_GGUF` overrides the path).
pub fn smollm2_gguf() -> Option<PathBuf> {
    fetched_gguf("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf", "LMPLEX_SMOLLM2_GGUF")
}

/// Gemma-3-270m, Q4_K_M (`LMPLEX_GEMMA3_GGUF` overrides the path).
pub fn gemma3_gguf() -> Option<PathBuf> {
    fetched_gguf("gemma-3-270m", "gemma-3-270m-q4_k_m.gguf", "LMPLEX_GEMMA3_GGUF")
}

/// Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (`LMPLEX_QWEN05_GGUF` overrides the path).
pub fn qwen05_gguf() -> Option<PathBuf> {
    fetched_gguf("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "LMPLEX_QWEN05_GGUF")
}

pub const BLOCK_SIZE: usize = 16;

/// A KV cache of `dtype` for one sequence of up to `max_len` tokens, and its block table.
pub fn single_seq_kv(model: &Model, max_len: usize, dtype: KvDtype) -> (KvCache, Vec<u32>) {
    let blocks = max_len.div_ceil(BLOCK_SIZE);
    (model.new_kv_cache(blocks, BLOCK_SIZE, dtype).unwrap(), (0..blocks as u32).collect())
}

/// All-position logits of `tokens` in one prefill (f32 KV), as a `[len, vocab]` row-major vector.
pub fn prefill_all_logits(model: &Model, tokens: &[u32]) -> Vec<Vec<f32>> {
    let (mut kv, table) = single_seq_kv(model, tokens.len(), KvDtype::F32);
    let batch = ForwardBatch {
        seqs: vec![SeqChunk {
            token_ids: tokens,
            start_pos: 0,
            block_table: &table,
            logits: LogitsSelect::All,
            num_prompt_tokens: usize::MAX,
            lora: None,
            embeds: None,
        }],
    };
    model.forward(&batch, &mut kv).unwrap().to_vec2::<f32>().unwrap()
}

/// Greedy decoding (f32 KV) with one prefill and then one token per step; returns the new
/// tokens and each step's logits.
pub fn greedy(model: &Model, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    greedy_with(model, prompt, n, KvDtype::F32)
}

/// `greedy` with a KV cache of `dtype`.
pub fn greedy_with(model: &Model, prompt: &[u32], n: usize, dtype: KvDtype) -> (Vec<u32>, Vec<Vec<f32>>) {
    let (mut kv, table) = single_seq_kv(model, prompt.len() + n, dtype);
    let mut out = Vec::new();
    let mut all = Vec::new();
    let mut chunk: Vec<u32> = prompt.to_vec();
    let mut pos = 0;
    for _ in 0..n {
        let batch = ForwardBatch {
            seqs: vec![SeqChunk {
                token_ids: &chunk,
                start_pos: pos,
                block_table: &table,
                logits: LogitsSelect::Last,
                num_prompt_tokens: prompt.len(),
                lora: None,
                embeds: None,
            }],
        };
        let logits = model.forward(&batch, &mut kv).unwrap().to_vec2::<f32>().unwrap().remove(0);
        let next = lmplex_model::sample::argmax(&logits);
        pos += chunk.len();
        chunk = vec![next];
        out.push(next);
        all.push(logits);
    }
    (out, all)
}

/// The family fixtures `scripts/make_family_fixtures.py` writes, sorted by name.
pub fn family_fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/families");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    v.sort();
    v
}

#[allow(unused_imports)] // not every test binary reads a fixture
pub use lmplex_model::testing::{fixture_tensors, HfTensor};

/// An HF folder in `dir`: `config`, a word-level tokenizer of its vocabulary, `tensors`.
pub fn write_hf_folder(dir: &Path, config: &Value, tensors: Vec<HfTensor>) {
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    write_word_tokenizer(dir, config["vocab_size"].as_u64().unwrap() as usize).unwrap();
    let dev = candle_core::Device::Cpu;
    let map: std::collections::HashMap<String, candle_core::Tensor> = tensors
        .into_iter()
        .map(|t| (t.name, candle_core::Tensor::from_vec(t.values, t.shape, &dev).unwrap()))
        .collect();
    candle_core::safetensors::save(&map, dir.join("model.safetensors")).unwrap();
}

/// Runs `chunks` of one sequence through `model` in turn; the last row's logits after each.
pub fn run_chunks(model: &Model, kv: &mut KvCache, table: &[u32], chunks: &[Vec<u32>]) -> Vec<Vec<f32>> {
    let mut pos = 0;
    chunks
        .iter()
        .map(|c| {
            let batch = ForwardBatch {
                seqs: vec![SeqChunk {
                    token_ids: c,
                    start_pos: pos,
                    block_table: table,
                    logits: LogitsSelect::Last,
                    num_prompt_tokens: usize::MAX,
                    lora: None,
                    embeds: None,
                }],
            };
            pos += c.len();
            model.forward_logits(&batch, kv).unwrap()
        })
        .collect()
}

/// The largest absolute difference between two equally long rows.
pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)
}
