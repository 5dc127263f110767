//! Tiny random checkpoints for tests (here and in the backends' crates): one HF folder per
//! family (llama, qwen2, qwen3, phi3) with a word-level tokenizer over `t0..t{VOCAB-1}`.
//!
//! Invariant: the same family always gets the same shapes (the constants below) and each
//! family's distinctive parts: untied head (llama, qwen3, phi3), q/k/v biases and a tied head
//! (qwen2), q/k head norms (qwen3), fused qkv and gate_up (phi3). Weights are Gaussian from a
//! generator seeded by the family, so a family's checkpoint is the same on every call and every
//! run (a test's tolerance is checked against one model, not a new draw each time). Also
//! `seeded_values` (from `lmplex_cpu::testing`), the benchmarks' inputs: the same values for a
//! seed on every build.

use candle_core::{Device, Tensor};
pub use lmplex_cpu::testing::seeded_values;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;

/// Vocabulary size: tokens `t0` to `t127`.
pub const VOCAB: usize = 128;
/// `hidden_size` of every tiny checkpoint.
pub const HIDDEN: usize = 64;
/// `intermediate_size` (the MLP's hidden width).
pub const INTER: usize = 96;
/// Decoder layers.
pub const LAYERS: usize = 2;
/// Query heads.
pub const HEADS: usize = 4;
/// KV heads (two query heads per KV head).
pub const KV_HEADS: usize = 2;
/// Width of one head (`HIDDEN / HEADS`).
pub const HEAD_DIM: usize = 16;
/// The checkpoints' trained context.
pub const MAX_POSITIONS: usize = 1024;

/// Which architecture a tiny checkpoint has; also seeds its weights.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Family {
    /// `llama`: untied head, no biases.
    Llama,
    /// `qwen2`: q/k/v biases and a tied head.
    Qwen2,
    /// `qwen3`: per-head q/k norms, untied head.
    Qwen3,
    /// `phi3`: fused `qkv_proj` and `gate_up_proj`, untied head.
    Phi3,
}

/// Gaussian values (Box-Muller) from `rng`, as a `shape` tensor.
fn randn(rng: &RefCell<StdRng>, shape: &[usize], std: f32) -> candle_core::Result<Tensor> {
    let n: usize = shape.iter().product();
    let mut rng = rng.borrow_mut();
    let v: Vec<f32> = (0..n)
        .map(|_| {
            let (u1, u2) = (1.0 - rng.random::<f64>(), rng.random::<f64>());
            ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32 * std
        })
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu)
}

/// `mean + std * u` for `n` values of `u` uniform in `[-sqrt(3), sqrt(3))` (unit variance),
/// hashed from `name` and the index: murmur3's finalizer over `i * 0x9E3779B9 ^ fnv1a(name)`.
/// `scripts/make_family_fixtures.py` computes the same bits with numpy, so a fixture needs
/// only tensor names and shapes, not weights.
pub fn hashed_values(name: &str, n: usize, std: f64, mean: f64) -> Vec<f32> {
    let seed = name.bytes().fold(0x811C_9DC5u32, |h, b| (h ^ b as u32).wrapping_mul(0x0100_0193));
    (0..n as u32)
        .map(|i| {
            let mut h = i.wrapping_mul(0x9E37_79B9) ^ seed;
            h ^= h >> 16;
            h = h.wrapping_mul(0x85EB_CA6B);
            h ^= h >> 13;
            h = h.wrapping_mul(0xC2B2_AE35);
            h ^= h >> 16;
            let u = h as f64 / 4_294_967_296.0 * 2.0 - 1.0;
            (mean + std * 3f64.sqrt() * u) as f32
        })
        .collect()
}

/// A tensor of a fixture's checkpoint: its HF name, shape and values.
pub struct HfTensor {
    /// The HF name.
    pub name: String,
    /// The shape.
    pub shape: Vec<usize>,
    /// The values, row-major.
    pub values: Vec<f32>,
}

/// A fixture's tensors (`{"tensors": [{"name", "shape", "std", "mean"}, ...]}`, as the
/// `scripts/make_*_fixtures.py` write them), their values regenerated from their names
/// (`hashed_values`). Panics on a malformed fixture (tests only).
pub fn fixture_tensors(fixture: &serde_json::Value) -> Vec<HfTensor> {
    let tensors = fixture["tensors"].as_array().expect("the fixture lists its tensors");
    tensors
        .iter()
        .map(|t| {
            let name = t["name"].as_str().expect("a tensor's name").to_string();
            let shape: Vec<usize> =
                t["shape"].as_array().expect("a shape").iter().filter_map(|d| d.as_u64()).map(|d| d as usize).collect();
            let (std, mean) = (t["std"].as_f64().expect("a std"), t["mean"].as_f64().expect("a mean"));
            let values = hashed_values(&name, shape.iter().product(), std, mean);
            HfTensor { name, shape, values }
        })
        .collect()
}

