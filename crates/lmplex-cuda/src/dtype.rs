//! Storage dtypes of the GPU backend: f32, f16 and bf16, each with its kernel-name suffix, its
//! cuBLAS type and its host encoding.
//!
//! Invariant: `encode` rounds to nearest-even (the `half` crate), as the kernels' `from_f32`
//! does, so a value written by the host and one written by a kernel agree bit for bit.

use cudarc::cublas::sys::cudaDataType;
use lmplex_core::DType;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dt {
    F32,
    F16,
    Bf16,
}

impl Dt {
    /// The GPU dtype for a requested one: `auto` is bf16.
    pub fn from_config(d: DType) -> Self {
        match d {
            DType::Auto | DType::BF16 => Self::Bf16,
            DType::F16 => Self::F16,
            DType::F32 => Self::F32,
        }
    }

    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::Bf16 => 2,
        }
    }

    /// The suffix of a kernel instantiated for this type (`rope_bf16`).
    pub fn suffix(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
        }
    }

    /// The name `info()` reports (torch's).
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::F16 => "float16",
            Self::Bf16 => "bfloat16",
        }
    }

    pub fn cuda(self) -> cudaDataType {
        match self {
            Self::F32 => cudaDataType::CUDA_R_32F,
            Self::F16 => cudaDataType::CUDA_R_16F,
            Self::Bf16 => cudaDataType::CUDA_R_16BF,
        }
    }

    /// `x` in this type's little-endian bytes, rounded to nearest-even.
    pub fn encode(self, x: &[f32]) -> Vec<u8> {
        match self {
            Self::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
            Self::F16 => x.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect(),
            Self::Bf16 => x.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect(),
        }
    }

    /// The values of little-endian bytes of this type.
    pub fn decode(self, b: &[u8]) -> Vec<f32> {
        match self {
            Self::F32 => b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            Self::F16 => b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            Self::Bf16 => b.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_with_round_to_nearest_even_and_decodes_back() {
        let x = [1.0f32, -2.5, 1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, 65504.0];
        assert_eq!(Dt::F32.decode(&Dt::F32.encode(&x)), x);
        // bf16 keeps 8 significant bits: 1 + 1/256 is a tie and rounds to even (1.0), 1 + 3/256
        // rounds up to 1 + 4/256.
        assert_eq!(Dt::Bf16.decode(&Dt::Bf16.encode(&x)), [1.0, -2.5, 1.0, 1.0 + 4.0 / 256.0, 65536.0]);
        assert_eq!(Dt::F16.decode(&Dt::F16.encode(&x)), [1.0, -2.5, 1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, 65504.0]);
        assert_eq!(Dt::Bf16.encode(&x).len(), 10);
        assert_eq!(Dt::from_config(DType::Auto), Dt::Bf16);
    }
}
