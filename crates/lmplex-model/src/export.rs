//! GGUF -> Hugging Face folder: dequantize every tensor and write `config.json`, (sharded)
//! safetensors with their index, `tokenizer.json`, `tokenizer_config.json` (chat template) and
//! `generation_config.json`, so a GGUF checkpoint can be loaded as HF transformers would.
//!
//! Invariants: tensor names are HF's (`gguf_name` inverted); llama q/k rows, which llama.cpp
//! permutes to the interleaved rope layout, are permuted back to HF's half-split layout, so the
//! folder loads with `interleaved: false` and computes the same function; a BOS the GGUF asks
//! for becomes a `TemplateProcessing` post-processor in `tokenizer.json`. Shards hold whole
//! tensors, in name order, each at most `max_shard_bytes` unless one tensor alone is larger.
//!
//! Cost: one dequantized tensor at a time plus one shard's tensors in memory.

use crate::args::{gguf_args, Arch, ModelArgs};
use crate::gguf_tokenizer::GgufTokenizer;
use crate::loader::open_gguf;
use crate::tokenizer::Tokenizer;
use crate::weights::gguf_name;
use candle_core::{DType, Device, Tensor};
use lmplex_core::{Error, Result};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// What `gguf_to_hf` wrote.
#[derive(Debug, Clone)]
pub struct Exported {
    /// Every file written: tokenizer, `config.json`, `generation_config.json`, shards, index.
    pub files: Vec<PathBuf>,
    /// Tensors written, over all shards.
    pub num_tensors: usize,
    /// Bytes of tensor data over all shards.
    pub total_bytes: usize,
}

/// `"bfloat16"`/`"bf16"`, `"float16"`/`"f16"` or `"float32"`/`"f32"`.
pub fn dtype_from_name(name: &str) -> Result<DType> {
    match name {
        "bfloat16" | "bf16" => Ok(DType::BF16),
        "float16" | "f16" => Ok(DType::F16),
        "float32" | "f32" => Ok(DType::F32),
        other => Err(Error::invalid(format!("dtype must be 'bfloat16', 'float16' or 'float32', not {other:?}"))),
    }
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::model_load(format!("{}: {e}", path.display()))
}

/// HF names of every tensor the architecture may have, keyed by their GGUF names.
fn hf_names(args: &ModelArgs) -> HashMap<String, String> {
    let mut names = vec!["model.embed_tokens.weight".to_string(), "model.norm.weight".into(), "lm_head.weight".into()];
    let parts = [
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.qkv_proj",
        "self_attn.o_proj",
        "self_attn.q_norm",
        "self_attn.k_norm",
        "input_layernorm",
        "post_attention_layernorm",
        "mlp.gate_proj",
        if args.arch == Arch::Phi3 { "mlp.gate_up_proj" } else { "mlp.up_proj" },
        "mlp.down_proj",
    ];
    for i in 0..args.num_hidden_layers {
        for p in parts {
            for suffix in ["weight", "bias"] {
                names.push(format!("model.layers.{i}.{p}.{suffix}"));
            }
        }
    }
    names.into_iter().map(|hf| (gguf_name(args.arch, &hf), hf)).collect()
}

/// Undoes llama.cpp's q/k permutation: rows `(head, pair, 2)` back to `(head, 2, pair)`.
fn unpermute_rows(t: &Tensor, heads: usize) -> candle_core::Result<Tensor> {
    let (rows, cols) = t.dims2()?;
    t.reshape((heads, rows / heads / 2, 2, cols))?.transpose(1, 2)?.contiguous()?.reshape((rows, cols))
}

