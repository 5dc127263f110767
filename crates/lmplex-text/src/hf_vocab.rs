//! A Hugging Face tokenizer folder as llama.cpp's GGUF tokenizer metadata (`tokenizer.ggml.*`),
//! as convert_hf_to_gguf.py writes it for byte-level BPE vocabularies (its `_set_vocab_gpt2`
//! and gguf-py's `SpecialVocab`): the inverse of `gguf_tokenizer`.
//!
//! Invariants:
//! - `tokens` has exactly `vocab_size` entries (the model's embedding rows): ids the tokenizer
//!   lacks are `[PAD{id}]` of type UNUSED; added tokens are CONTROL when special or when they
//!   look special (`looks_special`: `<|...|>` and the like, as convert_hf_to_gguf.py decides),
//!   else USER_DEFINED; the rest NORMAL.
//! - `tokenizer.ggml.pre` names llama.cpp's pre-tokenizer: found as convert_hf_to_gguf.py finds
//!   it (the sha256 of the ids of its check text, for the names lmplex reads back), else from a
//!   pre-tokenizer identical to one `gguf_tokenizer` builds; otherwise the folder is refused,
//!   since llama.cpp would split the text another way.
//! - Special ids come from tokenizer_config.json's token strings, then config.json's ids;
//!   `add_bos_token` from tokenizer_config.json, else from a post-processor that starts with
//!   the BOS; the chat template from tokenizer_config.json, chat_template.jinja or chat_template.json.

use crate::gguf_tokenizer::bpe_pre_tokenizer;
use candle_core::quantized::gguf_file::Value;
use lmplex_core::{Error, Result};
use serde_json::Value as Json;
use std::collections::HashMap;
use std::path::Path;

/// convert_hf_to_gguf.py's check text (`get_vocab_base_pre`'s `chktxt`).
const CHECK_TEXT: &str = "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n\u{1f680} (normal) \u{1f636}\u{200d}\u{1f32b}\u{fe0f} (multiple emojis concatenated) \u{2705} \u{1f999}\u{1f999} 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 \u{1780}\u{17b6}\u{1793}\u{17cb}\u{178f}\u{17c2}\u{1796}\u{17b7}\u{179f}\u{17c1}\u{179f}\u{17a2}\u{17b6}\u{1785}\u{1f601} ?\u{6211}\u{60f3}\u{5728}apple\u{5de5}\u{4f5c}1314151\u{5929}\u{ff5e} ------======= \u{43d}\u{435}\u{449}\u{43e} \u{43d}\u{430} \u{411}\u{44a}\u{43b}\u{433}\u{430}\u{440}\u{441}\u{43a}\u{438} ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL";

/// `sha256(str(ids))` of the check text -> llama.cpp's pre-tokenizer name, for the names
/// `gguf_tokenizer` reads (from convert_hf_to_gguf.py's table).
const PRE_HASHES: [(&str, &str); 10] = [
    ("0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5", "llama-bpe"),
    ("c136ed14d01c2745d4f60a9596ae66800e2b61fa45643e72436041855ad4089d", "smaug-bpe"),
    ("e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea", "qwen2"),
    ("d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c", "qwen2"),
    ("b3f499bb4255f8ca19fccd664443283318f2fd2414d5e0b040fbdd0cc195d6c5", "deepseek-r1-qwen"),
    ("855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249", "smollm"),
    ("35d91631860c815f952d711435f48d356ebac988362536bed955d43bfa436e34", "starcoder"),
    ("6221ad2852e85ce96f791f476e0b390cf9b474c9e3d1362f53a24a06dc8220ff", "refact"),
    ("3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454", "gpt-2"),
    ("0fe1cf6eda062318a1af7270f3331a85c539a01778ff948e24388e949c5282f4", "gpt-2"),
];

/// llama.cpp's token types.
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

/// convert_hf_to_gguf.py's `does_token_look_special`: added tokens some models leave
/// `special: false` that llama.cpp must still treat as control tokens (Qwen2.5's `<|fim_prefix|>`).
fn looks_special(t: &str) -> bool {
    matches!(t, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (t.starts_with("<|") && t.ends_with("|>"))
        || (t.starts_with("<\u{ff5c}") && t.ends_with("\u{ff5c}>"))
        || (t.starts_with("<unused") && t.ends_with('>'))
}

fn load_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::model_load(format!("{}: {e}", path.display()))
}

fn read_json(path: &Path) -> Result<Option<Json>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|e| load_err(path, e))?;
    serde_json::from_str(&text).map(Some).map_err(|e| load_err(path, e))
}

/// The python `str()` of a list of ints: `[1, 2, 3]`.
fn py_list(ids: &[u32]) -> String {
    let items: Vec<String> = ids.iter().map(u32::to_string).collect();
    format!("[{}]", items.join(", "))
}

