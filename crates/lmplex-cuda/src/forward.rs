//! `CudaModel`: the decoder-only transformer's forward pass on the device, the CPU `Model`'s
//! twin (same families, same `ForwardBatch`, same KV layout), built from lmplex-kernels and
//! cuBLAS GEMMs.
//!
//! One step: upload the batch's packed metadata (`meta`), gather embeddings, then per layer:
//! fused residual-add + RMSNorm -> qkv GEMM (+ bias) -> q/k head norms (Qwen3) -> RoPE in place
//! -> KV write through the slot mapping -> paged attention (split-K partitions, in row chunks
//! that bound its scratch) -> o GEMM -> add + norm -> gate_up GEMM -> SiLU x up -> down GEMM
//! (each GEMM a dequantizing GEMV for a matrix kept in GGUF blocks, `weights::Mat::apply`);
//! then the final norm, a gather of the rows whose logits are wanted, the head GEMM in f32, and
//! one copy of the logits to the host (the only synchronisation of a step) into a reused
//! page-locked buffer, or, when every sampling request picks from the raw logits alone
//! (`forward_pick`), the rows' argmax or seeded draw on the device and a copy of the ids alone.
//!
//! Fused kernels (`Gpu::fused`, `LMPLEX_CUDA_FUSED=1`, off until a device run confirms them):
//! RoPE writes the rotated K and V into the pool itself (`rope_and_cache`, no KV-write launch);
//! attention over contexts within one partition runs in one pass (no combining launch); with the
//! tile GEMM, the gate_up GEMM writes the SwiGLU activation (`tgemm_swiglu`, no SwiGLU launch and
//! no `[rows, 2 * inter]` product in memory) unless LoRA adapts the step. Each fused kernel gives
//! the bits of the launches it replaces, so the switch changes no logit.
//!
//! Attention on the tensor cores (`Gpu::tensor_attention`, `LMPLEX_CUDA_ATTENTION=tensor`, off
//! until a device run confirms it): the first pass of every row by `paged_attention_tc` (f16 and
//! bf16, head_dim a multiple of 16 up to 128), by tiles or alone with the same bits.
//!
//! CUDA graphs: a pure decode step is laid out by `BatchMeta::for_graph`; the first step of each
//! `GraphKey` is captured on the stream (everything after the metadata upload, up to the head
//! GEMM) and every later one replays it, so a step costs one launch instead of ~10 per layer.
//! A capture that fails turns graphs off for the model (one warning) and the step runs eagerly;
//! `enforce_eager` never captures. Graphs are dropped whenever a step buffer is reallocated.
//! What the captured graphs hold on the device is measured by the driver (its free memory
//! before the capture and after the first replay) and published in `LiveBytes`, with the step
//! buffers' size, for the memory report, which other threads read.
//!
//! Invariants: every GEMM runs whole `GEMM_ROWS` tiles of one shape and every kernel (the
//! quantized GEMV too) reduces a row in a fixed order, so a sequence's logits never depend on
//! the rest of the batch; the row-wise kernels, the GEMV and attention run over
//! `BatchMeta::rows` only (the GEMMs' other rows hold stale values that no real row reads);
//! padded rows write no KV and attend to nothing; buffers are allocated at load (`Workspace`) and grow
//! only when a batch exceeds them (never on the engine's path, which is bounded by
//! `max_num_batched_tokens` and `max_num_seqs`). A replayed graph computes exactly what the same
//! step run eagerly in the graph layout computes: the same kernels, arguments and GEMM shapes.

use crate::dtype::Dt;
use crate::gpu::{DevBuf, Gpu, HostBuf};
use crate::kernels::{Argmax, LogitEdits, Sample};
use crate::kv::DeviceKv;
use crate::lora::DeviceLora;
use crate::meta::{BatchMeta, GraphKey, Offsets};
use crate::weights::Weights;
use crate::workspace::{tiles, CudaSizing, Workspace};
use lmplex_core::{Error, Result};
use lmplex_model::lora::LoraModule;
use lmplex_model::sample::draw::DrawParams;
use lmplex_model::sample::pick::Pick;
use lmplex_model::{Checkpoint, ForwardBatch, ModelArgs};
use std::collections::HashMap;
use std::sync::Arc;

mod graphs;
mod layers;
use graphs::Graphs;
pub use graphs::LiveBytes;

