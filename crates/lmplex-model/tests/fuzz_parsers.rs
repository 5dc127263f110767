//! Structure-aware fuzzing of every parser of untrusted checkpoint bytes: GGUF files, a
//! Hugging Face folder's `config.json`, safetensors header, `tokenizer.json`,
//! `tokenizer_config.json` (with its chat template) and `generation_config.json`, and a PEFT
//! adapter's `adapter_config.json` and `adapter_model.safetensors`.
//!
//! Each case corrupts one valid tiny checkpoint (`lmplex_model::testing`) where its structure
//! is (a GGUF count, length, type tag, dimension or offset; a JSON value, key or type; the
//! safetensors header length), loads it, and on success renders a chat with its template. The
//! load must end within `HANG_S` seconds with a model or a `ModelLoad`/`InvalidRequest` error
//! naming the corrupted file or the checkpoint, never a panic or an abort, without any single
//! allocation above `MAX_ALLOC` (the checkpoints are under 1 MB), and without backtrace text in
//! the message (`fuzz`: the harness; `fuzz::gguf`, `fuzz::json`: the mutations).
//!
//! Bounded for CI (`CASES` per target); `scripts/fuzz-parsers --minutes N` runs every target
//! for N minutes, one case at a time (`LMPLEX_FUZZ_SECONDS`, `LMPLEX_FUZZ_CASES`).

mod fuzz;

use fuzz::gguf::{apply_gguf, gguf_fields, gguf_mutation, interesting};
use fuzz::json::{json_mutation, mutate_json, JsonMutation};
use fuzz::{check, check_load, fuzz};
use lmplex_model::lora::{LoraAdapter, LoraModule};
use lmplex_model::testing::{write_tiny_adapter, write_tiny_checkpoint, write_tiny_gguf, Family};
use proptest::prelude::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

#[test]
fn gguf_files() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.gguf");
    write_tiny_gguf(&base, Family::Llama, &|_| candle_core::quantized::GgmlDType::Q8_0).unwrap();
    let bytes = std::fs::read(&base).unwrap();
    let fields = gguf_fields(&bytes);
    check_load(&base, "base.gguf").unwrap();
    let path = dir.path().join("fuzzed.gguf");
    fuzz("gguf", gguf_mutation(), |muts| {
        std::fs::write(&path, apply_gguf(bytes.clone(), &fields, &muts)).unwrap();
        check_load(&path, "fuzzed.gguf")
    });
}

// --- Hugging Face folders ---------------------------------------------------------------------

/// A tiny Qwen2 folder (a tied head, biases) with a chat template and a generation config.
fn hf_base(dir: &Path) -> PathBuf {
    let base = dir.join("base");
    std::fs::create_dir_all(&base).unwrap();
    write_tiny_checkpoint(&base, Family::Qwen2).unwrap();
    let template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}\
        {% if add_generation_prompt %}<assistant>{% endif %}";
    let tc =
        serde_json::json!({"chat_template": template, "bos_token": "t1", "eos_token": "t2", "model_max_length": 64});
    std::fs::write(base.join("tokenizer_config.json"), tc.to_string()).unwrap();
    let gc = serde_json::json!({"bos_token_id": 1, "eos_token_id": [2, 3], "temperature": 0.7, "top_p": 0.9});
    std::fs::write(base.join("generation_config.json"), gc.to_string()).unwrap();
    base
}

