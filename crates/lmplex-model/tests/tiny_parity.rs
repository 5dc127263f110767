//! Tiny random checkpoints, one per architecture (llama, qwen2, qwen3, phi3), written as HF
//! folders: lmplex's logits equal candle-transformers' implementation of the same family on the
//! same f32 weights within 2e-3 (absolute, logits of order 1), over a 70-token prompt and then
//! 8 steps of incremental decoding.

mod common;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use lmplex_model::{ForwardBatch, LogitsSelect, SeqChunk};
use std::collections::HashMap;
use std::path::Path;

const VOCAB: usize = 128;
const HIDDEN: usize = 64;
const INTER: usize = 96;
const LAYERS: usize = 2;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 16;
const TOL: f32 = 2e-3;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Family {
    Llama,
    Qwen2,
    Qwen3,
    Phi3,
}

fn randn(shape: &[usize], std: f32) -> Tensor {
    Tensor::randn(0f32, std, shape, &Device::Cpu).unwrap()
}

fn write_checkpoint(dir: &Path, fam: Family) {
    let (model_type, tied) = match fam {
        Family::Llama => ("llama", false),
        Family::Qwen2 => ("qwen2", true),
        Family::Qwen3 => ("qwen3", false),
        Family::Phi3 => ("phi3", false),
    };
    let config = serde_json::json!({
        "model_type": model_type, "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": INTER,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 512,
        "tie_word_embeddings": tied, "hidden_act": "silu", "sliding_window": 4096, "use_sliding_window": false,
        "max_window_layers": LAYERS, "attention_bias": false, "bos_token_id": 1, "eos_token_id": 2,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let vocab: serde_json::Map<String, serde_json::Value> =
        (0..VOCAB).map(|i| (format!("t{i}"), serde_json::json!(i))).collect();
    let tokenizer = serde_json::json!({"version": "1.0", "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}});
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();

    let (q, kv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    let mut t: HashMap<String, Tensor> = HashMap::new();
    let norm = |n: usize| (randn(&[n], 0.1) + 1.0).unwrap();
    t.insert("model.embed_tokens.weight".into(), randn(&[VOCAB, HIDDEN], 0.5));
    t.insert("model.norm.weight".into(), norm(HIDDEN));
    if !tied {
        t.insert("lm_head.weight".into(), randn(&[VOCAB, HIDDEN], 0.1));
    }
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}");
        t.insert(format!("{p}.input_layernorm.weight"), norm(HIDDEN));
        t.insert(format!("{p}.post_attention_layernorm.weight"), norm(HIDDEN));
        t.insert(format!("{p}.self_attn.o_proj.weight"), randn(&[HIDDEN, q], 0.1));
        t.insert(format!("{p}.mlp.down_proj.weight"), randn(&[HIDDEN, INTER], 0.1));
        if fam == Family::Phi3 {
            t.insert(format!("{p}.self_attn.qkv_proj.weight"), randn(&[q + 2 * kv, HIDDEN], 0.2));
            t.insert(format!("{p}.mlp.gate_up_proj.weight"), randn(&[2 * INTER, HIDDEN], 0.1));
        } else {
            t.insert(format!("{p}.self_attn.q_proj.weight"), randn(&[q, HIDDEN], 0.2));
            t.insert(format!("{p}.self_attn.k_proj.weight"), randn(&[kv, HIDDEN], 0.2));
            t.insert(format!("{p}.self_attn.v_proj.weight"), randn(&[kv, HIDDEN], 0.2));
            t.insert(format!("{p}.mlp.gate_proj.weight"), randn(&[INTER, HIDDEN], 0.1));
            t.insert(format!("{p}.mlp.up_proj.weight"), randn(&[INTER, HIDDEN], 0.1));
        }
        if fam == Family::Qwen2 {
            t.insert(format!("{p}.self_attn.q_proj.bias"), randn(&[q], 0.1));
            t.insert(format!("{p}.self_attn.k_proj.bias"), randn(&[kv], 0.1));
            t.insert(format!("{p}.self_attn.v_proj.bias"), randn(&[kv], 0.1));
        }
        if fam == Family::Qwen3 {
            t.insert(format!("{p}.self_attn.q_norm.weight"), norm(HEAD_DIM));
            t.insert(format!("{p}.self_attn.k_norm.weight"), norm(HEAD_DIM));
        }
    }
    candle_core::safetensors::save(&t, dir.join("model.safetensors")).unwrap();
}

/// candle-transformers' model of the family, fed `chunks` one after another; the last-token
/// One candle forward step: `(tokens, start position) -> logits`.
type CandleStep<'a> = Box<dyn FnMut(&Tensor, usize) -> Tensor + 'a>;

/// logits after each chunk.
fn candle_logits(dir: &Path, fam: Family, chunks: &[Vec<u32>]) -> Vec<Vec<f32>> {
    use candle_transformers::models::{llama, phi3, qwen2, qwen3};
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let dev = Device::Cpu;
    let vb =
        || unsafe { VarBuilder::from_mmaped_safetensors(&[dir.join("model.safetensors")], DType::F32, &dev) }.unwrap();
    let mut step: CandleStep = match fam {
        Family::Llama => {
            let c = serde_json::from_str::<llama::LlamaConfig>(&cfg).unwrap().into_config(false);
            let m = llama::Llama::load(vb(), &c).unwrap();
            let mut cache = llama::Cache::new(true, DType::F32, &c, &dev).unwrap();
            Box::new(move |x, pos| m.forward(x, pos, &mut cache).unwrap())
        }
        Family::Qwen2 => {
            let mut m = qwen2::ModelForCausalLM::new(&serde_json::from_str(&cfg).unwrap(), vb()).unwrap();
            Box::new(move |x, pos| m.forward(x, pos).unwrap())
        }
        Family::Qwen3 => {
            let mut m = qwen3::ModelForCausalLM::new(&serde_json::from_str(&cfg).unwrap(), vb()).unwrap();
            Box::new(move |x, pos| m.forward(x, pos).unwrap())
        }
        Family::Phi3 => {
            let mut m = phi3::Model::new(&serde_json::from_str(&cfg).unwrap(), vb()).unwrap();
            Box::new(move |x, pos| m.forward(x, pos).unwrap())
        }
    };
    let mut pos = 0;
    chunks
        .iter()
        .map(|c| {
            let x = Tensor::new(c.as_slice(), &dev).unwrap().unsqueeze(0).unwrap();
            let l = step(&x, pos).flatten_all().unwrap().to_vec1::<f32>().unwrap();
            pos += c.len();
            l[l.len() - VOCAB..].to_vec()
        })
        .collect()
}

fn check(fam: Family) {
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), fam);
    let loaded = lmplex_model::load(dir.path(), Some(256)).unwrap();
    let prompt: Vec<u32> = (0..70u32).map(|i| (i * 37 + 11) % VOCAB as u32).collect();
    let mut chunks = vec![prompt];
    chunks.extend((0..8u32).map(|i| vec![(i * 13 + 5) % VOCAB as u32]));
    let theirs = candle_logits(dir.path(), fam, &chunks);
    let (mut kv, table) = common::single_seq_kv(&loaded.model, 128);
    let mut pos = 0;
    for (i, c) in chunks.iter().enumerate() {
        let batch = ForwardBatch {
            seqs: vec![SeqChunk { token_ids: c, start_pos: pos, block_table: &table, logits: LogitsSelect::Last }],
        };
        let ours = loaded.model.forward(&batch, &mut kv).unwrap().to_vec2::<f32>().unwrap().remove(0);
        pos += c.len();
        let diff = ours.iter().zip(&theirs[i]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        let scale = theirs[i].iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(scale > 0.1, "{fam:?}: degenerate logits");
        assert!(diff < TOL, "{fam:?} step {i}: max |logit diff| {diff} (logits up to {scale})");
    }
}

#[test]
fn llama_untied_matches_candle() {
    check(Family::Llama);
}

#[test]
fn qwen2_biases_tied_matches_candle() {
    check(Family::Qwen2);
}

#[test]
fn qwen3_qk_norm_matches_candle() {
    check(Family::Qwen3);
}

#[test]
fn phi3_fused_matches_candle() {
    check(Family::Phi3);
}
