//! Opening a checkpoint: a `.gguf` file or a Hugging Face folder, into its `ModelArgs`,
//! `WeightSource` and `Tokenizer` (`open`), and from there into the CPU backend's `Model`
//! (`load`); the CUDA backend builds its own model from the same `Checkpoint`.
//!
//! Invariants: every problem with the files (missing, truncated, corrupt, unknown architecture,
//! unsupported tensor type) is a `ModelLoad` error naming the path; nothing here panics on bad
//! bytes. `max_positions` never exceeds the checkpoint's trained context.

use crate::args::{gguf_args, token_ids, Arch, LongRope, ModelArgs, RopeScaling};
use crate::kv::KvDtype;
use crate::model::Model;
use crate::tokenizer::Tokenizer;
use crate::weights::{Packed, PackedMethod, WeightSource};
use candle_core::quantized::gguf_file;
use lmplex_core::{DType, Error, Result};
use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::path::{Path, PathBuf};

/// What a checkpoint says of itself, for `info()`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CheckpointInfo {
    /// `gguf` or `safetensors`.
    pub format: &'static str,
    /// The GGUF file type (`Q4_K_M`, ...), or `none` for a safetensors folder.
    pub quantization: String,
    /// The model's own name (GGUF `general.name`), if it has one.
    pub name: Option<String>,
}

/// What `load` gives back.
pub struct LoadedModel {
    /// The model, weights loaded into the CPU backend.
    pub model: Model,
    /// The checkpoint's tokenizer (from `tokenizer.json` or the GGUF vocabulary).
    pub tokenizer: Tokenizer,
    /// Facts for `info()`.
    pub info: CheckpointInfo,
    /// The KV element type for `auto` (`auto_kv_dtype`).
    pub kv_dtype: KvDtype,
}

/// An opened checkpoint: shapes, tokenizer and a source of weights, nothing loaded yet.
pub struct Checkpoint {
    /// The architecture, from `config.json` or GGUF metadata.
    pub args: ModelArgs,
    /// Where the weights are read from, by HF tensor name.
    pub src: WeightSource,
    /// The checkpoint's tokenizer (from `tokenizer.json` or the GGUF vocabulary).
    pub tokenizer: Tokenizer,
    /// `max_model_len` as resolved against the checkpoint's context length.
    pub max_positions: usize,
    /// Facts for `info()`.
    pub info: CheckpointInfo,
    /// The KV element type for `auto` (`auto_kv_dtype`).
    pub kv_dtype: KvDtype,
}

impl Checkpoint {
    /// Loads the weights into the CPU backend's `Model`.
    pub fn into_cpu(self) -> Result<LoadedModel> {
        let model = Model::load(self.args, &self.src, self.max_positions)?;
        Ok(LoadedModel { model, tokenizer: self.tokenizer, info: self.info, kv_dtype: self.kv_dtype })
    }
}

/// The CPU KV element type `kv_cache_dtype=auto` gives a checkpoint: f32 when its weights are
/// all f32 (`all_f32`), else f16 (a 16-bit or quantized checkpoint stores nothing finer, and
/// f16 K/V is llama.cpp's default; vLLM's `auto` is the model's dtype).
pub fn auto_kv_dtype(all_f32: bool) -> KvDtype {
    if all_f32 {
        KvDtype::F32
    } else {
        KvDtype::F16
    }
}

/// What a checkpoint will need, read from its headers without loading any weights (for memory
/// budgets checked before a load).
#[derive(Debug, Clone)]
pub struct ModelPlan {
    /// The architecture, from `config.json` or GGUF metadata.
    pub args: ModelArgs,
    /// `max_model_len` as `load` would set it.
    pub max_positions: usize,
    /// Bytes the weights take once loaded: GGUF tensors as stored; safetensors matrices in
    /// their own element type (bf16, f16 or f32; others as f32) or in the `dtype` asked for,
    /// vectors as f32.
    pub weight_bytes: usize,
    /// The KV element type for `auto` (`auto_kv_dtype`).
    pub kv_dtype: KvDtype,
}

