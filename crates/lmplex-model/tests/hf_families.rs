//! Every family against Hugging Face transformers' own implementation, through the fixtures
//! `scripts/make_family_fixtures.py` writes (`tests/fixtures/families/*.json`): a tiny model of
//! the family built from its transformers config class, weights regenerated here bit for bit
//! (`testing::hashed_values`), and transformers' float32 logits after the prompt and after each
//! greedy step. Each fixture exercises its family's parts: sliding windows shorter than the
//! prompt (Mistral, Qwen2 from `max_window_layers`, Phi-3, Gemma 2/3), LongRoPE with short and
//! long factors (Phi-3), soft-caps and sandwich norms (Gemma 2), q/k norms, local rope and
//! linear scaling (Gemma 3).
//!
//! Checks: logits within 1e-4 of transformers' at every step (float32 both sides, only the
//! summation order differs); a prompt fed in chunks that cut through the window gives the same
//! bits as the whole prompt; a sequence next to another in one batch gives the same bits as
//! alone.

mod common;

use lmplex_model::{ForwardBatch, LogitsSelect, SeqChunk};
use serde_json::Value;

const TOL: f32 = 1e-4;

#[test]
fn every_family_matches_transformers() {
    let paths = common::family_fixtures();
    let names: Vec<String> = paths.iter().map(|p| p.file_stem().unwrap().to_string_lossy().into_owned()).collect();
    let all = [
        "gemma",
        "gemma2",
        "gemma3",
        "mistral_window",
        "mixtral",
        "olmoe",
        "phi3_longrope",
        "qwen2_moe",
        "qwen2_window",
        "qwen3_moe",
    ];
    for want in all {
        assert!(names.iter().any(|n| n == want), "fixture {want} is missing: {names:?}");
    }
    for path in paths {
        let fixture: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let family = fixture["family"].as_str().unwrap();
        let dir = tempfile::tempdir().unwrap();
        common::write_hf_folder(dir.path(), &fixture["config"], common::fixture_tensors(&fixture));
        for (ci, case) in fixture["cases"].as_array().unwrap().iter().enumerate() {
            let max_len = case["max_model_len"].as_u64().unwrap() as usize;
            let loaded = lmplex_model::load(dir.path(), Some(max_len)).unwrap();
            let model = &loaded.model;
            let ids =
                |v: &Value| -> Vec<u32> { v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect() };
            let prompt = ids(&case["prompt"]);
            let outputs = case["outputs"].as_array().unwrap();
            let mut chunks = vec![prompt.clone()];
            chunks.extend(outputs[..outputs.len() - 1].iter().map(|o| vec![o["next"].as_u64().unwrap() as u32]));
            let (mut kv, table) = common::single_seq_kv(model, 64, loaded.kv_dtype);
            let ours = common::run_chunks(model, &mut kv, &table, &chunks);
            for (step, (o, got)) in outputs.iter().zip(&ours).enumerate() {
                let want: Vec<f32> =
                    o["logits"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
                let d = common::max_diff(got, &want);
                assert!(d < TOL, "{family} case {ci} step {step}: max |logit diff| {d}");
            }
            // The prompt in chunks of 5 (cutting through every window) gives the same bits.
            let mut split: Vec<Vec<u32>> = prompt.chunks(5).map(<[u32]>::to_vec).collect();
            let n_split = split.len();
            split.extend(chunks[1..].iter().cloned());
            let (mut kv2, table2) = common::single_seq_kv(model, 64, loaded.kv_dtype);
            let chunked = common::run_chunks(model, &mut kv2, &table2, &split);
            assert_eq!(chunked[n_split - 1..], ours[..], "{family} case {ci}: chunked prefill differs");
            // Next to another sequence in one batch: the same bits.
            let other: Vec<u32> = prompt.iter().rev().copied().collect();
            let mut kv3 = model.new_kv_cache(64, 16, loaded.kv_dtype).unwrap();
            let (ta, tb): (Vec<u32>, Vec<u32>) = ((0..8).collect(), (8..16).collect());
            let batch = ForwardBatch {
                seqs: vec![
                    SeqChunk {
                        token_ids: &other,
                        start_pos: 0,
                        block_table: &tb,
                        logits: LogitsSelect::Last,
                        num_prompt_tokens: usize::MAX,
                        lora: None,
                        embeds: None,
                    },
                    SeqChunk {
                        token_ids: &prompt,
                        start_pos: 0,
                        block_table: &ta,
                        logits: LogitsSelect::Last,
                        num_prompt_tokens: usize::MAX,
                        lora: None,
                        embeds: None,
                    },
                ],
            };
            let both = model.forward_logits(&batch, &mut kv3).unwrap();
            let vocab = model.args.vocab_size;
            assert_eq!(both[vocab..], ours[0][..], "{family} case {ci}: batched differs from alone");
        }
    }
}

/// `ModelArgs::num_parameters` (which sizes the device's weights in the memory plan) is every
/// element of the checkpoint, for every family: biases, q/k norms (per head and whole),
/// sandwich norms, routers and shared experts included.
#[test]
fn num_parameters_counts_every_tensor_of_every_family() {
    for path in common::family_fixtures() {
        let fixture: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let tensors = common::fixture_tensors(&fixture);
        let want: usize = tensors.iter().map(|t| t.shape.iter().product::<usize>()).sum();
        let dir = tempfile::tempdir().unwrap();
        common::write_hf_folder(dir.path(), &fixture["config"], tensors);
        let loaded = lmplex_model::load(dir.path(), Some(64)).unwrap();
        assert_eq!(loaded.model.args.num_parameters(), want, "{}", path.display());
    }
}

/// Speculative verification's premise, for every family: a chunk of generated tokens with every
/// row's logits (a decode token and its drafts) gives each row the bits decoding the tokens one
/// by one gives; and after a wrong draft, the chunk that computes the right token again over
/// the wrong one's K/V gives the bits of plain decoding too (windows and MoE routing included).
#[test]
fn a_verification_chunk_gives_each_row_the_bits_of_plain_decoding() {
    for path in common::family_fixtures() {
        let fixture: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let family = fixture["family"].as_str().unwrap().to_string();
        let dir = tempfile::tempdir().unwrap();
        common::write_hf_folder(dir.path(), &fixture["config"], common::fixture_tensors(&fixture));
        let case = &fixture["cases"][0];
        let loaded = lmplex_model::load(dir.path(), Some(64)).unwrap();
        let (model, dtype) = (&loaded.model, loaded.kv_dtype);
        let prompt: Vec<u32> = case["prompt"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let n = 6;
        let (tokens, steps) = common::greedy_with(model, &prompt, n + 1, dtype);
        let (mut kv, table) = common::single_seq_kv(model, 64, dtype);
        let vocab = model.args.vocab_size;
        let pass = |kv: &mut lmplex_model::KvCache, ids: &[u32], start: usize, logits| {
            let seq = SeqChunk {
                token_ids: ids,
                start_pos: start,
                block_table: &table,
                logits,
                num_prompt_tokens: prompt.len(),
                lora: None,
                embeds: None,
            };
            model.forward_logits(&ForwardBatch { seqs: vec![seq] }, kv).unwrap()
        };
        let p = prompt.len();
        pass(&mut kv, &prompt, 0, LogitsSelect::Last);
        // A wrong draft after the decode token: row 0 is plain decoding's step 1.
        let wrong = [tokens[0], (tokens[1] + 1) % vocab as u32, tokens[2]];
        let rows = pass(&mut kv, &wrong, p, LogitsSelect::All);
        assert_eq!(rows[..vocab], steps[1][..], "{family}: the decode row of a drafted chunk differs");
        // The right token over the wrong one's K/V, with the rest drafted right.
        let rows = pass(&mut kv, &tokens[1..n], p + 1, LogitsSelect::All);
        for (j, row) in rows.chunks_exact(vocab).enumerate() {
            assert_eq!(row, &steps[j + 2][..], "{family}: drafted row {j} differs from decoding it alone");
        }
    }
}
