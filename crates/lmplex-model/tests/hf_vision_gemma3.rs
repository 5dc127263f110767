//! The Gemma 3 vision tower and its text model against Hugging Face transformers, through the
//! fixture `scripts/make_gemma3_vlm_fixtures.py` writes (`tests/fixtures/vision/gemma3.json`):
//! a tiny `Gemma3ForConditionalGeneration` (SigLIP encoder of 2 layers, 32x32 images of 8x8
//! patches average-pooled to 4 tokens; a 3-layer Gemma 3 text model with a 6-token sliding
//! window), its weights and pixel values regenerated here bit for bit
//! (`testing::hashed_values`).
//!
//! Checks: features within `TOL` of transformers' relative to their scale, each image's the
//! same bits alone or beside another; the whole model with the features spliced at the image
//! tokens and each image's tokens attending to each other (`InputEmbeds::bidirectional`) gives
//! transformers' last logits and its greedy token at every position, including image tokens
//! past the sliding window; chunks at block boundaries give the same bits, a chunk ending inside
//! a block is refused, and a causal mask is told apart; the names checkpoints store the model
//! under load it too. The same weights with 16 tokens an image (`forward_long_image`), an image
//! longer than the window, give transformers' logits and greedy tokens too, told apart from
//! those of wrong compositions of the window and the image block.

mod common;

use candle_core::{Device, Tensor};
use lmplex_model::testing::hashed_values;
use lmplex_model::vision::{VisionArgs, VisionFamily, VisionTower};
use lmplex_model::{ForwardBatch, InputEmbeds, KvDtype, LoadedModel, LogitsSelect, SeqChunk, WeightSource};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

/// Largest `|ours - transformers'|` allowed for features, as a fraction of their largest value.
const TOL: f32 = 1e-5;

fn fixture() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/vision/gemma3.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The fixture's tensors, renamed by `rename`, written to `dir/model.safetensors` with the
/// config and a tokenizer; the weight source over them.
fn folder(dir: &Path, fx: &Value, rename: impl Fn(&str) -> String) -> WeightSource {
    let map: HashMap<String, Tensor> = common::fixture_tensors(fx)
        .into_iter()
        .map(|t| (rename(&t.name), Tensor::from_vec(t.values, t.shape, &Device::Cpu).unwrap()))
        .collect();
    let file = dir.join("model.safetensors");
    candle_core::safetensors::save(&map, &file).unwrap();
    std::fs::write(dir.join("config.json"), fx["config_json"].to_string()).unwrap();
    lmplex_model::testing::write_word_tokenizer(dir, 80).unwrap();
    WeightSource::safetensors(dir, &[file]).unwrap()
}

