//! GGUF checkpoints read by HF name: a text model's file (llama.cpp's `blk.N.*` names,
//! `gguf_name`) or a multimodal projector file, llama.cpp's `mmproj` (`v.*` and `mm.*`,
//! `clip_names`).
//!
//! Invariants: every tensor is checked at open to have an accepted type and to lie inside the
//! file, so a truncated download is named before anything is read. A tensor llama.cpp's
//! converter splits is read back joined (`Join`: an mmproj's q, k and v of Qwen's fused `qkv`,
//! the two frames of its Conv3d patch kernel), so a tower loader sees the HF tensor; values are
//! otherwise as stored (an mmproj holds Gemma 3's projector norm as `1 + w`:
//! `WeightSource::is_gguf`).

use super::names::{clip_names, gguf_name, Join};
use super::{load_err, Source, WeightSource};
use crate::args::Arch;
use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use lmplex_core::{Error, Result};
use std::fs::File;
use std::path::Path;
use std::sync::Mutex;

/// Which naming scheme a GGUF file's tensors follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GgufNames {
    /// A text model of this architecture (`gguf_name`).
    Text(Arch),
    /// A multimodal projector file (`clip_names`).
    Clip,
}

impl GgufNames {
    /// The stored tensors that make up `hf`, and how they join.
    fn parts(self, hf: &str) -> (Vec<String>, Join) {
        match self {
            Self::Text(arch) => (vec![gguf_name(arch, hf)], Join::One),
            Self::Clip => clip_names(hf),
        }
    }
}

impl WeightSource {
    /// Opens a text model's GGUF from its parsed header (`check_gguf`).
    pub fn gguf(path: &Path, content: gguf_file::Content, arch: Arch) -> Result<Self> {
        Self::open_gguf(path, content, GgufNames::Text(arch))
    }

    /// Opens a multimodal projector file (llama.cpp's `mmproj`, written by its
    /// `convert_hf_to_gguf.py --mmproj`) from its parsed header: its vision tower is read under
    /// the HF names the tower loaders ask for (`clip_names`).
    pub fn mmproj(path: &Path, content: gguf_file::Content) -> Result<Self> {
        Self::open_gguf(path, content, GgufNames::Clip)
    }

    /// Whether this is a GGUF file (whose norms llama.cpp may store with Gemma's `+1` added).
    pub fn is_gguf(&self) -> bool {
        matches!(self.source, Source::Gguf { .. })
    }