fn hf_config(args: &ModelArgs, dtype: DType) -> Result<serde_json::Value> {
    let (class, model_type) = match args.arch {
        Arch::Llama => ("LlamaForCausalLM", "llama"),
        Arch::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
        Arch::Qwen3 => ("Qwen3ForCausalLM", "qwen3"),
        Arch::Phi3 if !args.has_sliding_window() => ("Phi3ForCausalLM", "phi3"),
        other => {
            return Err(Error::invalid(format!(
                "exporting a {} GGUF to a Hugging Face folder is not supported (llama, qwen2, qwen3 and phi3 \
                 without a sliding window are)",
                other.name()
            )))
        }
    };
    let dtype = match dtype {
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        _ => "float32",
    };
    let mut cfg = json!({
        "architectures": [class],
        "model_type": model_type,
        "vocab_size": args.vocab_size,
        "hidden_size": args.hidden_size,
        "intermediate_size": args.intermediate_size,
        "num_hidden_layers": args.num_hidden_layers,
        "num_attention_heads": args.num_attention_heads,
        "num_key_value_heads": args.num_key_value_heads,
        "head_dim": args.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": args.rms_norm_eps,
        // transformers >= 5 reads rope_parameters; older readers (and candle) rope_theta.
        "rope_parameters": {"rope_type": "default", "rope_theta": args.rope.theta},
        "rope_theta": args.rope.theta,
        "max_position_embeddings": args.max_position_embeddings,
        "tie_word_embeddings": args.tie_word_embeddings,
        "attention_bias": args.attention_bias,
        "bos_token_id": args.bos_token_id,
        "eos_token_id": args.eos_token_ids,
        "dtype": dtype,
    });
    if args.arch == Arch::Qwen2 {
        // As Qwen2.5's own configs say: the window is off.
        cfg["use_sliding_window"] = json!(false);
        cfg["sliding_window"] = json!(args.max_position_embeddings);
        cfg["max_window_layers"] = json!(args.num_hidden_layers);
    }
    Ok(cfg)
}

fn write_json(path: &Path, v: &serde_json::Value) -> Result<PathBuf> {
    let text = serde_json::to_string_pretty(v).map_err(Error::internal)?;
    std::fs::write(path, text + "\n").map_err(|e| io_err(path, e))?;
    Ok(path.to_path_buf())
}

/// The tokenizer files; returns them and the tokenizer the loader would build from the GGUF.
fn write_tokenizer(g: GgufTokenizer, out: &Path) -> Result<(Vec<PathBuf>, Tokenizer)> {
    use tokenizers::processors::template::TemplateProcessing;
    let mut inner = g.tokenizer.clone();
    let bos = g.bos_token_id.and_then(|id| inner.id_to_token(id).map(|s| (s, id)));
    if let (true, Some((bos, id))) = (g.add_bos_token, &bos) {
        let post = TemplateProcessing::builder()
            .try_single(format!("{bos} $A"))
            .and_then(|b| b.try_pair(format!("{bos} $A {bos} $B")))
            .map_err(Error::internal)?
            .special_tokens(vec![(bos.clone(), *id)])
            .build()
            .map_err(Error::internal)?;
        inner.with_post_processor(Some(post));
    }
    let eos = g.eos_token_id.and_then(|id| inner.id_to_token(id));
    let template = g.chat_template.clone();
    let add_bos = g.add_bos_token;
    let tok = Tokenizer::from_gguf(g, &[])?;
    let tok_path = out.join("tokenizer.json");
    inner.save(&tok_path, true).map_err(|e| io_err(&tok_path, e))?;
    let cfg = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos.map(|(s, _)| s),
        "eos_token": eos,
        "add_bos_token": add_bos,
        "chat_template": template,
    });
    let cfg_path = write_json(&out.join("tokenizer_config.json"), &cfg)?;
    Ok((vec![tok_path, cfg_path], tok))
}

