//! The backend a model runs on: the CPU `Model` with its paged KV pool (f16 or f32, by
//! `kv_cache_dtype`), or the CUDA model with its device KV pool; loaded from one opened
//! checkpoint, driven by the step loop.
//!
//! Device choice: `crate::placement::place` (the plan's too); `device="cuda:N"` runs on GPU N or
//! fails with an `InvalidRequest` that says what is missing (driver, device, NVRTC, cuBLAS);
//! nothing falls back silently when CUDA was asked for.
//!
//! Invariants: both backends take the same `ForwardBatch` (built from the step's
//! `SchedulerOutput` by `forward_batch`, the one place that maps scheduler to model: neither
//! crate knows the other) and block ids from the same scheduler, and return the selected rows' logits in batch order; the front's `Memory` facts
//! are fixed at load, except the device's live usage, which is read when asked.

use crate::placement::{place_model, Placement};
use crate::report::RuntimeInfo;
use crate::sequence::Sequence;
use crate::sizing::{check_cuda_kv_dtype, cpu_kv_dtype, cuda_kv_dtype, cuda_sizing, KvSizing, BLOCK_SIZE};
use lmplex_core::{DType, Error, ModelConfig, Result, TokenId};
use lmplex_cuda::{CudaModel, Dt, Gpu, LiveBytes};
use lmplex_kv::manager::ReqId;
use lmplex_model::sample::pick::Pick;
use lmplex_model::{
    Checkpoint, CheckpointInfo, ForwardBatch, KvCache, LogitsSelect, Model, ModelArgs, SeqChunk, Tokenizer,
};
use lmplex_sched::SchedulerOutput;
use std::borrow::Cow;
use std::sync::Arc;

pub(crate) enum Runner {
    Cpu { model: Arc<Model>, kv: KvCache, warm: KvCache },
    Cuda(Box<CudaModel>),
}

/// Reads the device's (free, total) bytes.
pub(crate) type DeviceProbe = Arc<dyn Fn() -> Result<(usize, usize)> + Send + Sync>;

/// What the front reports in `memory()`.
pub(crate) struct Memory {
    pub weights: usize,
    /// Of `weights`, the routed experts of MoE layers.
    pub expert_weights: usize,
    pub other: usize,
    /// Step buffers on the device (CUDA only; `live` has them as they grow).
    pub workspace: usize,
    /// Reads the device's (free, total) bytes (CUDA only).
    pub device: Option<DeviceProbe>,
    /// The workspace and captured graphs' bytes as the model runs (CUDA only).
    pub live: Option<Arc<LiveBytes>>,
    /// A draft model's workspace and graphs' bytes as it runs (a draft on CUDA only); they
    /// count in `other`, with its weights and pool.
    pub draft_live: Option<Arc<LiveBytes>>,
}

pub(crate) struct Loaded {
    pub runner: Runner,
    pub tokenizer: Tokenizer,
    pub args: ModelArgs,
    pub max_positions: usize,
    pub checkpoint: CheckpointInfo,
    pub runtime: RuntimeInfo,
    pub sizing: KvSizing,
    pub memory: Memory,
}

/// Opens the config's checkpoint and loads it on the configured device.
pub(crate) fn load(config: &ModelConfig) -> Result<Loaded> {
    let path = config.checkpoint();
    let ckpt = lmplex_model::open(path, config.max_model_len)?;
    match place_model(config) {
        Placement::Cpu => load_cpu(config, ckpt),
        Placement::Cuda(ordinal) => load_cuda(config, ckpt, ordinal),
    }
}

