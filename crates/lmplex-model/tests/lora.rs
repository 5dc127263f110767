//! LoRA adapters against transformers + PEFT, through the fixtures
//! `scripts/make_lora_fixtures.py` writes (`tests/fixtures/lora/*.json`): per family (Llama,
//! Qwen2, Qwen3, Phi-3, Gemma, Gemma 3, Mistral with a window, Mixtral) a tiny base and two or
//! three PEFT adapters (ranks 2-8, alpha != r, rsLoRA, rank and alpha patterns, every projection,
//! Phi-3's fused ones, a mixture of experts' attention), all weights regenerated here bit for
//! bit, and PEFT's float32 logits after the prompt and after each greedy step.
//!
//! Checks: each adapter's logits within 1e-4 of PEFT's at every step; the base and every adapter
//! mixed in one batch, prompt rows and then generated rows, give each sequence the bits it gets
//! alone; every refusal (DoRA, a module the base lacks, a rank above the limit, a shape of
//! another model, a truncated file) is an error naming the field or tensor.

mod common;

use lmplex_model::lora::LoraAdapter;
use lmplex_model::{ForwardBatch, LogitsSelect, Model, SeqChunk};
use serde_json::Value;
use std::path::{Path, PathBuf};

const TOL: f32 = 1e-4;

fn fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lora");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    v.sort();
    v
}

/// Writes `adapter`'s folder (its config and its regenerated tensors) into `dir`.
fn write_adapter(dir: &Path, adapter: &Value) {
    write_adapter_as(dir, adapter, candle_core::DType::F32, false)
}

/// `write_adapter` with the tensors stored as `dtype`, after rounding them to bf16 if `round`.
fn write_adapter_as(dir: &Path, adapter: &Value, dtype: candle_core::DType, round: bool) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("adapter_config.json"), adapter["adapter_config"].to_string()).unwrap();
    let dev = candle_core::Device::Cpu;
    let map: std::collections::HashMap<String, candle_core::Tensor> = common::fixture_tensors(adapter)
        .into_iter()
        .map(|mut t| {
            if round {
                t.values.iter_mut().for_each(|v| *v = half::bf16::from_f32(*v).to_f32());
            }
            (t.name, candle_core::Tensor::from_vec(t.values, t.shape, &dev).unwrap().to_dtype(dtype).unwrap())
        })
        .collect();
    candle_core::safetensors::save(&map, dir.join("adapter_model.safetensors")).unwrap();
}

fn load_adapter(dir: &Path, model: &Model, max_rank: usize) -> lmplex_core::Result<LoraAdapter> {
    LoraAdapter::load(dir, &model.lora_modules(), model.args.num_hidden_layers, max_rank)
}

