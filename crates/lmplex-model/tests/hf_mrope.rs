//! Qwen2-VL and Qwen2.5-VL text models with multimodal rope (M-RoPE) against Hugging Face
//! transformers, through the fixtures `scripts/make_qwen2vl_fixtures.py` writes
//! (`tests/fixtures/vision/qwen2_vl.json`, `qwen2_5_vl.json`): a tiny Qwen2 text model whose 8
//! rope frequencies split 2, 3, 3 between temporal, height and width positions, its weights
//! regenerated bit for bit (`testing::hashed_values`), and transformers' image features spliced
//! at the image tokens (the tower itself is checked in `hf_vision_qwen2vl.rs`).
//!
//! Checks: the rope positions are transformers' `get_rope_index`; the last logits and the greedy
//! token at every position are transformers'; greedy decoding past the prompt (positions going
//! on from the prompt's largest, `rope_deltas`) gives transformers' `generate` tokens; chunks
//! anywhere give the same bits; the Hub's tensor names (`model.layers.*`) and config (text keys
//! at the top level, `rope_scaling.type = "mrope"`) load the same model.

mod common;

use candle_core::{Device, Tensor};
use lmplex_model::{ForwardBatch, InputEmbeds, KvDtype, LoadedModel, LogitsSelect, SeqChunk};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

fn fixture(family: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/fixtures/vision/{family}.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

/// The fixture's text model in `dir` (tensors renamed by `rename`, `config` as config.json).
fn load(dir: &Path, fx: &Value, config: &Value, rename: impl Fn(&str) -> String) -> LoadedModel {
    let map: HashMap<String, Tensor> = common::fixture_tensors(fx)
        .into_iter()
        .filter(|t| !t.name.contains("visual"))
        .map(|t| (rename(&t.name), Tensor::from_vec(t.values, t.shape, &Device::Cpu).unwrap()))
        .collect();
    candle_core::safetensors::save(&map, dir.join("model.safetensors")).unwrap();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    lmplex_model::testing::write_word_tokenizer(dir, 80).unwrap();
    lmplex_model::load(dir, Some(64)).unwrap()
}

/// transformers' features at the forward prompt's image tokens, with M-RoPE positions.
fn embeds(fx: &Value) -> InputEmbeds {
    let prompt = ids(&fx["forward"]["input_ids"]);
    let feats = floats(&fx["image_features"][0]["values"]);
    let grids: Vec<[usize; 3]> = fx["image_grid_thw"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            let g = ids(g);
            [g[0] as usize, g[1] as usize / 2, g[2] as usize / 2]
        })
        .collect();
    let e = InputEmbeds::at_placeholders(&prompt, 78, feats, 64).unwrap();
    e.with_mrope(prompt.len(), &grids).unwrap()
}

/// Greedy decoding of `n` tokens after `chunks` (the prompt, in order): the last prompt
/// logits and the tokens.
fn decode(m: &LoadedModel, chunks: &[&[u32]], e: &InputEmbeds, n: usize) -> (Vec<f32>, Vec<u32>) {
    let (mut kv, table) = common::single_seq_kv(&m.model, 64, KvDtype::F32);
    let (mut start, mut logits, mut out) = (0, Vec::new(), Vec::new());
    let argmax = |l: &[f32]| (0..l.len()).fold(0, |b, i| if l[i] > l[b] { i } else { b }) as u32;
    let step = |toks: &[u32], start: usize, kv: &mut lmplex_model::KvCache| {
        let seq = SeqChunk {
            token_ids: toks,
            start_pos: start,
            block_table: &table,
            logits: LogitsSelect::Last,
            num_prompt_tokens: usize::MAX,
            lora: None,
            embeds: Some(e),
        };
        m.model.forward_logits(&ForwardBatch { seqs: vec![seq] }, kv).unwrap()
    };
    for c in chunks {
        logits = step(c, start, &mut kv);
        start += c.len();
    }
    let prompt_logits = logits.clone();
    for _ in 0..n {
        let t = argmax(&logits);
        out.push(t);
        logits = step(&[t], start, &mut kv);
        start += 1;
    }
    (prompt_logits, out)
}

