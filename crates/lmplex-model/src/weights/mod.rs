//! Weight sources: a GGUF file or a Hugging Face safetensors folder, both addressed by HF tensor
//! names (`model.layers.0.self_attn.q_proj.weight`); `gguf_name` maps them to llama.cpp names.
//!
//! Invariants: quantized GGUF tensors stay quantized (`QWeight`: repacked for the integer
//! kernels with the same values, the GGUF blocks for the other formats), never dequantized to
//! f32 unless `LMPLEX_DEQUANTIZE=1`. Dense matrices keep a safetensors checkpoint's element
//! type (f32, bf16 or f16; other float types widen to f32), repacked into `DenseWeight`
//! panels; GGUF F32/F16/BF16 tensors and vectors (norms, biases) become f32. Safetensors are
//! memory-mapped and each tensor is copied once, into its stored form. An AWQ/GPTQ folder's
//! projections (`{prefix}.qweight` …) stand in for `{prefix}.weight`: Q4_1 blocks where their
//! layout allows, else the dense dequantized matrix (`packed.rs`). Every failure names the
//! file and tensor.

mod blocks;
mod gguf;
mod matrix;
mod names;
mod packed;

pub use blocks::Blocks;
pub use matrix::{Linear, Matrix};
pub use names::gguf_name;
pub use packed::{Method as PackedMethod, Packed, Raw as PackedRaw};

use crate::qmatmul::QWeight;
use candle_core::quantized::{ggml_file, gguf_file, GgmlDType};
use candle_core::{DType, Device, Tensor};
use lmplex_core::{Error, Result};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

enum Source {
    Gguf { path: PathBuf, content: gguf_file::Content, file: Mutex<File>, names: gguf::GgufNames },
    Safetensors { dir: PathBuf, st: candle_core::safetensors::MmapedSafetensors },
}

/// An AWQ/GPTQ projection as read: integer blocks, or the dense matrix.
enum PackedWeight {
    Quantized(Matrix),
    Dense(Tensor),
}

/// Reads tensors by HF name from whichever checkpoint was opened.
pub struct WeightSource {
    source: Source,
    device: Device,
    dequantize: bool,
    /// What dense matrices are stored as (`Matrix::dense`).
    dtype: lmplex_core::DType,
    /// An AWQ or GPTQ folder's layout: its projections are read from their packed tensors.
    packed: Option<Packed>,
    /// A multimodal folder's text model prefix (`ModelArgs::text_prefix`): the text weights'
    /// `model.` stands for it in the file (`stored_name`).
    text_prefix: Option<&'static str>,
}

/// Text-model prefixes as transformers 5 saves them, with the names older checkpoints on the
/// Hub use for the same tensors (transformers' checkpoint conversion mapping).
const LEGACY_TEXT_PREFIXES: [(&str, &str); 2] =
    [("model.language_model.", "language_model.model."), ("model.language_model.", "model.")];

fn load_err(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::model_load(format!("{}: {what}", path.display()))
}

impl WeightSource {
    /// `files`: the safetensors shards of `dir`.
    pub fn safetensors(dir: &Path, files: &[PathBuf]) -> Result<Self> {
        // SAFETY: the files are mapped read-only; lmplex never writes them, and a checkpoint
        // changed on disk while loaded is outside the contract (as in candle and vLLM).
        let st = unsafe { candle_core::safetensors::MmapedSafetensors::multi(files) }
            .map_err(|e| load_err(dir, format!("cannot read safetensors: {e}")))?;
        let source = Source::Safetensors { dir: dir.to_path_buf(), st };
        let dequantize = std::env::var("LMPLEX_DEQUANTIZE").is_ok_and(|v| v == "1");
        Ok(Self {
            source,
            device: Device::Cpu,
            dequantize,
            dtype: lmplex_core::DType::Auto,
            packed: None,
            text_prefix: None,
        })
    }

