//! GGUF-quantized weights on the device: the block formats the kernels read (`QFormat`,
//! `qgemv.cu`), and their dequantization with candle (ggml's layouts, an outside oracle), which
//! the twins of the quantized kernels use (`crate::kernels::qgemv`, `crate::kernels::tgemm`).
//!
//! Invariant: a format's `block()` is ggml's (weights, bytes) per block, so `bytes(rows, cols)`
//! is exactly what a GGUF file stores for the matrix, which the device holds as it is.

use candle_core::quantized::{ggml_file, GgmlDType};
use candle_core::Device;
use lmplex_core::{Error, Result};

/// GGUF block formats the quantized kernels read (`qgemv.cu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QFormat {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
}

impl QFormat {
    pub const ALL: [QFormat; 8] =
        [Self::Q4_0, Self::Q4_1, Self::Q5_0, Self::Q5_1, Self::Q8_0, Self::Q4K, Self::Q5K, Self::Q6K];

    /// (weights per block, bytes per block).
    pub fn block(self) -> (usize, usize) {
        match self {
            Self::Q4_0 => (32, 18),
            Self::Q4_1 => (32, 20),
            Self::Q5_0 => (32, 22),
            Self::Q5_1 => (32, 24),
            Self::Q8_0 => (32, 34),
            Self::Q4K => (256, 144),
            Self::Q5K => (256, 176),
            Self::Q6K => (256, 210),
        }
    }

    /// The kernels' name suffix (`qgemv_q4_k_bf16`).
    pub fn suffix(self) -> &'static str {
        match self {
            Self::Q4_0 => "q4_0",
            Self::Q4_1 => "q4_1",
            Self::Q5_0 => "q5_0",
            Self::Q5_1 => "q5_1",
            Self::Q8_0 => "q8_0",
            Self::Q4K => "q4_k",
            Self::Q5K => "q5_k",
            Self::Q6K => "q6_k",
        }
    }

    /// The format of a ggml type, `None` for the types the kernels do not read (dense types,
    /// Q2_K, Q3_K, ...), which the backend dequantizes at load.
    pub fn of(t: GgmlDType) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.ggml() == t)
    }

    pub fn ggml(self) -> GgmlDType {
        match self {
            Self::Q4_0 => GgmlDType::Q4_0,
            Self::Q4_1 => GgmlDType::Q4_1,
            Self::Q5_0 => GgmlDType::Q5_0,
            Self::Q5_1 => GgmlDType::Q5_1,
            Self::Q8_0 => GgmlDType::Q8_0,
            Self::Q4K => GgmlDType::Q4K,
            Self::Q5K => GgmlDType::Q5K,
            Self::Q6K => GgmlDType::Q6K,
        }
    }

    /// Bytes of a `[rows, cols]` matrix in this format (`cols` a whole number of blocks).
    pub fn bytes(self, rows: usize, cols: usize) -> usize {
        let (qk, bytes) = self.block();
        rows * cols / qk * bytes
    }
}

/// A `[rows, cols]` matrix of `format` blocks, dequantized to f32 (candle's decoders).
pub fn dequantize(format: QFormat, blocks: &[u8], rows: usize, cols: usize) -> Result<Vec<f32>> {
    if blocks.len() != format.bytes(rows, cols) {
        return Err(Error::internal(format!("{format:?} matrix {rows}x{cols} of {} bytes", blocks.len())));
    }
    ggml_file::qtensor_from_ggml(format.ggml(), blocks, vec![rows, cols], &Device::Cpu)
        .and_then(|q| q.dequantize(&Device::Cpu))
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(Error::internal)
}
