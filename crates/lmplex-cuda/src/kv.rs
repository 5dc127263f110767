//! The paged KV pool on the device and its warm tier in host memory.
//!
//! Layout (per layer, K then V): `[num_blocks * block_size, num_kv_heads, head_dim]` in the
//! backend's dtype (the CPU backend's V layout; its K is transposed within a block); one allocation holds all `2 * num_layers` buffers, buffer
//! `i` at `i * layer_bytes`. The warm tier mirrors it per buffer: `[2 * num_layers,
//! num_warm_blocks, block_bytes]`, a zeroed host allocation whose pages commit when first written.
//!
//! Invariant: swaps copy whole blocks of every layer, K and V, between the two; block ids out
//! of range are an error before anything is copied.

use crate::dtype::Dt;
use crate::gpu::{DevBuf, Gpu};
use lmplex_core::{Error, Result};

pub struct DeviceKv {
    buf: DevBuf,
    warm: Vec<u8>,
    pub num_layers: usize,
    pub num_blocks: usize,
    pub num_warm_blocks: usize,
    pub block_size: usize,
    /// Bytes of one block of one layer's K (or V).
    pub block_bytes: usize,
    layer_bytes: usize,
}

impl DeviceKv {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Gpu,
        dt: Dt,
        num_layers: usize,
        num_blocks: usize,
        num_warm_blocks: usize,
        block_size: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> Result<Self> {
        let block_bytes = block_size * num_kv_heads * head_dim * dt.size();
        let layer_bytes = num_blocks * block_bytes;
        let buf = gpu.alloc(2 * num_layers * layer_bytes)?;
        let warm_bytes = 2 * num_layers * num_warm_blocks * block_bytes;
        let mut warm = Vec::new();
        warm.try_reserve_exact(warm_bytes).map_err(|e| {
            Error::capacity(format!("cannot reserve {warm_bytes} bytes of host memory for the KV warm tier: {e}"))
        })?;
        warm.resize(warm_bytes, 0);
        Ok(Self { buf, warm, num_layers, num_blocks, num_warm_blocks, block_size, block_bytes, layer_bytes })
    }

    /// Device bytes of the pool.
    pub fn bytes(&self) -> usize {
        self.buf.bytes
    }

    pub fn k(&self, layer: usize) -> u64 {
        self.buf.at(2 * layer * self.layer_bytes)
    }

    pub fn v(&self, layer: usize) -> u64 {
        self.buf.at((2 * layer + 1) * self.layer_bytes)
    }

    fn check(pairs: &[(u32, u32)], from: usize, to: usize) -> Result<()> {
        match pairs.iter().find(|(f, t)| *f as usize >= from || *t as usize >= to) {
            Some(p) => Err(Error::internal(format!("KV block copy {p:?} out of range"))),
            None => Ok(()),
        }
    }

    fn warm_at(&self, buffer: usize, block: u32) -> usize {
        (buffer * self.num_warm_blocks + block as usize) * self.block_bytes
    }

    /// Copies device block `from` to warm block `to` for each pair.
    pub fn swap_out(&mut self, gpu: &Gpu, pairs: &[(u32, u32)]) -> Result<()> {
        Self::check(pairs, self.num_blocks, self.num_warm_blocks)?;
        for i in 0..2 * self.num_layers {
            for &(f, t) in pairs {
                let at = self.warm_at(i, t);
                let src = self.buf.at(i * self.layer_bytes + f as usize * self.block_bytes);
                gpu.dtoh(&mut self.warm[at..at + self.block_bytes], src)?;
            }
        }
        Ok(())
    }

    /// Copies warm block `from` to device block `to` for each pair.
    pub fn swap_in(&self, gpu: &Gpu, pairs: &[(u32, u32)]) -> Result<()> {
        Self::check(pairs, self.num_warm_blocks, self.num_blocks)?;
        for i in 0..2 * self.num_layers {
            for &(f, t) in pairs {
                let at = self.warm_at(i, f);
                let dst = self.buf.at(i * self.layer_bytes + t as usize * self.block_bytes);
                gpu.htod(dst, &self.warm[at..at + self.block_bytes])?;
            }
        }
        gpu.synchronize()
    }
}