#[test]
fn mrope_text_models_match_transformers() {
    for family in ["qwen2_vl", "qwen2_5_vl"] {
        let fx = fixture(family);
        let dir = tempfile::tempdir().unwrap();
        let m = load(dir.path(), &fx, &fx["config_json"], str::to_string);
        assert_eq!(m.model.args.text_prefix, Some("model.language_model."), "{family}");
        assert_eq!(m.model.args.rope.mrope_section, Some([2, 3, 3]), "{family}");
        let fwd = &fx["forward"];
        let prompt = ids(&fwd["input_ids"]);
        let e = embeds(&fx);
        let want_pos: Vec<Vec<u32>> = fwd["position_ids"].as_array().unwrap().iter().map(ids).collect();
        for (p, _) in prompt.iter().enumerate() {
            let got = e.rope_position(p);
            assert_eq!(got.map(|x| x as u32), [0, 1, 2].map(|k| want_pos[k][p]), "{family}: position {p}");
        }
        // Every position's greedy token and the last logits.
        let (mut kv, table) = common::single_seq_kv(&m.model, 64, KvDtype::F32);
        let seq = SeqChunk {
            token_ids: &prompt,
            start_pos: 0,
            block_table: &table,
            logits: LogitsSelect::All,
            num_prompt_tokens: usize::MAX,
            lora: None,
            embeds: Some(&e),
        };
        let all = m.model.forward_logits(&ForwardBatch { seqs: vec![seq] }, &mut kv).unwrap();
        let vocab = m.model.args.vocab_size;
        let argmax: Vec<u32> =
            all.chunks(vocab).map(|r| (0..vocab).fold(0, |b, i| if r[i] > r[b] { i } else { b }) as u32).collect();
        assert_eq!(argmax, ids(&fwd["argmax"]), "{family}: greedy tokens at every position");
        let last = &all[(prompt.len() - 1) * vocab..];
        let want = floats(&fwd["last_logits"]);
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs())).max(1.0);
        let d = common::max_diff(last, &want);
        assert!(d <= 1e-4 * scale, "{family}: last logits differ by {d} (scale {scale})");
        // Decoding goes on from the prompt's largest position; chunks anywhere: the same bits.
        let (whole, tokens) = decode(&m, &[&prompt], &e, 6);
        assert_eq!(tokens, ids(&fwd["generated"]), "{family}: generate");
        assert_eq!(whole, last, "{family}");
        let cut: Vec<&[u32]> = prompt.chunks(5).collect();
        assert_eq!(decode(&m, &cut, &e, 6), (whole, tokens), "{family}: chunks of 5");
    }
}

/// The Hub's Qwen2-VL checkpoints: the text model's tensors under `model.` (`model.layers.*`),
/// its keys at the top level of config.json with `rope_scaling: {type: mrope}`.
#[test]
fn the_hubs_names_and_config_load_the_same_model() {
    let fx = fixture("qwen2_vl");
    let saved = tempfile::tempdir().unwrap();
    let m = load(saved.path(), &fx, &fx["config_json"], str::to_string);
    let mut config = fx["config_json"].clone();
    let text = config.as_object_mut().unwrap().remove("text_config").unwrap();
    for (k, v) in text.as_object().unwrap() {
        if k != "rope_parameters" && k != "model_type" {
            config[k] = v.clone();
        }
    }
    config["rope_theta"] = 10000.0.into();
    config["rope_scaling"] = serde_json::json!({"type": "mrope", "mrope_section": [2, 3, 3]});
    let hub = tempfile::tempdir().unwrap();
    let rename = |n: &str| n.replace("model.language_model.", "model.");
    let old = load(hub.path(), &fx, &config, rename);
    assert_eq!(old.model.args.rope, m.model.args.rope);
    let e = embeds(&fx);
    let prompt = ids(&fx["forward"]["input_ids"]);
    assert_eq!(decode(&old, &[&prompt], &e, 3), decode(&m, &[&prompt], &e, 3));
}