fn pixels(fx: &Value) -> Vec<f32> {
    let p = &fx["pixel_values"];
    let n = p["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).product();
    hashed_values(p["name"].as_str().unwrap(), n, p["std"].as_f64().unwrap(), p["mean"].as_f64().unwrap())
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn features_match_transformers() {
    let fx = fixture();
    let args = VisionArgs::from_hf_config(&fx["config"].to_string()).unwrap();
    assert_eq!(VisionArgs::from_hf_config(&fx["config_json"].to_string()).unwrap(), args);
    assert_eq!(args.family, VisionFamily::Gemma3 { mm_tokens_per_image: 4 });
    assert_eq!((args.image_seq_len(), args.text_hidden_size, args.image_token_id), (4, 64, 78));
    let dir = tempfile::tempdir().unwrap();
    let tower = VisionTower::load(&folder(dir.path(), &fx, str::to_string), args.clone()).unwrap();
    let px = pixels(&fx);
    let (tile, feat) = (args.tile_len(), 4 * 64);
    let all = tower.encode(&px, 2).unwrap();
    for case in fx["image_features"].as_array().unwrap() {
        let images: Vec<usize> =
            case["images"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as usize).collect();
        let input: Vec<f32> = images.iter().flat_map(|&i| &px[i * tile..(i + 1) * tile]).copied().collect();
        let got = tower.encode(&input, images.len()).unwrap();
        let want = floats(&case["values"]);
        assert_eq!(got.len(), want.len(), "images {images:?}");
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(scale > 1.0, "the features are not trivial: max |x| {scale}");
        let d = common::max_diff(&got, &want);
        assert!(d <= TOL * scale, "images {images:?}: max |diff| {d} > {TOL} * {scale}");
        for (k, &i) in images.iter().enumerate() {
            assert_eq!(got[k * feat..(k + 1) * feat], all[i * feat..(i + 1) * feat], "image {i} depends on its batch");
        }
    }
}

/// The model, the tower and the fixture's features spliced at its forward prompt.
fn model_and_embeds(dir: &Path, fx: &Value, rename: impl Fn(&str) -> String) -> (LoadedModel, InputEmbeds) {
    let src = folder(dir, fx, rename);
    let args = VisionArgs::from_hf_config(&fx["config_json"].to_string()).unwrap();
    let tower = VisionTower::load(&src, args.clone()).unwrap();
    let loaded = lmplex_model::load(dir, Some(64)).unwrap();
    let prompt = ids(&fx["forward"]["input_ids"]);
    let feats = tower.encode(&pixels(fx), 2).unwrap();
    let embeds = InputEmbeds::at_placeholders(&prompt, args.image_token_id, feats, args.text_hidden_size).unwrap();
    (loaded, embeds.bidirectional())
}

/// The logits of `chunks` (one sequence, in order) with `embeds`: all rows of the last chunk
/// (`select`), or the error of the first chunk refused.
fn run(
    m: &LoadedModel,
    chunks: &[&[u32]],
    embeds: &InputEmbeds,
    select: LogitsSelect,
) -> lmplex_core::Result<Vec<f32>> {
    let (mut kv, table) = common::single_seq_kv(&m.model, 64, KvDtype::F32);
    let (mut start, mut out) = (0, Vec::new());
    for c in chunks {
        let seq = SeqChunk {
            token_ids: c,
            start_pos: start,
            block_table: &table,
            logits: select,
            num_prompt_tokens: usize::MAX,
            lora: None,
            embeds: Some(embeds),
        };
        out = m.model.forward_logits(&ForwardBatch { seqs: vec![seq] }, &mut kv)?;
        start += c.len();
    }
    Ok(out)
}

#[test]
fn the_whole_model_attends_within_each_image_as_transformers_does() {
    let fx = fixture();
    let dir = tempfile::tempdir().unwrap();
    let (m, embeds) = model_and_embeds(dir.path(), &fx, str::to_string);
    assert_eq!(m.model.args.text_prefix, Some("model.language_model."));
    let fwd = &fx["forward"];
    let prompt = ids(&fwd["input_ids"]);
    // The image tokens are the blocks the processor's token type ids mark.
    let types = ids(&fwd["token_type_ids"]);
    let marked: Vec<usize> = (0..prompt.len()).filter(|&p| types[p] == 1).collect();
    assert_eq!(embeds.blocks(), [4..8, 15..19]);
    assert_eq!(embeds.blocks().into_iter().flatten().collect::<Vec<_>>(), marked);
    let vocab = m.model.args.vocab_size;
    let all = run(&m, &[&prompt], &embeds, LogitsSelect::All).unwrap();
    let argmax: Vec<u32> =
        all.chunks(vocab).map(|row| (0..vocab).fold(0, |b, i| if row[i] > row[b] { i } else { b }) as u32).collect();
    assert_eq!(argmax, ids(&fwd["argmax"]), "greedy tokens at every position");
    let last = &all[(prompt.len() - 1) * vocab..];
    let want = floats(&fwd["last_logits"]);
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs())).max(1.0);
    let d = common::max_diff(last, &want);
    assert!(d <= 1e-4 * scale, "last logits differ by {d} (scale {scale})");
    // A causal mask moves them by far more than the tolerance: the test sees the blocks.
    let moved = fwd["causal_mask_moves_last_logits_by"].as_f64().unwrap() as f32;
    assert!(moved > 100.0 * 1e-4 * scale, "the fixture's causal logits are too close: {moved}");
    // Chunks ending at block boundaries: the same bits. One ending inside a block: refused.
    let cut = |at: &[usize]| -> Vec<&[u32]> {
        let mut b = vec![0];
        b.extend_from_slice(at);
        b.push(prompt.len());
        b.windows(2).map(|w| &prompt[w[0]..w[1]]).collect()
    };
    assert_eq!(run(&m, &cut(&[3, 10, 15]), &embeds, LogitsSelect::Last).unwrap(), last);
    assert_eq!(run(&m, &cut(&[4, 8, 19]), &embeds, LogitsSelect::Last).unwrap(), last);
    let e = run(&m, &cut(&[6]), &embeds, LogitsSelect::Last).unwrap_err();
    assert!(e.to_string().contains("inside a bidirectional image block"), "{e}");
}

