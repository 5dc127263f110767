//! `lmplex quantize`: a GGUF checkpoint (any type lmplex reads) rewritten as a GGUF of another
//! file type, as `llama-quantize` does: the same metadata (tokenizer and chat template included)
//! with `general.file_type` set, and each tensor dequantized to f32 and quantized to the type
//! llama.cpp's rules give it (`mix`). A Hugging Face folder is read as convert_hf_to_gguf.py
//! would write it first (`hf`), then quantized the same way.
//!
//! Invariants:
//! - Blocks are ggml's layouts. Q4_K, Q5_K and Q6_K are made by ggml's current reference
//!   quantizers (`kquants`; candle's own k-quant encoders follow an older ggml and measured
//!   worse); Q8_0, Q4_0, Q5_0 and Q5_1 by candle's ports of ggml's reference quantizers, and
//!   f16/bf16 by its conversions. Tensors keep their names and are written in
//!   llama.cpp's order (`llama_order`: by layer, then name), as `llama-quantize` writes them.
//! - `out` is never left half-written: the file is written beside it under a temporary name and
//!   renamed over `out` only once complete; a failure removes the temporary file.
//!
//! Cost: the quantized model is held in memory until it is written (candle's GGUF writer takes
//! every tensor at once), plus one dequantized tensor at a time.

mod hf;
mod kquants;
mod mix;

pub use kquants::{quantize_q4_k, quantize_q5_k, quantize_q6_k};
pub use mix::{plan, FileType, TensorDesc};

use crate::loader::open_gguf;
use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::Device;
use lmplex_core::{Error, Result};
use std::path::{Path, PathBuf};

/// One tensor of the output: its name, type and bytes.
#[derive(Debug, Clone)]
pub struct QuantizedTensor {
    /// GGUF name.
    pub name: String,
    /// ggml's type name (`Q4_K`, `F32`, ...).
    pub dtype: String,
    /// Bytes of its data.
    pub bytes: usize,
}

/// What `quantize_gguf` wrote.
#[derive(Debug, Clone)]
pub struct Quantized {
    /// Every tensor written, in file order.
    pub tensors: Vec<QuantizedTensor>,
    /// Bytes of tensor data read.
    pub bytes_in: usize,
    /// Bytes of tensor data written.
    pub bytes_out: usize,
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::model_load(format!("{}: {e}", path.display()))
}

/// ggml's name of a type (`Q4_K`, `F16`, ...).
pub fn type_name(t: GgmlDType) -> &'static str {
    match t {
        GgmlDType::F32 => "F32",
        GgmlDType::F16 => "F16",
        GgmlDType::BF16 => "BF16",
        GgmlDType::Q4_0 => "Q4_0",
        GgmlDType::Q4_1 => "Q4_1",
        GgmlDType::Q5_0 => "Q5_0",
        GgmlDType::Q5_1 => "Q5_1",
        GgmlDType::Q8_0 => "Q8_0",
        GgmlDType::Q8_1 => "Q8_1",
        GgmlDType::Q2K => "Q2_K",
        GgmlDType::Q3K => "Q3_K",
        GgmlDType::Q4K => "Q4_K",
        GgmlDType::Q5K => "Q5_K",
        GgmlDType::Q6K => "Q6_K",
        GgmlDType::Q8K => "Q8_K",
    }
}

/// `x` (rows of the tensor's last dimension, `dims` in candle's order) quantized to `t`.
fn quantize_tensor(x: Vec<f32>, dims: &[usize], t: GgmlDType) -> candle_core::Result<QTensor> {
    let raw = match t {
        GgmlDType::Q4K => quantize_q4_k(&x),
        GgmlDType::Q5K => quantize_q5_k(&x),
        GgmlDType::Q6K => quantize_q6_k(&x),
        _ => return QTensor::quantize(&candle_core::Tensor::from_vec(x, dims, &Device::Cpu)?, t),
    };
    candle_core::quantized::ggml_file::qtensor_from_ggml(t, &raw, dims.to_vec(), &Device::Cpu)
}

/// llama.cpp's tensor order (`weight_name_comparer`): by layer (`blk.N.`; other tensors first),
/// then by name. The type rules count layers in this order, and the output is written in it.
pub fn llama_order(a: &str, b: &str) -> std::cmp::Ordering {
    let layer = |n: &str| -> i64 {
        n.strip_prefix("blk.").and_then(|r| r.split('.').next()).and_then(|d| d.parse().ok()).unwrap_or(-1)
    };
    layer(a).cmp(&layer(b)).then_with(|| a.cmp(b))
}

/// Where the tensors come from: a GGUF file, or an HF folder.
enum Input {
    Gguf { content: gguf_file::Content, reader: std::io::BufReader<std::fs::File> },
    Hf(Box<hf::HfSource>),
}

