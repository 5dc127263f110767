//! llama.cpp multimodal projector files (`mmproj`) against Hugging Face transformers, through the
//! fixtures `scripts/make_mmproj_fixtures.py` writes: tiny random-weight towers of the four
//! families (Idefics3, Gemma 3, Qwen2-VL, Qwen2.5-VL) converted by llama.cpp's own
//! `convert_hf_to_gguf.py --mmproj` (`tests/fixtures/vision/*.mmproj.gguf`), and transformers'
//! float32 `get_image_features` of the same weights (`mmproj.json`).
//!
//! Checks: the tower's shapes read from the file equal those read from the model's
//! `config.json`; features within `TOL` of transformers' relative to their scale (Gemma 3's
//! against transformers run with its projection rounded to f16, as llama.cpp always stores it),
//! for a batch and for its last image alone; a text model's GGUF, a truncated file, a corrupt
//! size and a file that is not a GGUF are load errors saying so.

use candle_core::quantized::gguf_file;
use lmplex_core::Error;
use lmplex_model::testing::hashed_values;
use lmplex_model::vision::{Mmproj, Qwen2VlTower, TowerArgs, VisionTower};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Largest `|ours - transformers'|` allowed, as a fraction of the largest `|feature|`.
const TOL: f32 = 1e-5;
const FAMILIES: [&str; 4] = ["idefics3", "gemma3", "qwen2_vl", "qwen2_5_vl"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture() -> Value {
    let text = std::fs::read_to_string(root().join("tests/fixtures/vision/mmproj.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The family's mmproj, its image token given the config's id.
fn open(fx: &Value) -> Mmproj {
    let path = root().join(fx["gguf"].as_str().unwrap());
    Mmproj::open(&path, |_| Ok(image_token_id(fx))).unwrap()
}

fn image_token_id(fx: &Value) -> u32 {
    let c = &fx["config_json"];
    c["image_token_id"].as_u64().or_else(|| c["image_token_index"].as_u64()).unwrap() as u32
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn pixels(fx: &Value) -> (Vec<f32>, Vec<usize>) {
    let p = &fx["pixel_values"];
    let shape: Vec<usize> = p["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
    let n = shape.iter().product();
    (hashed_values(p["name"].as_str().unwrap(), n, p["std"].as_f64().unwrap(), p["mean"].as_f64().unwrap()), shape)
}

fn assert_close(family: &str, case: usize, ours: &[f32], theirs: &[f32]) {
    assert_eq!(ours.len(), theirs.len(), "{family} case {case}: feature count");
    let scale = theirs.iter().fold(0f32, |m, x| m.max(x.abs()));
    let diff = ours.iter().zip(theirs).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(diff <= TOL * scale, "{family} case {case}: max diff {diff} over scale {scale}");
}

#[test]
fn an_mmproj_gives_the_shapes_of_its_models_config() {
    let fx = fixture();
    for family in FAMILIES {
        let f = &fx["families"][family];
        let from_config = TowerArgs::from_hf_config(&f["config_json"].to_string()).unwrap();
        assert_eq!(open(f).tower, from_config, "{family}");
    }
}

#[test]
fn an_mmproj_records_its_processors_settings() {
    let fx = fixture();
    let idefics = open(&fx["families"]["idefics3"]);
    assert_eq!(idefics.preprocessor_config["size"], serde_json::json!({"longest_edge": 96}));
    assert_eq!(idefics.preprocessor_config["max_image_size"], serde_json::json!({"longest_edge": 32}));
    assert_eq!(idefics.preprocessor_config["image_mean"], serde_json::json!([0.5, 0.5, 0.5]));
    assert_eq!(idefics.processor_config, serde_json::json!({"image_seq_len": 4}));
    let gemma = open(&fx["families"]["gemma3"]);
    assert_eq!(gemma.preprocessor_config["size"], serde_json::json!({"height": 32, "width": 32}));
    assert_eq!(gemma.processor_config, serde_json::json!({"image_seq_length": 4}));
    let qwen = open(&fx["families"]["qwen2_5_vl"]);
    let want = fx["families"]["qwen2_5_vl"]["preprocessor_config"]["image_std"].as_array().unwrap().clone();
    let std = qwen.preprocessor_config["image_std"].as_array().unwrap().clone();
    for (ours, theirs) in std.iter().zip(&want) {
        // f32 in the file: its shortest decimal is within f32 precision of the config's.
        assert!((ours.as_f64().unwrap() - theirs.as_f64().unwrap()).abs() < 1e-7, "{ours} vs {theirs}");
    }
    assert_eq!(qwen.preprocessor_config["merge_size"], 2);
}

#[test]
fn siglip_towers_from_mmproj_match_transformers() {
    let fx = fixture();
    for family in ["idefics3", "gemma3"] {
        let f = &fx["families"][family];
        let mm = open(f);
        let TowerArgs::Siglip(args) = mm.tower.clone() else { panic!("{family}: not a SigLIP tower") };
        let tower = VisionTower::load(&mm.weights, args).unwrap();
        let (pixels, shape) = pixels(f);
        let per_tile = pixels.len() / shape[0];
        // llama.cpp stores Gemma 3's projection as f16 whatever `--outtype` says.
        let cases = if family == "gemma3" { &f["image_features_gguf_weights"] } else { &f["image_features"] };
        for (i, case) in cases.as_array().unwrap().iter().enumerate() {
            let tiles: Vec<usize> = case
                .get("tiles")
                .or_else(|| case.get("images"))
                .unwrap()
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as usize)
                .collect();
            let input: Vec<f32> =
                tiles.iter().flat_map(|&t| pixels[t * per_tile..(t + 1) * per_tile].iter().copied()).collect();
            let ours = tower.encode(&input, tiles.len()).unwrap();
            assert_close(family, i, &ours, &floats(&case["values"]));
        }
    }
}

#[test]
fn qwen_towers_from_mmproj_match_transformers() {
    let fx = fixture();
    for family in ["qwen2_vl", "qwen2_5_vl"] {
        let f = &fx["families"][family];
        let mm = open(f);
        let TowerArgs::Qwen2Vl(args) = mm.tower.clone() else { panic!("{family}: not a Qwen tower") };
        let patch_len = args.patch_len();
        let tower = Qwen2VlTower::load(&mm.weights, args).unwrap();
        let (patches, _) = pixels(f);
        let grids: Vec<[usize; 3]> = f["image_grid_thw"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| std::array::from_fn(|i| g[i].as_u64().unwrap() as usize))
            .collect();
        let rows: Vec<usize> = grids.iter().map(|g| g.iter().product()).collect();
        for (i, case) in f["image_features"].as_array().unwrap().iter().enumerate() {
            let images: Vec<usize> =
                case["images"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as usize).collect();
            let mut input = Vec::new();
            for &im in &images {
                let start = rows[..im].iter().sum::<usize>() * patch_len;
                input.extend_from_slice(&patches[start..start + rows[im] * patch_len]);
            }
            let these: Vec<[usize; 3]> = images.iter().map(|&im| grids[im]).collect();
            let ours = tower.encode(&input, &these).unwrap();
            assert_close(family, i, &ours, &floats(&case["values"]));
        }
    }
}

/// `Mmproj::open`'s error text for the file at `path`.
fn open_err(path: &Path) -> String {
    match Mmproj::open(path, |_| Ok(0)) {
        Err(Error::ModelLoad(m)) => m,
        Err(e) => panic!("{}: expected a load error, got {e:?}", path.display()),
        Ok(_) => panic!("{}: opened", path.display()),
    }
}

#[test]
fn a_file_that_is_not_a_whole_mmproj_is_a_load_error_saying_so() {
    let fx = fixture();
    let dir = tempfile::tempdir().unwrap();
    // A text model's GGUF.
    let text = dir.path().join("text.gguf");
    let f32s = |_: &str| candle_core::quantized::GgmlDType::F32;
    lmplex_model::testing::write_tiny_gguf(&text, lmplex_model::testing::Family::Llama, &f32s).unwrap();
    assert!(open_err(&text).contains("not a multimodal projector"), "{}", open_err(&text));
    // Truncated: the header reads, a tensor runs past the end.
    let bytes = std::fs::read(root().join(fx["families"]["idefics3"]["gguf"].as_str().unwrap())).unwrap();
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() - 100]).unwrap();
    assert!(open_err(&cut).contains("truncated"), "{}", open_err(&cut));
    // A corrupt size: an error naming the key, not a huge allocation.
    let path = root().join(fx["families"]["qwen2_5_vl"]["gguf"].as_str().unwrap());
    let mut file = std::fs::File::open(&path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let tensors: Vec<(String, candle_core::quantized::QTensor)> = content
        .tensor_infos
        .keys()
        .map(|n| (n.clone(), content.tensor(&mut file, n, &candle_core::Device::Cpu).unwrap()))
        .collect();
    let mut metadata = content.metadata.clone();
    metadata.insert("clip.vision.block_count".into(), gguf_file::Value::U32(1 << 30));
    let huge = dir.path().join("huge.gguf");
    let md: Vec<(&str, &gguf_file::Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let ts: Vec<(&str, &candle_core::quantized::QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    gguf_file::write(&mut std::fs::File::create(&huge).unwrap(), &md, &ts).unwrap();
    assert!(open_err(&huge).contains("'clip.vision.block_count' is 1073741824"), "{}", open_err(&huge));
    // Not a GGUF at all.
    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, b"not a gguf file at all").unwrap();
    assert!(open_err(&junk).contains("not a GGUF"), "{}", open_err(&junk));
}
