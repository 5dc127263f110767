//! How much memory an engine reserves, decided before anything is allocated.
//!
//! The KV pool holds `kv_cache_bytes / bytes_per_block` blocks, or enough for
//! `max_model_concurrency` sequences of `max_model_len` tokens; the swap space (the warm tier
//! preempted requests swap to) holds `kv_swap_bytes / bytes_per_block` blocks, by default as many bytes as the pool up to 4 GiB.
//! `Engine::new` and the `ModelHost`'s budget check use the same numbers, so a model admitted
//! by its plan takes what the plan said (weights within the estimate of `lmplex_model::plan`).
//!
//! KV element type: on the CPU, `kv_cache_dtype` or for `auto` the checkpoint's choice
//! (`lmplex_model::auto_kv_dtype`: f32 for an all-f32 checkpoint, else f16), int8 blocks
//! counting their scales; on CUDA the compute dtype, and any other explicit `kv_cache_dtype`
//! is an error.

use crate::placement::{place_model, Placement};
use lmplex_core::{DType, Error, KvCacheDtype, ModelConfig, Result};
use lmplex_cuda::CudaSizing;
use lmplex_model::{KvCache, KvDtype, ModelArgs, ModelPlan};

/// Tokens per KV block (vLLM's default).
pub const BLOCK_SIZE: usize = 16;
/// Largest default swap space (vLLM's default `swap_space`).
pub const DEFAULT_MAX_KV_SWAP_BYTES: usize = 4 << 30;

/// How many KV blocks an engine reserves, hot and warm, and what one block costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvSizing {
    /// Bytes of one block, K and V of every layer (`BLOCK_SIZE` tokens).
    pub bytes_per_block: usize,
    /// Blocks in the KV pool.
    pub num_blocks: usize,
    /// Blocks in the swap space (host memory).
    pub num_swap_blocks: usize,
}

impl KvSizing {
    /// `kv`: what the cache stores (`cpu_kv_dtype` on the CPU; on CUDA, `cuda_kv_dtype`).
    pub fn new(config: &ModelConfig, args: &ModelArgs, max_positions: usize, kv: KvDtype) -> Result<Self> {
        let (layers, heads, hd) = (args.num_hidden_layers, args.num_key_value_heads, args.head_dim);
        let bytes_per_block = KvCache::bytes_per_block(layers, BLOCK_SIZE, heads, hd, kv);
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
        Ok(Self { bytes_per_block, num_blocks, num_swap_blocks: swap / bytes_per_block })
    }

    /// Bytes of the KV pool.
    pub fn kv_cache_bytes(&self) -> usize {
        self.num_blocks * self.bytes_per_block
    }
    /// Bytes of the swap space (the warm tier), committed only as it is used.
    pub fn kv_swap_bytes(&self) -> usize {
        self.num_swap_blocks * self.bytes_per_block
    }
}

/// The CPU KV cache's element type: the config's; for `auto`, float32 with `dtype=float32`,
/// float16 with `dtype=bfloat16|float16`, else the checkpoint's (`auto`).
pub fn cpu_kv_dtype(config: &ModelConfig, auto: KvDtype) -> KvDtype {
    match config.kv_cache_dtype {
        KvCacheDtype::Auto => match config.dtype {
            DType::Auto => auto,
            DType::F32 => KvDtype::F32,
            DType::BF16 | DType::F16 => KvDtype::F16,
        },
        KvCacheDtype::F32 => KvDtype::F32,
        KvCacheDtype::F16 => KvDtype::F16,
        KvCacheDtype::Int8 => KvDtype::I8,
    }
}

/// The CPU KV dtype whose block size equals the CUDA cache's, which holds the compute dtype
/// of `elem_bytes` bytes (f16 also stands for bf16).
pub fn cuda_kv_dtype(elem_bytes: usize) -> KvDtype {
    if elem_bytes == 4 {
        KvDtype::F32
    } else {
        KvDtype::F16
    }
}

/// On CUDA the KV cache holds the compute dtype (`dtype_name`): `kv_cache_dtype` must be
/// `auto` or that dtype.
pub fn check_cuda_kv_dtype(config: &ModelConfig, dtype_name: &str) -> Result<()> {
    let asked = match config.kv_cache_dtype {
        KvCacheDtype::Auto => return Ok(()),
        KvCacheDtype::F32 => KvDtype::F32.name(),
        KvCacheDtype::F16 => KvDtype::F16.name(),
        KvCacheDtype::Int8 => KvDtype::I8.name(),
    };
    if asked == dtype_name {
        return Ok(());
    }
    if config.kv_cache_dtype == KvCacheDtype::Int8 {
        return Err(Error::invalid(format!(
            "kv_cache_dtype=int8 is CPU only; on CUDA the KV cache holds the compute dtype ({dtype_name})"
        )));
    }
    Err(Error::invalid(format!(
        "kv_cache_dtype={asked} is not available on CUDA, where the KV cache holds the compute dtype \
         ({dtype_name}); leave it auto or set dtype={asked}"
    )))
}