    /// Reads the text model's weights from under `prefix` (`ModelArgs::text_prefix`): asked for
    /// `model.layers.0…`, `model.embed_tokens…` or `model.norm…`, a safetensors folder gives
    /// `{prefix}layers.0…`; every other name (the head, a vision tower's) is read as asked. A
    /// folder whose embeddings are not under `prefix` but under an older name
    /// (`LEGACY_TEXT_PREFIXES`: the Hub's Gemma 3 and Qwen2-VL checkpoints) is read from under that.
    pub fn with_text_prefix(mut self, prefix: Option<&'static str>) -> Self {
        self.text_prefix = prefix.map(|p| {
            let names: Vec<&'static str> = std::iter::once(p)
                .chain(LEGACY_TEXT_PREFIXES.iter().filter(|(new, _)| *new == p).map(|(_, old)| *old))
                .collect();
            self.first_prefix(&names, "embed_tokens.weight")
        });
        self
    }

    /// The first of `prefixes` under which a safetensors folder stores `{prefix}{probe}` (as
    /// stored, before `with_text_prefix`'s renaming), else the first: where a group of tensors
    /// lives when checkpoints name it in several ways.
    pub fn first_prefix(&self, prefixes: &[&'static str], probe: &str) -> &'static str {
        let holds = |p: &str| match &self.source {
            Source::Safetensors { st, .. } => st.get(&format!("{p}{probe}")).is_ok(),
            Source::Gguf { .. } => false,
        };
        prefixes.iter().copied().find(|p| holds(p)).unwrap_or(prefixes[0])
    }

    /// The name in the file of the tensor asked for as `hf_name` (`with_text_prefix`).
    fn stored_name<'n>(&self, hf_name: &'n str) -> std::borrow::Cow<'n, str> {
        let text = ["layers.", "embed_tokens.", "norm."];
        match (self.text_prefix, hf_name.strip_prefix("model.")) {
            (Some(p), Some(rest)) if text.iter().any(|t| rest.starts_with(t)) => format!("{p}{rest}").into(),
            _ => hf_name.into(),
        }
    }

    /// Reads projections stored in `packed`'s layout (an AWQ or GPTQ folder) as the dense
    /// matrices they stand for (`packed.rs`).
    pub fn with_packed(mut self, packed: Option<Packed>) -> Self {
        self.packed = packed;
        self
    }

    /// A packed folder's `{base}.weight`: Q4_1 blocks for the integer kernels when `quantized`
    /// and its layout allows (`Packed::q4_1_blocks`), else the dense f32 matrix (a `Matrix`
    /// stored as `dtype` says, or a `Tensor`); `None` when `hf_name` is not a packed projection.
    fn packed(&self, hf_name: &str, quantized: bool) -> Option<Result<PackedWeight>> {
        let (Some(packed), Source::Safetensors { dir, st }) = (&self.packed, &self.source) else { return None };
        let stored = self.stored_name(hf_name);
        let base = stored.strip_suffix(".weight")?;
        st.get(&format!("{base}.qweight")).ok()?;
        let read = || -> Result<PackedWeight> {
            let (qweight, qzeros, scales, g_idx) = read_packed(st, packed, base)?;
            if quantized {
                if let Some((blocks, out, inp)) = packed.q4_1_blocks(&qweight, &qzeros, &scales, g_idx.as_ref())? {
                    let q = ggml_file::qtensor_from_ggml(GgmlDType::Q4_1, &blocks, vec![out, inp], &self.device)
                        .map_err(Error::internal)?;
                    let w = QWeight::from_qtensor(&q).map_err(Error::internal)?;
                    return Ok(PackedWeight::Quantized(Matrix::Quantized(Arc::new(w))));
                }
            }
            let (w, out, inp) = packed.dequantize(&qweight, &qzeros, &scales, g_idx.as_ref())?;
            Ok(PackedWeight::Dense(Tensor::from_vec(w, (out, inp), &self.device).map_err(Error::internal)?))
        };
        Some(read().map_err(|e| load_err(dir, format!("'{base}': {e}"))))
    }