/// Writes `gguf` as an HF folder in `out` (created if needed) with tensors in `dtype`
/// (`BF16`, `F16` or `F32`), in shards of at most `max_shard_bytes`.
pub fn gguf_to_hf(gguf: &Path, out: &Path, dtype: DType, max_shard_bytes: usize) -> Result<Exported> {
    if !matches!(dtype, DType::BF16 | DType::F16 | DType::F32) {
        return Err(Error::invalid(format!("export dtype must be bf16, f16 or f32, not {dtype:?}")));
    }
    let (content, mut reader) = open_gguf(gguf)?;
    let g = crate::gguf_tokenizer::from_gguf(&content).map_err(|e| io_err(gguf, e))?;
    // A family that cannot be exported is refused before anything is written.
    hf_config(&gguf_args(&content, gguf, None)?, dtype)?;
    std::fs::create_dir_all(out).map_err(|e| io_err(out, e))?;
    let (mut files, tokenizer) = write_tokenizer(g, out)?;
    let mut args = gguf_args(&content, gguf, Some(&tokenizer))?;
    if content.tensor_infos.contains_key("rope_freqs.weight") {
        return Err(io_err(gguf, "rope frequency factors (rope_freqs.weight) cannot be exported to config.json yet"));
    }
    args.rope.interleaved = false; // after unpermute_rows below
    files.push(write_json(&out.join("config.json"), &hf_config(&args, dtype)?)?);
    let gen = json!({"bos_token_id": args.bos_token_id, "eos_token_id": tokenizer.eos_token_ids});
    files.push(write_json(&out.join("generation_config.json"), &gen)?);

    let names = hf_names(&args);
    let mut tensors: Vec<(String, String)> = Vec::new();
    for g_name in content.tensor_infos.keys() {
        let hf = names.get(g_name).ok_or_else(|| io_err(gguf, format!("tensor '{g_name}' has no HF name")))?;
        tensors.push((hf.clone(), g_name.clone()));
    }
    tensors.sort();
    let elem = dtype.size_in_bytes();
    let mut shards: Vec<Vec<(String, String)>> = vec![Vec::new()];
    let mut shard_bytes = 0usize;
    for t in tensors {
        let bytes = content.tensor_infos[&t.1].shape.elem_count() * elem;
        if shard_bytes > 0 && shard_bytes + bytes > max_shard_bytes {
            shards.push(Vec::new());
            shard_bytes = 0;
        }
        shard_bytes += bytes;
        shards.last_mut().expect("one shard at least").push(t);
    }
    let n = shards.len();
    let (mut weight_map, mut total_bytes, mut num_tensors) = (BTreeMap::new(), 0usize, 0usize);
    for (i, shard) in shards.iter().enumerate() {
        let file =
            if n == 1 { "model.safetensors".to_string() } else { format!("model-{:05}-of-{n:05}.safetensors", i + 1) };
        let mut map: HashMap<String, Tensor> = HashMap::new();
        for (hf, g_name) in shard {
            let q = content.tensor(&mut reader, g_name, &Device::Cpu).map_err(|e| io_err(gguf, e))?;
            let mut t = q.dequantize(&Device::Cpu).map_err(|e| io_err(gguf, e))?;
            if args.arch == Arch::Llama && (g_name.ends_with("attn_q.weight") || g_name.ends_with("attn_k.weight")) {
                let heads =
                    if g_name.ends_with("attn_q.weight") { args.num_attention_heads } else { args.num_key_value_heads };
                t = unpermute_rows(&t, heads).map_err(Error::internal)?;
            }
            let t = t.to_dtype(dtype).map_err(Error::internal)?;
            total_bytes += t.elem_count() * elem;
            num_tensors += 1;
            weight_map.insert(hf.clone(), file.clone());
            map.insert(hf.clone(), t);
        }
        let path = out.join(&file);
        candle_core::safetensors::save(&map, &path).map_err(|e| io_err(&path, e))?;
        files.push(path);
    }
    if n > 1 {
        let index = json!({"metadata": {"total_size": total_bytes}, "weight_map": weight_map});
        files.push(write_json(&out.join("model.safetensors.index.json"), &index)?);
    }
    Ok(Exported { files, num_tensors, total_bytes })
}