    fn open_gguf(path: &Path, content: gguf_file::Content, names: GgufNames) -> Result<Self> {
        let file = File::open(path).map_err(|e| load_err(path, e))?;
        let file_len = file.metadata().map_err(|e| load_err(path, e))?.len();
        // Check up front that every tensor lies inside the file: a truncated download is named
        // here rather than failing half-way through loading.
        for (name, info) in &content.tensor_infos {
            Self::check_gguf_dtype(path, name, info.ggml_dtype)?;
            // Dimensions come from the file: no zero, no product past the file's size.
            let dims = info.shape.dims();
            let elems = dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).filter(|_| !dims.contains(&0));
            let block = info.ggml_dtype.block_size();
            let Some(elems) = elems.filter(|e| e.is_multiple_of(block)) else {
                return Err(load_err(path, format!("tensor '{name}' has dimensions {dims:?}")));
            };
            let bytes = (elems / block) as u64 * info.ggml_dtype.type_size() as u64;
            let end = content.tensor_data_offset.checked_add(info.offset).and_then(|o| o.checked_add(bytes));
            if end.is_none_or(|e| e > file_len) {
                let end = end.map_or("past u64".to_string(), |e| e.to_string());
                return Err(load_err(
                    path,
                    format!("file is truncated: tensor '{name}' ends at byte {end} but the file has {file_len} bytes"),
                ));
            }
        }
        Ok(Self {
            source: Source::Gguf { path: path.to_path_buf(), content, file: Mutex::new(file), names },
            device: Device::Cpu,
            dequantize: std::env::var("LMPLEX_DEQUANTIZE").is_ok_and(|v| v == "1"),
            dtype: lmplex_core::DType::Auto,
            packed: None,
            text_prefix: None,
        })
    }

    /// GGUF tensor types lmplex accepts (the list plus the close relatives candle reads).
    pub(super) fn check_gguf_dtype(path: &Path, name: &str, dtype: GgmlDType) -> Result<()> {
        use GgmlDType::*;
        match dtype {
            F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q2K | Q3K | Q4K | Q5K | Q6K => Ok(()),
            other => Err(load_err(path, format!("tensor '{name}' has unsupported quant type {other:?}"))),
        }
    }

    /// The stored name of `hf_name` in a GGUF source, when it is stored as one tensor.
    pub(super) fn gguf_stored_name(&self, hf_name: &str) -> Option<String> {
        let Source::Gguf { names, .. } = &self.source else { return None };
        match names.parts(hf_name) {
            (mut parts, Join::One) => parts.pop(),
            _ => None,
        }
    }

    /// Whether a GGUF source holds every stored tensor `hf_name` is made of.
    pub(super) fn gguf_has(&self, hf_name: &str) -> bool {
        let Source::Gguf { content, names, .. } = &self.source else { return false };
        names.parts(hf_name).0.iter().all(|n| content.tensor_infos.contains_key(n))
    }

    /// The element type `hf_name` is stored in when it is a float type (the first part's, for
    /// a joined tensor); `None` for a quantized or missing tensor.
    pub(super) fn gguf_stored_float(&self, hf_name: &str) -> Option<DType> {
        let Source::Gguf { content, names, .. } = &self.source else { return None };
        let (parts, _) = names.parts(hf_name);
        match content.tensor_infos.get(parts.first()?)?.ggml_dtype {
            GgmlDType::F32 => Some(DType::F32),
            GgmlDType::F16 => Some(DType::F16),
            GgmlDType::BF16 => Some(DType::BF16),
            _ => None,
        }
    }

    /// The tensor `hf_name`, stored as one GGUF tensor, as candle reads it.
    pub(super) fn qtensor(&self, hf_name: &str) -> Result<QTensor> {
        let Source::Gguf { path, .. } = &self.source else {
            return Err(Error::internal("qtensor on a non-GGUF source"));
        };
        let name = self
            .gguf_stored_name(hf_name)
            .ok_or_else(|| load_err(path, format!("tensor '{hf_name}' is stored split; it can only be read dense")))?;
        self.qtensor_stored(hf_name, &name)
    }

    /// The stored tensor `name` (for the HF tensor `hf_name`, which errors name too).
    fn qtensor_stored(&self, hf_name: &str, name: &str) -> Result<QTensor> {
        let Source::Gguf { path, content, file, .. } = &self.source else {
            return Err(Error::internal("qtensor on a non-GGUF source"));
        };
        let info = content
            .tensor_infos
            .get(name)
            .ok_or_else(|| load_err(path, format!("missing tensor '{name}' (HF name '{hf_name}')")))?;
        Self::check_gguf_dtype(path, name, info.ggml_dtype)?;
        let mut f = file.lock().map_err(|_| Error::internal("weight file lock poisoned"))?;
        content
            .tensor(&mut *f, name, &self.device)
            .map_err(|e| load_err(path, format!("cannot read tensor '{name}': {e}")))
    }

    /// The HF tensor `hf_name` from a GGUF source as f32, its stored parts joined (`Join`).
    pub(super) fn gguf_tensor(&self, hf_name: &str) -> Result<Tensor> {
        let Source::Gguf { path, names, .. } = &self.source else {
            return Err(Error::internal("gguf_tensor on a non-GGUF source"));
        };
        let (parts, join) = names.parts(hf_name);
        let read = |name: &String| {
            self.qtensor_stored(hf_name, name)?
                .dequantize(&self.device)
                .map_err(|e| load_err(path, format!("cannot dequantize '{name}': {e}")))
        };
        let tensors = parts.iter().map(read).collect::<Result<Vec<_>>>()?;
        let joined = match join {
            Join::One => {
                return tensors.into_iter().next().ok_or_else(|| Error::internal("a tensor of no parts"));
            }
            Join::Rows => Tensor::cat(&tensors, 0),
            Join::Frames => Tensor::stack(&tensors, 2),
        };
        joined.map_err(|e| load_err(path, format!("cannot join {} into '{hf_name}': {e}", parts.join(", "))))
    }
}