/// Reads a checkpoint's headers (GGUF metadata, or `config.json` and safetensors sizes) and
/// says what loading it with dense matrices stored as `dtype` (`WeightSource::set_dtype`)
/// would take; the same errors as `load` for a bad path or header.
pub fn plan(path: &Path, max_model_len: Option<usize>, dtype: DType) -> Result<ModelPlan> {
    if !path.exists() {
        return Err(err(path, "no such file or folder"));
    }
    if path.is_dir() {
        let cfg_path = path.join("config.json");
        let cfg = std::fs::read_to_string(&cfg_path).map_err(|_| err(path, "missing config.json"))?;
        let args = ModelArgs::from_hf_config(&cfg).map_err(|e| err(&cfg_path, e))?;
        let (mut weight_bytes, mut all_f32) = (0usize, true);
        let packed = packed_config(&cfg).map_err(|e| err(&cfg_path, e))?;
        for f in safetensors_files(path)? {
            let (n, f32s) = safetensors_loaded_bytes(&f, dtype, packed)?;
            weight_bytes += n;
            all_f32 &= f32s;
        }
        let max_positions = positions(path, &args, max_model_len)?;
        return Ok(ModelPlan { args, max_positions, weight_bytes, kv_dtype: auto_kv_dtype(all_f32) });
    }
    let (content, _) = open_gguf(path)?;
    let args = gguf_args(&content, path, None)?;
    let file = std::fs::metadata(path).map_err(|e| err(path, e))?.len() as usize;
    let max_positions = positions(path, &args, max_model_len)?;
    Ok(ModelPlan {
        args,
        max_positions,
        weight_bytes: file.saturating_sub(content.tensor_data_offset as usize),
        kv_dtype: auto_kv_dtype(gguf_file_type(&content) == Some(0)),
    })
}

/// The weights of the checkpoint at `path` (whose shapes `plan` read as `args`), from the
/// headers only: no tokenizer, no tensor data read. A backend's memory plan asks it how each
/// tensor is stored (`WeightSource::quantized_type`).
pub fn weight_source(path: &Path, args: &ModelArgs) -> Result<WeightSource> {
    if path.is_dir() {
        let cfg = std::fs::read_to_string(path.join("config.json")).map_err(|_| err(path, "missing config.json"))?;
        let packed = packed_config(&cfg).map_err(|e| err(path, e))?;
        let src = WeightSource::safetensors(path, &safetensors_files(path)?)?;
        return Ok(src.with_packed(packed).with_text_prefix(args.text_prefix));
    }
    let (content, _) = open_gguf(path)?;
    WeightSource::gguf(path, content, args.arch)
}

/// GGUF's `general.file_type` (0: every tensor f32).
fn gguf_file_type(content: &gguf_file::Content) -> Option<u32> {
    content.metadata.get("general.file_type").and_then(|v| v.to_u32().ok())
}

/// Bytes a safetensors file's tensors take once loaded with matrices stored as `dtype`, and
/// whether every tensor is F32, from its JSON header alone. `packed`: an AWQ/GPTQ folder's
/// layout, whose projections are held as Q4_1 blocks where `Packed::holds_q4_1` says so, else as
/// dense matrices (f32 unless `dtype` says otherwise), and whose zeros, scales and group indices
/// are not kept.
fn safetensors_loaded_bytes(path: &Path, dtype: DType, packed: Option<Packed>) -> Result<(usize, bool)> {
    let mut f = File::open(path).map_err(|e| err(path, e))?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).map_err(|e| err(path, format!("truncated safetensors header: {e}")))?;
    let len = u64::from_le_bytes(len) as usize;
    if len > 100 << 20 {
        return Err(err(path, "safetensors header larger than 100 MB"));
    }
    let mut header = vec![0u8; len];
    f.read_exact(&mut header).map_err(|e| err(path, format!("truncated safetensors header: {e}")))?;
    let v: serde_json::Value =
        serde_json::from_slice(&header).map_err(|e| err(path, format!("bad safetensors header: {e}")))?;
    let tensors = v.as_object().ok_or_else(|| err(path, "safetensors header is not an object"))?;
    let tensors = tensors.iter().filter(|(k, _)| *k != "__metadata__");
    // Matrices keep a 16-bit element type or take `dtype`'s; everything else is held as f32
    // (`weights`).
    let bytes = tensors
        .clone()
        .filter_map(|(name, t)| {
            let shape = t.get("shape")?.as_array()?;
            let numel = shape.iter().filter_map(|d| d.as_u64()).product::<u64>();
            if let Some(p) = packed {
                if name.ends_with(".qweight") {
                    let values = numel * p.pack() as u64;
                    let rows = shape.first()?.as_u64()? as usize;
                    let inputs = if p.method == PackedMethod::Awq { rows } else { rows * p.pack() };
                    if p.holds_q4_1(inputs) {
                        return Some(values / 32 * 20);
                    }
                    return Some(values * if matches!(dtype, DType::BF16 | DType::F16) { 2 } else { 4 });
                }
                if [".qzeros", ".scales", ".g_idx"].iter().any(|s| name.ends_with(s)) {
                    return Some(0);
                }
            }
            let half = match dtype {
                _ if shape.len() < 2 => false,
                DType::Auto => matches!(t.get("dtype")?.as_str()?, "BF16" | "F16"),
                DType::BF16 | DType::F16 => true,
                DType::F32 => false,
            };
            Some(numel * if half { 2 } else { 4 })
        })
        .sum::<u64>() as usize;
    let all_f32 = tensors.clone().all(|(_, t)| t.get("dtype").and_then(|d| d.as_str()) == Some("F32"));
    Ok((bytes, all_f32))
}

