//! The Idefics3 (SmolVLM) vision tower against Hugging Face transformers, through the fixture
//! `scripts/make_vlm_fixtures.py` writes (`tests/fixtures/vision/idefics3.json`): a tiny
//! `Idefics3ForConditionalGeneration` (SigLIP encoder of 2 layers, 32x32 tiles of 8x8 patches,
//! pixel shuffle by 2), its weights and pixel values regenerated here bit for bit
//! (`testing::hashed_values`), and transformers' float32 `get_image_features` for 3 tiles and
//! for tile 2 alone.
//!
//! Checks: features within `TOL` of transformers' relative to their scale (float32 both sides,
//! only the order of sums and the `tanh`/`exp` implementations differ); each tile's features
//! are the same bits encoded alone, with others, or in another order; bf16 and f16 checkpoints
//! compute as their values widened to f32; a missing or misshapen tensor is a load error naming
//! it.

mod common;

use candle_core::{DType, Device, Tensor};
use lmplex_model::testing::hashed_values;
use lmplex_model::vision::{VisionArgs, VisionTower};
use lmplex_model::{ForwardBatch, InputEmbeds, KvDtype, LogitsSelect, SeqChunk, WeightSource};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

/// Largest `|ours - transformers'|` allowed, as a fraction of the largest `|feature|`.
const TOL: f32 = 1e-5;

fn fixture() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/vision/idefics3.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn config(fixture: &Value) -> String {
    fixture["config"].to_string()
}

/// The fixture's tensors written to `dir/model.safetensors` in `dtype` (rounded to nearest),
/// with `edit` applied to the name -> tensor map first; the weight source over them.
fn weights(dir: &Path, fixture: &Value, dtype: DType, edit: impl FnOnce(&mut HashMap<String, Tensor>)) -> WeightSource {
    let mut map: HashMap<String, Tensor> = common::fixture_tensors(fixture)
        .into_iter()
        .map(|t| (t.name, Tensor::from_vec(t.values, t.shape, &Device::Cpu).unwrap().to_dtype(dtype).unwrap()))
        .collect();
    edit(&mut map);
    let file = dir.join("model.safetensors");
    candle_core::safetensors::save(&map, &file).unwrap();
    WeightSource::safetensors(dir, &[file]).unwrap()
}

fn tower(fixture: &Value, dtype: DType) -> VisionTower {
    let dir = tempfile::tempdir().unwrap();
    let src = weights(dir.path(), fixture, dtype, |_| {});
    VisionTower::load(&src, VisionArgs::from_hf_config(&config(fixture)).unwrap()).unwrap()
}

