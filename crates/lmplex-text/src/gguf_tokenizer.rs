//! Builds a `tokenizers::Tokenizer` from GGUF metadata (`tokenizer.ggml.*`), by writing the
//! equivalent `tokenizer.json` and letting the `tokenizers` crate parse it.
//!
//! Invariants: BPE (`gpt2`) vocabularies use byte-level pre-tokenization with the regex that
//! llama.cpp's `tokenizer.ggml.pre` names; SentencePiece (`llama`) vocabularies become a BPE
//! model with byte fallback whose merges follow the pieces' scores (`spm_bpe`), which splits
//! text as llama.cpp's SPM tokenizer and transformers' converted tokenizers do. Control and
//! user-defined tokens are added tokens so they are never split. BOS is not added here: the caller honours `add_bos_token`.

use candle_core::quantized::gguf_file::{Content, Value};
use lmplex_core::{Error, Result};
use serde_json::{json, Value as Json};

const QWEN2_REGEX: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// What the loader needs besides the tokenizer itself.
pub struct GgufTokenizer {
    /// The tokenizer built from `tokenizer.ggml.*` (BPE for `gpt2`, Unigram for `llama`).
    pub tokenizer: tokenizers::Tokenizer,
    /// `tokenizer.ggml.bos_token_id`, if present.
    pub bos_token_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`, if present.
    pub eos_token_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`; if absent, true only for SentencePiece (`llama`) vocabularies.
    pub add_bos_token: bool,
    /// `tokenizer.chat_template`, if present.
    pub chat_template: Option<String>,
}

fn meta<'a>(c: &'a Content, key: &str) -> Option<&'a Value> {
    c.metadata.get(key)
}

fn meta_u32(c: &Content, key: &str) -> Option<u32> {
    meta(c, key).and_then(|v| v.to_u32().ok().or_else(|| v.to_i32().ok().map(|x| x as u32)))
}

fn strings(c: &Content, key: &str) -> Result<Vec<String>> {
    let v = meta(c, key).ok_or_else(|| Error::model_load(format!("GGUF has no '{key}'")))?;
    let arr = v.to_vec().map_err(|_| Error::model_load(format!("GGUF '{key}' is not an array")))?;
    arr.iter()
        .map(|x| x.to_string().cloned().map_err(|_| Error::model_load(format!("GGUF '{key}' holds a non-string"))))
        .collect()
}

/// A numeric metadata value as f64 (0 for anything else). Matched directly: `Value::to_f32`
/// on an integer builds an error with a backtrace, which costs seconds over a 150k-token
/// vocabulary when `RUST_BACKTRACE` is set.
fn number(v: &Value) -> f64 {
    use Value as V;
    match *v {
        V::U8(x) => x.into(),
        V::I8(x) => x.into(),
        V::U16(x) => x.into(),
        V::I16(x) => x.into(),
        V::U32(x) => x.into(),
        V::I32(x) => x.into(),
        V::U64(x) => x as f64,
        V::I64(x) => x as f64,
        V::F32(x) => x.into(),
        V::F64(x) => x,
        _ => 0.0,
    }
}

fn numbers(c: &Content, key: &str) -> Vec<f64> {
    meta(c, key).and_then(|v| v.to_vec().ok()).map(|a| a.iter().map(number).collect()).unwrap_or_default()
}

fn byte_level(add_prefix_space: bool, use_regex: bool) -> Json {
    json!({"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": true, "use_regex": use_regex})
}

fn split(regex: &str) -> Json {
    json!({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false})
}

/// The pre-tokenizer llama.cpp uses for a `tokenizer.ggml.pre` value.
pub fn bpe_pre_tokenizer(pre: &str) -> Json {
    match pre {
        "qwen2" | "deepseek-r1-qwen" => {
            json!({"type": "Sequence", "pretokenizers": [split(QWEN2_REGEX), byte_level(false, false)]})
        }
        "llama3" | "llama-bpe" | "smaug-bpe" => {
            json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_REGEX), byte_level(false, false)]})
        }
        "smollm" | "starcoder" | "refact" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true}, byte_level(false, true)]}),
        _ => byte_level(false, true),
    }
}

/// A SentencePiece vocabulary (`llama`) as the BPE model llama.cpp's SPM tokenizer runs: the
/// adjacent pair whose joined piece scores highest merges first. The merges are every split of
/// every normal piece into two pieces of the vocabulary, ordered by the joined piece's score
/// (ties: by piece, then by the parts' ids), as transformers' `SentencePieceExtractor` builds
/// them. Control, unused and byte pieces join nothing; a repeated piece keeps its first id.
fn spm_bpe(tokens: &[String], scores: &[f64], types: &[f64]) -> (serde_json::Map<String, Json>, Vec<Json>) {
    let mut index: std::collections::HashMap<&str, usize> = std::collections::HashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        index.entry(t.as_str()).or_insert(i);
    }
    let mut found: Vec<(f64, usize, usize, usize)> = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        let ty = types.get(i).copied().unwrap_or(1.0) as i64;
        if matches!(ty, 3 | 5 | 6) || index.get(t.as_str()) != Some(&i) {
            continue;
        }
        let score = scores.get(i).copied().unwrap_or(0.0);
        for (k, _) in t.char_indices().skip(1) {
            if let (Some(&l), Some(&r)) = (index.get(&t[..k]), index.get(&t[k..])) {
                found.push((score, i, l, r));
            }
        }
    }
    found.sort_by(|a, b| b.0.total_cmp(&a.0).then((a.1, a.2, a.3).cmp(&(b.1, b.2, b.3))));
    let merges = found.iter().map(|&(_, _, l, r)| json!([tokens[l], tokens[r]])).collect();
    let vocab = index.iter().map(|(t, &i)| (t.to_string(), json!(i))).collect();
    (vocab, merges)
}