    /// Dense matrices read from now on are stored as `dtype` (`Matrix::dense`; `ModelConfig`'s
    /// `dtype` on the CPU). Quantized GGUF tensors stay quantized. `Auto` on a safetensors
    /// folder whose matrices are all bf16 means `BF16`: such a checkpoint computes in bf16, as
    /// vLLM's and torch's `auto` do; other checkpoints keep `Auto` (each matrix's own type).
    pub fn set_dtype(&mut self, dtype: lmplex_core::DType) {
        self.dtype = match dtype {
            lmplex_core::DType::Auto if self.bf16_matrices() => lmplex_core::DType::BF16,
            other => other,
        };
    }

    /// Whether this is a safetensors folder whose matrices (2-D tensors) are all bf16.
    fn bf16_matrices(&self) -> bool {
        let Source::Safetensors { st, .. } = &self.source else { return false };
        let mut matrices = st.tensors().into_iter().filter(|(_, t)| t.shape().len() == 2).peekable();
        matrices.peek().is_some() && matrices.all(|(_, t)| t.dtype() == safetensors::Dtype::BF16)
    }

    /// The dtype dense matrices are stored as (`set_dtype`).
    pub fn dtype(&self) -> lmplex_core::DType {
        self.dtype
    }

    /// Whether every tensor is stored as f32 (the `auto` KV dtype's question,
    /// `loader::auto_kv_dtype`).
    pub fn all_f32(&self) -> bool {
        match &self.source {
            Source::Gguf { content, .. } => content.tensor_infos.values().all(|i| i.ggml_dtype == GgmlDType::F32),
            Source::Safetensors { st, .. } => st.tensors().iter().all(|(_, t)| t.dtype() == safetensors::Dtype::F32),
        }
    }