/// The fixture's 3 tiles of pixel values, `[3, 3, 32, 32]`.
fn pixels(fixture: &Value) -> Vec<f32> {
    let p = &fixture["pixel_values"];
    let n = p["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).product();
    hashed_values(p["name"].as_str().unwrap(), n, p["std"].as_f64().unwrap(), p["mean"].as_f64().unwrap())
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

#[test]
fn features_match_transformers() {
    let fx = fixture();
    let args = VisionArgs::from_hf_config(&config(&fx)).unwrap();
    // config.json as saved (defaults left out) gives the same shapes as the full config.
    assert_eq!(VisionArgs::from_hf_config(&fx["config_json"].to_string()).unwrap(), args);
    assert_eq!((args.image_seq_len(), args.text_hidden_size, args.image_token_id), (4, 64, 70));
    let tower = tower(&fx, DType::F32);
    let px = pixels(&fx);
    let tile_len = args.tile_len();
    for case in fx["image_features"].as_array().unwrap() {
        let tiles: Vec<usize> =
            case["tiles"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as usize).collect();
        let input: Vec<f32> = tiles.iter().flat_map(|&t| &px[t * tile_len..(t + 1) * tile_len]).copied().collect();
        let got = tower.encode(&input, tiles.len()).unwrap();
        let want = floats(&case["values"]);
        let shape: Vec<u64> = case["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
        assert_eq!(shape, [tiles.len() as u64 * 4, 64]);
        assert_eq!(got.len(), want.len(), "tiles {tiles:?}");
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(scale > 1.0, "the features are not trivial: max |x| {scale}");
        let d = common::max_diff(&got, &want);
        assert!(d <= TOL * scale, "tiles {tiles:?}: max |diff| {d} > {TOL} * {scale}");
    }
}

#[test]
fn each_tile_depends_only_on_itself() {
    let fx = fixture();
    let tower = tower(&fx, DType::F32);
    let px = pixels(&fx);
    let (tile_len, feat_len) = (tower.args().tile_len(), tower.args().image_seq_len() * tower.args().text_hidden_size);
    let tile = |t: usize| &px[t * tile_len..(t + 1) * tile_len];
    let all = tower.encode(&px, 3).unwrap();
    let feats = |t: usize| &all[t * feat_len..(t + 1) * feat_len];
    assert_eq!(tower.encode(tile(2), 1).unwrap(), feats(2), "tile 2 alone differs from tile 2 of three");
    let reordered: Vec<f32> = [2, 0, 1, 2].iter().flat_map(|&t| tile(t)).copied().collect();
    let out = tower.encode(&reordered, 4).unwrap();
    for (i, t) in [2, 0, 1, 2].into_iter().enumerate() {
        assert_eq!(&out[i * feat_len..(i + 1) * feat_len], feats(t), "tile {t} at position {i}");
    }
    // One tile a pass, or two then one: the same bits.
    let n = tower.args().num_patches();
    let tower = tower.with_rows_per_pass(n);
    assert_eq!(tower.encode(&px, 3).unwrap(), all, "one tile a pass");
    let tower = tower.with_rows_per_pass(2 * n + 1);
    assert_eq!(tower.encode(&px, 3).unwrap(), all, "two tiles, then one");
    assert!(tower.encode(&[], 0).unwrap().is_empty());
    assert!(tower.encode(&px[1..], 3).unwrap_err().to_string().contains("pixel values for 3 tiles"));
}

/// A bf16 or f16 checkpoint keeps its matrices in their stored type and computes as the f32
/// checkpoint of the same (rounded) values.
#[test]
fn half_precision_checkpoints_compute_as_their_f32_widening() {
    let fx = fixture();
    let px = pixels(&fx);
    for half in [DType::BF16, DType::F16] {
        let narrow = tower(&fx, half);
        let dir = tempfile::tempdir().unwrap();
        let widened = weights(dir.path(), &fx, DType::F32, |m| {
            for t in m.values_mut() {
                *t = t.to_dtype(half).unwrap().to_dtype(DType::F32).unwrap();
            }
        });
        let wide = VisionTower::load(&widened, narrow.args().clone()).unwrap();
        assert!(narrow.size_in_bytes() < wide.size_in_bytes() * 6 / 10, "{half:?} matrices are kept narrow");
        let (a, b) = (narrow.encode(&px, 3).unwrap(), wide.encode(&px, 3).unwrap());
        let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
        let d = common::max_diff(&a, &b);
        assert!(d <= 1e-5 * scale, "{half:?}: max |diff| {d} from its f32 widening (scale {scale})");
    }
}

#[test]
fn a_missing_or_misshapen_tensor_is_a_load_error_naming_it() {
    let fx = fixture();
    let args = VisionArgs::from_hf_config(&config(&fx)).unwrap();
    let fc1 = "model.vision_model.encoder.layers.1.mlp.fc1.weight";
    let proj = "model.connector.modality_projection.proj.weight";
    let pos = "model.vision_model.embeddings.position_embedding.weight";
    // Each case: a tensor removed (`None`) or replaced by zeros of the wrong shape.
    let cases: [(&str, Option<&[usize]>); 3] = [(fc1, None), (proj, Some(&[64, 64])), (pos, Some(&[9, 32]))];
    for (name, shape) in cases {
        let dir = tempfile::tempdir().unwrap();
        let src = weights(dir.path(), &fx, DType::F32, |m| match shape {
            None => drop(m.remove(name)),
            Some(s) => drop(m.insert(name.into(), Tensor::zeros(s, DType::F32, &Device::Cpu).unwrap())),
        });
        match VisionTower::load(&src, args.clone()) {
            Err(lmplex_core::Error::ModelLoad(m)) => assert!(m.contains(name), "'{m}' does not name {name}"),
            Err(e) => panic!("{name}: expected ModelLoad, got {e:?}"),
            Ok(_) => panic!("{name}: loaded"),
        }
    }
}

/// The whole model: the Idefics3 folder's text model (its weights under `model.text_model.`,
/// its config the `text_config`) with the tower's features spliced at the `<image>` tokens
/// (`InputEmbeds`) gives transformers' logits at the last position and its greedy token at
/// every position; the prompt in chunks that cut through the image rows gives the same bits.
#[test]
fn the_whole_model_with_spliced_features_matches_transformers() {
    let fx = fixture();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), fx["config_json"].to_string()).unwrap();
    let args = VisionArgs::from_hf_config(&config(&fx)).unwrap();
    lmplex_model::testing::write_word_tokenizer(dir.path(), 72).unwrap();
    let src = weights(dir.path(), &fx, DType::F32, |_| {});
    let tower = VisionTower::load(&src, args.clone()).unwrap();
    let loaded = lmplex_model::load(dir.path(), Some(64)).unwrap();
    let model = &loaded.model;
    assert_eq!(model.args.text_prefix, Some("model.text_model."));
    let fwd = &fx["forward"];
    let ids: Vec<u32> = fwd["input_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let feats = tower.encode(&pixels(&fx), 3).unwrap();
    let embeds = InputEmbeds::at_placeholders(&ids, args.image_token_id, feats, args.text_hidden_size).unwrap();
    let vocab = model.args.vocab_size;
    let run = |chunks: &[&[u32]], select: LogitsSelect| -> Vec<f32> {
        let (mut kv, table) = common::single_seq_kv(model, 64, KvDtype::F32);
        let mut start = 0;
        let mut out = Vec::new();
        for c in chunks {
            let seq = SeqChunk {
                token_ids: c,
                start_pos: start,
                block_table: &table,
                logits: select,
                num_prompt_tokens: usize::MAX,
                lora: None,
                embeds: Some(&embeds),
            };
            out = model.forward_logits(&ForwardBatch { seqs: vec![seq] }, &mut kv).unwrap();
            start += c.len();
        }
        out
    };
    let all = run(&[&ids], LogitsSelect::All);
    let argmax: Vec<u64> =
        all.chunks(vocab).map(|row| (0..vocab).fold(0, |b, i| if row[i] > row[b] { i } else { b }) as u64).collect();
    let want: Vec<u64> = fwd["argmax"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
    assert_eq!(argmax, want, "greedy tokens at every position");
    let last = &all[(ids.len() - 1) * vocab..];
    let want_last = floats(&fwd["last_logits"]);
    let scale = want_last.iter().fold(0f32, |m, x| m.max(x.abs()));
    let d = common::max_diff(last, &want_last);
    assert!(d <= 1e-4 * scale.max(1.0), "last logits differ by {d} (scale {scale})");
    // Chunks of 5 cut through the image rows: the same bits.
    let chunks: Vec<&[u32]> = ids.chunks(5).collect();
    assert_eq!(run(&chunks, LogitsSelect::Last), last, "chunked prefill through the image differs");
    // Without the features (placeholder embeddings) the logits differ: the splice is what counts.
    let (mut kv, table) = common::single_seq_kv(model, 64, KvDtype::F32);
    let plain = SeqChunk {
        token_ids: &ids,
        start_pos: 0,
        block_table: &table,
        logits: LogitsSelect::Last,
        num_prompt_tokens: usize::MAX,
        lora: None,
        embeds: None,
    };
    assert_ne!(model.forward_logits(&ForwardBatch { seqs: vec![plain] }, &mut kv).unwrap(), last);
}
