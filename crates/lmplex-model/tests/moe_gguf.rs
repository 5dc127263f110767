//! The MoE families' GGUF path against their Hugging Face path: the transformers-checked tiny
//! Mixtral and Qwen2-MoE fixtures (`tests/fixtures/families`, see `hf_families.rs`) written as
//! GGUF files the way llama.cpp's converter lays them out: `ffn_{gate,up,down}_exps` as one
//! 3-D tensor `[experts, out, in]` each, the router as `ffn_gate_inp`, Qwen2-MoE's shared expert
//! as `ffn_*_shexp` and `ffn_gate_inp_shexp`, Mixtral as `llama` with an expert count and its
//! q/k rows permuted to the interleaved rope layout.
//!
//! Checks: an F32 GGUF gives the folder's logits within 1e-4 (only the summation order
//! differs). A GGUF whose expert tensors are Q8_0 (kept quantized, sliced per expert from the 3-D
//! blocks) gives, within 2e-3 and with the same greedy tokens, the logits of a folder holding
//! those experts' dequantized values (the quantized kernels round activations to 16 bits). The
//! expert weights are counted as loaded (f32, or the Q8_0 blocks).

mod common;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use lmplex_model::testing::{hashed_values, write_word_tokenizer};
use lmplex_model::weights::gguf_name;
use lmplex_model::{Arch, ForwardBatch, LogitsSelect, SeqChunk};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

