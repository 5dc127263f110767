//! The Qwen2-VL and Qwen2.5-VL vision towers against Hugging Face transformers, through the
//! fixtures `scripts/make_qwen2vl_fixtures.py` writes (`tests/fixtures/vision/qwen2_vl.json`,
//! `qwen2_5_vl.json`): tiny towers (2 blocks of width 32, 2 heads, 4x4 patches over 2 frames,
//! 2x2 merged units; Qwen2.5-VL with windows of 2x2 units in block 0), their weights and patch
//! rows regenerated here bit for bit (`testing::hashed_values`), and transformers' float32
//! `get_image_features` for two images (grids 1x4x6 and 1x8x4) and for the second alone.
//!
//! Checks: features within `TOL` of transformers' relative to their scale; each image's the
//! same bits alone, beside the other, or in the other order; bad grids and patch counts are
//! `InvalidRequest`; bf16 and f16 checkpoints compute as their values widened to f32; a missing
//! or misshapen tensor is a load error naming it; the Hub's tensor names (`visual.` for
//! transformers' `model.visual.`) load the same tower.

mod common;

use candle_core::{DType, Device, Tensor};
use lmplex_core::Error;
use lmplex_model::testing::hashed_values;
use lmplex_model::vision::{Qwen2VlFamily, Qwen2VlTower, Qwen2VlVisionArgs};
use lmplex_model::WeightSource;
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

/// Largest `|ours - transformers'|` allowed, as a fraction of the largest `|feature|`.
const TOL: f32 = 1e-5;
const FAMILIES: [&str; 2] = ["qwen2_vl", "qwen2_5_vl"];

fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/fixtures/vision/{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The fixture's tensors, renamed by `rename` (dropped where it gives `None`), written to
/// `dir/model.safetensors`; the weight source over them.
fn folder(dir: &Path, fx: &Value, rename: impl Fn(&str) -> Option<String>) -> WeightSource {
    folder_as(dir, fx, |t| t, rename)
}

/// `folder` with each tensor passed through `convert` (a dtype) first.
fn folder_as(
    dir: &Path,
    fx: &Value,
    convert: impl Fn(Tensor) -> Tensor,
    rename: impl Fn(&str) -> Option<String>,
) -> WeightSource {
    let map: HashMap<String, Tensor> = common::fixture_tensors(fx)
        .into_iter()
        .filter_map(|t| Some((rename(&t.name)?, convert(Tensor::from_vec(t.values, t.shape, &Device::Cpu).unwrap()))))
        .collect();
    let file = dir.join("model.safetensors");
    candle_core::safetensors::save(&map, &file).unwrap();
    WeightSource::safetensors(dir, &[file]).unwrap()
}

fn args(fx: &Value) -> Qwen2VlVisionArgs {
    Qwen2VlVisionArgs::from_hf_config(&fx["config_json"].to_string()).unwrap()
}

fn tower(fx: &Value) -> Qwen2VlTower {
    let dir = tempfile::tempdir().unwrap();
    Qwen2VlTower::load(&folder(dir.path(), fx, |n| Some(n.to_string())), args(fx)).unwrap()
}

fn patches(fx: &Value) -> Vec<f32> {
    let p = &fx["pixel_values"];
    let n = p["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).product();
    hashed_values(p["name"].as_str().unwrap(), n, p["std"].as_f64().unwrap(), p["mean"].as_f64().unwrap())
}

fn grids(fx: &Value) -> Vec<[usize; 3]> {
    let g = fx["image_grid_thw"].as_array().unwrap();
    g.iter().map(|g| std::array::from_fn(|i| g[i].as_u64().unwrap() as usize)).collect()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

/// The patch rows and features of image `i` of the batch: `(rows, tokens)` ranges.
fn spans(grids: &[[usize; 3]], unit: usize, i: usize) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
    let rows = |g: &[usize; 3]| g.iter().product::<usize>();
    let start: usize = grids[..i].iter().map(rows).sum();
    let n = rows(&grids[i]);
    (start..start + n, start / unit..(start + n) / unit)
}

#[test]
fn features_match_transformers() {
    for name in FAMILIES {
        let fx = fixture(name);
        let a = args(&fx);
        assert_eq!(Qwen2VlVisionArgs::from_hf_config(&fx["config"].to_string()).unwrap(), a, "{name}");
        let family = if name == "qwen2_vl" { Qwen2VlFamily::Qwen2Vl } else { Qwen2VlFamily::Qwen25Vl };
        assert_eq!((a.family, a.hidden_size, a.num_heads, a.text_hidden_size), (family, 32, 2, 64), "{name}");
        assert_eq!((a.patch_len(), a.merge_unit(), a.image_token_id), (96, 4, 78), "{name}");
        let t = tower(&fx);
        let (px, grids, len) = (patches(&fx), grids(&fx), a.patch_len());
        for case in fx["image_features"].as_array().unwrap() {
            let images: Vec<usize> =
                case["images"].as_array().unwrap().iter().map(|i| i.as_u64().unwrap() as usize).collect();
            let input: Vec<f32> = images
                .iter()
                .flat_map(|&i| &px[spans(&grids, 4, i).0.start * len..spans(&grids, 4, i).0.end * len])
                .copied()
                .collect();
            let g: Vec<[usize; 3]> = images.iter().map(|&i| grids[i]).collect();
            let got = t.encode(&input, &g).unwrap();
            let want = floats(&case["values"]);
            assert_eq!(got.len(), want.len(), "{name} images {images:?}");
            let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
            assert!(scale > 1.0, "{name}: the features are not trivial: max |x| {scale}");
            let d = common::max_diff(&got, &want);
            assert!(d <= TOL * scale, "{name} images {images:?}: max |diff| {d} > {TOL} * {scale}");
        }
    }
}

/// Each image's features are the same bits alone, beside the other image, and in either order.
#[test]
fn each_image_depends_on_itself_alone() {
    for name in FAMILIES {
        let fx = fixture(name);
        let (t, px, grids) = (tower(&fx), patches(&fx), grids(&fx));
        let (len, width) = (t.args().patch_len(), t.args().text_hidden_size);
        let both = t.encode(&px, &grids).unwrap();
        let rows = |i: usize| &px[spans(&grids, 4, i).0.start * len..spans(&grids, 4, i).0.end * len];
        let feats = |out: &[f32], g: &[[usize; 3]], k: usize| {
            let s = spans(g, 4, k).1;
            out[s.start * width..s.end * width].to_vec()
        };
        let swapped_px: Vec<f32> = rows(1).iter().chain(rows(0)).copied().collect();
        let swapped_grids = [grids[1], grids[0]];
        let swapped = t.encode(&swapped_px, &swapped_grids).unwrap();
        for i in 0..2 {
            let alone = t.encode(rows(i), &grids[i..=i]).unwrap();
            assert_eq!(alone, feats(&both, &grids, i), "{name}: image {i} alone vs beside the other");
            assert_eq!(alone, feats(&swapped, &swapped_grids, 1 - i), "{name}: image {i} in the other order");
        }
        // The same image twice gives the same bits twice.
        let twice: Vec<f32> = rows(1).iter().chain(rows(1)).copied().collect();
        let out = t.encode(&twice, &[grids[1], grids[1]]).unwrap();
        assert_eq!(out[..out.len() / 2], out[out.len() / 2..], "{name}");
        // One image a pass: the same bits as both in one.
        assert_eq!(t.with_rows_per_pass(1).encode(&px, &grids).unwrap(), both, "{name}: one image a pass");
    }
}

#[test]
fn bad_input_is_an_invalid_request() {
    let fx = fixture("qwen2_5_vl");
    let (t, px, grids) = (tower(&fx), patches(&fx), grids(&fx));
    let len = t.args().patch_len();
    let cases: Vec<(&[f32], Vec<[usize; 3]>)> = vec![
        (&px[..px.len() - 1], grids.clone()),
        (&px, vec![grids[0]]),
        (&px[..24 * len], vec![[1, 3, 8]]),
        (&px[..24 * len], vec![[1, 6, 4], [0, 2, 2]]),
        (&px[..len], vec![[usize::MAX, 2, 2]]),
    ];
    for (input, g) in cases {
        match t.encode(input, &g) {
            Err(Error::InvalidRequest(_)) => {}
            other => panic!("grids {g:?} with {} values: {other:?}", input.len()),
        }
    }
    assert_eq!(t.encode(&[], &[]).unwrap(), Vec::<f32>::new());
}

#[test]
fn a_missing_or_misshapen_tensor_is_a_load_error_naming_it() {
    for name in FAMILIES {
        let fx = fixture(name);
        let missing = "model.visual.blocks.1.attn.qkv.bias";
        let dir = tempfile::tempdir().unwrap();
        let src = folder(dir.path(), &fx, |n| (n != missing).then(|| n.to_string()));
        match Qwen2VlTower::load(&src, args(&fx)) {
            Err(Error::ModelLoad(m)) => assert!(m.contains(missing), "{name}: '{m}' does not name {missing}"),
            Err(e) => panic!("{name}: expected a ModelLoad error, got {e}"),
            Ok(_) => panic!("{name}: loaded without {missing}"),
        }
        // A config whose MLP is wider than the checkpoint's.
        let mut a = args(&fx);
        a.intermediate_size += 4;
        let dir = tempfile::tempdir().unwrap();
        let src = folder(dir.path(), &fx, |n| Some(n.to_string()));
        let fc1 = if name == "qwen2_vl" { "blocks.0.mlp.fc1.weight" } else { "blocks.0.mlp.gate_proj.weight" };
        match Qwen2VlTower::load(&src, a) {
            Err(Error::ModelLoad(m)) => assert!(m.contains(fc1) && m.contains("shape"), "{name}: '{m}'"),
            Err(e) => panic!("{name}: expected a ModelLoad error, got {e}"),
            Ok(_) => panic!("{name}: loaded a misshapen {fc1}"),
        }
    }
}

/// A bf16 or f16 checkpoint (the Hub's are bf16) keeps its matrices in their stored type and
/// computes as the f32 checkpoint of the same (rounded) values.
#[test]
fn half_precision_checkpoints_compute_as_their_f32_widening() {
    for name in FAMILIES {
        let fx = fixture(name);
        let (px, grids) = (patches(&fx), grids(&fx));
        for half in [DType::BF16, DType::F16] {
            let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
            let keep = |n: &str| Some(n.to_string());
            let narrow = folder_as(d1.path(), &fx, |t| t.to_dtype(half).unwrap(), keep);
            let widened = |t: Tensor| t.to_dtype(half).unwrap().to_dtype(DType::F32).unwrap();
            let wide = folder_as(d2.path(), &fx, widened, keep);
            let (narrow, wide) =
                (Qwen2VlTower::load(&narrow, args(&fx)).unwrap(), Qwen2VlTower::load(&wide, args(&fx)).unwrap());
            assert!(
                narrow.size_in_bytes() < wide.size_in_bytes() * 6 / 10,
                "{name} {half:?}: matrices are kept narrow"
            );
            let (a, b) = (narrow.encode(&px, &grids).unwrap(), wide.encode(&px, &grids).unwrap());
            let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
            let d = common::max_diff(&a, &b);
            assert!(d <= TOL * scale, "{name} {half:?}: max |diff| {d} from its f32 widening (scale {scale})");
        }
    }
}

/// The Hub's checkpoints store the tower as `visual.*`, where transformers 5 holds it as
/// `model.visual.*`: both load the same tower.
#[test]
fn hub_tensor_names_load_the_same_tower() {
    for name in FAMILIES {
        let fx = fixture(name);
        let dir = tempfile::tempdir().unwrap();
        let hub = |n: &str| Some(n.strip_prefix("model.").unwrap_or(n).to_string());
        let src = folder(dir.path(), &fx, hub);
        assert!(src.has("visual.patch_embed.proj.weight") && !src.has("model.visual.patch_embed.proj.weight"));
        let t = Qwen2VlTower::load(&src, args(&fx)).unwrap();
        let want = tower(&fx);
        assert_eq!(t.size_in_bytes(), want.size_in_bytes(), "{name}");
        let (px, grids) = (patches(&fx), grids(&fx));
        assert_eq!(t.encode(&px, &grids).unwrap(), want.encode(&px, &grids).unwrap(), "{name}");
    }
}
