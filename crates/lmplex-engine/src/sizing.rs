//! How much memory an engine reserves, decided before anything is allocated.
//!
//! The KV pool holds `kv_cache_bytes / bytes_per_block` blocks, or enough for
//! `max_model_concurrency` sequences of `max_model_len` tokens; the warm tier holds
//! `kv_swap_bytes / bytes_per_block` blocks, by default as many bytes as the pool up to 4 GiB.
//! `Engine::new` and the `ModelHost`'s budget check use the same numbers, so a model admitted
//! by its plan takes what the plan said (weights within the estimate of `lmplex_model::plan`).

use lmplex_core::{DeviceKind, Error, ModelConfig, Result};
use lmplex_model::{KvCache, ModelArgs, ModelPlan};
use std::path::Path;

/// Tokens per KV block (vLLM's default).
pub const BLOCK_SIZE: usize = 16;
/// Largest default warm tier (vLLM's default `swap_space`).
pub const DEFAULT_MAX_KV_SWAP_BYTES: usize = 4 << 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvSizing {
    pub bytes_per_block: usize,
    pub num_blocks: usize,
    pub num_warm_blocks: usize,
}

impl KvSizing {
    /// `elem_bytes`: bytes of one K or V value (4 on the CPU, the dtype's size on CUDA).
    pub fn new(config: &ModelConfig, args: &ModelArgs, max_positions: usize, elem_bytes: usize) -> Result<Self> {
        let bytes_per_block =
            KvCache::bytes_per_block(args.num_hidden_layers, BLOCK_SIZE, args.num_key_value_heads, args.head_dim) / 4
                * elem_bytes;
        let num_blocks = match config.kv_cache_bytes {
            Some(b) => b / bytes_per_block,
            None => max_positions.div_ceil(BLOCK_SIZE) * config.max_model_concurrency,
        };
        if num_blocks == 0 {
            return Err(Error::invalid(format!(
                "kv_cache_bytes={} is smaller than one KV block of this model ({bytes_per_block} bytes)",
                config.kv_cache_bytes.unwrap_or(0)
            )));
        }
        let swap = config.kv_swap_bytes.unwrap_or((num_blocks * bytes_per_block).min(DEFAULT_MAX_KV_SWAP_BYTES));
        Ok(Self { bytes_per_block, num_blocks, num_warm_blocks: swap / bytes_per_block })
    }

    pub fn kv_cache_bytes(&self) -> usize {
        self.num_blocks * self.bytes_per_block
    }
    pub fn kv_swap_bytes(&self) -> usize {
        self.num_warm_blocks * self.bytes_per_block
    }
}

/// What loading `config` from `path` will reserve, from the checkpoint's headers alone.
#[derive(Debug, Clone)]
pub struct EnginePlan {
    pub model: ModelPlan,
    pub kv: KvSizing,
}

impl EnginePlan {
    pub fn new(config: &ModelConfig, path: &Path) -> Result<Self> {
        config.validate()?;
        let mut model = lmplex_model::plan(path, config.max_model_len)?;
        let elem = match config.device {
            // The CUDA backend holds every weight and KV value in its dtype.
            DeviceKind::Cuda => {
                let size = lmplex_cuda::Dt::from_config(config.dtype).size();
                model.weight_bytes = model.args.num_parameters() * size;
                size
            }
            DeviceKind::Cpu | DeviceKind::Auto => 4,
        };
        let kv = KvSizing::new(config, &model.args, model.max_positions, elem)?;
        Ok(Self { model, kv })
    }

    /// Bytes on the model's device: weights and the KV pool (the warm tier is host memory).
    pub fn device_bytes(&self) -> usize {
        self.model.weight_bytes + self.kv.kv_cache_bytes()
    }
}
