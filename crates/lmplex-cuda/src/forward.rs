//! `CudaModel`: the decoder-only transformer's forward pass on the device, the CPU `Model`'s
//! twin (same families, same `ForwardBatch`, same KV layout), built from lmplex-kernels and
//! cuBLAS GEMMs.
//!
//! One step: upload the batch's packed metadata (`meta`), gather embeddings, then per layer:
//! fused residual-add + RMSNorm -> qkv GEMM (+ bias) -> q/k head norms (Qwen3) -> RoPE in place
//! -> KV write through the slot mapping -> paged attention (split-K partitions, in row chunks
//! that bound its scratch) -> o GEMM -> add + norm -> gate_up GEMM -> SiLU x up -> down GEMM;
//! then the final norm, a gather of the rows whose logits are wanted, the head GEMM in f32, and
//! one copy of the logits to the host (the only synchronisation of a step).
//!
//! Invariants: every GEMM runs whole `GEMM_ROWS` tiles of one shape and every kernel reduces a
//! row in a fixed order, so a sequence's logits never depend on the rest of the batch; padded
//! rows write no KV and attend to nothing; buffers are allocated at load (`Workspace`) and grow
//! only when a batch exceeds them (never on the engine's path, which is bounded by
//! `max_num_batched_tokens` and `max_num_seqs`).

use crate::dtype::Dt;
use crate::gpu::{Arg, DevBuf, Gpu, GEMM_ROWS};
use crate::kv::DeviceKv;
use crate::meta::BatchMeta;
use crate::weights::{LayerWeights, Weights};
use lmplex_core::{Error, Result};
use lmplex_model::{Checkpoint, ForwardBatch, ModelArgs};
use Arg::{F, I, P};

/// Keys per attention partition (`PARTITION` in paged_attention.cu).
const PARTITION: usize = 512;
/// Most bytes of attention partials (`out`, `max`, `sum` per row, head and partition).
const ATTN_SCRATCH: usize = 64 << 20;
const THREADS: u32 = 256;

/// Step buffers, sized for `rows` token rows and `logit_rows` logits rows.
struct Workspace {
    rows: usize,
    logit_rows: usize,
    meta: DevBuf,
    res: DevBuf,
    h: DevBuf,
    tmp: DevBuf,
    qkv: DevBuf,
    attn: DevBuf,
    gate_up: DevBuf,
    act: DevBuf,
    sel: DevBuf,
    logits: DevBuf,
    part: DevBuf,
}

impl Workspace {
    fn new(gpu: &Gpu, a: &ModelArgs, dt: Dt, rows: usize, logit_rows: usize) -> Result<Self> {
        let s = dt.size();
        let (qw, kw, hd) = (a.num_attention_heads * a.head_dim, a.num_key_value_heads * a.head_dim, a.head_dim);
        let per_row_attn = a.num_attention_heads * (hd + 2) * 4;
        let meta = 8 * (5 * rows + logit_rows) + 64 * 1024;
        Ok(Self {
            rows,
            logit_rows,
            meta: gpu.alloc(meta)?,
            res: gpu.alloc(rows * a.hidden_size * s)?,
            h: gpu.alloc(rows * a.hidden_size * s)?,
            tmp: gpu.alloc(rows * a.hidden_size * s)?,
            qkv: gpu.alloc(rows * (qw + 2 * kw) * s)?,
            attn: gpu.alloc(rows * qw * s)?,
            gate_up: gpu.alloc(rows * 2 * a.intermediate_size * s)?,
            act: gpu.alloc(rows * a.intermediate_size * s)?,
            sel: gpu.alloc(logit_rows * a.hidden_size * s)?,
            logits: gpu.alloc(logit_rows * a.vocab_size * 4)?,
            part: gpu.alloc(ATTN_SCRATCH.max(per_row_attn))?,
        })
    }

    fn bytes(&self) -> usize {
        [&self.meta, &self.res, &self.h, &self.tmp, &self.qkv, &self.attn, &self.gate_up, &self.act]
            .iter()
            .chain([&self.sel, &self.logits, &self.part].iter())
            .map(|b| b.bytes)
            .sum()
    }
}

pub struct CudaModel {
    pub gpu: Gpu,
    pub args: ModelArgs,
    pub dt: Dt,
    pub max_positions: usize,
    pub kv: DeviceKv,
    w: Weights,
    ws: Workspace,
}

/// Sizes the engine decides: the KV pool, its warm tier and the most rows a step may hold.
#[derive(Debug, Clone, Copy)]
pub struct CudaSizing {
    pub num_blocks: usize,
    pub num_warm_blocks: usize,
    pub block_size: usize,
    pub max_num_batched_tokens: usize,
    pub max_num_seqs: usize,
}

