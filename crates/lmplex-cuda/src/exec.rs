//! The executors' shared vocabulary: a kernel argument (`Arg`), a driver error as lmplex's
//! (`de`), the choice of GEMM path (`GemmKind`), of the fused kernels (`fused_from_env`) and of
//! the tensor-core attention (`tensor_attention_from_env`). A leaf: it imports nothing of this crate,
//! so the device, the host executors and the launch code all build on it without importing
//! each other.

use cudarc::driver::DriverError;
use lmplex_core::{Error, Result};

/// A kernel argument: a device address, an `int` or a `float`.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    P(u64),
    I(i32),
    F(f32),
}

/// A CUDA driver error as lmplex's `Internal` error.
pub(crate) fn de(e: DriverError) -> Error {
    Error::internal(format!("CUDA: {e:?}"))
}

/// How matrices multiply a batch (`crate::mat`'s header).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GemmKind {
    #[default]
    Vendor,
    Tiles,
}

impl GemmKind {
    /// The environment's choice: `LMPLEX_CUDA_GEMM` = `vendor` (or unset) or `tiles`.
    pub fn from_env() -> Result<Self> {
        match std::env::var("LMPLEX_CUDA_GEMM").as_deref() {
            Err(_) | Ok("") | Ok("vendor") => Ok(Self::Vendor),
            Ok("tiles") => Ok(Self::Tiles),
            Ok(other) => Err(Error::invalid(format!("LMPLEX_CUDA_GEMM={other:?}: expected \"vendor\" or \"tiles\""))),
        }
    }
}

/// The environment's choice of the fused kernels (`forward.rs`'s header): `LMPLEX_CUDA_FUSED` =
/// `1` turns them on, `0` (or unset) leaves them off, as they stay until a device run confirms
/// them.
pub fn fused_from_env() -> Result<bool> {
    match std::env::var("LMPLEX_CUDA_FUSED").as_deref() {
        Err(_) | Ok("") | Ok("0") => Ok(false),
        Ok("1") => Ok(true),
        Ok(other) => Err(Error::invalid(format!("LMPLEX_CUDA_FUSED={other:?}: expected \"0\" or \"1\""))),
    }
}

/// The environment's choice of the attention's first pass (`forward.rs`'s header):
/// `LMPLEX_CUDA_ATTENTION` = `tensor` runs it on the tensor cores, `cuda-cores` (or unset) on the
/// CUDA cores, as it stays until a device run confirms the tensor cores.
pub fn tensor_attention_from_env() -> Result<bool> {
    match std::env::var("LMPLEX_CUDA_ATTENTION").as_deref() {
        Err(_) | Ok("") | Ok("cuda-cores") => Ok(false),
        Ok("tensor") => Ok(true),
        Ok(other) => {
            Err(Error::invalid(format!("LMPLEX_CUDA_ATTENTION={other:?}: expected \"cuda-cores\" or \"tensor\"")))
        }
    }
}
