//! Host memory the device's results are copied into ([`HostBuf`]), and [`Gpu::host_buf`].
//!
//! Invariant: on a device the memory is page-locked and zeroed before anything reads it; the
//! host executors get plain zeroed memory.

use super::{de, Exec, Gpu};
use cudarc::driver::PinnedHostSlice;
use lmplex_core::{Error, Result};

/// Host memory the device copies into: page-locked on a device (a copy at full bus speed, with no
/// page faults), plain memory on the host executors.
pub enum HostBuf {
    Pinned(PinnedHostSlice<f32>),
    Plain(Vec<f32>),
}

impl HostBuf {
    pub fn len(&self) -> usize {
        match self {
            Self::Pinned(p) => p.len(),
            Self::Plain(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn as_slice(&self) -> Result<&[f32]> {
        match self {
            Self::Pinned(p) => p.as_slice().map_err(de),
            Self::Plain(v) => Ok(v),
        }
    }

    pub fn as_mut_slice(&mut self) -> Result<&mut [f32]> {
        match self {
            Self::Pinned(p) => p.as_mut_slice().map_err(de),
            Self::Plain(v) => Ok(v),
        }
    }
}

impl Gpu {
    /// `len` zeroed f32s of host memory for copies from the device ([`HostBuf`]).
    pub fn host_buf(&self, len: usize) -> Result<HostBuf> {
        let Exec::Cuda(c) = &self.exec else { return Ok(HostBuf::Plain(vec![0.0; len])) };
        // SAFETY: the memory is zeroed below before anything reads it. Flags 0: cached memory
        // (write-combined memory would make the host's reads of the logits slow).
        let mut p = unsafe { c.dev.ctx.alloc_pinned_with_flags::<f32>(len.max(1), 0) }
            .map_err(|e| Error::capacity(format!("CUDA: cannot allocate {len} f32s of pinned host memory: {e:?}")))?;
        p.as_mut_slice().map_err(de)?.fill(0.0);
        Ok(HostBuf::Pinned(p))
    }
}