/// Rewrites the GGUF file or Hugging Face folder `src` as the GGUF `out` in file type `ft`
/// (module docs).
pub fn quantize_gguf(src: &Path, out: &Path, ft: FileType) -> Result<Quantized> {
    let mut input = if src.is_dir() {
        Input::Hf(Box::new(hf::HfSource::open(src)?))
    } else {
        let (content, reader) = open_gguf(src)?;
        Input::Gguf { content, reader }
    };
    let (temp, file) = TempOut::create(out)?;
    let mut shapes: Vec<(String, Vec<usize>)> = match &input {
        Input::Gguf { content, .. } => {
            content.tensor_infos.iter().map(|(n, i)| (n.clone(), i.shape.dims().to_vec())).collect()
        }
        Input::Hf(h) => h.tensors.iter().map(|(n, (_, d))| (n.clone(), d.clone())).collect(),
    };
    shapes.sort_by(|a, b| llama_order(&a.0, &b.0));
    let descs: Vec<TensorDesc<'_>> = shapes
        .iter()
        .map(|(n, dims)| TensorDesc { name: n.as_str(), row: dims.last().copied().unwrap_or(1), dims: dims.len() })
        .collect();
    let source_md: Vec<(String, gguf_file::Value)> = match &input {
        Input::Gguf { content, .. } => content.metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        Input::Hf(h) => h.metadata.clone(),
    };
    let lookup = |key: &str| source_md.iter().find(|(k, _)| k == key).map(|(_, v)| v);
    let arch = lookup("general.architecture").and_then(|v| v.to_string().ok()).cloned();
    let count = |key: &str| {
        arch.as_ref().and_then(|a| lookup(&format!("{a}.{key}")).and_then(|v| v.to_u32().ok())).unwrap_or(0) as usize
    };
    let types = plan(ft, &descs, count("block_count"), count("expert_count"));
    let mut tensors = Vec::with_capacity(shapes.len());
    let (mut bytes_in, mut bytes_out) = (0usize, 0usize);
    for ((name, dims), ty) in shapes.iter().zip(types) {
        let qt = match &mut input {
            Input::Gguf { content, reader } => {
                let qt = content.tensor(reader, name, &Device::Cpu).map_err(|e| io_err(src, format!("{name}: {e}")))?;
                bytes_in += qt.storage_size_in_bytes();
                match ty {
                    Some(t) if t != qt.dtype() => {
                        let x = qt
                            .dequantize(&Device::Cpu)
                            .and_then(|t| t.flatten_all()?.to_vec1::<f32>())
                            .map_err(|e| io_err(src, format!("{name}: {e}")))?;
                        quantize_tensor(x, dims, t).map_err(|e| Error::internal(format!("quantizing {name}: {e}")))?
                    }
                    _ => qt,
                }
            }
            Input::Hf(h) => {
                let x = h.tensor(name)?;
                bytes_in += x.len() * 4;
                quantize_tensor(x, dims, ty.unwrap_or(GgmlDType::F32))
                    .map_err(|e| Error::internal(format!("quantizing {name}: {e}")))?
            }
        };
        bytes_out += qt.storage_size_in_bytes();
        tensors.push((name.to_string(), qt));
    }
    let mut metadata: Vec<(&str, gguf_file::Value)> = source_md
        .iter()
        .filter(|(k, _)| {
            !matches!(k.as_str(), "general.file_type" | "general.quantization_version" | "general.alignment")
        })
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    metadata.push(("general.file_type", gguf_file::Value::U32(ft.ftype())));
    metadata.push(("general.quantization_version", gguf_file::Value::U32(2)));
    // `general.architecture` first (as llama.cpp writes it), the rest by name.
    metadata.sort_by_key(|(k, _)| (*k != "general.architecture", *k));
    let md: Vec<(&str, &gguf_file::Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut w = std::io::BufWriter::new(file);
    gguf_file::write(&mut w, &md, &ts).map_err(|e| io_err(out, e))?;
    temp.persist(w.into_inner().map_err(|e| io_err(out, e.error()))?)?;
    let tensors = tensors
        .iter()
        .map(|(n, t)| QuantizedTensor {
            name: n.clone(),
            dtype: type_name(t.dtype()).into(),
            bytes: t.storage_size_in_bytes(),
        })
        .collect();
    Ok(Quantized { tensors, bytes_in, bytes_out })
}

/// The output file while it is written: a temporary file beside `out`, removed on drop unless
/// `persist` renamed it to `out` (so an error or a panic leaves nothing behind).
struct TempOut {
    tmp: PathBuf,
    out: PathBuf,
    done: bool,
}

impl TempOut {
    /// Creates `.NAME.PID.tmp` beside `out` (failing fast on an unwritable `out`).
    fn create(out: &Path) -> Result<(Self, std::fs::File)> {
        let name = out.file_name().ok_or_else(|| Error::invalid(format!("{}: not a file path", out.display())))?;
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{}.tmp", std::process::id()));
        let tmp = out.with_file_name(tmp_name);
        let file = std::fs::File::create(&tmp).map_err(|e| io_err(&tmp, e))?;
        Ok((Self { tmp, out: out.to_path_buf(), done: false }, file))
    }

    /// Syncs `file` (the temporary file) and renames it to `out`.
    fn persist(mut self, file: std::fs::File) -> Result<()> {
        file.sync_all().map_err(|e| io_err(&self.tmp, e))?;
        std::fs::rename(&self.tmp, &self.out).map_err(|e| io_err(&self.out, e))?;
        self.done = true;
        Ok(())
    }
}

impl Drop for TempOut {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests;
