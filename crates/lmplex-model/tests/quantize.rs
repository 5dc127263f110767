//! `quantize::quantize_gguf` on real checkpoints:
//!
//! - The type rules give every tensor of Qwen2.5-Coder-0.5B's and Gemma-3-270m's Q4_K_M GGUFs
//!   (both made by `llama-quantize`) the type it has in the file.
//! - SmolLM2-135M rewritten as f32 keeps every value, tensor name, shape and metadata key (but
//!   the file type), and the tokenizer and chat template work from it; rewritten from that as
//!   Q8_0 and Q4_K_M, it loads and runs with logits near the source's and the types the rules
//!   name.
//! - A Hugging Face folder (the GGUF exported as f32) quantizes to the same tensors, bytes and
//!   tokenizer metadata as the GGUF itself: the HF-to-GGUF step inverts the export.
//! - A failed write leaves neither `out` nor a temporary file behind.

mod common;

use candle_core::quantized::gguf_file;
use candle_core::Device;
use lmplex_model::quantize::{llama_order, plan, quantize_gguf, type_name, FileType, TensorDesc};
use lmplex_model::sample::argmax;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;

fn read(path: &Path) -> (gguf_file::Content, BufReader<File>) {
    let mut r = BufReader::new(File::open(path).unwrap());
    (gguf_file::Content::read(&mut r).unwrap(), r)
}

/// The file's tensor names in llama.cpp's order.
fn names(c: &gguf_file::Content) -> Vec<String> {
    let mut v: Vec<String> = c.tensor_infos.keys().cloned().collect();
    v.sort_by(|a, b| llama_order(a, b));
    v
}

/// The file's tensor names as its header lists them.
fn file_order(c: &gguf_file::Content) -> Vec<String> {
    let mut v: Vec<String> = c.tensor_infos.keys().cloned().collect();
    v.sort_by_key(|n| c.tensor_infos[n].offset);
    v
}

/// These files were made by a `llama-quantize` that counted layers in the source's file order
/// (which it kept); the current one counts them in `llama_order`, as `quantize_gguf` does. So
/// the rules are given the files' own order here.
fn rules_match_llama_quantize(path: &Path) {
    let (c, _) = read(path);
    let order = file_order(&c);
    let descs: Vec<TensorDesc<'_>> = order
        .iter()
        .map(|n| {
            let d = c.tensor_infos[n].shape.dims();
            TensorDesc { name: n, row: *d.last().unwrap(), dims: d.len() }
        })
        .collect();
    let types = plan(FileType::Q4KM, &descs, 0, 0);
    for (n, t) in order.iter().zip(types) {
        let have = type_name(c.tensor_infos[n].ggml_dtype);
        assert_eq!(t.map_or("F32", type_name), have, "{}: {n}", path.display());
    }
}

#[test]
fn q4_k_m_rules_match_llama_quantizes_files() {
    for path in [common::qwen05_gguf(), common::gemma3_gguf()].into_iter().flatten() {
        rules_match_llama_quantize(&path);
    }
}

fn mean_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f32>() / a.len() as f32
}