    /// Every tensor of a safetensors folder with its shape, by HF name (none for a GGUF); the
    /// text model's under the names they are asked for by (`with_text_prefix`).
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let asked = |n: String| match self.text_prefix.and_then(|p| n.strip_prefix(p)) {
            Some(rest) => format!("model.{rest}"),
            None => n,
        };
        match &self.source {
            Source::Gguf { .. } => Vec::new(),
            Source::Safetensors { st, .. } => {
                st.tensors().into_iter().map(|(n, t)| (asked(n), t.shape().to_vec())).collect()
            }
        }
    }

    /// Whether the checkpoint has a tensor of this HF name.
    pub fn has(&self, hf_name: &str) -> bool {
        match &self.source {
            Source::Gguf { .. } => self.gguf_has(hf_name),
            Source::Safetensors { st, .. } => {
                let hf_name = &*self.stored_name(hf_name);
                st.get(hf_name).is_ok()
                    || (self.packed.is_some()
                        && hf_name.strip_suffix(".weight").is_some_and(|b| st.get(&format!("{b}.qweight")).is_ok()))
            }
        }
    }

    /// A safetensors tensor's stored little-endian bytes and element type, borrowed from the
    /// mapped file (`None` for a GGUF or a missing tensor): the GPU backend uploads a tensor
    /// already in its dtype without converting it.
    pub fn stored_bytes(&self, hf_name: &str) -> Option<(safetensors::Dtype, &[u8])> {
        let Source::Safetensors { st, .. } = &self.source else { return None };
        st.get(&self.stored_name(hf_name)).ok().map(|view| (view.dtype(), view.data()))
    }

    /// The float type the tensor `hf_name` is stored in (f32, bf16 or f16), from a safetensors
    /// folder or a GGUF file; `None` for a quantized, packed or missing tensor, or another type.
    pub fn stored_float(&self, hf_name: &str) -> Option<DType> {
        match &self.source {
            Source::Gguf { .. } => self.gguf_stored_float(hf_name),
            Source::Safetensors { .. } => match self.stored_bytes(hf_name)?.0 {
                safetensors::Dtype::F32 => Some(DType::F32),
                safetensors::Dtype::F16 => Some(DType::F16),
                safetensors::Dtype::BF16 => Some(DType::BF16),
                _ => None,
            },
        }
    }

    /// A 1-D f32 tensor (norm weights, biases) as a vector.
    pub fn vector(&self, hf_name: &str) -> Result<Vec<f32>> {
        self.tensor(hf_name)?
            .flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| Error::model_load(format!("tensor '{hf_name}': {e}")))
    }

    /// A dense f32 tensor (norm weights, biases), whatever its stored type.
    pub fn tensor(&self, hf_name: &str) -> Result<Tensor> {
        match &self.source {
            Source::Gguf { .. } => self.gguf_tensor(hf_name),
            Source::Safetensors { dir, st, .. } => match self.packed(hf_name, false) {
                Some(Ok(PackedWeight::Dense(t))) => Ok(t),
                Some(Ok(PackedWeight::Quantized(_))) => Err(Error::internal("packed weight read quantized")),
                Some(Err(e)) => Err(e),
                None => st
                    .load(&self.stored_name(hf_name), &self.device)
                    .and_then(|t| t.to_dtype(DType::F32))
                    .map_err(|e| load_err(dir, format!("cannot read tensor '{hf_name}': {e}"))),
            },
        }
    }

    /// A weight matrix `[out, in]`, kept quantized when it is.
    pub fn matrix(&self, hf_name: &str) -> Result<Matrix> {
        match &self.source {
            Source::Gguf { path, .. } => {
                let q = self.qtensor(hf_name)?;
                let dense = matches!(q.dtype(), GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16);
                if self.dequantize || dense {
                    let t = q
                        .dequantize(&self.device)
                        .and_then(|t| Matrix::dense(t, self.dtype))
                        .map_err(|e| load_err(path, e))?;
                    return Ok(t);
                }
                Ok(Matrix::Quantized(Arc::new(QWeight::from_qtensor(&q).map_err(|e| load_err(path, e))?)))
            }
            Source::Safetensors { dir, .. } if self.packed.is_some() => match self.packed(hf_name, !self.dequantize) {
                Some(Ok(PackedWeight::Quantized(m))) => Ok(m),
                Some(Ok(PackedWeight::Dense(t))) => Matrix::dense(t, self.dtype).map_err(|e| load_err(dir, e)),
                Some(Err(e)) => Err(e),
                None => self.stored_matrix(hf_name),
            },
            Source::Safetensors { .. } => self.stored_matrix(hf_name),
        }
    }

    /// A safetensors matrix as stored.
    fn stored_matrix(&self, hf_name: &str) -> Result<Matrix> {
        match &self.source {
            Source::Gguf { .. } => Err(Error::internal("stored_matrix on a GGUF source")),
            Source::Safetensors { dir, st } => {
                // Kept in the checkpoint's element type (the dense kernels widen it exactly).
                st.load(&self.stored_name(hf_name), &self.device)
                    .and_then(|t| Matrix::dense(t, self.dtype))
                    .map_err(|e| load_err(dir, format!("cannot read tensor '{hf_name}': {e}")))
            }
        }
    }

    /// The `n` expert matrices of a 3-D tensor `[n, out, in]` (GGUF `ffn_*_exps`, or
    /// transformers 5's fused `experts.gate_up_proj`/`down_proj`), each kept quantized when the
    /// tensor is: expert `e`'s rows are its contiguous slice of the GGUF blocks.
    pub fn expert_matrices(&self, hf_name: &str, n: usize) -> Result<Vec<Matrix>> {
        let bad =
            |dims: &[usize]| Error::model_load(format!("tensor '{hf_name}' is {dims:?}, expected [{n}, out, in]"));
        match &self.source {
            Source::Gguf { path, .. } => {
                let q = self.qtensor(hf_name)?;
                let dims = q.shape().dims().to_vec();
                let [e, rows, cols] = dims[..] else { return Err(bad(&dims)) };
                if e != n {
                    return Err(bad(&dims));
                }
                let dense = matches!(q.dtype(), GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16);
                if self.dequantize || dense {
                    let t = q.dequantize(&self.device).map_err(|e| load_err(path, e))?;
                    return (0..n)
                        .map(|i| t.get(i).and_then(|t| Matrix::dense(t, self.dtype)).map_err(|e| load_err(path, e)))
                        .collect();
                }
                let data = q.data().map_err(|e| load_err(path, e))?;
                let per = data.len() / n;
                (0..n)
                    .map(|i| {
                        let part = candle_core::quantized::ggml_file::qtensor_from_ggml(
                            q.dtype(),
                            &data[i * per..(i + 1) * per],
                            vec![rows, cols],
                            &self.device,
                        )
                        .map_err(|e| load_err(path, e))?;
                        Ok(Matrix::Quantized(Arc::new(QWeight::from_qtensor(&part).map_err(|e| load_err(path, e))?)))
                    })
                    .collect()
            }
            Source::Safetensors { dir, st } => {
                let t = st
                    .load(&self.stored_name(hf_name), &self.device)
                    .map_err(|e| load_err(dir, format!("cannot read tensor '{hf_name}': {e}")))?;
                if t.dims().len() != 3 || t.dims()[0] != n {
                    return Err(bad(t.dims()));
                }
                (0..n)
                    .map(|i| t.get(i).and_then(|t| Matrix::dense(t, self.dtype)).map_err(|e| load_err(dir, e)))
                    .collect()
            }
        }
    }

    /// `{prefix}.weight` plus `{prefix}.bias` when `bias` is asked for.
    pub fn linear(&self, prefix: &str, bias: bool) -> Result<Linear> {
        let weight = self.matrix(&format!("{prefix}.weight"))?;
        let bias = if bias { Some(self.vector(&format!("{prefix}.bias"))?) } else { None };
        Ok(Linear { weight, bias })
    }

    /// GGUF llama-3 models store the rope frequency factors as a tensor.
    pub fn rope_freq_factors(&self) -> Result<Option<Vec<f32>>> {
        match &self.source {
            Source::Gguf { content, .. } if content.tensor_infos.contains_key("rope_freqs.weight") => {
                let t = self.tensor("rope_freqs.weight")?;
                Ok(Some(t.to_vec1::<f32>().map_err(Error::internal)?))
            }
            _ => Ok(None),
        }
    }
}