/// The tokenizer and its special-token facts from GGUF metadata (`ModelLoad` error if malformed).
pub fn from_gguf(c: &Content) -> Result<GgufTokenizer> {
    let model = meta(c, "tokenizer.ggml.model")
        .and_then(|v| v.to_string().ok().cloned())
        .ok_or_else(|| Error::model_load("GGUF has no tokenizer (tokenizer.ggml.model is missing)"))?;
    let tokens = strings(c, "tokenizer.ggml.tokens")?;
    let types = numbers(c, "tokenizer.ggml.token_type");
    // 3 = control, 4 = user defined: never split; control tokens are special.
    let added: Vec<Json> = tokens
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            let ty = types.get(i).copied().unwrap_or(1.0) as i64;
            (ty == 3 || ty == 4).then(|| {
                json!({"id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                       "normalized": false, "special": ty == 3})
            })
        })
        .collect();
    let unk = meta_u32(c, "tokenizer.ggml.unknown_token_id");
    let tokenizer_json = match model.as_str() {
        "gpt2" => {
            let merges = strings(c, "tokenizer.ggml.merges")?;
            // tokenizers panics on a merge whose parts or result are not in the vocabulary.
            let known: std::collections::HashSet<&str> = tokens.iter().map(String::as_str).collect();
            for m in &merges {
                let ok = m.split_once(' ').is_some_and(|(a, b)| {
                    known.contains(a) && known.contains(b) && known.contains(format!("{a}{b}").as_str())
                });
                if !ok {
                    return Err(Error::model_load(format!(
                        "GGUF tokenizer merge '{m}' uses tokens not in the vocabulary"
                    )));
                }
            }
            let vocab: serde_json::Map<String, Json> =
                tokens.iter().enumerate().map(|(i, t)| (t.clone(), json!(i))).collect();
            let pre = meta(c, "tokenizer.ggml.pre").and_then(|v| v.to_string().ok().cloned()).unwrap_or_default();
            json!({
                "version": "1.0", "added_tokens": added, "normalizer": null,
                "pre_tokenizer": bpe_pre_tokenizer(&pre), "post_processor": null,
                "decoder": byte_level(true, true),
                "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                          "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                          "ignore_merges": matches!(pre.as_str(), "llama3" | "llama-bpe"),
                          "vocab": vocab, "merges": merges}
            })
        }
        "llama" => {
            let scores = numbers(c, "tokenizer.ggml.scores");
            let add_space = meta(c, "tokenizer.ggml.add_space_prefix").and_then(|v| v.to_bool().ok()).unwrap_or(true);
            let mut normalizers = vec![json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"})];
            let mut decoders = vec![
                json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
                json!({"type": "ByteFallback"}),
                json!({"type": "Fuse"}),
            ];
            if add_space {
                normalizers.insert(0, json!({"type": "Prepend", "prepend": "\u{2581}"}));
                decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
            }
            let (vocab, merges) = spm_bpe(&tokens, &scores, &types);
            json!({
                "version": "1.0", "added_tokens": added,
                "normalizer": {"type": "Sequence", "normalizers": normalizers},
                "pre_tokenizer": null, "post_processor": null,
                "decoder": {"type": "Sequence", "decoders": decoders},
                "model": {"type": "BPE", "dropout": null,
                          "unk_token": unk.and_then(|u| tokens.get(u as usize)).cloned(),
                          "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true,
                          "byte_fallback": true, "ignore_merges": false, "vocab": vocab, "merges": merges}
            })
        }
        other => {
            return Err(Error::model_load(format!(
                "GGUF tokenizer model '{other}' is not supported (expected 'gpt2' or 'llama')"
            )))
        }
    };
    let bytes = tokenizer_json.to_string();
    // Malformed vocabularies can still panic inside `tokenizers`: turn that into an error.
    let built = std::panic::catch_unwind(|| tokenizers::Tokenizer::from_bytes(bytes.as_bytes()))
        .map_err(|_| Error::model_load("the GGUF tokenizer metadata is malformed"))?;
    let tokenizer =
        built.map_err(|e| Error::model_load(format!("cannot build the tokenizer from GGUF metadata: {e}")))?;
    let add_bos_default = model == "llama";
    Ok(GgufTokenizer {
        tokenizer,
        bos_token_id: meta_u32(c, "tokenizer.ggml.bos_token_id"),
        eos_token_id: meta_u32(c, "tokenizer.ggml.eos_token_id"),
        add_bos_token: meta(c, "tokenizer.ggml.add_bos_token")
            .and_then(|v| v.to_bool().ok())
            .unwrap_or(add_bos_default),
        chat_template: meta(c, "tokenizer.chat_template").and_then(|v| v.to_string().ok().cloned()),
    })
}
