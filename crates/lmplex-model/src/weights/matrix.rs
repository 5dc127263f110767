//! Weight matrices as the forward pass multiplies them (`Matrix`: quantized or dense) and
//! projections (`Linear`: a matrix and an optional bias).
//!
//! Invariant: a row's product depends only on that row and its kind (`RowKinds`: prompt rows
//! take the prompt kernel, generated rows the decode kernel), never on the batch around it.
//! Dense matrices are stored as `DenseWeight` panels in the checkpoint's element type, or in
//! the `dtype` the model was loaded with (`Matrix::dense`).

use crate::dense::{Activations, DenseWeight};
use crate::kv::RowKinds;
use crate::qmatmul::QWeight;
use candle_core::{DType, Tensor};
use lmplex_core::{Error, Result};
use std::sync::Arc;

/// A weight matrix `[out, in]`: quantized (`QWeight`) or dense f32; both multiply
/// batch-invariantly.
#[derive(Clone)]
pub enum Matrix {
    /// A GGUF quantized tensor, kept in its blocks (or repacked for the integer kernels).
    Quantized(Arc<QWeight>),
    /// A dense f32, bf16 or f16 matrix (safetensors, F32/F16/BF16 GGUF tensors, or
    /// `LMPLEX_DEQUANTIZE=1`).
    Dense(Arc<DenseWeight>),
}

impl Matrix {
    /// `(out, in)`: the matrix's rows and columns.
    pub fn dims(&self) -> (usize, usize) {
        match self {
            Self::Quantized(q) => q.dims(),
            Self::Dense(d) => d.dims(),
        }
    }

    /// `x: [m, in]` row-major -> `[m, out]` row-major; prompt rows take the prompt kernel and
    /// generated rows the decode kernel (`kinds`, one per row; `QWeight::matmul_prompt`,
    /// `DenseWeight::matmul_prompt`).
    pub fn matmul_rows(&self, x: &[f32], m: usize, kinds: &RowKinds) -> Vec<f32> {
        let (n, k) = self.dims();
        debug_assert_eq!((x.len(), kinds.len()), (m * k, m));
        let mul = |x: &[f32], m: usize, prompt: bool| match (self, prompt) {
            (Self::Quantized(q), true) => q.matmul_prompt(x, m),
            (Self::Quantized(q), false) => q.matmul(x, m),
            (Self::Dense(d), true) => d.matmul_prompt(x, m),
            (Self::Dense(d), false) => d.matmul(x, m),
        };
        match kinds.num_prompt() {
            0 => mul(x, m, false),
            p if p == m => mul(x, m, true),
            p => {
                // Mixed: each kind's rows gathered, multiplied apart, and put back in place.
                let pick = |prompt: bool| -> Vec<f32> {
                    (0..m)
                        .filter(|&i| kinds.is_prompt(i) == prompt)
                        .flat_map(|i| &x[i * k..(i + 1) * k])
                        .copied()
                        .collect()
                };
                let (yp, yg) = (mul(&pick(true), p, true), mul(&pick(false), m - p, false));
                let (mut ip, mut ig) = (yp.chunks_exact(n), yg.chunks_exact(n));
                let mut out = Vec::with_capacity(m * n);
                for i in 0..m {
                    let row = if kinds.is_prompt(i) { ip.next() } else { ig.next() };
                    out.extend_from_slice(row.expect("one output row per input row of each kind"));
                }
                out
            }
        }
    }

    /// Rows `ids` of the matrix (embedding lookup) -> `[ids.len(), in]` row-major. Ids are
    /// checked against the vocabulary at submit; one outside it here is an internal error.
    pub fn rows(&self, ids: &[u32]) -> Result<Vec<f32>> {
        let (n, k) = self.dims();
        let mut out = vec![0f32; ids.len() * k];
        for (o, &id) in out.chunks_exact_mut(k).zip(ids) {
            if id as usize >= n {
                return Err(Error::internal(format!("token id {id} is outside the vocabulary ({n})")));
            }
            match self {
                Self::Quantized(q) => q.dequantize_row(id as usize, o),
                Self::Dense(w) => w.row_into(id as usize, o),
            }
        }
        Ok(out)
    }

    /// Bytes the matrix takes in memory.
    pub fn size_in_bytes(&self) -> usize {
        match self {
            Self::Quantized(q) => q.size_in_bytes(),
            Self::Dense(d) => d.size_in_bytes(),
        }
    }