/// Checkpoints store Gemma 3 under other names than transformers holds it by: the Hub's
/// (`language_model.model.*`, `vision_tower.vision_model.*`, `multi_modal_projector.*`) and
/// transformers 5's `save_pretrained` (the same, the tower without `vision_model.`). Both load
/// the same model.
#[test]
fn stored_tensor_names_load_the_same_model() {
    let fx = fixture();
    let saved = tempfile::tempdir().unwrap();
    let (m, embeds) = model_and_embeds(saved.path(), &fx, str::to_string);
    let prompt = ids(&fx["forward"]["input_ids"]);
    let want = run(&m, &[&prompt], &embeds, LogitsSelect::Last).unwrap();
    for tower in ["vision_tower.vision_model.", "vision_tower."] {
        let rename = |n: &str| {
            if let Some(rest) = n.strip_prefix("model.language_model.") {
                format!("language_model.model.{rest}")
            } else if let Some(rest) = n.strip_prefix("model.vision_tower.") {
                format!("{tower}{rest}")
            } else {
                n.strip_prefix("model.").unwrap_or(n).to_string()
            }
        };
        let dir = tempfile::tempdir().unwrap();
        let (old, old_embeds) = model_and_embeds(dir.path(), &fx, rename);
        assert_eq!(old_embeds, embeds, "{tower}");
        assert_eq!(run(&old, &[&prompt], &old_embeds, LogitsSelect::Last).unwrap(), want, "{tower}");
    }
}

/// The model of `forward_long_image` (the same weights, 16 tokens an image: `config_json` there),
/// its vision arguments and the features of its images spliced at its prompt, bidirectionally.
fn long_image_model(dir: &Path, fx: &Value) -> (LoadedModel, VisionArgs, InputEmbeds) {
    let case = &fx["forward_long_image"];
    let src = folder(dir, fx, str::to_string);
    std::fs::write(dir.join("config.json"), case["config_json"].to_string()).unwrap();
    let args = VisionArgs::from_hf_config(&case["config_json"].to_string()).unwrap();
    assert_eq!(VisionArgs::from_hf_config(&case["config"].to_string()).unwrap(), args);
    let tower = VisionTower::load(&src, args.clone()).unwrap();
    let loaded = lmplex_model::load(dir, Some(64)).unwrap();
    let (px, tile) = (pixels(fx), args.tile_len());
    let images: Vec<usize> = ids(&case["images"]).into_iter().map(|i| i as usize).collect();
    let input: Vec<f32> = images.iter().flat_map(|&i| &px[i * tile..(i + 1) * tile]).copied().collect();
    let feats = tower.encode(&input, images.len()).unwrap();
    let prompt = ids(&case["input_ids"]);
    let embeds = InputEmbeds::at_placeholders(&prompt, args.image_token_id, feats, args.text_hidden_size).unwrap();
    (loaded, args, embeds.bidirectional())
}