pub struct CudaModel {
    pub gpu: Gpu,
    pub args: ModelArgs,
    pub dt: Dt,
    pub max_positions: usize,
    pub kv: DeviceKv,
    w: Weights,
    ws: Workspace,
    graphs: Graphs,
    /// Where each step's logits land on the host, reused from step to step.
    host_logits: HostBuf,
    /// The packed logit edits of a pick with penalties, bias or held-back endings
    /// (`meta::pack_edits`), grown to the largest step's.
    edits: Option<DevBuf>,
    live: Arc<LiveBytes>,
    /// The adapters on the device, when LoRA is on (`CudaSizing::max_loras`).
    lora: Option<DeviceLora>,
}

impl CudaModel {
    /// Uploads `ckpt`'s weights in `dt` and allocates the KV pool and the step buffers.
    pub fn load(gpu: Gpu, ckpt: &Checkpoint, dt: Dt, sizing: CudaSizing) -> Result<Self> {
        let a = &ckpt.args;
        if a.head_dim > 256 || !a.head_dim.is_multiple_of(2) {
            return Err(Error::invalid(format!(
                "head_dim {} is not supported on CUDA (even, at most 256)",
                a.head_dim
            )));
        }
        gpu.bind()?;
        let w = Weights::load(&gpu, a, &ckpt.src, dt)?;
        let kv = DeviceKv::new(
            &gpu,
            dt,
            a.num_hidden_layers,
            sizing.num_blocks,
            sizing.num_warm_blocks,
            sizing.block_size,
            a.num_key_value_heads,
            a.head_dim,
        )?;
        let ws = Workspace::new(&gpu, a, dt, tiles(sizing.max_num_batched_tokens), tiles(sizing.max_num_seqs))?;
        gpu.synchronize()?;
        let graphs = Graphs { enabled: !sizing.enforce_eager, by_key: HashMap::new() };
        let host_logits = gpu.host_buf(ws.logit_rows * a.vocab_size)?;
        let max_positions = ckpt.max_positions;
        let live = Arc::new(LiveBytes::default());
        let lora = (sizing.max_loras > 0).then(|| DeviceLora::new(sizing.max_loras));
        let (args, edits) = (a.clone(), None);
        let m = Self { gpu, args, dt, max_positions, kv, w, ws, graphs, host_logits, edits, live, lora };
        m.publish_workspace();
        Ok(m)
    }

    pub fn weight_bytes(&self) -> usize {
        self.w.bytes
    }

    /// Bytes of weights one decode step reads: all but an embedding table that is not also the
    /// head (as `Model::decode_weight_bytes`).
    pub fn decode_weight_bytes(&self) -> usize {
        self.w.bytes - if self.w.lm_head.is_some() { self.w.embed_tokens.bytes() } else { 0 }
    }

    /// The projections a LoRA adapter may adapt, when LoRA is on.
    pub fn lora_modules(&self) -> Option<Vec<LoraModule>> {
        self.lora.as_ref().map(|_| crate::lora::modules(&self.args))
    }

    /// Bytes the adapters take on the device (their pool and the step's tables).
    pub fn lora_bytes(&self) -> usize {
        self.lora.as_ref().map_or(0, DeviceLora::bytes)
    }

    /// The step buffers (the logit edits' too, once a pick has edits) and cuBLAS's workspace.
    pub fn workspace_bytes(&self) -> usize {
        self.ws.bytes() + self.edits.as_ref().map_or(0, |b| b.bytes) + self.gpu.blas_workspace_bytes()
    }

    /// Runs the batch; returns the selected rows' logits, `[rows, vocab]` row-major, in batch
    /// order (as `Model::forward`), in a host buffer the next step reuses.
    pub fn forward(&mut self, batch: &ForwardBatch) -> Result<&[f32]> {
        let len = self.run(batch)? * self.args.vocab_size;
        if self.host_logits.len() < len {
            self.host_logits = self.gpu.host_buf(self.ws.logit_rows * self.args.vocab_size)?;
        }
        self.gpu.dtoh(&mut self.host_logits.as_mut_slice()?[..len], self.ws.logits.ptr)?;
        Ok(&self.host_logits.as_slice()?[..len])
    }