/// Copies `base` to `to` (files only).
fn copy_dir(base: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(base).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// Fuzzes the JSON file `name` of folder `base`: each case a copy of it at `case` with the file
/// corrupted, checked by `load`.
fn fuzz_json_file(base: &Path, case: &Path, name: &'static str, load: impl Fn(&Path) -> Result<(), TestCaseError>) {
    load(base).unwrap();
    let doc: Value = serde_json::from_slice(&std::fs::read(base.join(name)).unwrap()).unwrap();
    fuzz(name, json_mutation(), |muts| {
        copy_dir(base, case);
        let mut v = doc.clone();
        muts.iter().for_each(|m| mutate_json(&mut v, m));
        std::fs::write(case.join(name), v.to_string()).unwrap();
        load(case)
    });
}

/// Fuzzes the JSON file `name` of a Hugging Face folder.
fn json_file(name: &'static str) {
    let dir = tempfile::tempdir().unwrap();
    let base = hf_base(dir.path());
    fuzz_json_file(&base, &dir.path().join("case"), name, |p| check_load(p, name));
}

#[test]
fn config_json() {
    json_file("config.json");
}

#[test]
fn tokenizer_json() {
    json_file("tokenizer.json");
}

#[test]
fn tokenizer_config_json_and_chat_template() {
    json_file("tokenizer_config.json");
}

#[test]
fn generation_config_json() {
    json_file("generation_config.json");
}

/// How to corrupt a safetensors file: its header length, its header JSON, or a cut.
#[derive(Debug, Clone)]
enum SafetensorsMutation {
    HeaderLen(u64),
    Header(Vec<JsonMutation>),
    Truncate(usize),
}

fn safetensors_mutation() -> impl Strategy<Value = SafetensorsMutation> {
    prop_oneof![
        1 => any::<u64>().prop_map(SafetensorsMutation::HeaderLen),
        6 => json_mutation().prop_map(SafetensorsMutation::Header),
        1 => any::<usize>().prop_map(SafetensorsMutation::Truncate),
    ]
}

/// The safetensors file `bytes` corrupted by `m`.
fn apply_safetensors(bytes: &[u8], m: SafetensorsMutation) -> Vec<u8> {
    let n = (u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize).min(bytes.len() - 8);
    match m {
        SafetensorsMutation::HeaderLen(pick) => {
            let mut b = bytes.to_vec();
            b[..8].copy_from_slice(&interesting(8, pick));
            b
        }
        SafetensorsMutation::Header(muts) => {
            let mut h: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
            muts.iter().for_each(|m| mutate_json(&mut h, m));
            let text = h.to_string();
            let mut b = (text.len() as u64).to_le_bytes().to_vec();
            b.extend_from_slice(text.as_bytes());
            b.extend_from_slice(&bytes[8 + n..]);
            b
        }
        SafetensorsMutation::Truncate(keep) => bytes[..keep % (bytes.len() + 1)].to_vec(),
    }
}

#[test]
fn safetensors_files() {
    let dir = tempfile::tempdir().unwrap();
    let base = hf_base(dir.path());
    let bytes = std::fs::read(base.join("model.safetensors")).unwrap();
    let case = dir.path().join("case");
    fuzz("model.safetensors", safetensors_mutation(), |m| {
        copy_dir(&base, &case);
        std::fs::write(case.join("model.safetensors"), apply_safetensors(&bytes, m)).unwrap();
        check_load(&case, "model.safetensors")
    });
}

// --- LoRA adapters (PEFT folders) -------------------------------------------------------------

/// A PEFT adapter of every projection of a tiny Llama, rank 4, and what loading it needs: the
/// base's projections and layer count.
fn adapter_base(dir: &Path) -> (PathBuf, Vec<LoraModule>, usize) {
    let base = dir.join("base");
    std::fs::create_dir_all(&base).unwrap();
    write_tiny_checkpoint(&base, Family::Llama).unwrap();
    let model = lmplex_model::load(&base, Some(32)).unwrap().model;
    let (modules, layers) = (model.lora_modules(), model.args.num_hidden_layers);
    let adapter = dir.join("adapter");
    write_tiny_adapter(&adapter, &modules, 4, 0.08, "fuzz").unwrap();
    (adapter, modules, layers)
}

/// Loads the adapter in `dir`; the outcome checked as for a checkpoint, the error naming `file`.
fn check_adapter(dir: &Path, modules: &[LoraModule], layers: usize, file: &str) -> Result<(), TestCaseError> {
    let (d, modules) = (dir.to_path_buf(), modules.to_vec());
    check(dir, file, move || LoraAdapter::load(&d, &modules, layers, 64).map(|_| ()).map_err(|e| (true, e)))
}

#[test]
fn adapter_config_json() {
    let dir = tempfile::tempdir().unwrap();
    let (base, modules, layers) = adapter_base(dir.path());
    let name = "adapter_config.json";
    fuzz_json_file(&base, &dir.path().join("case"), name, |p| check_adapter(p, &modules, layers, name));
}

#[test]
fn adapter_safetensors() {
    let dir = tempfile::tempdir().unwrap();
    let (base, modules, layers) = adapter_base(dir.path());
    let name = "adapter_model.safetensors";
    let bytes = std::fs::read(base.join(name)).unwrap();
    let case = dir.path().join("case");
    fuzz(name, safetensors_mutation(), |m| {
        copy_dir(&base, &case);
        std::fs::write(case.join(name), apply_safetensors(&bytes, m)).unwrap();
        check_adapter(&case, &modules, layers, name)
    });
}