/// An image of 16 tokens, longer than the 6-token sliding window: in sliding layers an image
/// token sees the rest of its image after it, but its image's start only within the window
/// (transformers' `(causal or same image) and within the window`). Its logits at the image's
/// last token, at the text token after the image and at the last position, and its greedy token
/// at every position, are transformers'; the fixture's wrong masks (no image block, the block
/// past the window, image rows without the window) move those rows by far more than the
/// tolerance; chunks before and after the image give the same bits.
#[test]
fn an_image_longer_than_the_sliding_window_attends_as_transformers_does() {
    let fx = fixture();
    let case = &fx["forward_long_image"];
    let dir = tempfile::tempdir().unwrap();
    let (m, args, embeds) = long_image_model(dir.path(), &fx);
    assert_eq!(args.family, VisionFamily::Gemma3 { mm_tokens_per_image: 16 });
    assert_eq!(args.image_seq_len(), 16);
    let window = case["config"]["text_config"]["sliding_window"].as_u64().unwrap() as usize;
    assert_eq!(window, 6);
    let prompt = ids(&case["input_ids"]);
    let types = ids(&case["token_type_ids"]);
    let block = ids(&case["image_block"]);
    let (start, end) = (block[0] as usize, block[1] as usize);
    assert_eq!((start, end, prompt.len()), (4, 20, 24));
    assert!(end - start > window, "the image is not longer than the window");
    assert_eq!(embeds.blocks(), std::slice::from_ref(&(start..end)));
    let marked: Vec<usize> = (0..prompt.len()).filter(|&p| types[p] == 1).collect();
    assert_eq!(embeds.blocks().into_iter().flatten().collect::<Vec<_>>(), marked);

    let vocab = m.model.args.vocab_size;
    let all = run(&m, &[&prompt], &embeds, LogitsSelect::All).unwrap();
    let argmax: Vec<u32> =
        all.chunks(vocab).map(|row| (0..vocab).fold(0, |b, i| if row[i] > row[b] { i } else { b }) as u32).collect();
    assert_eq!(argmax, ids(&case["argmax"]), "greedy tokens at every position");
    let row = |r: usize| &all[r * vocab..(r + 1) * vocab];
    let rows = &case["rows"];
    for name in ["image_last", "after_image", "last"] {
        let r = rows[name].as_u64().unwrap() as usize;
        let want = floats(&case[format!("{name}_logits")]);
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs())).max(1.0);
        let tol = 1e-4 * scale;
        let d = common::max_diff(row(r), &want);
        assert!(d <= tol, "{name} logits (row {r}) differ by {d} (scale {scale})");
        // Each wrong mask moves this row by far more than the tolerance: the test tells them apart.
        for (mask, moved) in case["wrong_masks_move_logits_by"].as_object().unwrap() {
            let moved = moved[name].as_f64().unwrap() as f32;
            assert!(moved > 100.0 * tol, "{mask} moves the {name} logits by only {moved}");
        }
    }
    assert_eq!((rows["image_last"].as_u64(), rows["after_image"].as_u64()), (Some(19), Some(20)));
    let last = row(prompt.len() - 1);

    // Chunks ending before or after the image: the same bits; one ending inside it: refused.
    let cut = |at: &[usize]| -> Vec<&[u32]> {
        let mut b = vec![0];
        b.extend_from_slice(at);
        b.push(prompt.len());
        b.windows(2).map(|w| &prompt[w[0]..w[1]]).collect()
    };
    for at in [&[start, end][..], &[start - 1, end + 1], &[start], &[end], &[2, start, end, end + 2]] {
        assert_eq!(run(&m, &cut(at), &embeds, LogitsSelect::Last).unwrap(), last, "chunks at {at:?}");
    }
    // The image's last row, ending a chunk of the text before the image and the image.
    assert_eq!(run(&m, &[&prompt[..start], &prompt[start..end]], &embeds, LogitsSelect::Last).unwrap(), row(end - 1));
    let e = run(&m, &cut(&[start + window + 2]), &embeds, LogitsSelect::Last).unwrap_err();
    assert!(e.to_string().contains("inside a bidirectional image block"), "{e}");
}