/// A packed projection's `qweight`, `qzeros`, `scales` and (GPTQ) `g_idx` tensors.
type PackedTensors = (packed::Raw<i32>, packed::Raw<i32>, packed::Raw<f32>, Option<packed::Raw<i32>>);

fn read_packed(st: &candle_core::safetensors::MmapedSafetensors, packed: &Packed, base: &str) -> Result<PackedTensors> {
    let ints = |suffix: &str| raw_i32(st, &format!("{base}.{suffix}"));
    let (qweight, qzeros, scales) = (ints("qweight")?, ints("qzeros")?, raw_f32(st, &format!("{base}.scales"))?);
    let g_idx = match packed.method {
        packed::Method::Gptq { .. } if st.get(&format!("{base}.g_idx")).is_ok() => Some(ints("g_idx")?),
        _ => None,
    };
    Ok((qweight, qzeros, scales, g_idx))
}

/// A safetensors tensor's values as i32 (AWQ/GPTQ's packed words and group indices).
fn raw_i32(st: &candle_core::safetensors::MmapedSafetensors, name: &str) -> Result<packed::Raw<i32>> {
    let v = st.get(name).map_err(|e| Error::model_load(format!("missing tensor '{name}': {e}")))?;
    if v.dtype() != safetensors::Dtype::I32 {
        return Err(Error::model_load(format!("tensor '{name}' is {:?}, I32 expected", v.dtype())));
    }
    let values = v.data().chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    Ok(packed::Raw { shape: v.shape().to_vec(), values })
}

/// A safetensors tensor's values as f32 (AWQ/GPTQ's scales: f16, bf16 or f32).
fn raw_f32(st: &candle_core::safetensors::MmapedSafetensors, name: &str) -> Result<packed::Raw<f32>> {
    use safetensors::Dtype;
    let v = st.get(name).map_err(|e| Error::model_load(format!("missing tensor '{name}': {e}")))?;
    let b = v.data();
    let values = match v.dtype() {
        Dtype::F16 => b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        Dtype::BF16 => b.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        Dtype::F32 => b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        other => return Err(Error::model_load(format!("tensor '{name}' is {other:?}, a float type expected"))),
    };
    Ok(packed::Raw { shape: v.shape().to_vec(), values })
}