fn err(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::model_load(format!("{}: {what}", path.display()))
}

/// Loads `path` on the CPU backend with rope tables for at most `max_model_len` positions
/// (`None`: the checkpoint's context length).
pub fn load(path: &Path, max_model_len: Option<usize>) -> Result<LoadedModel> {
    open(path, max_model_len)?.into_cpu().map_err(|e| named(path, e))
}

/// Opens `path` (headers, tokenizer, weight index) without loading any weights. A load error
/// names the checkpoint.
pub fn open(path: &Path, max_model_len: Option<usize>) -> Result<Checkpoint> {
    if !path.exists() {
        return Err(err(path, "no such file or folder"));
    }
    let opened =
        if path.is_dir() { open_hf_dir(path, max_model_len) } else { open_gguf_checkpoint(path, max_model_len) };
    opened.map_err(|e| named(path, e))
}

/// `e`, its message starting with the checkpoint's path when it does not name it yet.
fn named(path: &Path, e: Error) -> Error {
    let shown = path.display().to_string();
    match e {
        Error::ModelLoad(m) if !m.contains(&shown) => err(path, m),
        e => e,
    }
}

fn positions(path: &Path, args: &ModelArgs, max_model_len: Option<usize>) -> Result<usize> {
    match max_model_len {
        None => Ok(args.max_position_embeddings),
        Some(n) if n <= args.max_position_embeddings => Ok(n),
        Some(n) => Err(err(
            path,
            format!("max_model_len {n} exceeds the model's context length {}", args.max_position_embeddings),
        )),
    }
}

/// Reads a GGUF header (magic checked first, architecture named before anything else fails)
/// and returns it with the open reader.
pub(crate) fn open_gguf(path: &Path) -> Result<(gguf_file::Content, BufReader<File>)> {
    let (content, reader) = read_gguf_header(path)?;
    if let Some(arch) = content.metadata.get("general.architecture").and_then(|v| v.to_string().ok()) {
        Arch::from_name(arch).map_err(|e| err(path, e))?;
    }
    Ok((content, reader))
}

/// Reads a GGUF header (magic checked first) of any architecture, a multimodal projector's too.
pub(crate) fn read_gguf_header(path: &Path) -> Result<(gguf_file::Content, BufReader<File>)> {
    let mut reader = BufReader::new(File::open(path).map_err(|e| err(path, e))?);
    let mut magic = [0u8; 4];
    if reader.read_exact(&mut magic).is_err() || &magic != b"GGUF" {
        return Err(err(path, "not a GGUF file (bad magic bytes)"));
    }
    reader.seek(std::io::SeekFrom::Start(0)).map_err(|e| err(path, e))?;
    let content = gguf_file::Content::read(&mut reader)
        .map_err(|e| err(path, format!("corrupt or truncated GGUF header: {e}")))?;
    Ok((content, reader))
}

fn open_gguf_checkpoint(path: &Path, max_model_len: Option<usize>) -> Result<Checkpoint> {
    let (content, _) = open_gguf(path)?;
    let mut g = crate::gguf_tokenizer::from_gguf(&content).map_err(|e| err(path, e))?;
    let arch = content.metadata.get("general.architecture").and_then(|v| v.to_string().ok());
    if g.chat_template.is_none() && arch.is_some_and(|a| Arch::from_name(a).is_ok_and(Arch::is_gemma)) {
        // Gemma GGUFs converted from base checkpoints carry no template; Gemma's own is the one.
        g.chat_template = Some(crate::chat::GEMMA_CHAT_TEMPLATE.to_string());
    }
    let tokenizer = Tokenizer::from_gguf(g, &[])?;
    let mut args = gguf_args(&content, path, Some(&tokenizer))?;
    let file_type = gguf_file_type(&content);
    let info = CheckpointInfo {
        format: "gguf",
        quantization: gguf_file_type_name(file_type).into(),
        name: content.metadata.get("general.name").and_then(|v| v.to_string().ok()).cloned(),
    };
    let max_positions = positions(path, &args, max_model_len)?;
    let longrope = gguf_longrope(&content, &args);
    let src = WeightSource::gguf(path, content, args.arch)?;
    if let Some((original, attention_factor)) = longrope {
        // Phi-3 128k GGUFs keep LongRoPE's factors as tensors.
        args.rope.scaling = RopeScaling::LongRope(LongRope {
            short_factor: src.vector("rope_factors_short.weight")?,
            long_factor: src.vector("rope_factors_long.weight")?,
            original_max_position_embeddings: original,
            attention_factor,
        });
        args.validate().map_err(|e| err(path, e))?;
    }
    let kv_dtype = auto_kv_dtype(file_type == Some(0));
    Ok(Checkpoint { args, src, tokenizer, max_positions, info, kv_dtype })
}

