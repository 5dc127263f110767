//! The CUDA model's step buffers (`Workspace`) and the sizes the engine decides for it
//! (`CudaSizing`).
//!
//! Invariant: `Workspace::sizes` is the one list of step-buffer sizes: `Workspace::new`
//! allocates it and `CudaSizing::workspace_bytes` plans it, so a plan equals a load.

use crate::dtype::Dt;
use crate::gpu::{DevBuf, Gpu, GEMM_ROWS};
use lmplex_core::Result;
use lmplex_model::ModelArgs;

/// Most bytes of attention partials (`out`, `max`, `sum` per row, head and partition).
const ATTN_SCRATCH: usize = 64 << 20;

/// Step buffers, sized for `rows` token rows and `logit_rows` logits rows.
pub(crate) struct Workspace {
    pub(crate) rows: usize,
    pub(crate) logit_rows: usize,
    pub(crate) meta: DevBuf,
    pub(crate) res: DevBuf,
    pub(crate) h: DevBuf,
    pub(crate) tmp: DevBuf,
    pub(crate) qkv: DevBuf,
    pub(crate) attn: DevBuf,
    pub(crate) gate_up: DevBuf,
    pub(crate) act: DevBuf,
    pub(crate) sel: DevBuf,
    pub(crate) logits: DevBuf,
    /// The picked ids of the logits rows (u32).
    pub(crate) argmax: DevBuf,
    /// The rows' draw parameters (`meta::pack_draws`).
    pub(crate) draws: DevBuf,
    pub(crate) part: DevBuf,
}

impl Workspace {
    /// Bytes of each buffer, in field order (`meta` .. `part`).
    pub(crate) fn sizes(a: &ModelArgs, dt: Dt, rows: usize, logit_rows: usize) -> [usize; 13] {
        let s = dt.size();
        let (qw, kw, hd) = (a.num_attention_heads * a.head_dim, a.num_key_value_heads * a.head_dim, a.head_dim);
        let per_row_attn = a.num_attention_heads * (hd + 2) * 4;
        [
            8 * (5 * rows + logit_rows) + 64 * 1024,
            rows * a.hidden_size * s,
            rows * a.hidden_size * s,
            rows * a.hidden_size * s,
            rows * (qw + 2 * kw) * s,
            rows * qw * s,
            rows * 2 * a.intermediate_size * s,
            rows * a.intermediate_size * s,
            logit_rows * a.hidden_size * s,
            logit_rows * a.vocab_size * 4,
            logit_rows * 4,
            crate::meta::draws_bytes(logit_rows),
            ATTN_SCRATCH.max(per_row_attn),
        ]
        .map(|b| b.max(1))
    }

    pub(crate) fn new(gpu: &Gpu, a: &ModelArgs, dt: Dt, rows: usize, logit_rows: usize) -> Result<Self> {
        let [meta, res, h, tmp, qkv, attn, gate_up, act, sel, logits, argmax, draws, part] =
            Self::sizes(a, dt, rows, logit_rows).map(|b| gpu.alloc(b));
        Ok(Self {
            rows,
            logit_rows,
            meta: meta?,
            res: res?,
            h: h?,
            tmp: tmp?,
            qkv: qkv?,
            attn: attn?,
            gate_up: gate_up?,
            act: act?,
            sel: sel?,
            logits: logits?,
            argmax: argmax?,
            draws: draws?,
            part: part?,
        })
    }

    pub(crate) fn bytes(&self) -> usize {
        [&self.meta, &self.res, &self.h, &self.tmp, &self.qkv, &self.attn, &self.gate_up, &self.act]
            .iter()
            .chain([&self.sel, &self.logits, &self.argmax, &self.draws, &self.part].iter())
            .map(|b| b.bytes)
            .sum()
    }
}

/// Sizes the engine decides: the KV pool, its warm tier and the most rows a step may hold.
#[derive(Debug, Clone, Copy)]
pub struct CudaSizing {
    pub num_blocks: usize,
    pub num_warm_blocks: usize,
    pub block_size: usize,
    pub max_num_batched_tokens: usize,
    pub max_num_seqs: usize,
    /// Never capture CUDA graphs (vLLM's `enforce_eager`).
    pub enforce_eager: bool,
    /// LoRA adapters kept on the device between steps (`max_loras`); 0 turns LoRA off.
    pub max_loras: usize,
}

impl CudaSizing {
    /// What `CudaModel::load` allocates for the step buffers plus cuBLAS's workspace (what
    /// `CudaModel::workspace_bytes` reports on a device), from the shapes alone.
    pub fn workspace_bytes(&self, a: &ModelArgs, dt: Dt) -> usize {
        let step: usize =
            Workspace::sizes(a, dt, tiles(self.max_num_batched_tokens), tiles(self.max_num_seqs)).iter().sum();
        step + crate::gpu::BLAS_WORKSPACE
    }
}

pub(crate) fn tiles(n: usize) -> usize {
    n.div_ceil(GEMM_ROWS).max(1) * GEMM_ROWS
}