/// llama.cpp's name for the folder's pre-tokenizer (module docs).
fn pre_name(dir: &Path, json: &Json) -> Result<String> {
    use sha2::{Digest, Sha256};
    let path = dir.join("tokenizer.json");
    let tok = tokenizers::Tokenizer::from_file(&path).map_err(|e| load_err(&path, e))?;
    // A vocabulary that cannot encode the check text has no hash; the structure may still tell.
    let hash: String = match tok.encode(CHECK_TEXT, true) {
        Ok(enc) => Sha256::digest(py_list(enc.get_ids()).as_bytes()).iter().map(|b| format!("{b:02x}")).collect(),
        Err(_) => "none".into(),
    };
    if let Some((_, name)) = PRE_HASHES.iter().find(|(h, _)| *h == hash) {
        return Ok((*name).to_string());
    }
    let pre = json.get("pre_tokenizer").cloned().unwrap_or(Json::Null);
    for name in ["qwen2", "llama-bpe", "smollm", "gpt-2"] {
        if bpe_pre_tokenizer(name) == pre {
            return Ok(name.to_string());
        }
    }
    Err(Error::invalid(format!(
        "{}: the pre-tokenizer is not one llama.cpp has a name for that lmplex knows (check-text hash {hash});          supported: llama-bpe, qwen2, smollm, starcoder, refact, gpt-2",
        path.display()
    )))
}

/// A merge in llama.cpp's form: `"a b"`, spaces inside a part as U+0120 (gguf-py's rule).
fn merge(m: &Json) -> Option<String> {
    match m {
        Json::String(s) => Some(s.clone()),
        Json::Array(p) if p.len() == 2 => {
            let part = |v: &Json| v.as_str().map(|s| s.replace(' ', "\u{120}"));
            Some(format!("{} {}", part(&p[0])?, part(&p[1])?))
        }
        _ => None,
    }
}

/// A token string of tokenizer_config.json (`"<s>"` or `{"content": "<s>", ...}`).
fn token_str(v: Option<&Json>) -> Option<&str> {
    match v? {
        Json::String(s) => Some(s),
        Json::Object(o) => o.get("content")?.as_str(),
        _ => None,
    }
}

