//! Tiny random checkpoints, one per architecture (llama, qwen2, qwen3, phi3), written as HF
//! folders: lmplex's logits equal candle-transformers' implementation of the same family on the
//! same f32 weights within 2e-3 (absolute, logits of order 1), over a 70-token prompt and then
//! 8 steps of incremental decoding.

mod common;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use lmplex_model::testing::{write_tiny_checkpoint, Family, HIDDEN, VOCAB};
use lmplex_model::{ForwardBatch, LogitsSelect, SeqChunk};
use std::path::Path;

const TOL: f32 = 2e-3;

/// One candle forward step: `(tokens, start position) -> logits`.
type CandleStep<'a> = Box<dyn FnMut(&Tensor, usize) -> Tensor + 'a>;

/// candle-transformers' model of the family, fed `chunks` one after another; the last-token
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
    write_tiny_checkpoint(dir.path(), fam).unwrap();
    let loaded = lmplex_model::load(dir.path(), Some(256)).unwrap();
    // A decode step reads all weights but an untied embedding table (one f32 row per token).
    let (all, read) = (loaded.model.weight_bytes(), loaded.model.decode_weight_bytes());
    let untied = matches!(fam, Family::Llama | Family::Qwen3 | Family::Phi3);
    assert_eq!(all - read, if untied { VOCAB * HIDDEN * 4 } else { 0 }, "{fam:?}");
    let prompt: Vec<u32> = (0..70u32).map(|i| (i * 37 + 11) % VOCAB as u32).collect();
    let mut chunks = vec![prompt];
    chunks.extend((0..8u32).map(|i| vec![(i * 13 + 5) % VOCAB as u32]));
    let theirs = candle_logits(dir.path(), fam, &chunks);
    // An all-f32 checkpoint: `auto` keeps K/V in f32, so this is the default path.
    assert_eq!(loaded.kv_dtype, lmplex_model::KvDtype::F32);
    assert_eq!(
        lmplex_model::plan(dir.path(), Some(256), lmplex_core::DType::Auto).unwrap().kv_dtype,
        lmplex_model::KvDtype::F32
    );
    let (mut kv, table) = common::single_seq_kv(&loaded.model, 128, loaded.kv_dtype);
    let mut pos = 0;
    for (i, c) in chunks.iter().enumerate() {
        let batch = ForwardBatch {
            seqs: vec![SeqChunk {
                token_ids: c,
                start_pos: pos,
                block_table: &table,
                logits: LogitsSelect::Last,
                num_prompt_tokens: chunks[0].len(),
                lora: None,
                embeds: None,
            }],
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