fn fixture(name: &str) -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/fixtures/families/{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// The fixture's tensors by HF name.
fn tensors(f: &Value) -> BTreeMap<String, Tensor> {
    f["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let name = t["name"].as_str().unwrap();
            let shape: Vec<usize> =
                t["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
            let v =
                hashed_values(name, shape.iter().product(), t["std"].as_f64().unwrap(), t["mean"].as_f64().unwrap());
            (name.to_string(), Tensor::from_vec(v, shape, &Device::Cpu).unwrap())
        })
        .collect()
}

/// Rows `(head, 2, pair)` -> `(head, pair, 2)`: llama.cpp's permutation of Llama's q and k.
fn permute(t: &Tensor, heads: usize) -> Tensor {
    let (rows, cols) = t.dims2().unwrap();
    t.reshape((heads, 2, rows / heads / 2, cols))
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .contiguous()
        .unwrap()
        .reshape((rows, cols))
        .unwrap()
}

fn write_gguf(f: &Value, ts: &BTreeMap<String, Tensor>, path: &Path, quant: GgmlDType) {
    let c = &f["config"];
    let u = |k: &str| c[k].as_u64().unwrap() as u32;
    let mixtral = c["model_type"] == "mixtral";
    let arch = if mixtral { "llama" } else { "qwen2moe" };
    let (heads, kv_heads) = (u("num_attention_heads") as usize, u("num_key_value_heads") as usize);
    let mut md: Vec<(String, gguf_file::Value)> = vec![
        ("general.architecture".into(), gguf_file::Value::String(arch.into())),
        ("general.file_type".into(), gguf_file::Value::U32(if quant == GgmlDType::F32 { 0 } else { 7 })),
    ];
    let experts = if mixtral { u("num_local_experts") } else { u("num_experts") };
    let width = if mixtral { u("intermediate_size") } else { u("moe_intermediate_size") };
    let mut num = vec![
        ("embedding_length", u("hidden_size")),
        ("block_count", u("num_hidden_layers")),
        ("feed_forward_length", u("intermediate_size")),
        ("attention.head_count", heads as u32),
        ("attention.head_count_kv", kv_heads as u32),
        ("attention.key_length", u("head_dim")),
        ("attention.value_length", u("head_dim")),
        ("context_length", u("max_position_embeddings")),
        ("expert_count", experts),
        ("expert_used_count", u("num_experts_per_tok")),
        ("expert_feed_forward_length", width),
    ];
    if !mixtral {
        num.push(("expert_shared_feed_forward_length", u("shared_expert_intermediate_size")));
    }
    for (k, v) in num {
        md.push((format!("{arch}.{k}"), gguf_file::Value::U32(v)));
    }
    let theta = c["rope_parameters"]["rope_theta"].as_f64().unwrap() as f32;
    md.push((format!("{arch}.rope.freq_base"), gguf_file::Value::F32(theta)));
    md.push((
        format!("{arch}.attention.layer_norm_rms_epsilon"),
        gguf_file::Value::F32(c["rms_norm_eps"].as_f64().unwrap() as f32),
    ));
    let vocab = u("vocab_size") as usize;
    let tok = |f: &dyn Fn(usize) -> gguf_file::Value| gguf_file::Value::Array((0..vocab).map(f).collect());
    md.push(("tokenizer.ggml.model".into(), gguf_file::Value::String("llama".into())));
    md.push(("tokenizer.ggml.tokens".into(), tok(&|i| gguf_file::Value::String(format!("t{i}")))));
    md.push(("tokenizer.ggml.scores".into(), tok(&|_| gguf_file::Value::F32(0.0))));
    md.push(("tokenizer.ggml.token_type".into(), tok(&|_| gguf_file::Value::I32(1))));
    md.push(("tokenizer.ggml.eos_token_id".into(), gguf_file::Value::U32(2)));

    let gguf_arch = if mixtral { Arch::Mixtral } else { Arch::Qwen2Moe };
    let mut out: Vec<(String, QTensor)> = Vec::new();
    let mut put = |name: String, t: Tensor| {
        // Only the routed experts are quantized.
        let q =
            if !name.contains("_exps") { QTensor::quantize(&t, GgmlDType::F32) } else { QTensor::quantize(&t, quant) };
        out.push((name, q.unwrap()));
    };
    for (hf, t) in ts.clone() {
        if let Some(x) = hf.strip_suffix(".mlp.experts.gate_up_proj") {
            let i = t.dim(1).unwrap() / 2;
            put(
                gguf_name(gguf_arch, &format!("{x}.mlp.experts.gate_proj.weight")),
                t.narrow(1, 0, i).unwrap().contiguous().unwrap(),
            );
            put(
                gguf_name(gguf_arch, &format!("{x}.mlp.experts.up_proj.weight")),
                t.narrow(1, i, i).unwrap().contiguous().unwrap(),
            );
        } else if let Some(x) = hf.strip_suffix(".mlp.experts.down_proj") {
            put(gguf_name(gguf_arch, &format!("{x}.mlp.experts.down_proj.weight")), t);
        } else if mixtral && hf.ends_with("q_proj.weight") {
            put(gguf_name(gguf_arch, &hf), permute(&t, heads));
        } else if mixtral && hf.ends_with("k_proj.weight") {
            put(gguf_name(gguf_arch, &hf), permute(&t, kv_heads));
        } else {
            put(gguf_name(gguf_arch, &hf), t);
        }
    }
    let mut file = std::fs::File::create(path).unwrap();
    let md_refs: Vec<(&str, &gguf_file::Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = out.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut file, &md_refs, &t_refs).unwrap();
}

/// Prompt then greedy steps; the last logits row after each chunk.
fn logits(path: &Path, prompt: &[u32], steps: usize) -> (Vec<Vec<f32>>, usize) {
    let loaded = lmplex_model::load(path, Some(256)).unwrap();
    let m = &loaded.model;
    // A decode step reads 2 of the 4 experts, and one row of the untied (f32) embedding table.
    assert_eq!(m.weight_bytes() - m.decode_weight_bytes(), m.expert_weight_bytes() / 2 + 64 * 64 * 4);
    let (mut kv, table) = common::single_seq_kv(m, 64, lmplex_model::KvDtype::F32);
    let (mut input, mut pos, mut out) = (prompt.to_vec(), 0, Vec::new());
    for _ in 0..=steps {
        let batch = ForwardBatch {
            seqs: vec![SeqChunk {
                token_ids: &input,
                start_pos: pos,
                block_table: &table,
                logits: LogitsSelect::Last,
                num_prompt_tokens: prompt.len(),
                lora: None,
                embeds: None,
            }],
        };
        let l = m.forward_logits(&batch, &mut kv).unwrap();
        pos += input.len();
        input = vec![lmplex_model::sample::argmax(&l)];
        out.push(l);
    }
    (out, m.expert_weight_bytes())
}

/// Writes the fixture's config and tokenizer with tensors `ts` as an HF folder `dir`.
fn write_folder(f: &Value, ts: &BTreeMap<String, Tensor>, dir: &Path) {
    std::fs::create_dir(dir).unwrap();
    std::fs::write(dir.join("config.json"), f["config"].to_string()).unwrap();
    write_word_tokenizer(dir, 64).unwrap();
    let map: std::collections::HashMap<String, Tensor> = ts.clone().into_iter().collect();
    candle_core::safetensors::save(&map, dir.join("model.safetensors")).unwrap();
}

fn check(name: &str) {
    let f = fixture(name);
    let dir = tempfile::tempdir().unwrap();
    let prompt: Vec<u32> =
        f["cases"][0]["prompt"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let c = &f["config"];
    let experts = c["num_local_experts"].as_u64().or(c["num_experts"].as_u64()).unwrap() as usize;
    let width = c["moe_intermediate_size"].as_u64().or(c["intermediate_size"].as_u64()).unwrap() as usize;
    let sparse = if name == "qwen2_moe" { 1 } else { 2 };
    let f32_bytes = sparse * experts * 3 * 64 * width * 4;
    let exact = tensors(&f);
    // The experts as Q8_0 stores them: the folder of the quantized run holds these values.
    let rounded: BTreeMap<String, Tensor> = exact
        .iter()
        .map(|(k, t)| {
            let t = if k.contains(".experts.") {
                QTensor::quantize(t, GgmlDType::Q8_0).unwrap().dequantize(&Device::Cpu).unwrap()
            } else {
                t.clone()
            };
            (k.clone(), t)
        })
        .collect();
    for (quant, ts, tol) in [(GgmlDType::F32, &exact, 1e-4f32), (GgmlDType::Q8_0, &rounded, 2e-3)] {
        let folder = dir.path().join(format!("hf-{quant:?}"));
        write_folder(&f, ts, &folder);
        let (want, hf_bytes) = logits(&folder, &prompt, 8);
        assert_eq!(hf_bytes, f32_bytes, "{name}: expert bytes (f32)");
        let path = dir.path().join(format!("{name}-{quant:?}.gguf"));
        write_gguf(&f, ts, &path, quant);
        let (got, bytes) = logits(&path, &prompt, 8);
        if quant == GgmlDType::Q8_0 {
            // GGUF's 34 bytes per 32 weights, give or take the repacking for the integer kernels.
            let blocks = f32_bytes / 4 / 32 * 34;
            assert!((blocks..blocks * 6 / 5).contains(&bytes), "{name}: {bytes} expert bytes for {blocks} of blocks");
        } else {
            assert_eq!(bytes, f32_bytes);
        }
        for (step, (g, w)) in got.iter().zip(&want).enumerate() {
            let d = g.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(d < tol, "{name} {quant:?} step {step}: max |logit diff| {d}");
            assert_eq!(
                lmplex_model::sample::argmax(g),
                lmplex_model::sample::argmax(w),
                "{name} {quant:?} step {step}"
            );
        }
    }
}
#[test]
fn mixtral_gguf_matches_its_hf_folder() {
    check("mixtral");
}

#[test]
fn qwen2_moe_gguf_with_shared_expert_matches_its_hf_folder() {
    check("qwen2_moe");
}