/// Writes a word-level `tokenizer.json` over `t0..t{vocab-1}` into `dir`.
pub fn write_word_tokenizer(dir: &Path, vocab: usize) -> std::io::Result<()> {
    let words: serde_json::Map<String, serde_json::Value> =
        (0..vocab).map(|i| (format!("t{i}"), serde_json::json!(i))).collect();
    let tokenizer = serde_json::json!({"version": "1.0", "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": words, "unk_token": "t0"}});
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string())
}

/// Writes `config.json`, `tokenizer.json` and `model.safetensors` of a random `fam` model.
pub fn write_tiny_checkpoint(dir: &Path, fam: Family) -> Result<(), Box<dyn std::error::Error>> {
    let (model_type, tied) = match fam {
        Family::Llama => ("llama", false),
        Family::Qwen2 => ("qwen2", true),
        Family::Qwen3 => ("qwen3", false),
        Family::Phi3 => ("phi3", false),
    };
    let config = serde_json::json!({
        "model_type": model_type, "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": INTER,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": MAX_POSITIONS,
        "tie_word_embeddings": tied, "hidden_act": "silu", "sliding_window": 4096, "use_sliding_window": false,
        "max_window_layers": LAYERS, "attention_bias": false, "bos_token_id": 1, "eos_token_id": 2,
    });
    std::fs::write(dir.join("config.json"), config.to_string())?;
    write_word_tokenizer(dir, VOCAB)?;
    candle_core::safetensors::save(&tiny_tensors(fam, tied)?, dir.join("model.safetensors"))?;
    Ok(())
}

