//! The new families against a second outside implementation, candle-transformers, on the
//! same weights: Gemma, Gemma 2, Gemma 3, Mistral, Mixtral, Qwen2-MoE and Qwen3-MoE (candle has
//! no OLMoE, and its Phi-3 LongRoPE differs from transformers', so those two have transformers
//! alone, in `hf_families.rs`).
//!
//! Each family's fixture (`tests/fixtures/families`) is rewritten in the layout candle reads,
//! which lmplex reads too, and both load that one folder:
//! - the config in transformers 4's layout: `rope_theta` at the top level; Gemma 3's layer
//!   pattern as `sliding_window_pattern` with `rope_local_base_freq` (candle has no linear rope
//!   scaling, so the fixture's is dropped); Gemma 2 and 3 with a tied head and
//!   `query_pre_attn_scalar` equal to the head size (candle ties the head and scales queries
//!   by the head size always);
//! - experts under per-expert names (`experts.N.gate_proj`, Mixtral's `block_sparse_moe.
//!   experts.N.w1/w2/w3`), split from the fixture's fused 3-D tensors; Qwen2-MoE's dense layer
//!   moves from `mlp_only_layers` to `decoder_sparse_step` (candle reads only the latter);
//! - windows longer than the sequence: candle's window mask admits one key more than
//!   transformers' (windows shorter than the prompt are checked against transformers).
//!
//! Check: lmplex's logits within 1e-4 of candle's (float32 both sides, logits of order 1)
//! after the prompt and after each of 8 decode steps.

mod common;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use common::HfTensor;
use serde_json::{json, Value};
use std::path::Path;

const TOL: f32 = 1e-4;
/// Longer than any sequence here: candle and lmplex both attend to every key.
const NO_WINDOW: u64 = 4096;

/// One candle forward step: `(tokens, start position) -> logits`.
type CandleStep = Box<dyn FnMut(&Tensor, usize) -> Tensor>;

/// `config` in transformers 4's layout, as candle reads it.
fn candle_config(family: &str, config: &Value) -> Value {
    let mut c = config.clone();
    let o = c.as_object_mut().unwrap();
    let rope = o.remove("rope_parameters").unwrap();
    match family {
        "gemma3" => {
            let (full, local) = (&rope["full_attention"], &rope["sliding_attention"]);
            o.insert("rope_theta".into(), full["rope_theta"].clone());
            o.insert("rope_local_base_freq".into(), local["rope_theta"].clone());
            // Layers 0 and 2 slide, layer 1 is global, as the fixture's `layer_types` say.
            assert_eq!(o["layer_types"], json!(["sliding_attention", "full_attention", "sliding_attention"]));
            o.remove("layer_types");
            o.remove("_sliding_window_pattern");
            o.insert("sliding_window_pattern".into(), json!(2));
        }
        _ => {
            o.insert("rope_theta".into(), rope["rope_theta"].clone());
        }
    }
    match family {
        "gemma2" | "gemma3" => {
            o.insert("sliding_window".into(), json!(NO_WINDOW));
            o.insert("tie_word_embeddings".into(), json!(true));
            o.insert("query_pre_attn_scalar".into(), o["head_dim"].clone());
        }
        "mixtral" => {
            o.insert("sliding_window".into(), json!(NO_WINDOW));
        }
        "mistral_window" => {
            o.insert("sliding_window".into(), Value::Null);
        }
        "qwen2_moe" => {
            assert_eq!(o["mlp_only_layers"], json!([1]));
            o.insert("mlp_only_layers".into(), json!([]));
            o.insert("decoder_sparse_step".into(), json!(2));
            o.insert("sliding_window".into(), json!(NO_WINDOW));
        }
        "qwen3_moe" => {
            o.insert("num_experts".into(), o["num_local_experts"].clone());
            o.insert("max_window_layers".into(), o["num_hidden_layers"].clone());
        }
        _ => {}
    }
    o.insert("use_flash_attn".into(), json!(false));
    c
}

/// Rows `[from, to)` of each `[rows, cols]` matrix in a `[experts, rows, cols]` tensor.
fn expert_rows(t: &HfTensor, e: usize, from: usize, to: usize) -> Vec<f32> {
    let (rows, cols) = (t.shape[1], t.shape[2]);
    t.values[(e * rows + from) * cols..(e * rows + to) * cols].to_vec()
}

/// The fixture's tensors under candle's names: fused experts split per expert.
fn candle_tensors(family: &str, tensors: Vec<HfTensor>) -> Vec<HfTensor> {
    let (mut out, mut fused) = (Vec::new(), Vec::<(String, HfTensor)>::new());
    // candle's Gemma 2 and 3 always tie the head to the embeddings.
    let tied = matches!(family, "gemma2" | "gemma3");
    for t in tensors.into_iter().filter(|t| !(tied && t.name == "lm_head.weight")) {
        match t.name.rsplit_once(".mlp.experts.") {
            Some((layer, _)) => fused.push((layer.to_string(), t)),
            None => out.push(t),
        }
    }
    let mut layers: Vec<String> = fused.iter().map(|(l, _)| l.clone()).collect();
    layers.dedup();
    for layer in layers {
        let find = |suffix: &str| &fused.iter().find(|(l, t)| *l == layer && t.name.ends_with(suffix)).unwrap().1;
        let (gate_up, down) = (find(".gate_up_proj"), find(".down_proj"));
        let (experts, inter, hidden) = (gate_up.shape[0], gate_up.shape[1] / 2, gate_up.shape[2]);
        for e in 0..experts {
            let parts = [
                ("gate_proj", "w1", vec![inter, hidden], expert_rows(gate_up, e, 0, inter)),
                ("up_proj", "w3", vec![inter, hidden], expert_rows(gate_up, e, inter, 2 * inter)),
                ("down_proj", "w2", vec![hidden, inter], expert_rows(down, e, 0, hidden)),
            ];
            for (hf, mixtral, shape, values) in parts {
                let name = match family {
                    "mixtral" => format!("{layer}.block_sparse_moe.experts.{e}.{mixtral}.weight"),
                    _ => format!("{layer}.mlp.experts.{e}.{hf}.weight"),
                };
                out.push(HfTensor { name, shape, values });
            }
        }
    }
    for t in &mut out {
        if family == "mixtral" && t.name.ends_with(".mlp.gate.weight") {
            t.name = t.name.replace(".mlp.gate.", ".block_sparse_moe.gate.");
        }
        // Qwen2-MoE: the dense MLP moves from layer 1 to layer 0 and the experts to layer 1.
        if family == "qwen2_moe" && t.name.contains(".mlp.") {
            let swapped = if t.name.starts_with("model.layers.0.") { "model.layers.1." } else { "model.layers.0." };
            t.name = format!("{swapped}{}", &t.name["model.layers.N.".len()..]);
        }
    }
    out
}

