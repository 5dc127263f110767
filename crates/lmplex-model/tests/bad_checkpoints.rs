//! Broken checkpoints give a `ModelLoad` error that names the problem, never a panic.

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use lmplex_core::Error;
use std::path::Path;

fn load_err(path: &Path) -> String {
    match lmplex_model::load(path, Some(64)) {
        Err(Error::ModelLoad(m)) => m,
        Err(e) => panic!("expected ModelLoad, got {e:?}"),
        Ok(_) => panic!("{} loaded", path.display()),
    }
}

/// A minimal GGUF with llama metadata and the given tensors.
fn write_gguf(path: &Path, arch: &str, tensors: &[(&str, QTensor)]) {
    use gguf_file::Value;
    let md = [
        ("general.architecture", Value::String(arch.into())),
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.tokens", Value::Array(["a", "b", "ab"].map(|t| Value::String(t.into())).to_vec())),
        ("tokenizer.ggml.merges", Value::Array(vec![Value::String("a b".into())])),
        ("llama.block_count", Value::U32(1)),
        ("llama.embedding_length", Value::U32(256)),
        ("llama.feed_forward_length", Value::U32(256)),
        ("llama.attention.head_count", Value::U32(2)),
    ];
    let md: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (*k, v)).collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (*k, v)).collect();
    let mut f = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut f, &md, &ts).unwrap();
}

fn qt(dtype: GgmlDType) -> QTensor {
    let t = Tensor::ones((2, 256), candle_core::DType::F32, &Device::Cpu).unwrap();
    QTensor::quantize(&t, dtype).unwrap()
}

#[test]
fn bad_tokenizer_merges_are_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.gguf");
    write_gguf(&p, "llama", &[("token_embd.weight", qt(GgmlDType::F32))]);
    // Rewrite the merge "a b" as "a c": "c" is not in the vocabulary.
    let mut bytes = std::fs::read(&p).unwrap();
    let at = bytes.windows(3).position(|w| w == b"a b").unwrap();
    bytes[at + 2] = b'c';
    std::fs::write(&p, bytes).unwrap();
    let m = load_err(&p);
    assert!(m.contains("merge 'a c'"), "{m}");
}

#[test]
fn unsupported_quant_type_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("q8k.gguf");
    write_gguf(&p, "llama", &[("token_embd.weight", qt(GgmlDType::Q8K))]);
    let m = load_err(&p);
    assert!(m.contains("unsupported quant type Q8K"), "{m}");
}

#[test]
fn unknown_gguf_architecture_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.gguf");
    write_gguf(&p, "mamba", &[("token_embd.weight", qt(GgmlDType::F32))]);
    let m = load_err(&p);
    assert!(m.contains("unknown architecture 'mamba'"), "{m}");
}

#[test]
fn missing_tensor_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.gguf");
    write_gguf(&p, "llama", &[("token_embd.weight", qt(GgmlDType::Q8_0))]);
    let m = load_err(&p);
    assert!(m.contains("missing tensor 'blk.0."), "{m}");
}

#[test]
fn truncated_safetensors_and_missing_shard_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cfg = r#"{"model_type":"llama","vocab_size":2,"hidden_size":8,"intermediate_size":8,
        "num_hidden_layers":1,"num_attention_heads":2}"#;
    std::fs::write(d.join("config.json"), cfg).unwrap();
    let tok = r#"{"version":"1.0","added_tokens":[],"normalizer":null,"pre_tokenizer":null,
        "post_processor":null,"decoder":null,"model":{"type":"WordLevel","vocab":{"a":0,"b":1},"unk_token":"a"}}"#;
    std::fs::write(d.join("tokenizer.json"), tok).unwrap();
    let t = Tensor::ones((2, 8), candle_core::DType::F32, &Device::Cpu).unwrap();
    let st = d.join("model.safetensors");
    candle_core::safetensors::save(&std::collections::HashMap::from([("model.embed_tokens.weight", t)]), &st).unwrap();
    let bytes = std::fs::read(&st).unwrap();
    std::fs::write(&st, &bytes[..bytes.len() - 10]).unwrap();
    let m = load_err(d);
    assert!(m.contains("safetensors"), "{m}");

    std::fs::remove_file(&st).unwrap();
    let index = r#"{"weight_map":{"model.embed_tokens.weight":"model-00001-of-00002.safetensors"}}"#;
    std::fs::write(d.join("model.safetensors.index.json"), index).unwrap();
    let m = load_err(d);
    assert!(m.contains("model-00001-of-00002.safetensors") && m.contains("missing"), "{m}");
}
