//! Embeddings of every tiny family against Hugging Face transformers: the base model's
//! `last_hidden_state` (after the final norm) pooled by the last token and by the mean, as
//! `scripts/make_embedding_fixtures.py` recorded them (`tests/fixtures/embed_families.json`),
//! for the prompt of each case of each family fixture (`tests/fixtures/families`).
//!
//! Checks: `Model::forward_hidden_between` over the whole prompt, pooled by `Pooler`, within
//! `TOL` of transformers (float32 both sides, only the summation order differs); the same
//! prompt in chunks of 5 (as chunked prefill runs it, each chunk's rows added to the pooler)
//! gives the same bits.

mod common;

use lmplex_core::Pooling;
use lmplex_model::{ForwardBatch, LogitsSelect, Pooler, SeqChunk};
use serde_json::Value;

const TOL: f32 = 1e-4;

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

/// `prompt` run in `chunk`-token chunks, every row's final hidden state added to a `mode` pooler.
fn pool(model: &lmplex_model::Model, prompt: &[u32], chunk: usize, mode: Pooling) -> Vec<f32> {
    let (mut kv, table) = common::single_seq_kv(model, prompt.len(), lmplex_model::KvDtype::F32);
    let mut pooler = Pooler::new(mode, model.args.hidden_size);
    for (i, ids) in prompt.chunks(chunk).enumerate() {
        let seq = SeqChunk {
            token_ids: ids,
            start_pos: i * chunk,
            block_table: &table,
            logits: LogitsSelect::All,
            num_prompt_tokens: prompt.len(),
            lora: None,
            embeds: None,
        };
        let rows = model.forward_hidden_between(&ForwardBatch { seqs: vec![seq] }, &mut kv, &|| {}).unwrap();
        pooler.add(i * chunk, &rows);
    }
    pooler.pooled()
}

#[test]
fn every_family_pools_like_transformers() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/embed_families.json");
    let want: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let paths = common::family_fixtures();
    assert_eq!(paths.len(), want["families"].as_object().unwrap().len(), "one embedding fixture per family");
    for path in paths {
        let fixture: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let family = fixture["family"].as_str().unwrap();
        let dir = tempfile::tempdir().unwrap();
        common::write_hf_folder(dir.path(), &fixture["config"], common::fixture_tensors(&fixture));
        let cases = want["families"][family].as_array().unwrap_or_else(|| panic!("{family}: no embeddings"));
        for (ci, case) in cases.iter().enumerate() {
            let prompt: Vec<u32> =
                case["prompt"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
            // The context the oracle ran under (LongRoPE picks its factors by it).
            let max_len = fixture["cases"][ci]["max_model_len"].as_u64().unwrap() as usize;
            let loaded = lmplex_model::load(dir.path(), Some(max_len)).unwrap();
            for (mode, key) in [(Pooling::Last, "last"), (Pooling::Mean, "mean")] {
                let whole = pool(&loaded.model, &prompt, prompt.len(), mode);
                let d = common::max_diff(&whole, &floats(&case[key]));
                assert!(d < TOL, "{family} case {ci} {key}: max |diff| {d}");
                let chunked = pool(&loaded.model, &prompt, 5, mode);
                assert_eq!(chunked, whole, "{family} case {ci} {key}: chunked prefill pools other bits");
            }
        }
    }
}