/// What loading `config` will reserve, from its checkpoint's headers alone.
#[derive(Debug, Clone)]
pub struct EnginePlan {
    /// Where it will run (`crate::placement::place`).
    pub placement: Placement,
    /// The checkpoint's shapes, context and weight bytes.
    pub model: ModelPlan,
    /// The KV pool and swap space it will reserve.
    pub kv: KvSizing,
    /// The CUDA backend's step buffers and cuBLAS workspace (0 on the CPU).
    pub workspace_bytes: usize,
    /// Its LoRA adapters held at once: the `max_loras` largest of `lora_modules`.
    pub lora_bytes: usize,
    /// Its draft model (speculative decoding's `draft` method), on its device: the
    /// draft's weights and a KV pool of as many blocks as the target's (`draft_plan_bytes`).
    pub draft_bytes: usize,
}

/// Bytes `config`'s LoRA adapters take held: the `max_loras` largest (`lora::planned_bytes`,
/// read from their headers).
pub fn lora_plan_bytes(config: &ModelConfig) -> Result<usize> {
    let mut sizes = config
        .lora_modules
        .iter()
        .map(|(name, path)| {
            lmplex_model::lora::planned_bytes(std::path::Path::new(path))
                .map_err(|e| e.with_context(&format!("LoRA adapter '{name}'")))
        })
        .collect::<Result<Vec<usize>>>()?;
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    Ok(sizes.iter().take(config.max_loras).sum())
}

/// Bytes `config`'s draft model takes beside a target of `num_blocks` KV blocks on
/// `placement` (0 without one): its weights, its KV pool of `num_blocks` blocks and on CUDA its
/// workspace (`draft_cuda_sizing`), read from its headers (`lmplex_model::plan`), as
/// `DraftModel::load` sizes them.
pub fn draft_plan_bytes(config: &ModelConfig, placement: Placement, num_blocks: usize) -> Result<usize> {
    let Some(path) = config.speculative.as_ref().and_then(|s| s.model.as_deref()) else { return Ok(0) };
    let path = std::path::Path::new(path);
    let draft = |e: Error| e.with_context("speculative: the draft model");
    let a = |plan: &ModelPlan| (plan.args.num_hidden_layers, plan.args.num_key_value_heads, plan.args.head_dim);
    match placement {
        Placement::Cpu => {
            let plan = lmplex_model::plan(path, config.max_model_len, config.dtype).map_err(draft)?;
            let (layers, heads, hd) = a(&plan);
            let per_block =
                KvCache::bytes_per_block(layers, BLOCK_SIZE, heads, hd, cpu_kv_dtype(config, plan.kv_dtype));
            Ok(plan.weight_bytes + num_blocks * per_block)
        }
        Placement::Cuda(_) => {
            let plan = lmplex_model::plan(path, config.max_model_len, DType::Auto).map_err(draft)?;
            let dt = lmplex_cuda::Dt::from_config(config.dtype);
            let src = lmplex_model::weight_source(path, &plan.args).map_err(draft)?;
            let weights = lmplex_cuda::weights::planned_bytes(&plan.args, &src, dt);
            let (layers, heads, hd) = a(&plan);
            let per_block = KvCache::bytes_per_block(layers, BLOCK_SIZE, heads, hd, cuda_kv_dtype(dt.size()));
            let workspace = draft_cuda_sizing(config, num_blocks, BLOCK_SIZE).workspace_bytes(&plan.args, dt);
            Ok(weights + num_blocks * per_block + workspace)
        }
    }
}

/// The CUDA backend's sizes for `config`'s draft model: `num_blocks` KV blocks, no warm tier
/// (a preempted request's draft state is dropped, never swapped) and no adapters; passes of the
/// target's sizes.
pub fn draft_cuda_sizing(config: &ModelConfig, num_blocks: usize, block_size: usize) -> CudaSizing {
    CudaSizing {
        num_blocks,
        num_warm_blocks: 0,
        block_size,
        max_num_batched_tokens: config.batched_tokens(),
        max_num_seqs: config.max_model_concurrency,
        enforce_eager: config.enforce_eager,
        max_loras: 0,
    }
}