fn tiles(n: usize) -> usize {
    n.div_ceil(GEMM_ROWS).max(1) * GEMM_ROWS
}

fn i(v: usize) -> Result<Arg> {
    i32::try_from(v).map(I).map_err(|_| Error::internal(format!("{v} does not fit a kernel's int argument")))
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
        Ok(Self { gpu, args: a.clone(), dt, max_positions: ckpt.max_positions, kv, w, ws })
    }

    pub fn weight_bytes(&self) -> usize {
        self.w.bytes
    }

    /// Bytes of weights one decode step reads: all but an embedding table that is not also the
    /// head (as `Model::decode_weight_bytes`).
    pub fn decode_weight_bytes(&self) -> usize {
        self.w.bytes - if self.w.lm_head.is_some() { self.w.embed_tokens.bytes } else { 0 }
    }

    pub fn workspace_bytes(&self) -> usize {
        self.ws.bytes()
    }

    fn k(&self, name: &str) -> String {
        format!("{name}_{}", self.dt.suffix())
    }

    /// Runs the batch; returns the selected rows' logits, `[rows, vocab]` row-major, in batch
    /// order (as `Model::forward`).
    pub fn forward(&mut self, batch: &ForwardBatch) -> Result<Vec<f32>> {
        if batch.num_tokens() == 0 {
            return Err(Error::internal("empty forward batch"));
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
        let m = BatchMeta::new(batch, self.kv.block_size);
        if m.padded > self.ws.rows || m.logit_rows.len() > self.ws.logit_rows {
            let (rows, lr) = (m.padded.max(self.ws.rows), m.logit_rows.len().max(self.ws.logit_rows));
            self.ws = Workspace::new(&self.gpu, &self.args, self.dt, rows, lr)?;
        }
        let (bytes, off) = m.pack();
        if bytes.len() > self.ws.meta.bytes {
            self.ws.meta = self.gpu.alloc(bytes.len())?;
        }
        self.gpu.htod(self.ws.meta.ptr, &bytes)?;
        let meta = |o: usize| P(self.ws.meta.at(o));
        let a = &self.args;
        let (n, hidden) = (m.padded, a.hidden_size);
        let rows = (n as u32, 1, 1);
        self.gpu.launch(
            &self.k("embedding"),
            rows,
            THREADS,
            &[P(self.w.embed_tokens.ptr), meta(off.ids), P(self.ws.tmp.ptr), i(hidden)?, i(a.vocab_size)?],
        )?;
        for (li, layer) in self.w.layers.iter().enumerate() {
            self.norm(&layer.input_layernorm, n, li > 0)?;
            self.attention(li, layer, &m, &off)?;
            self.norm(&layer.post_attention_layernorm, n, true)?;
            self.mlp(layer, n)?;
        }
        self.norm(&self.w.norm, n, true)?;
        let lr = m.logit_rows.len();
        self.gpu.launch(
            &self.k("embedding"),
            (lr as u32, 1, 1),
            THREADS,
            &[P(self.ws.h.ptr), meta(off.logit_rows), P(self.ws.sel.ptr), i(hidden)?, i(n)?],
        )?;
        let vocab = a.vocab_size;
        self.gpu.gemm(self.ws.sel.ptr, self.w.head().ptr, self.ws.logits.ptr, lr, vocab, hidden, self.dt, Dt::F32)?;
        let mut logits = vec![0f32; m.num_logit_rows * vocab];
        self.gpu.dtoh(&mut logits, self.ws.logits.ptr)?;
        Ok(logits)
    }

    /// `res = tmp (+ res)`, `h = rmsnorm(res) * w`.
    fn norm(&self, w: &DevBuf, n: usize, add: bool) -> Result<()> {
        let a = &self.args;
        self.gpu.launch(
            &self.k("fused_add_rmsnorm"),
            (n as u32, 1, 1),
            THREADS,
            &[
                P(self.ws.tmp.ptr),
                P(self.ws.res.ptr),
                P(w.ptr),
                P(self.ws.h.ptr),
                i(a.hidden_size)?,
                F(a.rms_norm_eps),
                F(0.0),
                I(add as i32),
            ],
        )
    }

    /// `tmp = o_proj(attention(qkv_proj(h)))`, writing this step's K/V into the pool.
    fn attention(&self, li: usize, l: &LayerWeights, m: &BatchMeta, off: &crate::meta::Offsets) -> Result<()> {
        let a = &self.args;
        let (g, ws, sz) = (&self.gpu, &self.ws, self.dt.size());
        let (n, hidden, hd) = (m.padded, a.hidden_size, a.head_dim);
        let (nh, nkv) = (a.num_attention_heads, a.num_key_value_heads);
        let (qw, kw) = (nh * hd, nkv * hd);
        let width = qw + 2 * kw;
        let meta = |o: usize| P(ws.meta.at(o));
        let rows = (n as u32, 1, 1);
        g.gemm(ws.h.ptr, l.qkv.ptr, ws.qkv.ptr, n, width, hidden, self.dt, self.dt)?;
        if let Some(b) = &l.qkv_bias {
            g.launch(&self.k("add_bias"), rows, THREADS, &[P(ws.qkv.ptr), P(b.ptr), i(width)?])?;
        }
        for (w, col0, heads) in [(&l.q_norm, 0, nh), (&l.k_norm, qw, nkv)] {
            if let Some(w) = w {
                let args = [P(ws.qkv.ptr), P(w.ptr), i(width)?, i(col0)?, i(hd)?, F(a.rms_norm_eps)];
                g.launch(&self.k("rmsnorm_heads"), (n as u32, heads as u32, 1), 128, &args)?;
            }
        }
        let (q, k, v) = (ws.qkv.ptr, ws.qkv.at(qw * sz), ws.qkv.at((qw + kw) * sz));
        let neox = !a.rope.interleaved as i32;
        let freqs = P(self.w.inv_freq.ptr);
        let rope =
            [P(q), P(k), meta(off.positions), freqs, i(nh)?, i(nkv)?, i(hd)?, i(hd)?, i(width)?, i(width)?, I(neox)];
        g.launch(&self.k("rope"), rows, THREADS, &rope)?;
        let (kc, vc) = (self.kv.k(li), self.kv.v(li));
        let cache = [P(k), P(v), P(kc), P(vc), meta(off.slots), i(nkv)?, i(hd)?, i(width)?, i(width)?];
        g.launch(&self.k("reshape_and_cache"), rows, THREADS, &cache)?;
        // Attention over the real rows, in chunks whose partials fit the scratch buffer.
        let parts = m.max_ctx.div_ceil(PARTITION).max(1);
        let per_row = nh * parts * (hd + 2) * 4;
        let chunk = (ws.part.bytes / per_row).max(1);
        let (po, pm) = (ws.part.ptr, ws.part.at(chunk.min(m.num_tokens) * nh * parts * hd * 4));
        let ps = pm + (chunk.min(m.num_tokens) * nh * parts * 4) as u64;
        let scale = 1.0 / (hd as f32).sqrt();
        for r0 in (0..m.num_tokens).step_by(chunk) {
            let r = chunk.min(m.num_tokens - r0);
            let (seq, ctx) = (ws.meta.at(off.row_seq + 4 * r0), ws.meta.at(off.row_ctx + 4 * r0));
            let qr = q + (r0 * width * sz) as u64;
            let args = [
                P(qr),
                P(kc),
                P(vc),
                meta(off.block_tables),
                P(seq),
                P(ctx),
                P(po),
                P(pm),
                P(ps),
                F(scale),
                i(nh)?,
                i(nkv)?,
                i(hd)?,
                i(self.kv.block_size)?,
                i(m.max_blocks)?,
                i(parts)?,
                i(width)?,
            ];
            g.launch(&self.k("paged_attention_partition"), (nh as u32, r as u32, parts as u32), 128, &args)?;
            let out = ws.attn.at(r0 * qw * sz);
            let args = [P(po), P(pm), P(ps), P(ctx), P(out), i(nh)?, i(hd)?, i(parts)?];
            g.launch(&self.k("paged_attention_reduce"), (nh as u32, r as u32, 1), 128, &args)?;
        }
        g.gemm(ws.attn.ptr, l.o_proj.ptr, ws.tmp.ptr, n, hidden, qw, self.dt, self.dt)
    }

    /// `tmp = down(silu(gate(h)) * up(h))`.
    fn mlp(&self, l: &LayerWeights, n: usize) -> Result<()> {
        let (g, ws, a) = (&self.gpu, &self.ws, &self.args);
        let (hidden, inter, sz) = (a.hidden_size, a.intermediate_size, self.dt.size());
        g.gemm(ws.h.ptr, l.gate_up.ptr, ws.gate_up.ptr, n, 2 * inter, hidden, self.dt, self.dt)?;
        let args = [P(ws.gate_up.ptr), P(ws.gate_up.at(inter * sz)), P(ws.act.ptr), i(inter)?, i(2 * inter)?];
        g.launch(&self.k("silu_and_mul"), (n as u32, 1, 1), THREADS, &args)?;
        g.gemm(ws.act.ptr, l.down_proj.ptr, ws.tmp.ptr, n, hidden, inter, self.dt, self.dt)
    }
}
