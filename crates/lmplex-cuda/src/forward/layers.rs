//! A step's launches after the metadata upload (`CudaModel::layers`): the embedding gather, each
//! layer's attention and MLP, the final norm and the head GEMM, unfused or fused (`forward`'s
//! header).
//!
//! Fused norms (`Gpu::fused` with the tile GEMM, every layer's matrices tile-multipliable, no
//! adapter in the step): the residual stream `res` is the only hidden state between launches.
//! The embeddings are gathered into it; each projection that reads the normalised stream (qkv,
//! gate_up) normalises it as it stages it, and each that writes the stream (o, down) adds into
//! it, except the last layer's down, whose output the final norm adds as in the unfused step.
//! Either way a step computes the same bits (each fused kernel equals the launches it replaces).

use super::CudaModel;
use crate::dtype::Dt;
use crate::gpu::DevBuf;
use crate::kernels::paged_attention::tensor_cores_take;
use crate::kernels::{
    AddBias, Embedding, FusedAddRmsnorm, Fusion, PagedAttention, ReshapeAndCache, RmsnormHeads, Rope, RopeAndCache,
    RowNorm, SiluAndMul, PARTITION, TILE_ROWS,
};
use crate::lora::StepLora;
use crate::mat::tiles;
use crate::meta::{BatchMeta, Offsets};
use crate::weights::LayerWeights;
use lmplex_core::Result;
use lmplex_model::lora::Target;

impl CudaModel {
    /// Whether this step runs with the norms fused into the projections (the module header).
    fn norms_fused(&self, lora: Option<&StepLora>) -> bool {
        let a = &self.args;
        let ks = [a.hidden_size, a.num_attention_heads * a.head_dim, a.intermediate_size];
        self.gpu.fused && lora.is_none() && ks.iter().all(|&k| tiles(&self.gpu, self.dt, k))
    }

    /// The RMSNorm (weights `w`) a projection applies to `res` as it stages it, norms fused.
    fn row_norm(&self, w: &DevBuf) -> RowNorm {
        RowNorm { weight: w.ptr, eps: self.args.rms_norm_eps, offset: 0.0 }
    }

    /// The step's kernels and GEMMs after the metadata upload: embeddings, the layers (with the
    /// step's LoRA deltas), the final norm and the head GEMM into `ws.logits`.
    pub(super) fn layers(&self, m: &BatchMeta, off: &Offsets, lora: Option<&StepLora>) -> Result<()> {
        let meta = |o: usize| self.ws.meta.at(o);
        let a = &self.args;
        let (rows, hidden) = (m.rows, a.hidden_size);
        let fused = self.norms_fused(lora);
        let first = if fused { self.ws.res.ptr } else { self.ws.tmp.ptr };
        self.w.embed_tokens.gather(&self.gpu, meta(off.ids), first, rows, hidden, a.vocab_size, self.dt)?;
        let last = self.w.layers.len().saturating_sub(1);
        for (li, layer) in self.w.layers.iter().enumerate() {
            let norm = |w: &DevBuf, add| {
                if fused {
                    Ok(Some(self.row_norm(w)))
                } else {
                    self.norm(w, rows, add).map(|_| None)
                }
            };
            let input = norm(&layer.input_layernorm, li > 0)?;
            self.attention(li, layer, m, off, lora, input)?;
            let post = norm(&layer.post_attention_layernorm, true)?;
            self.mlp(li, layer, m, lora, post, fused && li < last)?;
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

    /// `tmp = o_proj(attention(qkv_proj(h)))`, writing this step's K/V into the pool; with the
    /// norms fused (`norm` set), `res += o_proj(attention(qkv_proj(rmsnorm(res))))`.
    fn attention(
        &self,
        li: usize,
        l: &LayerWeights,
        m: &BatchMeta,
        off: &Offsets,
        lora: Option<&StepLora>,
        norm: Option<RowNorm>,
    ) -> Result<()> {
        let a = &self.args;
        let (g, ws, sz) = (&self.gpu, &self.ws, self.dt.size());
        let (n, rows, hidden, hd) = (m.padded, m.rows, a.hidden_size, a.head_dim);
        let (nh, nkv) = (a.num_attention_heads, a.num_key_value_heads);
        let (qw, kw) = (nh * hd, nkv * hd);
        let width = qw + 2 * kw;
        let meta = |o: usize| ws.meta.at(o);
        let dt = self.dt;
        match norm {
            Some(norm) => {
                let fusion = Fusion { norm: Some(norm), add: false };
                l.qkv.apply_fused(g, ws.res.ptr, ws.qkv.ptr, rows, width, hidden, (dt, dt), fusion)?
            }
            None => l.qkv.apply(g, ws.h.ptr, ws.qkv.ptr, (n, rows), width, hidden, dt, dt)?,
        }
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
        let (positions, inv_freq, neox) = (meta(off.positions), self.w.inv_freq.ptr, !a.rope.interleaved);
        let (k_cache, v_cache) = (self.kv.k(li), self.kv.v(li));
        let (slot_mapping, num_q_heads, num_kv_heads, head_dim, rot_dim) = (meta(off.slots), nh, nkv, hd, hd);
        if g.fused {
            RopeAndCache {
                q,
                k,
                v,
                k_cache,
                v_cache,
                slot_mapping,
                positions,
                inv_freq,
                num_q_heads,
                num_kv_heads,
                head_dim,
                rot_dim,
                q_stride: width,
                kv_stride: width,
                neox,
            }
            .launch(g, dt, rows)?;
        } else {
            let (q_stride, k_stride, v_stride) = (width, width, width);
            Rope { q, k, positions, inv_freq, num_q_heads, num_kv_heads, head_dim, rot_dim, q_stride, k_stride, neox }
                .launch(g, dt, rows)?;
            ReshapeAndCache { k, v, k_cache, v_cache, slot_mapping, num_kv_heads, head_dim, k_stride, v_stride }
                .launch(g, dt, rows)?;
        }
        // Attention over the real rows, in chunks whose partials fit the scratch buffer.
        let parts = m.max_ctx.div_ceil(PARTITION).max(1);
        let per_row = nh * parts * (hd + 2) * 4;
        let chunk = (ws.part.bytes / per_row).max(1);
        // By tiles (a prefill chunk's rows share their keys and values; a decode row stages its
        // own through shared memory) when whole tiles fit the scratch, else row by row: the same
        // bits either way (`paged_attention.cu`), on the CUDA cores or on the tensor cores.
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
                one_pass: g.fused && parts == 1,
                tensor_cores: g.tensor_attention && tensor_cores_take(dt, hd),
            }
            .launch(g, dt, r)?;
        }
        if norm.is_some() {
            let fusion = Fusion { norm: None, add: true };
            return l.o_proj.apply_fused(g, ws.attn.ptr, ws.res.ptr, rows, hidden, qw, (dt, dt), fusion);
        }
        l.o_proj.apply(g, ws.attn.ptr, ws.tmp.ptr, (n, rows), hidden, qw, dt, dt)?;
        match lora {
            Some(lora) => lora.add(g, dt, (li, Target::O), ws.attn.ptr, qw, ws.tmp.ptr, (hidden, hidden)),
            None => Ok(()),
        }
    }