impl EnginePlan {
    /// Sizes what `Engine::new` would reserve, from `config` and its checkpoint's headers.
    pub fn new(config: &ModelConfig) -> Result<Self> {
        let path = config.checkpoint();
        config.validate()?;
        let placement = place_model(config);
        let dense = if placement == Placement::Cpu { config.dtype } else { DType::Auto };
        let mut model = lmplex_model::plan(path, config.max_model_len, dense)?;
        match placement {
            // The CUDA backend holds matrices in the blocks its kernels read as they are, and
            // every other weight and the KV cache in its dtype.
            Placement::Cuda(_) => {
                let dt = lmplex_cuda::Dt::from_config(config.dtype);
                check_cuda_kv_dtype(config, dt.name())?;
                let src = lmplex_model::weight_source(path, &model.args)?;
                model.weight_bytes = lmplex_cuda::weights::planned_bytes(&model.args, &src, dt);
                let kv = KvSizing::new(config, &model.args, model.max_positions, cuda_kv_dtype(dt.size()))?;
                let workspace_bytes = cuda_sizing(config, &kv).workspace_bytes(&model.args, dt);
                let (lora_bytes, draft_bytes) =
                    (lora_plan_bytes(config)?, draft_plan_bytes(config, placement, kv.num_blocks)?);
                Ok(Self { placement, model, kv, workspace_bytes, lora_bytes, draft_bytes })
            }
            Placement::Cpu => {
                let kv = KvSizing::new(config, &model.args, model.max_positions, cpu_kv_dtype(config, model.kv_dtype))?;
                let (lora_bytes, draft_bytes) =
                    (lora_plan_bytes(config)?, draft_plan_bytes(config, placement, kv.num_blocks)?);
                Ok(Self { placement, model, kv, workspace_bytes: 0, lora_bytes, draft_bytes })
            }
        }
    }

    /// Bytes on the model's device: weights, the KV pool, the workspace, the adapters held and
    /// the draft model (the warm tier is host memory).
    pub fn device_bytes(&self) -> usize {
        self.model.weight_bytes + self.kv.kv_cache_bytes() + self.workspace_bytes + self.lora_bytes + self.draft_bytes
    }
}

/// Whether LoRA adapters run on the CUDA backend: only under `LMPLEX_CUDA_LORA=1` until a
/// device run confirms the path (the emulator checks it on every commit).
pub fn cuda_lora_on() -> bool {
    std::env::var("LMPLEX_CUDA_LORA").is_ok_and(|v| v == "1")
}

/// Whether speculative decoding may run on the CUDA backend (`LMPLEX_CUDA_SPECULATIVE=1`):
/// off until a device run confirms its verification steps; a model asking for it on CUDA
/// otherwise fails to load, saying so.
pub fn cuda_speculative_on() -> bool {
    std::env::var("LMPLEX_CUDA_SPECULATIVE").is_ok_and(|v| v == "1")
}

/// The CUDA backend's sizes for `config` with the KV pool `kv`.
pub fn cuda_sizing(config: &ModelConfig, kv: &KvSizing) -> CudaSizing {
    CudaSizing {
        num_blocks: kv.num_blocks,
        num_warm_blocks: kv.num_swap_blocks,
        block_size: BLOCK_SIZE,
        max_num_batched_tokens: config.batched_tokens(),
        max_num_seqs: config.max_model_concurrency,
        enforce_eager: config.enforce_eager,
        max_loras: if cuda_lora_on() { config.max_loras } else { 0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_dtype_follows_the_config_then_the_checkpoint() {
        let mut c = ModelConfig::new("m");
        assert_eq!(cpu_kv_dtype(&c, KvDtype::F16), KvDtype::F16);
        assert_eq!(cpu_kv_dtype(&c, KvDtype::F32), KvDtype::F32);
        assert!(check_cuda_kv_dtype(&c, "bfloat16").is_ok());
        c.kv_cache_dtype = KvCacheDtype::F32;
        assert_eq!(cpu_kv_dtype(&c, KvDtype::F16), KvDtype::F32);
        assert!(check_cuda_kv_dtype(&c, "float32").is_ok());
        let e = check_cuda_kv_dtype(&c, "bfloat16").unwrap_err().to_string();
        assert!(e.contains("kv_cache_dtype=float32") && e.contains("dtype=float32"), "{e}");
        c.kv_cache_dtype = KvCacheDtype::F16;
        assert_eq!(cpu_kv_dtype(&c, KvDtype::F32), KvDtype::F16);
        c.kv_cache_dtype = KvCacheDtype::parse("int8").unwrap();
        assert_eq!(cpu_kv_dtype(&c, KvDtype::F32), KvDtype::I8);
        let e = check_cuda_kv_dtype(&c, "bfloat16").unwrap_err().to_string();
        assert!(e.contains("kv_cache_dtype=int8"), "{e}");
    }

    /// An int8 block costs a quarter of f32's values plus one f32 scale per token, head, 32
    /// dimensions and K or V: for head_dim 64, (64 + 8) / (2 * 64) of f16's bytes.
    #[test]
    fn int8_blocks_count_their_scales() {
        let (l, h, d) = (30, 3, 64);
        let f16 = KvCache::bytes_per_block(l, BLOCK_SIZE, h, d, KvDtype::F16);
        let i8 = KvCache::bytes_per_block(l, BLOCK_SIZE, h, d, KvDtype::I8);
        assert_eq!(f16, 2 * l * BLOCK_SIZE * h * d * 2);
        assert_eq!(i8, 2 * l * BLOCK_SIZE * h * (d + 8));
    }
}