fn load_cpu(config: &ModelConfig, mut ckpt: Checkpoint) -> Result<Loaded> {
    ckpt.src.set_dtype(config.dtype);
    let compute = ckpt.src.dtype();
    let kv_dtype = cpu_kv_dtype(config, ckpt.kv_dtype);
    let sizing = KvSizing::new(config, &ckpt.args, ckpt.max_positions, kv_dtype)?;
    let lmplex_model::LoadedModel { model, tokenizer, info, .. } = ckpt.into_cpu()?;
    let kv = model.new_kv_cache(sizing.num_blocks, BLOCK_SIZE, kv_dtype)?;
    let warm = model.new_kv_cache(sizing.num_swap_blocks, BLOCK_SIZE, kv_dtype)?;
    let runtime = RuntimeInfo {
        device: "cpu",
        // bfloat16 (asked for, or `auto` on a bf16 folder): prompt rows of dense matrices
        // multiply bf16 activations (`Matrix::dense`).
        compute_dtype: if compute == DType::BF16 { "bfloat16" } else { "float32" },
        kv_dtype: kv_dtype.name(),
        decode_weight_bytes: model.decode_weight_bytes(),
        gpu_name: None,
        cuda_arch: None,
    };
    let memory = Memory {
        weights: model.weight_bytes(),
        expert_weights: model.expert_weight_bytes(),
        other: model.other_bytes(),
        workspace: 0,
        device: None,
        live: None,
        draft_live: None,
    };
    let (args, max_positions) = (model.args.clone(), model.max_positions());
    Ok(Loaded {
        runner: Runner::Cpu { model: Arc::new(model), kv, warm },
        tokenizer,
        args,
        max_positions,
        checkpoint: info,
        runtime,
        sizing,
        memory,
    })
}

fn load_cuda(config: &ModelConfig, ckpt: Checkpoint, ordinal: u32) -> Result<Loaded> {
    if config.speculative.is_some() && !crate::sizing::cuda_speculative_on() {
        return Err(Error::invalid(
            "speculative decoding runs on the CPU backend; on CUDA it waits for a device run to confirm it \
             (set LMPLEX_CUDA_SPECULATIVE=1 to try it, or device=\"cpu\")",
        ));
    }
    let dt = Dt::from_config(config.dtype);
    check_cuda_kv_dtype(config, dt.name())?;
    let sizing = KvSizing::new(config, &ckpt.args, ckpt.max_positions, cuda_kv_dtype(dt.size()))?;
    let gpu = open_gpu(ordinal)?;
    let (name, arch) = (gpu.name.clone(), gpu.arch);
    let model = CudaModel::load(gpu, &ckpt, dt, cuda_sizing(config, &sizing))?;
    let probe = model.gpu.context().map(|ctx| -> DeviceProbe {
        Arc::new(move || {
            ctx.bind_to_thread().map_err(|e| Error::internal(format!("CUDA: {e:?}")))?;
            cudarc::driver::result::mem_get_info().map_err(|e| Error::internal(format!("CUDA: {e:?}")))
        })
    });
    let Checkpoint { args, tokenizer, max_positions, info, .. } = ckpt;
    let runtime = RuntimeInfo {
        device: "cuda",
        compute_dtype: dt.name(),
        kv_dtype: dt.name(),
        decode_weight_bytes: model.decode_weight_bytes(),
        gpu_name: Some(name),
        cuda_arch: Some(format!("sm_{arch}")),
    };
    let memory = Memory {
        weights: model.weight_bytes(),
        expert_weights: 0,
        other: 0,
        workspace: model.workspace_bytes(),
        device: probe,
        live: Some(model.live_bytes()),
        draft_live: None,
    };
    let runner = Runner::Cuda(Box::new(model));
    Ok(Loaded { runner, tokenizer, args, max_positions, checkpoint: info, runtime, sizing, memory })
}

/// CUDA device `ordinal`, or what `LMPLEX_CUDA_EXECUTOR` puts in its place: `counting`, no
/// device and no kernel work (`Gpu::counting()`), so the engine's own time per step is measured
/// on any machine (`lmplex bench --workloads gpu-model`); `host`, every kernel's CPU twin
/// (`Gpu::host()`), so the engine's CUDA paths run whole, slowly, in tests without a device.
pub(crate) fn open_gpu(ordinal: u32) -> Result<Gpu> {
    match std::env::var("LMPLEX_CUDA_EXECUTOR").as_deref() {
        Err(_) | Ok("") | Ok("device") => Gpu::open(ordinal),
        Ok("counting") => Ok(Gpu::counting()),
        Ok("host") => Ok(Gpu::host()),
        Ok(other) => Err(Error::invalid(format!(
            "LMPLEX_CUDA_EXECUTOR={other:?}: expected \"device\", \"counting\" or \"host\""
        ))),
    }
}