#[test]
fn smollm2_round_trips_and_requantizes() {
    let Some(src) = common::smollm2_gguf() else { return };
    let dir = tempfile::tempdir().unwrap();
    let f32_path = dir.path().join("smol-f32.gguf");
    let done = quantize_gguf(&src, &f32_path, FileType::F32).unwrap();
    assert!(done.bytes_out > done.bytes_in);
    let (a, mut ra) = read(&src);
    let (b, mut rb) = read(&f32_path);
    // SmolLM2's file lists its layers as 0, 1, 10, 11, ...; the output is in llama.cpp's order.
    assert_eq!(names(&a), file_order(&b));
    assert_ne!(file_order(&a), file_order(&b));
    for (k, v) in &a.metadata {
        if k != "general.file_type" {
            assert_eq!(format!("{v:?}"), format!("{:?}", b.metadata[k]), "metadata {k}");
        }
    }
    assert!(matches!(b.metadata["general.file_type"], gguf_file::Value::U32(0)));
    for n in names(&a) {
        let x = a.tensor(&mut ra, &n, &Device::Cpu).unwrap().dequantize(&Device::Cpu).unwrap();
        let y = b.tensor(&mut rb, &n, &Device::Cpu).unwrap();
        assert_eq!(type_name(y.dtype()), "F32", "{n}");
        let y = y.dequantize(&Device::Cpu).unwrap();
        assert_eq!(x.dims(), y.dims(), "{n}");
        let (x, y) =
            (x.flatten_all().unwrap().to_vec1::<f32>().unwrap(), y.flatten_all().unwrap().to_vec1::<f32>().unwrap());
        assert_eq!(x, y, "{n}: f32 keeps every value");
    }
    let ours = lmplex_model::load(&f32_path, Some(256)).unwrap();
    let base = lmplex_model::load(&src, Some(256)).unwrap();
    let ids = base.tokenizer.encode("The capital of France is Paris, and the capital of Italy is", false).unwrap();
    assert_eq!(
        ours.tokenizer.encode("The capital of France is Paris, and the capital of Italy is", false).unwrap(),
        ids
    );
    let want = common::prefill_all_logits(&base.model, &ids);
    // Mean |logit diff| over the prompt's positions (logits of size ~20) and how many positions
    // keep their top token; measured: Q8_0 0.24 and 13 of 13, Q4_K_M 0.83 and 12 of 13.
    for (ft, tol, same_top, expect) in [(FileType::Q8_0, 0.4, 13, "Q8_0"), (FileType::Q4KM, 1.2, 11, "Q6_K")] {
        let out = dir.path().join(format!("smol-{ft:?}.gguf"));
        let done = quantize_gguf(&f32_path, &out, ft).unwrap();
        let ffn_down = done.tensors.iter().find(|t| t.name == "blk.0.ffn_down.weight").unwrap();
        assert_eq!(ffn_down.dtype, expect, "{ft:?}: layer 0's ffn_down");
        if ft == FileType::Q4KM {
            // Layers by index, as the current llama-quantize gives them on this file (checked
            // by hand): the first and last eighth of 30 layers and every third between.
            let more: Vec<usize> = (0..30).filter(|&i| !(3..26).contains(&i) || (i as i64 - 3) % 3 == 2).collect();
            assert_eq!(more, [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]);
            for t in &done.tensors {
                let Some(i) = t.name.strip_prefix("blk.").and_then(|r| r.split('.').next()?.parse::<usize>().ok())
                else {
                    continue;
                };
                let want = match (t.name.contains("attn_v."), t.name.contains("ffn_down."), more.contains(&i)) {
                    (true, _, true) => "Q8_0",
                    (true, _, false) => "Q5_0",
                    (_, true, true) => "Q6_K",
                    (_, true, false) => "Q4_K",
                    _ => continue,
                };
                assert_eq!(t.dtype, want, "{}", t.name);
            }
        }
        let m = lmplex_model::load(&out, Some(256)).unwrap();
        assert_eq!(m.info.quantization, if ft == FileType::Q8_0 { "Q8_0" } else { "Q4_K_M" });
        let got = common::prefill_all_logits(&m.model, &ids);
        assert_eq!((want.len(), ids.len()), (got.len(), 13));
        let mean = want.iter().zip(&got).map(|(w, g)| mean_diff(w, g)).sum::<f32>() / want.len() as f32;
        let top = want.iter().zip(&got).filter(|(w, g)| argmax(w) == argmax(g)).count();
        assert!(mean < tol && top >= same_top, "{ft:?}: mean |logit diff| {mean}, top token kept at {top} of 13");
    }
    // A failed write (the target is a folder): an error, and nothing left beside it.
    let blocked = dir.path().join("taken");
    std::fs::create_dir(&blocked).unwrap();
    assert!(quantize_gguf(&f32_path, &blocked, FileType::Q8_0).is_err());
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.iter().all(|n| !n.to_string_lossy().ends_with(".tmp")), "{left:?}");
}