/// The last row's logits after each chunk of one sequence under `lora`.
fn run(model: &Model, lora: Option<&LoraAdapter>, chunks: &[Vec<u32>]) -> Vec<Vec<f32>> {
    let (mut kv, table) = common::single_seq_kv(model, 64, lmplex_model::KvDtype::F32);
    let mut pos = 0;
    chunks
        .iter()
        .map(|c| {
            let seqs = vec![SeqChunk {
                token_ids: c,
                start_pos: pos,
                block_table: &table,
                logits: LogitsSelect::Last,
                num_prompt_tokens: chunks[0].len(),
                lora,
                embeds: None,
            }];
            pos += c.len();
            model.forward_logits(&ForwardBatch { seqs }, &mut kv).unwrap()
        })
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn adapters_match_peft_and_mix_in_one_batch() {
    let paths = fixtures();
    assert_eq!(paths.len(), 8, "{paths:?}");
    for path in paths {
        let fixture: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let family = fixture["family"].as_str().unwrap();
        let dir = tempfile::tempdir().unwrap();
        common::write_hf_folder(dir.path(), &fixture["config"], common::fixture_tensors(&fixture));
        let model = lmplex_model::load(dir.path(), Some(64)).unwrap().model;
        let case = &fixture["case"];
        let prompt = ids(&case["prompt"]);
        let adapters: Vec<(String, LoraAdapter, &Value)> = fixture["adapters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                let name = a["name"].as_str().unwrap().to_string();
                let adir = dir.path().join(format!("adapter-{name}"));
                write_adapter(&adir, a);
                (name, load_adapter(&adir, &model, 64).unwrap(), &a["outputs"])
            })
            .collect();
        let mut runs = vec![(None, "base", &case["outputs"])];
        runs.extend(adapters.iter().map(|(n, a, o)| (Some(a), n.as_str(), *o)));
        let mut alone = Vec::new();
        for (lora, name, outputs) in &runs {
            let outputs = outputs.as_array().unwrap();
            let mut chunks = vec![prompt.clone()];
            chunks.extend(outputs[..outputs.len() - 1].iter().map(|o| vec![o["next"].as_u64().unwrap() as u32]));
            let ours = run(&model, *lora, &chunks);
            for (step, (o, got)) in outputs.iter().zip(&ours).enumerate() {
                let want: Vec<f32> =
                    o["logits"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
                let d = common::max_diff(got, &want);
                assert!(d < TOL, "{family}/{name} step {step}: max |logit diff| {d}");
            }
            alone.push((chunks, ours));
        }
        // Every run in one batch: the prompts, then each one's first generated token.
        let mut kv = model.new_kv_cache(4 * runs.len(), 16, lmplex_model::KvDtype::F32).unwrap();
        let tables: Vec<Vec<u32>> = (0..runs.len() as u32).map(|i| (4 * i..4 * i + 4).collect()).collect();
        for step in 0..2 {
            let seqs = runs
                .iter()
                .zip(&alone)
                .zip(&tables)
                .map(|(((lora, _, _), (chunks, _)), table)| SeqChunk {
                    token_ids: &chunks[step],
                    start_pos: if step == 0 { 0 } else { prompt.len() },
                    block_table: table,
                    logits: LogitsSelect::Last,
                    num_prompt_tokens: prompt.len(),
                    lora: *lora,
                    embeds: None,
                })
                .collect();
            let both = model.forward_logits(&ForwardBatch { seqs }, &mut kv).unwrap();
            let vocab = model.args.vocab_size;
            for (i, ((_, name, _), (_, ours))) in runs.iter().zip(&alone).enumerate() {
                assert_eq!(
                    both[i * vocab..(i + 1) * vocab],
                    ours[step][..],
                    "{family}/{name} step {step}: batched differs"
                );
            }
        }
    }
}

/// An adapter stored in bf16 is kept in bf16 (half the bytes) and computes what the same values
/// in f32 compute, bit for bit.
#[test]
fn a_bf16_adapter_is_its_values_in_f32() {
    let path = fixtures().into_iter().find(|p| p.ends_with("qwen2.json")).unwrap();
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    common::write_hf_folder(dir.path(), &fixture["config"], common::fixture_tensors(&fixture));
    let model = lmplex_model::load(dir.path(), Some(64)).unwrap().model;
    let a = &fixture["adapters"][1];
    write_adapter_as(&dir.path().join("bf16"), a, candle_core::DType::BF16, false);
    write_adapter_as(&dir.path().join("f32"), a, candle_core::DType::F32, true);
    let (bf16, f32) = (
        load_adapter(&dir.path().join("bf16"), &model, 64).unwrap(),
        load_adapter(&dir.path().join("f32"), &model, 64).unwrap(),
    );
    assert_eq!(2 * bf16.size_in_bytes(), f32.size_in_bytes());
    let prompt = ids(&fixture["case"]["prompt"]);
    let chunks = vec![prompt.clone(), vec![3], vec![5]];
    assert_eq!(run(&model, Some(&bf16), &chunks), run(&model, Some(&f32), &chunks));
}

#[test]
fn bad_adapters_are_refused_by_name() {
    let path = fixtures().into_iter().find(|p| p.ends_with("llama.json")).unwrap();
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    common::write_hf_folder(dir.path(), &fixture["config"], common::fixture_tensors(&fixture));
    let model = lmplex_model::load(dir.path(), Some(64)).unwrap().model;
    let good = &fixture["adapters"][0];
    let refused = |name: &str, edit: &dyn Fn(&mut Value), file: &dyn Fn(&Path), max_rank: usize| -> String {
        let mut a = good.clone();
        edit(&mut a);
        let adir = dir.path().join(name);
        write_adapter(&adir, &a);
        file(&adir);
        match load_adapter(&adir, &model, max_rank) {
            Ok(_) => panic!("{name}: loaded"),
            Err(e) => e.to_string(),
        }
    };
    let none = |_: &Path| {};
    let keep = |_: &mut Value| {};
    let e = refused("dora", &|a| a["adapter_config"]["use_dora"] = true.into(), &none, 64);
    assert!(e.contains("use_dora"), "{e}");
    let e = refused("save", &|a| a["adapter_config"]["modules_to_save"] = serde_json::json!(["lm_head"]), &none, 64);
    assert!(e.contains("modules_to_save"), "{e}");
    let e = refused("c_attn", &|a| a["adapter_config"]["target_modules"] = serde_json::json!(["c_attn"]), &none, 64);
    assert!(e.contains("\"c_attn\""), "{e}");
    let e = refused("rank", &keep, &none, 4);
    assert!(e.contains("rank 8, above max_lora_rank 4"), "{e}");
    let e = refused(
        "shape",
        &|a| {
            for t in a["tensors"].as_array_mut().unwrap() {
                if t["name"].as_str().unwrap().ends_with("lora_A.weight") {
                    t["shape"] = serde_json::json!([8, 32]);
                }
            }
        },
        &none,
        64,
    );
    assert!(e.contains("[8, 32] where this model and rank 8 need [8, 64]"), "{e}");
    let truncate = |d: &Path| {
        let f = d.join("adapter_model.safetensors");
        let bytes = std::fs::read(&f).unwrap();
        std::fs::write(&f, &bytes[..bytes.len() / 2]).unwrap();
    };
    let e = refused("truncated", &keep, &truncate, 64);
    assert!(e.contains("adapter_model.safetensors: corrupt or truncated"), "{e}");
    let e = refused("nofile", &keep, &|d: &Path| std::fs::remove_file(d.join("adapter_config.json")).unwrap(), 64);
    assert!(e.contains("not a PEFT adapter folder"), "{e}");
}