/// candle-transformers' model of `family` in `dir`: the last-token logits after each chunk.
fn candle_logits(dir: &Path, family: &str, chunks: &[Vec<u32>]) -> Vec<Vec<f32>> {
    use candle_transformers::models::{gemma, gemma2, gemma3, mistral, mixtral, qwen2_moe, qwen3_moe};
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let vocab = serde_json::from_str::<Value>(&cfg).unwrap()["vocab_size"].as_u64().unwrap() as usize;
    let dev = Device::Cpu;
    // SAFETY: the file was written by this test and is not changed while mapped.
    let vb =
        unsafe { VarBuilder::from_mmaped_safetensors(&[dir.join("model.safetensors")], DType::F32, &dev) }.unwrap();
    fn step<M: 'static>(mut m: M, f: fn(&mut M, &Tensor, usize) -> candle_core::Result<Tensor>) -> CandleStep {
        Box::new(move |x, pos| f(&mut m, x, pos).unwrap())
    }
    let mut forward: CandleStep = match family {
        "gemma" => {
            step(gemma::Model::new(false, &serde_json::from_str(&cfg).unwrap(), vb).unwrap(), |m, x, p| m.forward(x, p))
        }
        "gemma2" => step(gemma2::Model::new(false, &serde_json::from_str(&cfg).unwrap(), vb).unwrap(), |m, x, p| {
            m.forward(x, p)
        }),
        "gemma3" => step(gemma3::Model::new(false, &serde_json::from_str(&cfg).unwrap(), vb).unwrap(), |m, x, p| {
            m.forward(x, p)
        }),
        "mistral_window" => {
            step(mistral::Model::new(&serde_json::from_str(&cfg).unwrap(), vb).unwrap(), |m, x, p| m.forward(x, p))
        }
        "mixtral" => {
            step(mixtral::Model::new(&serde_json::from_str(&cfg).unwrap(), vb).unwrap(), |m, x, p| m.forward(x, p))
        }
        "qwen2_moe" => {
            step(qwen2_moe::Model::new(&serde_json::from_str(&cfg).unwrap(), vb).unwrap(), |m, x, p| m.forward(x, p))
        }
        "qwen3_moe" => {
            step(qwen3_moe::ModelForCausalLM::new(&serde_json::from_str(&cfg).unwrap(), vb).unwrap(), |m, x, p| {
                m.forward(x, p)
            })
        }
        other => panic!("no candle model for {other}"),
    };
    // candle's Gemma 3 cache appends only contiguous keys, which a many-token step is not: it
    // takes its tokens one at a time.
    let one_by_one = family == "gemma3";
    let mut pos = 0;
    chunks
        .iter()
        .map(|c| {
            let steps: Vec<&[u32]> = if one_by_one { c.chunks(1).collect() } else { vec![c] };
            let mut l = Vec::new();
            for s in steps {
                let x = Tensor::new(s, &dev).unwrap().unsqueeze(0).unwrap();
                l = forward(&x, pos).flatten_all().unwrap().to_vec1::<f32>().unwrap();
                pos += s.len();
            }
            l[l.len() - vocab..].to_vec()
        })
        .collect()
}

#[test]
fn new_families_match_candle() {
    let families = ["gemma", "gemma2", "gemma3", "mistral_window", "mixtral", "qwen2_moe", "qwen3_moe"];
    let mut checked = Vec::new();
    for path in common::family_fixtures() {
        let fixture: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let family = fixture["family"].as_str().unwrap();
        if !families.contains(&family) {
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        let config = candle_config(family, &fixture["config"]);
        common::write_hf_folder(dir.path(), &config, candle_tensors(family, common::fixture_tensors(&fixture)));
        let case = &fixture["cases"][0];
        let prompt: Vec<u32> = case["prompt"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let mut chunks = vec![prompt];
        chunks.extend((0..8u32).map(|i| vec![(i * 13 + 5) % config["vocab_size"].as_u64().unwrap() as u32]));
        let theirs = candle_logits(dir.path(), family, &chunks);
        let loaded = lmplex_model::load(dir.path(), Some(256)).unwrap();
        let (mut kv, table) = common::single_seq_kv(&loaded.model, 64, loaded.kv_dtype);
        let ours = common::run_chunks(&loaded.model, &mut kv, &table, &chunks);
        let worst = ours.iter().zip(&theirs).map(|(a, b)| common::max_diff(a, b)).fold(0f32, f32::max);
        eprintln!("{family}: max |logit diff| vs candle {worst:.2e}");
        assert!(worst < TOL, "{family}: max |logit diff| vs candle {worst}");
        checked.push(family.to_string());
    }
    assert_eq!(checked, families, "a family's fixture is missing");
}