/// Q4_K, Q5_K and Q6_K bytes equal `llama-quantize`'s on the same values (two rows of SmolLM2's
/// `blk.3.ffn_down`, 12 blocks each; `scripts/make_kquant_fixture.py` wrote the fixture).
#[test]
fn k_quants_equal_llama_quantizes_bytes() {
    let Some(src) = common::smollm2_gguf() else { return };
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kquants_smollm2.json"),
    )
    .unwrap();
    let fixture: serde_json::Value = serde_json::from_str(&text).unwrap();
    let (c, mut r) = read(&src);
    let name = fixture["tensor"].as_str().unwrap();
    let t = c.tensor(&mut r, name, &Device::Cpu).unwrap().dequantize(&Device::Cpu).unwrap();
    let row = *t.dims().last().unwrap();
    let rows = fixture["rows"].as_u64().unwrap() as usize;
    let x = &t.flatten_all().unwrap().to_vec1::<f32>().unwrap()[..rows * row];
    let hex = |b: Vec<u8>| b.iter().map(|v| format!("{v:02x}")).collect::<String>();
    for (kind, f) in [
        ("Q4_K", lmplex_model::quantize::quantize_q4_k as fn(&[f32]) -> Vec<u8>),
        ("Q5_K", lmplex_model::quantize::quantize_q5_k),
        ("Q6_K", lmplex_model::quantize::quantize_q6_k),
    ] {
        assert_eq!(hex(f(x)), fixture[kind].as_str().unwrap(), "{kind}");
    }
}

/// The metadata values of `c` as text, by key.
fn metadata(c: &gguf_file::Content) -> std::collections::HashMap<String, String> {
    c.metadata.iter().map(|(k, v)| (k.clone(), format!("{v:?}"))).collect()
}

#[test]
fn hf_folder_quantizes_as_its_gguf() {
    // SmolLM2's tensors are all Q4_1, so every Q4_K_M tensor is made from the same f32 values
    // both ways. Qwen's file is Q4_K_M already: from the GGUF, a tensor whose type does not
    // change keeps its bytes, so only BF16 compares byte for byte there.
    let cases = [
        (common::smollm2_gguf(), &[FileType::Bf16, FileType::Q4KM][..]),
        (common::qwen05_gguf(), &[FileType::Bf16][..]),
    ];
    for (src, types) in cases {
        let Some(src) = src else { continue };
        let dir = tempfile::tempdir().unwrap();
        let hf = dir.path().join("hf");
        lmplex_model::export::gguf_to_hf(&src, &hf, candle_core::DType::F32, usize::MAX).unwrap();
        for &ft in types {
            let (from_gguf, from_hf) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"));
            quantize_gguf(&src, &from_gguf, ft).unwrap();
            quantize_gguf(&hf, &from_hf, ft).unwrap();
            let ((a, mut ra), (b, mut rb)) = (read(&from_gguf), read(&from_hf));
            assert_eq!(names(&a), names(&b), "{ft:?}");
            for n in names(&a) {
                let (x, y) =
                    (a.tensor(&mut ra, &n, &Device::Cpu).unwrap(), b.tensor(&mut rb, &n, &Device::Cpu).unwrap());
                assert_eq!((x.dtype(), x.shape()), (y.dtype(), y.shape()), "{ft:?} {n}");
                assert!(x.data().unwrap() == y.data().unwrap(), "{ft:?} {n}: bytes differ");
            }
            let (ma, mb) = (metadata(&a), metadata(&b));
            for key in [
                "tokenizer.ggml.model",
                "tokenizer.ggml.pre",
                "tokenizer.ggml.tokens",
                "tokenizer.ggml.token_type",
                "tokenizer.ggml.merges",
                "tokenizer.ggml.bos_token_id",
                "tokenizer.ggml.eos_token_id",
                "tokenizer.chat_template",
                "general.architecture",
                "general.file_type",
            ] {
                assert_eq!(ma.get(key), mb.get(key), "{ft:?} {key}");
                assert!(mb.contains_key(key), "{key}");
            }
            // Every key the HF path writes that the source also has agrees with it.
            for (k, v) in &mb {
                if let Some(w) = ma.get(k).filter(|_| k != "general.name") {
                    assert_eq!(v, w, "{ft:?} {k}");
                }
            }
            // And it runs: greedy tokens as from the GGUF-made file.
            let (la, lb) =
                (lmplex_model::load(&from_gguf, Some(64)).unwrap(), lmplex_model::load(&from_hf, Some(64)).unwrap());
            let ids = la.tokenizer.encode("The capital of France is", false).unwrap();
            assert_eq!(common::greedy(&la.model, &ids, 4).0, common::greedy(&lb.model, &ids, 4).0, "{ft:?}");
        }
    }
}