/// The GGUF metadata of the tokenizer in `dir` for a model of `vocab_size` embedding rows.
pub fn gguf_metadata(dir: &Path, vocab_size: usize) -> Result<Vec<(String, Value)>> {
    let path = dir.join("tokenizer.json");
    let json = read_json(&path)?.ok_or_else(|| load_err(dir, "no tokenizer.json"))?;
    let model = &json["model"];
    if model["type"] != "BPE" || model["byte_fallback"] == true {
        return Err(Error::invalid(format!(
            "{}: only byte-level BPE tokenizers (Llama 3, Qwen, SmolLM, GPT-2 style) can be written to a GGUF yet",
            path.display()
        )));
    }
    let mut by_id: HashMap<u64, (String, i32)> = HashMap::new();
    for (tok, id) in model["vocab"].as_object().into_iter().flatten() {
        if let Some(id) = id.as_u64() {
            // A `[PAD{id}]` filler (a GGUF's own, kept by `lmplex models export`) stays UNUSED.
            let ty = if *tok == format!("[PAD{id}]") { UNUSED } else { NORMAL };
            by_id.insert(id, (tok.clone(), ty));
        }
    }
    for a in json["added_tokens"].as_array().into_iter().flatten() {
        if let (Some(id), Some(content)) = (a["id"].as_u64(), a["content"].as_str()) {
            let ty = if a["special"] == true || looks_special(content) { CONTROL } else { USER_DEFINED };
            by_id.insert(id, (content.to_string(), ty));
        }
    }
    if let Some(id) = by_id.keys().find(|&&id| id as usize >= vocab_size) {
        return Err(load_err(&path, format!("token id {id} is past the model's {vocab_size} embedding rows")));
    }
    let (mut tokens, mut types) = (Vec::with_capacity(vocab_size), Vec::with_capacity(vocab_size));
    for i in 0..vocab_size as u64 {
        let (t, ty) = by_id.get(&i).cloned().unwrap_or_else(|| (format!("[PAD{i}]"), UNUSED));
        tokens.push(Value::String(t));
        types.push(Value::I32(ty));
    }
    let merges: Vec<Value> = model["merges"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| merge(m).map(Value::String).ok_or_else(|| load_err(&path, format!("malformed merge {m}"))))
        .collect::<Result<_>>()?;
    let mut md = vec![
        ("tokenizer.ggml.model".to_string(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".to_string(), Value::String(pre_name(dir, &json)?)),
        ("tokenizer.ggml.tokens".to_string(), Value::Array(tokens)),
        ("tokenizer.ggml.token_type".to_string(), Value::Array(types)),
        ("tokenizer.ggml.merges".to_string(), Value::Array(merges)),
    ];
    // Special tokens: tokenizer_config.json's strings, then config.json's ids.
    let cfg = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Json::Null);
    let model_cfg = read_json(&dir.join("config.json"))?.unwrap_or(Json::Null);
    let id_of: HashMap<&str, u64> = by_id.iter().map(|(id, (t, _))| (t.as_str(), *id)).collect();
    let mut bos = None;
    for (typ, key) in [
        ("bos", "bos_token"),
        ("eos", "eos_token"),
        ("unknown", "unk_token"),
        ("seperator", "sep_token"),
        ("padding", "pad_token"),
    ] {
        let short = key.trim_end_matches("_token");
        let id = token_str(cfg.get(key))
            .and_then(|s| id_of.get(s).copied())
            .or_else(|| model_cfg.get(format!("{short}_token_id")).and_then(Json::as_u64));
        if let Some(id) = id.filter(|&id| (id as usize) < vocab_size) {
            if typ == "bos" {
                bos = token_str(cfg.get(key)).map(str::to_string).or_else(|| by_id.get(&id).map(|t| t.0.clone()));
            }
            md.push((format!("tokenizer.ggml.{typ}_token_id"), Value::U32(id as u32)));
        }
    }
    let starts_with_bos =
        json["post_processor"]["single"][0]["SpecialToken"]["id"].as_str().is_some_and(|f| Some(f) == bos.as_deref())
            || json["post_processor"]["processors"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|p| p["single"][0]["SpecialToken"]["id"].as_str().is_some_and(|f| Some(f) == bos.as_deref()));
    match cfg.get("add_bos_token").and_then(Json::as_bool) {
        Some(b) => md.push(("tokenizer.ggml.add_bos_token".into(), Value::Bool(b))),
        None if starts_with_bos => md.push(("tokenizer.ggml.add_bos_token".into(), Value::Bool(true))),
        None => {}
    }
    if let Some(b) = cfg.get("add_eos_token").and_then(Json::as_bool) {
        md.push(("tokenizer.ggml.add_eos_token".into(), Value::Bool(b)));
    }
    let template = crate::chat::folder_template(&cfg, dir);
    if let Some(t) = template {
        md.push(("tokenizer.chat_template".into(), Value::String(t)));
    }
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte-level BPE folder with added tokens of each kind: special, special-looking but
    /// `special: false` (Qwen2.5's FIM tokens), and plain; ids past the vocabulary padded.
    #[test]
    fn token_types_follow_convert_hf_to_gguf() {
        let dir = std::env::temp_dir().join(format!("lmplex-hf-vocab-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let vocab: serde_json::Map<String, Json> =
            ["a", "b", "ab"].iter().enumerate().map(|(i, t)| (t.to_string(), serde_json::json!(i))).collect();
        let tok = serde_json::json!({
            "version": "1.0", "normalizer": null, "post_processor": null,
            "pre_tokenizer": bpe_pre_tokenizer("gpt-2"),
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "added_tokens": [
                {"id": 3, "content": "<|im_start|>", "special": true, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false},
                {"id": 4, "content": "<|fim_prefix|>", "special": false, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false},
                {"id": 5, "content": "<tool_call>", "special": false, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false}
            ],
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                      "vocab": vocab, "merges": [["a", "b"]]}
        });
        std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
        std::fs::write(
            dir.join("tokenizer_config.json"),
            r#"{"eos_token": "<|im_start|>", "chat_template": "{{ x }}"}"#,
        )
        .unwrap();
        let md = gguf_metadata(&dir, 8).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let get = |k: &str| md.iter().find(|(key, _)| key == k).map(|(_, v)| format!("{v:?}")).unwrap();
        assert_eq!(
            get("tokenizer.ggml.token_type"),
            format!("{:?}", Value::Array([1, 1, 1, 3, 3, 4, 5, 5].map(Value::I32).to_vec()))
        );
        assert!(get("tokenizer.ggml.tokens").contains("[PAD7]"));
        assert_eq!(get("tokenizer.ggml.merges"), format!("{:?}", Value::Array(vec![Value::String("a b".into())])));
        assert_eq!(get("tokenizer.ggml.pre"), format!("{:?}", Value::String("gpt-2".into())));
        assert_eq!(get("tokenizer.ggml.eos_token_id"), format!("{:?}", Value::U32(3)));
        assert_eq!(get("tokenizer.chat_template"), format!("{:?}", Value::String("{{ x }}".into())));
    }
}