    /// A dense matrix from `t`: in `t`'s element type for `dtype = Auto` (bf16 and f16 kept,
    /// other types widened to f32), else cast to `dtype` (round to nearest even). `bfloat16`
    /// also rounds prompt rows' activations to bf16 (`Activations::Bf16`: one AMX pass, the
    /// precision of torch's bf16 path); the other dtypes multiply in f32 precision.
    pub(crate) fn dense(t: Tensor, dtype: lmplex_core::DType) -> candle_core::Result<Self> {
        use lmplex_core::DType as Want;
        let (n, k) = t.dims2()?;
        let t = match dtype {
            Want::Auto => t,
            Want::BF16 => t.to_dtype(DType::BF16)?,
            Want::F16 => t.to_dtype(DType::F16)?,
            Want::F32 => t.to_dtype(DType::F32)?,
        };
        let t = t.flatten_all()?;
        let w = match t.dtype() {
            DType::BF16 => {
                let bits: Vec<u16> = t.to_vec1::<half::bf16>()?.into_iter().map(half::bf16::to_bits).collect();
                let act = if dtype == Want::BF16 { Activations::Bf16 } else { Activations::Split };
                DenseWeight::from_bf16(n, k, &bits).with_activations(act)
            }
            DType::F16 => {
                let bits: Vec<u16> = t.to_vec1::<half::f16>()?.into_iter().map(half::f16::to_bits).collect();
                DenseWeight::from_f16(n, k, &bits)
            }
            _ => DenseWeight::new(n, k, t.to_dtype(DType::F32)?.to_vec1::<f32>()?),
        };
        Ok(Self::Dense(Arc::new(w)))
    }
}

/// A projection: matrix plus optional bias `[out]`.
#[derive(Clone)]
pub struct Linear {
    pub(crate) weight: Matrix,
    pub(crate) bias: Option<Vec<f32>>,
}

impl From<Matrix> for Linear {
    fn from(weight: Matrix) -> Self {
        Self { weight, bias: None }
    }
}

impl Linear {
    /// `x: [m, in]` row-major -> `[m, out]`, bias added; `kinds` picks each row's kernel.
    pub fn forward_rows(&self, x: &[f32], m: usize, kinds: &RowKinds) -> Vec<f32> {
        let mut y = self.weight.matmul_rows(x, m, kinds);
        if let Some(b) = &self.bias {
            crate::rowops::add_bias(&mut y, b);
        }
        y
    }

    /// Bytes the weights and bias take in memory.
    pub fn size_in_bytes(&self) -> usize {
        self.weight.size_in_bytes() + self.bias.as_ref().map_or(0, |b| b.len() * 4)
    }

    /// One projection whose output rows are those of `parts` in turn (q, k and v; gate and
    /// up), when their weights share kind, format and input width and all or none have a bias.
    /// A row's output is computed as in its part, so results do not change; the batch is
    /// quantized once and the thread team meets once instead of once per part.
    pub fn concat(parts: &[&Linear]) -> Option<Linear> {
        // Every part's matrix as `T` (`pick`), or None if one is of the other kind.
        fn all<'a, T>(parts: &[&'a Linear], pick: impl Fn(&'a Matrix) -> Option<&'a T>) -> Option<Vec<&'a T>> {
            parts.iter().map(|p| pick(&p.weight)).collect()
        }
        let weight = match parts.first()?.weight {
            Matrix::Quantized(_) => {
                let qs = all(parts, |m| if let Matrix::Quantized(q) = m { Some(&**q) } else { None })?;
                Matrix::Quantized(Arc::new(QWeight::concat(&qs)?))
            }
            Matrix::Dense(_) => {
                let ds = all(parts, |m| if let Matrix::Dense(d) = m { Some(&**d) } else { None })?;
                Matrix::Dense(Arc::new(DenseWeight::concat(&ds)?))
            }
        };
        let bias = match parts.iter().filter(|p| p.bias.is_some()).count() {
            0 => None,
            c if c == parts.len() => Some(parts.iter().flat_map(|p| p.bias.iter().flatten().copied()).collect()),
            _ => return None,
        };
        Some(Linear { weight, bias })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::Device;

    /// A batch mixing prompt and generated rows gives each row its kind's kernel result.
    #[test]
    fn mixed_row_kinds_take_their_own_kernels() {
        let (n, k, m) = (40, 256, 6);
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
        let x: Vec<f32> = (0..m * k).map(|i| ((i * 104729) % 997) as f32 / 498.0 - 1.0).collect();
        let wt = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        let q = QWeight::from_qtensor(&QTensor::quantize(&wt, GgmlDType::Q5_0).unwrap()).unwrap();
        let mat = Matrix::Quantized(Arc::new(q));
        let flags = vec![true, false, false, true, true, false];
        let y = mat.matmul_rows(&x, m, &RowKinds::new(flags.clone()));
        for (i, &p) in flags.iter().enumerate() {
            let alone = mat.matmul_rows(&x[i * k..(i + 1) * k], 1, &RowKinds::uniform(1, p));
            assert_eq!(alone, y[i * n..(i + 1) * n], "row {i} (prompt: {p})");
        }
    }
}