/// The forward pass over a step's scheduled chunks (prefill chunks and decodes alike), in
/// scheduling order; a chunk asks for its last row's logits when its request samples this step,
/// and for every row's when it is a prompt chunk of a request that wants prompt logprobs or a
/// decode with drafted tokens to verify.
/// `seq` gives a request's sequence: its adapter (`None`: the base) and its images' features.
pub(crate) fn forward_batch<'a>(
    out: &'a SchedulerOutput,
    seq: impl Fn(ReqId) -> Option<&'a Sequence>,
) -> ForwardBatch<'a> {
    let seqs = out
        .scheduled
        .iter()
        .map(|s| {
            let q = seq(s.id);
            SeqChunk {
                token_ids: &s.token_ids,
                start_pos: s.num_computed_tokens,
                block_table: &s.block_table,
                logits: match (s.all_logits || s.num_draft_tokens > 0, s.sample) {
                    (true, _) => LogitsSelect::All,
                    (false, true) => LogitsSelect::Last,
                    (false, false) => LogitsSelect::None,
                },
                num_prompt_tokens: s.num_prompt_tokens,
                lora: q.and_then(|q| q.lora.as_deref()),
                embeds: q.and_then(|q| q.embeds.as_deref()),
            }
        })
        .collect();
    ForwardBatch { seqs }
}

impl Runner {
    /// What a LoRA adapter is checked against: the model's adaptable projections and its layer
    /// count (`None` on CUDA unless LoRA is on there, `sizing::cuda_lora_on`).
    pub fn lora_base(&self) -> crate::lora::Base {
        match self {
            Self::Cpu { model, .. } => Some((model.lora_modules(), model.args.num_hidden_layers)),
            Self::Cuda(m) => m.lora_modules().map(|mods| (mods, m.args.num_hidden_layers)),
        }
    }

    /// The selected rows' logits, `[rows, vocab]` row-major, in batch order (on CUDA, borrowed
    /// from the host buffer the next step overwrites). On the CPU, `between_layers` runs after
    /// each layer (where the step may give the device way, `Turn::give_way`); a CUDA pass,
    /// queued on the device at once, has no such point.
    pub fn forward(&mut self, batch: &ForwardBatch, between_layers: &dyn Fn()) -> Result<Cow<'_, [f32]>> {
        match self {
            Self::Cpu { model, kv, .. } => model.forward_logits_between(batch, kv, between_layers).map(Cow::Owned),
            Self::Cuda(m) => m.forward(batch).map(Cow::Borrowed),
        }
    }

    /// The selected rows' final hidden states, `[rows, hidden]` after the final norm, in
    /// batch order (an embedding model's pass: no head); `between_layers` as in `forward`.
    /// The CPU backend only: an embedding model is placed on the CPU (`placement`).
    pub fn forward_hidden(&mut self, batch: &ForwardBatch, between_layers: &dyn Fn()) -> Result<Vec<f32>> {
        match self {
            Self::Cpu { model, kv, .. } => model.forward_hidden_between(batch, kv, between_layers),
            Self::Cuda(_) => Err(Error::invalid("embedding models (task = \"embed\") run on the CPU backend only")),
        }
    }

    /// The token of each selected row, picked with that row's `picks` (its logit edits, then
    /// the argmax or the seeded draw), in batch order: on CUDA on the device, so only the ids
    /// are copied back. `between_layers` as in `forward`.
    pub fn forward_pick(
        &mut self,
        batch: &ForwardBatch,
        picks: &[Pick],
        between_layers: &dyn Fn(),
    ) -> Result<Vec<TokenId>> {
        match self {
            Self::Cpu { model, kv, .. } => {
                let logits = model.forward_logits_between(batch, kv, between_layers)?;
                let rows = logits.chunks_exact(model.args.vocab_size);
                if rows.len() != picks.len() {
                    return Err(lmplex_core::Error::internal("one pick per logits row expected"));
                }
                Ok(rows.zip(picks).map(|(row, p)| p.pick(row)).collect())
            }
            Self::Cuda(m) => m.forward_pick(batch, picks),
        }
    }

    /// Copies blocks out to the warm tier, then in from it.
    pub fn swap(&mut self, out: &[(u32, u32)], into: &[(u32, u32)]) -> Result<()> {
        match self {
            Self::Cpu { kv, warm, .. } => {
                kv.copy_blocks_to(warm, out)?;
                warm.copy_blocks_to(kv, into)
            }
            Self::Cuda(m) => {
                let m = &mut **m;
                m.kv.swap_out(&m.gpu, out)?;
                m.kv.swap_in(&m.gpu, into)
            }
        }
    }
}