/// The tiny checkpoint of `fam` as a GGUF file at `path` (llama.cpp's tensor names and
/// metadata keys, a word-level `llama` vocabulary over `t0..t{VOCAB-1}`), each matrix stored in
/// the ggml type `quant(hf_name)` (vectors in f32). q and k are stored as the folder holds them,
/// not permuted to llama.cpp's interleaved layout, so a Llama GGUF is a model of its own, the
/// same for every backend that reads it.
pub fn write_tiny_gguf(
    path: &Path,
    fam: Family,
    quant: &dyn Fn(&str) -> candle_core::quantized::GgmlDType,
) -> Result<(), Box<dyn std::error::Error>> {
    use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
    let (arch, model) = match fam {
        Family::Llama => ("llama", crate::Arch::Llama),
        Family::Qwen2 => ("qwen2", crate::Arch::Qwen2),
        Family::Qwen3 => ("qwen3", crate::Arch::Qwen3),
        Family::Phi3 => ("phi3", crate::Arch::Phi3),
    };
    let mut md: Vec<(String, gguf_file::Value)> = vec![
        ("general.architecture".into(), gguf_file::Value::String(arch.into())),
        ("general.file_type".into(), gguf_file::Value::U32(1)),
    ];
    let num = [
        ("embedding_length", HIDDEN),
        ("block_count", LAYERS),
        ("feed_forward_length", INTER),
        ("attention.head_count", HEADS),
        ("attention.head_count_kv", KV_HEADS),
        ("attention.key_length", HEAD_DIM),
        ("attention.value_length", HEAD_DIM),
        ("context_length", MAX_POSITIONS),
    ];
    md.extend(num.map(|(k, v)| (format!("{arch}.{k}"), gguf_file::Value::U32(v as u32))));
    md.push((format!("{arch}.attention.layer_norm_rms_epsilon"), gguf_file::Value::F32(1e-6)));
    let tok = |f: &dyn Fn(usize) -> gguf_file::Value| gguf_file::Value::Array((0..VOCAB).map(f).collect());
    md.push(("tokenizer.ggml.model".into(), gguf_file::Value::String("llama".into())));
    md.push(("tokenizer.ggml.tokens".into(), tok(&|i| gguf_file::Value::String(format!("t{i}")))));
    md.push(("tokenizer.ggml.scores".into(), tok(&|_| gguf_file::Value::F32(0.0))));
    md.push(("tokenizer.ggml.token_type".into(), tok(&|_| gguf_file::Value::I32(1))));
    md.push(("tokenizer.ggml.eos_token_id".into(), gguf_file::Value::U32(2)));
    let tensors = tiny_tensors(fam, fam == Family::Qwen2)?;
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    let mut qs = Vec::new();
    for name in names {
        let t = &tensors[name];
        let dtype = if t.rank() == 2 { quant(name) } else { GgmlDType::F32 };
        qs.push((crate::weights::gguf_name(model, name), QTensor::quantize(t, dtype)?));
    }
    let md_refs: Vec<(&str, &gguf_file::Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let q_refs: Vec<(&str, &QTensor)> = qs.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(path)?;
    gguf_file::write(&mut file, &md_refs, &q_refs)?;
    Ok(())
}

/// The tiny checkpoint's tensors by HF name (see the module header).
fn tiny_tensors(fam: Family, tied: bool) -> candle_core::Result<HashMap<String, Tensor>> {
    let (q, kv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    let mut t: HashMap<String, Tensor> = HashMap::new();
    let rng = RefCell::new(StdRng::seed_from_u64(0x6c6d_706c_6578 + fam as u64));
    let randn = |shape: &[usize], std: f32| randn(&rng, shape, std);
    let norm = |n: usize| randn(&[n], 0.1)? + 1.0;
    t.insert("model.embed_tokens.weight".into(), randn(&[VOCAB, HIDDEN], 0.5)?);
    t.insert("model.norm.weight".into(), norm(HIDDEN)?);
    if !tied {
        t.insert("lm_head.weight".into(), randn(&[VOCAB, HIDDEN], 0.1)?);
    }
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}");
        t.insert(format!("{p}.input_layernorm.weight"), norm(HIDDEN)?);
        t.insert(format!("{p}.post_attention_layernorm.weight"), norm(HIDDEN)?);
        t.insert(format!("{p}.self_attn.o_proj.weight"), randn(&[HIDDEN, q], 0.1)?);
        t.insert(format!("{p}.mlp.down_proj.weight"), randn(&[HIDDEN, INTER], 0.1)?);
        if fam == Family::Phi3 {
            t.insert(format!("{p}.self_attn.qkv_proj.weight"), randn(&[q + 2 * kv, HIDDEN], 0.2)?);
            t.insert(format!("{p}.mlp.gate_up_proj.weight"), randn(&[2 * INTER, HIDDEN], 0.1)?);
        } else {
            t.insert(format!("{p}.self_attn.q_proj.weight"), randn(&[q, HIDDEN], 0.2)?);
            t.insert(format!("{p}.self_attn.k_proj.weight"), randn(&[kv, HIDDEN], 0.2)?);
            t.insert(format!("{p}.self_attn.v_proj.weight"), randn(&[kv, HIDDEN], 0.2)?);
            t.insert(format!("{p}.mlp.gate_proj.weight"), randn(&[INTER, HIDDEN], 0.1)?);
            t.insert(format!("{p}.mlp.up_proj.weight"), randn(&[INTER, HIDDEN], 0.1)?);
        }
        if fam == Family::Qwen2 {
            t.insert(format!("{p}.self_attn.q_proj.bias"), randn(&[q], 0.1)?);
            t.insert(format!("{p}.self_attn.k_proj.bias"), randn(&[kv], 0.1)?);
            t.insert(format!("{p}.self_attn.v_proj.bias"), randn(&[kv], 0.1)?);
        }
        if fam == Family::Qwen3 {
            t.insert(format!("{p}.self_attn.q_norm.weight"), norm(HEAD_DIM)?);
            t.insert(format!("{p}.self_attn.k_norm.weight"), norm(HEAD_DIM)?);
        }
    }
    Ok(t)
}

/// Writes a PEFT LoRA adapter folder into `dir` adapting `modules` (a base's
/// `Model::lora_modules`, or a subset): rank `rank`, `lora_alpha = 2 * rank`, `A` and `B` of
/// standard deviation `std` hashed from `seed` and each tensor's name (`hashed_values`), stored in
/// f32 in Hugging Face's row order.
pub fn write_tiny_adapter(
    dir: &Path,
    modules: &[crate::lora::LoraModule],
    rank: usize,
    std: f64,
    seed: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    let mut targets: Vec<&str> = modules.iter().filter_map(|m| m.target.module().split('.').nth(1)).collect();
    targets.sort_unstable();
    targets.dedup();
    let config = serde_json::json!({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
        "target_modules": targets, "lora_dropout": 0.0, "bias": "none", "task_type": "CAUSAL_LM"});
    std::fs::write(dir.join("adapter_config.json"), config.to_string())?;
    let mut tensors = HashMap::new();
    for m in modules {
        for (which, shape) in [("lora_A", [rank, m.in_features]), ("lora_B", [m.out_features, rank])] {
            let name = format!("base_model.model.{}.{which}.weight", m.name());
            let v = hashed_values(&format!("{seed}/{name}"), shape[0] * shape[1], std, 0.0);
            tensors.insert(name, Tensor::from_vec(v, &shape, &Device::Cpu)?);
        }
    }
    candle_core::safetensors::save(&tensors, dir.join("adapter_model.safetensors"))?;
    Ok(())
}