    /// Runs the batch; returns the token of each selected row, picked on the device with that
    /// row's `picks`: its logit edits (penalties, bias, held-back endings), then the argmax
    /// (lowest index among equal maxima) when greedy, else the seeded draw, all as the host
    /// sampler picks them. Only the ids are copied back.
    pub fn forward_pick(&mut self, batch: &ForwardBatch, picks: &[Pick]) -> Result<Vec<u32>> {
        let rows = self.run(batch)?;
        if picks.len() != rows {
            return Err(Error::internal(format!("{} picks for {rows} logits rows", picks.len())));
        }
        let (logits, out, vocab) = (self.ws.logits.ptr, self.ws.argmax.ptr, self.args.vocab_size);
        if picks.iter().any(|p| !p.edits.is_empty()) {
            let (bytes, at) = crate::meta::pack_edits(picks);
            if self.edits.as_ref().is_none_or(|b| b.bytes < bytes.len()) {
                self.edits = None;
                self.edits = Some(self.gpu.alloc(bytes.len().next_power_of_two())?);
                self.publish_workspace();
            }
            let buf = self.edits.as_ref().ok_or_else(|| Error::internal("no edit buffer"))?;
            self.gpu.htod(buf.ptr, &bytes)?;
            LogitEdits { logits, edits: buf.at(at), row_start: buf.ptr, vocab }.launch(&self.gpu, rows)?;
        }
        let draws: Vec<DrawParams> = picks.iter().map(|p| p.draw).collect();
        let draws = draws.as_slice();
        Argmax { logits, out, vocab }.launch(&self.gpu, rows)?;
        if draws.iter().any(|d| d.temperature > 0.0) {
            let (bytes, o) = crate::meta::pack_draws(draws);
            self.gpu.htod(self.ws.draws.ptr, &bytes)?;
            let at = |i: usize| self.ws.draws.at(o[i]);
            let (temperature, top_k, top_p, min_p, seed, step) = (at(0), at(1), at(2), at(3), at(4), at(5));
            Sample { logits, out, temperature, top_k, top_p, min_p, seed, step, vocab }.launch(&self.gpu, rows)?;
        }
        let mut ids = vec![0u32; rows];
        self.gpu.dtoh(&mut ids, out)?;
        Ok(ids)
    }

    /// Runs the batch up to the logits in `ws.logits`; returns how many rows were selected.
    fn run(&mut self, batch: &ForwardBatch) -> Result<usize> {
        if batch.num_tokens() == 0 {
            return Err(Error::internal("empty forward batch"));
        }
        if batch.seqs.iter().any(|s| s.embeds.is_some_and(|e| !e.is_empty())) {
            return Err(Error::invalid("image inputs run on the CPU backend only (device = \"cpu\")"));
        }
        let has_lora = batch.seqs.iter().any(|s| s.lora.is_some());
        if has_lora && self.lora.is_none() {
            return Err(Error::invalid("LoRA adapters are off on CUDA (LMPLEX_CUDA_LORA=1 turns them on)"));
        }
        if let Some(s) = batch.seqs.iter().find(|s| s.end_pos() > self.max_positions) {
            return Err(Error::invalid(format!(
                "sequence reaches position {} but the model was loaded for {}",
                s.end_pos(),
                self.max_positions
            )));
        }
        let need = batch.seqs.iter().map(|s| s.end_pos().div_ceil(self.kv.block_size)).collect::<Vec<_>>();
        for (s, n) in batch.seqs.iter().zip(need) {
            if s.block_table.len() < n || s.block_table[..n].iter().any(|&b| b as usize >= self.kv.num_blocks) {
                return Err(Error::internal("a block table does not cover its sequence with valid blocks"));
            }
        }
        self.gpu.bind()?;
        // A step with adapters runs eagerly: its tables change from step to step.
        let graphed = match self.graphs.enabled && !has_lora {
            true => BatchMeta::for_graph(batch, self.kv.block_size),
            false => None,
        };
        let (m, key) = match graphed {
            Some((m, key)) => (m, Some(key)),
            None => (BatchMeta::new(batch, self.kv.block_size), None),
        };
        if m.padded > self.ws.rows || m.logit_rows.len() > self.ws.logit_rows {
            let (rows, lr) = (m.padded.max(self.ws.rows), m.logit_rows.len().max(self.ws.logit_rows));
            self.drop_graphs();
            self.ws = Workspace::new(&self.gpu, &self.args, self.dt, rows, lr)?;
            self.publish_workspace();
        }
        let (bytes, off) = m.pack();
        if bytes.len() > self.ws.meta.bytes {
            self.drop_graphs();
            self.ws.meta = self.gpu.alloc(bytes.len())?;
            self.publish_workspace();
        }
        self.gpu.htod(self.ws.meta.ptr, &bytes)?;
        let layers = self.args.num_hidden_layers;
        let lora = match self.lora.as_mut() {
            Some(l) if has_lora => l.prepare(&self.gpu, self.dt, batch, layers)?,
            _ => None,
        };
        if lora.is_some() {
            self.publish_workspace();
        }
        match key {
            Some(key) if self.gpu.can_capture() => self.replay(key, &m, &off)?,
            _ => self.layers(&m, &off, lora.as_ref())?,
        }
        Ok(m.num_logit_rows)
    }
}