    /// `tmp = down(silu(gate(h)) * up(h))`; with the norms fused (`norm` set), the gate and up
    /// products read `rmsnorm(res)`, and with `add_down` the down product adds into `res`.
    fn mlp(
        &self,
        li: usize,
        l: &LayerWeights,
        m: &BatchMeta,
        lora: Option<&StepLora>,
        norm: Option<RowNorm>,
        add_down: bool,
    ) -> Result<()> {
        let (g, ws, a, dt, tiles) = (&self.gpu, &self.ws, &self.args, self.dt, (m.padded, m.rows));
        let (hidden, inter, sz) = (a.hidden_size, a.intermediate_size, dt.size());
        let x = if norm.is_some() { ws.res.ptr } else { ws.h.ptr };
        let swiglu = lora.is_none() && l.gate_up.apply_swiglu(g, x, ws.act.ptr, (m.rows, inter, hidden), dt, norm)?;
        if !swiglu {
            match norm {
                Some(norm) => {
                    let fusion = Fusion { norm: Some(norm), add: false };
                    l.gate_up.apply_fused(g, x, ws.gate_up.ptr, m.rows, 2 * inter, hidden, (dt, dt), fusion)?
                }
                None => l.gate_up.apply(g, x, ws.gate_up.ptr, tiles, 2 * inter, hidden, dt, dt)?,
            }
            if let Some(lora) = lora {
                for (t, col0, out) in
                    [(Target::Gate, 0, inter), (Target::Up, inter, inter), (Target::GateUp, 0, 2 * inter)]
                {
                    lora.add(g, dt, (li, t), ws.h.ptr, hidden, ws.gate_up.at(col0 * sz), (out, 2 * inter))?;
                }
            }
            let (gate, up, out) = (ws.gate_up.ptr, ws.gate_up.at(inter * sz), ws.act.ptr);
            SiluAndMul { gate, up, out, inter, in_stride: 2 * inter }.launch(g, self.dt, m.rows)?;
        }
        if add_down {
            let fusion = Fusion { norm: None, add: true };
            return l.down_proj.apply_fused(g, ws.act.ptr, ws.res.ptr, m.rows, hidden, inter, (dt, dt), fusion);
        }
        l.down_proj.apply(g, ws.act.ptr, ws.tmp.ptr, tiles, hidden, inter, dt, dt)?;
        match lora {
            Some(lora) => lora.add(g, dt, (li, Target::Down), ws.act.ptr, inter, ws.tmp.ptr, (hidden, hidden)),
            None => Ok(()),
        }
    }
}