/// The fixture's Qwen2-VL text model as llama.cpp writes it: architecture `qwen2vl`, the M-RoPE
/// sections in `rope.dimension_sections` (`[t, h, w, 0]`), q/k as stored (llama.cpp permutes
/// only Llama's), f32 tensors under llama.cpp's names, a word-level `llama` vocabulary.
fn write_qwen2vl_gguf(path: &Path, fx: &Value, sections: &[i32]) {
    use candle_core::quantized::{gguf_file::Value as V, GgmlDType, QTensor};
    let text = &fx["config_json"]["text_config"];
    let n = |k: &str| V::U32(text[k].as_u64().unwrap() as u32);
    let mut md: Vec<(String, V)> = vec![("general.architecture".into(), V::String("qwen2vl".into()))];
    for (key, hf) in [
        ("embedding_length", "hidden_size"),
        ("block_count", "num_hidden_layers"),
        ("feed_forward_length", "intermediate_size"),
        ("attention.head_count", "num_attention_heads"),
        ("attention.head_count_kv", "num_key_value_heads"),
        ("context_length", "max_position_embeddings"),
    ] {
        md.push((format!("qwen2vl.{key}"), n(hf)));
    }
    md.push(("qwen2vl.attention.layer_norm_rms_epsilon".into(), V::F32(1e-6)));
    md.push(("qwen2vl.rope.freq_base".into(), V::F32(10_000.0)));
    md.push(("qwen2vl.rope.dimension_sections".into(), V::Array(sections.iter().map(|&s| V::I32(s)).collect())));
    let vocab = text["vocab_size"].as_u64().unwrap() as usize;
    let tok = |f: &dyn Fn(usize) -> V| V::Array((0..vocab).map(f).collect());
    md.push(("tokenizer.ggml.model".into(), V::String("llama".into())));
    md.push(("tokenizer.ggml.tokens".into(), tok(&|i| V::String(format!("t{i}")))));
    md.push(("tokenizer.ggml.scores".into(), tok(&|_| V::F32(0.0))));
    md.push(("tokenizer.ggml.token_type".into(), tok(&|_| V::I32(1))));
    md.push(("tokenizer.ggml.eos_token_id".into(), V::U32(2)));
    let qs: Vec<(String, QTensor)> = common::fixture_tensors(fx)
        .into_iter()
        .filter(|t| !t.name.contains("visual"))
        .map(|t| {
            let hf = t.name.replace("model.language_model.", "model.");
            let name = lmplex_model::weights::gguf_name(lmplex_model::Arch::Qwen2, &hf);
            let tensor = Tensor::from_vec(t.values, t.shape, &Device::Cpu).unwrap();
            (name, QTensor::quantize(&tensor, GgmlDType::F32).unwrap())
        })
        .collect();
    let md_refs: Vec<(&str, &V)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let q_refs: Vec<(&str, &QTensor)> = qs.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(path).unwrap();
    candle_core::quantized::gguf_file::write(&mut file, &md_refs, &q_refs).unwrap();
}

/// A Qwen2-VL text model from a GGUF (`qwen2vl`, llama.cpp's) computes the folder's bits;
/// sections that do not sum to half a head are a load error.
#[test]
fn a_qwen2vl_gguf_loads_the_same_model() {
    let fx = fixture("qwen2_vl");
    let saved = tempfile::tempdir().unwrap();
    let folder = load(saved.path(), &fx, &fx["config_json"], str::to_string);
    let path = saved.path().join("text.gguf");
    write_qwen2vl_gguf(&path, &fx, &[2, 3, 3, 0]);
    let gguf = lmplex_model::load(&path, Some(64)).unwrap();
    assert_eq!(gguf.model.args.rope, folder.model.args.rope);
    let e = embeds(&fx);
    let prompt = ids(&fx["forward"]["input_ids"]);
    let (logits, tokens) = decode(&gguf, &[&prompt], &e, 6);
    assert_eq!(tokens, ids(&fx["forward"]["generated"]), "generate");
    assert_eq!((logits, tokens), decode(&folder, &[&prompt], &e, 6));
    write_qwen2vl_gguf(&path, &fx, &[2, 3, 4, 0]);
    let err = lmplex_model::load(&path, Some(64)).err().unwrap().to_string();
    assert!(err.contains("does not sum to head_dim / 2 (8)"), "{err}");
}
