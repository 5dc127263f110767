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
use crate::kernels::{
    AddBias, Argmax, Embedding, FusedAddRmsnorm, LogitEdits, PagedAttention, ReshapeAndCache, RmsnormHeads, Rope,
    Sample, SiluAndMul, PARTITION, TILE_ROWS,
};
use crate::kv::DeviceKv;
use crate::lora::{DeviceLora, StepLora};
use crate::meta::{BatchMeta, GraphKey, Offsets};
use crate::weights::{LayerWeights, Weights};
use crate::workspace::{tiles, CudaSizing, Workspace};
use lmplex_core::{Error, Result};
use lmplex_model::lora::{LoraModule, Target};
use lmplex_model::sample::draw::DrawParams;
use lmplex_model::sample::pick::Pick;
use lmplex_model::{Checkpoint, ForwardBatch, ModelArgs};
use std::collections::HashMap;
use std::sync::Arc;

mod graphs;
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

    /// The step's kernels and GEMMs after the metadata upload: embeddings, the layers (with the
    /// step's LoRA deltas), the final norm and the head GEMM into `ws.logits`.
    fn layers(&self, m: &BatchMeta, off: &Offsets, lora: Option<&StepLora>) -> Result<()> {
        let meta = |o: usize| self.ws.meta.at(o);
        let a = &self.args;
        let (rows, hidden) = (m.rows, a.hidden_size);
        self.w.embed_tokens.gather(&self.gpu, meta(off.ids), self.ws.tmp.ptr, rows, hidden, a.vocab_size, self.dt)?;
        for (li, layer) in self.w.layers.iter().enumerate() {
            self.norm(&layer.input_layernorm, rows, li > 0)?;
            self.attention(li, layer, m, off, lora)?;
            self.norm(&layer.post_attention_layernorm, rows, true)?;
            self.mlp(li, layer, m, lora)?;
        }
        self.norm(&self.w.norm, rows, true)?;
        let lr = m.logit_rows.len();
        let (table, out) = (self.ws.h.ptr, self.ws.sel.ptr);
        Embedding { table, ids: meta(off.logit_rows), out, hidden, vocab: m.padded }.launch(&self.gpu, self.dt, lr)?;
        let (sel, logits, vocab) = (self.ws.sel.ptr, self.ws.logits.ptr, a.vocab_size);
        self.w.head().apply(&self.gpu, sel, logits, (lr, m.head_rows), vocab, hidden, self.dt, Dt::F32)
    }

    /// `res = tmp (+ res)`, `h = rmsnorm(res) * w`.
    fn norm(&self, w: &DevBuf, n: usize, add: bool) -> Result<()> {
        FusedAddRmsnorm {
            x: self.ws.tmp.ptr,
            residual: self.ws.res.ptr,
            weight: w.ptr,
            out: self.ws.h.ptr,
            hidden: self.args.hidden_size,
            eps: self.args.rms_norm_eps,
            weight_offset: 0.0,
            add_residual: add,
        }
        .launch(&self.gpu, self.dt, n)
    }

    /// `tmp = o_proj(attention(qkv_proj(h)))`, writing this step's K/V into the pool.
    fn attention(
        &self,
        li: usize,
        l: &LayerWeights,
        m: &BatchMeta,
        off: &Offsets,
        lora: Option<&StepLora>,
    ) -> Result<()> {
        let a = &self.args;
        let (g, ws, sz) = (&self.gpu, &self.ws, self.dt.size());
        let (n, rows, hidden, hd) = (m.padded, m.rows, a.hidden_size, a.head_dim);
        let (nh, nkv) = (a.num_attention_heads, a.num_key_value_heads);
        let (qw, kw) = (nh * hd, nkv * hd);
        let width = qw + 2 * kw;
        let meta = |o: usize| ws.meta.at(o);
        let dt = self.dt;
        l.qkv.apply(g, ws.h.ptr, ws.qkv.ptr, (n, rows), width, hidden, dt, dt)?;
        if let Some(b) = &l.qkv_bias {
            AddBias { x: ws.qkv.ptr, bias: b.ptr, width }.launch(g, dt, rows)?;
        }
        if let Some(lora) = lora {
            for (t, col0, out) in
                [(Target::Q, 0, qw), (Target::K, qw, kw), (Target::V, qw + kw, kw), (Target::Qkv, 0, width)]
            {
                lora.add(g, dt, (li, t), ws.h.ptr, hidden, ws.qkv.at(col0 * sz), (out, width))?;
            }
        }
        for (w, col0, heads) in [(&l.q_norm, 0, nh), (&l.k_norm, qw, nkv)] {
            if let Some(w) = w {
                let eps = a.rms_norm_eps;
                RmsnormHeads { x: ws.qkv.ptr, weight: w.ptr, row_stride: width, col0, head_dim: hd, eps }
                    .launch(g, dt, rows, heads)?;
            }
        }
        let (q, k, v) = (ws.qkv.ptr, ws.qkv.at(qw * sz), ws.qkv.at((qw + kw) * sz));
        Rope {
            q,
            k,
            positions: meta(off.positions),
            inv_freq: self.w.inv_freq.ptr,
            num_q_heads: nh,
            num_kv_heads: nkv,
            head_dim: hd,
            rot_dim: hd,
            q_stride: width,
            k_stride: width,
            neox: !a.rope.interleaved,
        }
        .launch(g, dt, rows)?;
        let (k_cache, v_cache) = (self.kv.k(li), self.kv.v(li));
        let (slot_mapping, num_kv_heads, head_dim) = (meta(off.slots), nkv, hd);
        ReshapeAndCache {
            k,
            v,
            k_cache,
            v_cache,
            slot_mapping,
            num_kv_heads,
            head_dim,
            k_stride: width,
            v_stride: width,
        }
        .launch(g, dt, rows)?;
        // Attention over the real rows, in chunks whose partials fit the scratch buffer.
        let parts = m.max_ctx.div_ceil(PARTITION).max(1);
        let per_row = nh * parts * (hd + 2) * 4;
        let chunk = (ws.part.bytes / per_row).max(1);
        // By tiles (a prefill chunk's rows share their keys and values; a decode row stages its
        // own through shared memory) when whole tiles fit the scratch, else row by row: the same
        // bits either way (`paged_attention.cu`).
        let tiled = chunk >= TILE_ROWS;
        let chunk = if tiled { chunk / TILE_ROWS * TILE_ROWS } else { chunk };
        let firsts: Vec<usize> = m.tiles.chunks_exact(2).map(|p| p[0] as usize).collect();
        let (po, pm) = (ws.part.ptr, ws.part.at(chunk.min(rows) * nh * parts * hd * 4));
        let ps = pm + (chunk.min(rows) * nh * parts * 4) as u64;
        let scale = 1.0 / (hd as f32).sqrt();
        for r0 in (0..rows).step_by(chunk) {
            let r = chunk.min(rows - r0);
            let (t0, t1) = (firsts.partition_point(|&f| f < r0), firsts.partition_point(|&f| f < r0 + r));
            PagedAttention {
                q: q + (r0 * width * sz) as u64,
                k_cache,
                v_cache,
                block_tables: meta(off.block_tables),
                row_seq: ws.meta.at(off.row_seq + 4 * r0),
                row_ctx: ws.meta.at(off.row_ctx + 4 * r0),
                part_out: po,
                part_max: pm,
                part_sum: ps,
                out: ws.attn.at(r0 * qw * sz),
                scale,
                num_q_heads: nh,
                num_kv_heads: nkv,
                head_dim: hd,
                block_size: self.kv.block_size,
                max_blocks_per_seq: m.max_blocks,
                max_partitions: parts,
                q_stride: width,
                tiles: tiled.then(|| (ws.meta.at(off.tiles + 8 * t0), t1 - t0, r0)),
            }
            .launch(g, dt, r)?;
        }
        l.o_proj.apply(g, ws.attn.ptr, ws.tmp.ptr, (n, rows), hidden, qw, dt, dt)?;
        match lora {
            Some(lora) => lora.add(g, dt, (li, Target::O), ws.attn.ptr, qw, ws.tmp.ptr, (hidden, hidden)),
            None => Ok(()),
        }
    }

    /// `tmp = down(silu(gate(h)) * up(h))`.
    fn mlp(&self, li: usize, l: &LayerWeights, m: &BatchMeta, lora: Option<&StepLora>) -> Result<()> {
        let (g, ws, a, dt, tiles) = (&self.gpu, &self.ws, &self.args, self.dt, (m.padded, m.rows));
        let (hidden, inter, sz) = (a.hidden_size, a.intermediate_size, dt.size());
        l.gate_up.apply(g, ws.h.ptr, ws.gate_up.ptr, tiles, 2 * inter, hidden, dt, dt)?;
        if let Some(lora) = lora {
            for (t, col0, out) in [(Target::Gate, 0, inter), (Target::Up, inter, inter), (Target::GateUp, 0, 2 * inter)]
            {
                lora.add(g, dt, (li, t), ws.h.ptr, hidden, ws.gate_up.at(col0 * sz), (out, 2 * inter))?;
            }
        }
        let (gate, up, out) = (ws.gate_up.ptr, ws.gate_up.at(inter * sz), ws.act.ptr);
        SiluAndMul { gate, up, out, inter, in_stride: 2 * inter }.launch(g, self.dt, m.rows)?;
        l.down_proj.apply(g, ws.act.ptr, ws.tmp.ptr, tiles, hidden, inter, dt, dt)?;
        match lora {
            Some(lora) => lora.add(g, dt, (li, Target::Down), ws.act.ptr, inter, ws.tmp.ptr, (hidden, hidden)),
            None => Ok(()),
        }
    }
}
