//! Quantized matrices as ggml blocks, for a backend that keeps them quantized (the CUDA
//! backend's W4A16 kernels): the type a matrix is stored in, from the headers alone
//! (`quantized_type`, for memory plans), and its blocks (`blocks`, for the upload).
//!
//! Invariant: `blocks(name)` is `Some` exactly when dequantizing is off (`LMPLEX_DEQUANTIZE`,
//! `set_dequantize`) and the tensor is a GGUF tensor of a quantized type, or a packed
//! projection 4-bit in runs of whole 32-input groups (then Q4_1 blocks, as the CPU holds it:
//! `Packed::q4_1_blocks`). `quantized_type` answers the same from the config and headers, except
//! that it counts an act-order checkpoint dense even when its `g_idx` happens to be in order.

use super::{load_err, read_packed, Source, WeightSource};
use candle_core::quantized::GgmlDType;
use lmplex_core::Result;

/// A matrix `[rows, cols]` in ggml blocks of `dtype`, row-major (row r is `cols / block`
/// blocks).
#[derive(Debug, Clone)]
pub struct Blocks {
    /// The block type (`Q4_K`, `Q8_0`, ...).
    pub dtype: GgmlDType,
    /// Output rows.
    pub rows: usize,
    /// Inputs per row (a whole number of blocks).
    pub cols: usize,
    /// The blocks, as a GGUF file stores them.
    pub data: Vec<u8>,
}

fn dense(t: GgmlDType) -> bool {
    matches!(t, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16)
}

impl WeightSource {
    /// Reads quantized matrices dense from now on (`true`), as `LMPLEX_DEQUANTIZE=1` does.
    pub fn set_dequantize(&mut self, on: bool) {
        self.dequantize = on;
    }

    /// The ggml type the matrix `hf_name` (`cols` inputs) is held in when it stays quantized;
    /// `None` when it is read dense (or is missing). From the headers and config alone.
    pub fn quantized_type(&self, hf_name: &str, cols: usize) -> Option<GgmlDType> {
        if self.dequantize {
            return None;
        }
        match &self.source {
            Source::Gguf { content, .. } => {
                let t = content.tensor_infos.get(&self.gguf_stored_name(hf_name)?)?.ggml_dtype;
                (!dense(t)).then_some(t)
            }
            Source::Safetensors { st, .. } => {
                let packed = self.packed.as_ref()?;
                let base = hf_name.strip_suffix(".weight")?;
                st.get(&format!("{base}.qweight")).ok()?;
                packed.holds_q4_1(cols).then_some(GgmlDType::Q4_1)
            }
        }
    }

    /// The matrix `hf_name` as ggml blocks when it is stored quantized (see the header);
    /// `None` when it is dense.
    pub fn blocks(&self, hf_name: &str) -> Result<Option<Blocks>> {
        if self.dequantize {
            return Ok(None);
        }
        match &self.source {
            Source::Gguf { path, .. } => {
                let q = self.qtensor(hf_name)?;
                if dense(q.dtype()) {
                    return Ok(None);
                }
                let (rows, cols) = q.shape().dims2().map_err(|e| load_err(path, format!("'{hf_name}': {e}")))?;
                let data = q.data().map_err(|e| load_err(path, format!("'{hf_name}': {e}")))?.into_owned();
                Ok(Some(Blocks { dtype: q.dtype(), rows, cols, data }))
            }
            Source::Safetensors { dir, st } => {
                let (Some(packed), Some(base)) = (&self.packed, hf_name.strip_suffix(".weight")) else {
                    return Ok(None);
                };
                if st.get(&format!("{base}.qweight")).is_err() {
                    return Ok(None);
                }
                let read = || -> Result<Option<Blocks>> {
                    let (qweight, qzeros, scales, g_idx) = read_packed(st, packed, base)?;
                    let blocks = packed.q4_1_blocks(&qweight, &qzeros, &scales, g_idx.as_ref())?;
                    Ok(blocks.map(|(data, rows, cols)| Blocks { dtype: GgmlDType::Q4_1, rows, cols, data }))
                };
                read().map_err(|e| load_err(dir, format!("'{base}': {e}")))
            }
        }
    }
}