/// LongRoPE's original context and attention factor when the GGUF stores the factor tensors
/// (`rope_factors_long.weight`): from `rope.scaling.original_context_length` and
/// `rope.scaling.attn_factor`, the factor defaulting as in transformers.
fn gguf_longrope(c: &gguf_file::Content, args: &ModelArgs) -> Option<(usize, f32)> {
    if !c.tensor_infos.contains_key("rope_factors_long.weight") {
        return None;
    }
    let key = |k: &str| c.metadata.get(&format!("{}.rope.scaling.{k}", args.arch.name()));
    let original = key("original_context_length").and_then(|v| v.to_u32().ok()).map_or(4096, |v| v as usize);
    let factor = args.max_position_embeddings as f64 / original as f64;
    let default = if factor <= 1.0 { 1.0 } else { (1.0 + factor.ln() / (original as f64).ln()).sqrt() as f32 };
    Some((original, key("attn_factor").and_then(|v| v.to_f32().ok()).unwrap_or(default)))
}

/// llama.cpp's `LLAMA_FTYPE_*` names.
fn gguf_file_type_name(t: Option<u32>) -> &'static str {
    match t {
        Some(0) => "F32",
        Some(1) => "F16",
        Some(2) => "Q4_0",
        Some(3) => "Q4_1",
        Some(7) => "Q8_0",
        Some(8) => "Q5_0",
        Some(9) => "Q5_1",
        Some(10) => "Q2_K",
        Some(11..=13) => "Q3_K",
        Some(14) => "Q4_K_S",
        Some(15) => "Q4_K_M",
        Some(16) => "Q5_K_S",
        Some(17) => "Q5_K_M",
        Some(18) => "Q6_K",
        Some(32) => "BF16",
        _ => "unknown",
    }
}

/// The safetensors shards of an HF folder: from the index when there is one.
fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(|e| err(&index, e))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| err(&index, format!("invalid JSON: {e}")))?;
        let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| err(&index, "no weight_map"))?;
        let mut files: Vec<String> = map.values().filter_map(|f| f.as_str().map(str::to_string)).collect();
        files.sort();
        files.dedup();
        let files: Vec<PathBuf> = files.into_iter().map(|f| dir.join(f)).collect();
        if let Some(missing) = files.iter().find(|f| !f.exists()) {
            return Err(err(missing, "shard listed in model.safetensors.index.json is missing"));
        }
        return Ok(files);
    }
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    Err(err(dir, "no model.safetensors or model.safetensors.index.json"))
}

fn open_hf_dir(dir: &Path, max_model_len: Option<usize>) -> Result<Checkpoint> {
    let cfg_path = dir.join("config.json");
    let cfg = std::fs::read_to_string(&cfg_path).map_err(|_| err(dir, "missing config.json"))?;
    let mut args = ModelArgs::from_hf_config(&cfg).map_err(|e| err(&cfg_path, e))?;
    // generation_config.json's eos ids take precedence (Llama-3 lists several there).
    if let Ok(g) = std::fs::read_to_string(dir.join("generation_config.json")) {
        let v: serde_json::Value =
            serde_json::from_str(&g).map_err(|e| err(dir, format!("generation_config.json: {e}")))?;
        let eos = token_ids(&v.get("eos_token_id").cloned());
        if !eos.is_empty() {
            args.eos_token_ids = eos;
        }
    }
    let tokenizer = Tokenizer::from_hf_dir(dir, &args.eos_token_ids, args.bos_token_id)?;
    args.eos_token_ids = tokenizer.eos_token_ids.clone();
    let files = safetensors_files(dir)?;
    let packed = packed_config(&cfg).map_err(|e| err(&cfg_path, e))?;
    let quantization = match packed.map(|p| p.method) {
        None => "none",
        Some(PackedMethod::Awq) => "awq",
        Some(PackedMethod::Gptq { .. }) => "gptq",
    };
    let info = CheckpointInfo { format: "safetensors", quantization: quantization.into(), name: None };
    let max_positions = positions(dir, &args, max_model_len)?;
    let src = WeightSource::safetensors(dir, &files)?.with_packed(packed).with_text_prefix(args.text_prefix);
    let kv_dtype = auto_kv_dtype(src.all_f32());
    Ok(Checkpoint { args, src, tokenizer, max_positions, info, kv_dtype })
}

/// The AWQ/GPTQ layout `config.json` names (`quantization_config`), if any.
fn packed_config(cfg: &str) -> Result<Option<Packed>> {
    let v: serde_json::Value = serde_json::from_str(cfg).map_err(|e| Error::model_load(e.to_string()))?;
    Packed::from_config(&v)
}
