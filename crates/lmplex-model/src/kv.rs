//! KV memory and the batch description the forward pass reads.
//!
//! Layout: per layer, one K and one V buffer of `num_blocks` blocks; token `pos` of a sequence
//! lives in block `block_table[pos / block_size]` at offset `pos % block_size` (its slot). Within
//! a block, V is `[block_size, num_kv_heads, head_dim]` (the CUDA backend's layout for K and V)
//! and K is transposed, `[num_kv_heads, head_dim, block_size]`, so one vector load holds one
//! dimension of consecutive keys (`attention`).
//!
//! Element type (`KvDtype`; it and `KvElem` live in `lmplex_cpu::kv_elem`, where the attention
//! kernel reads them, and are re-exported here): f32, or f16 (half the memory and the bytes
//! attention reads per step; llama.cpp's default), or int8 with one f32 scale per token, KV
//! head and 32 dimensions for K and for V (`KvDtype::scaled`; the scales are `[num_blocks,
//! num_kv_heads, groups, block_size]` per layer, beside K and V; K and V are stored rotated,
//! `KvRotation`, and `ops::paged_attention` rotates Q to match and the output back). K and V are rounded to it once, when written;
//! every read widens them back to f32 exactly, so the choice changes what is stored, never how
//! it is computed with, and a sequence's results still do not depend on the batch.
//!
//! Memory: each buffer is an anonymous mapping (`ZeroBuf`), zero-filled by the OS and committed
//! page by page as the forward pass writes it, so a pool sized for the worst case costs resident
//! memory only for the blocks actually used (and a never-used warm tier costs none).
//!
//! A second `KvCache` of the same shape and element type serves as the warm tier:
//! `copy_blocks_to` moves whole blocks (every layer, K and V) between the two when the
//! scheduler swaps a request.
//!
//! Invariants: the model owns no KV state; the runner owns a `KvCache` and gives each sequence
//! a block table long enough for `start_pos + token_ids.len()` tokens. Which blocks are free is
//! bookkeeping for the caller (a block pool), not for this module.

use lmplex_core::{Error, Result};
pub use lmplex_cpu::kv_elem::{f16_bits_to_f32, hadamard, inv_scale, row_scale, KvDtype, KvElem, KvRotation, KV_GROUP};

/// A zero-filled buffer of KV elements backed by an anonymous mapping: pages are committed
/// when first written, not when allocated (unlike `vec![0.0; n]`, which the allocator may zero
/// eagerly). All-zero bytes are 0.0 in every `KvElem`.
pub struct ZeroBuf {
    map: Option<memmap2::MmapMut>,
    bytes: usize,
}

impl ZeroBuf {
    /// Reserves `bytes` of zeroed address space (nothing committed yet); 0 bytes maps nothing.
    pub fn new(bytes: usize) -> Result<Self> {
        if bytes == 0 {
            return Ok(Self { map: None, bytes: 0 });
        }
        let map = memmap2::MmapMut::map_anon(bytes)
            .map_err(|e| Error::capacity(format!("cannot reserve {bytes} bytes for the KV cache: {e}")))?;
        Ok(Self { map: Some(map), bytes })
    }

    /// The buffer as `bytes / size_of::<T>()` elements of `T`.
    pub fn as_slice<T: KvElem>(&self) -> &[T] {
        match &self.map {
            // SAFETY: the mapping is page-aligned (so aligned for any KvElem), `bytes` long,
            // lives as long as `self`, and every bit pattern is a valid KvElem (sealed: f32, f16).
            Some(m) => unsafe { std::slice::from_raw_parts(m.as_ptr().cast::<T>(), self.bytes / size_of::<T>()) },
            None => &[],
        }
    }

    /// The buffer as `bytes / size_of::<T>()` elements of `T`, writable.
    pub fn as_mut_slice<T: KvElem>(&mut self) -> &mut [T] {
        match &mut self.map {
            // SAFETY: as in `as_slice`, and `&mut self` makes this the only reference.
            Some(m) => unsafe {
                std::slice::from_raw_parts_mut(m.as_mut_ptr().cast::<T>(), self.bytes / size_of::<T>())
            },
            None => &mut [],
        }
    }

    fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self.map.as_deref_mut().unwrap_or(&mut [])
    }
}

/// Which logits a sequence of the batch wants back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsSelect {
    /// None: a prefill chunk that does not end the prompt.
    None,
    /// The last token's logits (the next-token distribution).
    Last,
    /// Every token's logits (prompt scoring, parity tests).
    All,
}

/// One sequence's part of a forward batch: new tokens at positions `start_pos..`.
#[derive(Debug, Clone, Copy)]
pub struct SeqChunk<'a> {
    /// The new tokens, in order.
    pub token_ids: &'a [u32],
    /// Tokens of this sequence already in the KV cache (vLLM's `num_computed_tokens`).
    pub start_pos: usize,
    /// The sequence's blocks, in position order; must cover `end_pos()` tokens.
    pub block_table: &'a [u32],
    /// Which logits to return for this sequence's tokens.
    pub logits: LogitsSelect,
    /// Positions before this are the prompt's, later ones were generated: the two take
    /// different matmul kernels (`RowKinds`), so a token's K/V depend on its kind, never on
    /// the batch. `usize::MAX`: every token is a prompt token.
    pub num_prompt_tokens: usize,
    /// The LoRA adapter this sequence runs under (`None`: the base model).
    pub lora: Option<&'a crate::lora::LoraAdapter>,
    /// Rows that replace the token embeddings at some of the sequence's positions (an image's
    /// features); `None`: every row is its token's embedding.
    pub embeds: Option<&'a crate::input_embeds::InputEmbeds>,
}

impl SeqChunk<'_> {
    /// One past the last new token's position: the sequence's length after this pass.
    pub fn end_pos(&self) -> usize {
        self.start_pos + self.token_ids.len()
    }
}

/// The unit of work of one forward pass: several sequences, prefill and decode alike.
#[derive(Debug, Clone, Default)]
pub struct ForwardBatch<'a> {
    /// The sequences, in the order their rows and logits come out.
    pub seqs: Vec<SeqChunk<'a>>,
}

/// Which matmul kernel each row of a forward pass takes. Prompt rows (many per sequence, in
/// prefill chunks) take the prompt kernel, generated rows (one per sequence and step) the decode
/// kernel (`QWeight::matmul_prompt` and `matmul`; `DenseWeight::matmul_prompt` and `matmul`).
/// The kind is a property of the token in its sequence, so a row's result never depends on what
/// else is in the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowKinds {
    prompt: Vec<bool>,
    num_prompt: usize,
}

impl RowKinds {
    /// `flags[i]`: row `i` is a prompt row.
    pub fn new(flags: Vec<bool>) -> Self {
        let num_prompt = flags.iter().filter(|&&p| p).count();
        Self { prompt: flags, num_prompt }
    }

    /// `m` rows of one kind.
    pub fn uniform(m: usize, prompt: bool) -> Self {
        Self::new(vec![prompt; m])
    }

    /// Rows in the pass.
    pub fn len(&self) -> usize {
        self.prompt.len()
    }

    /// Whether the pass has no rows.
    pub fn is_empty(&self) -> bool {
        self.prompt.is_empty()
    }

    /// How many rows are prompt rows.
    pub fn num_prompt(&self) -> usize {
        self.num_prompt
    }

    /// Whether row `i` is a prompt row. Panics if `i` is out of range.
    pub fn is_prompt(&self, i: usize) -> bool {
        self.prompt[i]
    }
}

impl ForwardBatch<'_> {
    /// Each row's kind, rows in batch order.
    pub fn row_kinds(&self) -> RowKinds {
        RowKinds::new(
            self.seqs.iter().flat_map(|s| (s.start_pos..s.end_pos()).map(move |p| p < s.num_prompt_tokens)).collect(),
        )
    }

    /// New tokens across all sequences: the rows of the pass.
    pub fn num_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.token_ids.len()).sum()
    }

    /// Rows of logits the pass returns (one per `Last` sequence, every token of an `All` one).
    pub fn num_logit_rows(&self) -> usize {
        self.seqs
            .iter()
            .map(|s| match s.logits {
                LogitsSelect::None => 0,
                LogitsSelect::Last => 1,
                LogitsSelect::All => s.token_ids.len(),
            })
            .sum()
    }
}

/// One layer's buffers: K, V, and int8's K and V scales (f32, `[num_blocks, num_kv_heads,
/// groups, block_size]`; empty for an unscaled dtype).
struct LayerBufs {
    k: ZeroBuf,
    v: ZeroBuf,
    ks: ZeroBuf,
    vs: ZeroBuf,
}

impl LayerBufs {
    fn all(&self) -> [&ZeroBuf; 4] {
        [&self.k, &self.v, &self.ks, &self.vs]
    }
    fn all_mut(&mut self) -> [&mut ZeroBuf; 4] {
        [&mut self.k, &mut self.v, &mut self.ks, &mut self.vs]
    }
}

/// Paged K/V storage for every layer of one model, on the CPU, in f32, f16 or int8 (`dtype`).
pub struct KvCache {
    layers: Vec<LayerBufs>,
    /// The element type K and V are stored in.
    pub dtype: KvDtype,
    /// Token slots per block.
    pub block_size: usize,
    /// Blocks per layer (block ids are `0..num_blocks`).
    pub num_blocks: usize,
    /// KV heads per layer.
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

impl KvCache {
    /// An f32 cache (`with_dtype` for another element type).
    pub fn new(
        num_layers: usize,
        num_blocks: usize,
        block_size: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> Result<Self> {
        Self::with_dtype(num_layers, num_blocks, block_size, num_kv_heads, head_dim, KvDtype::F32)
    }

    /// `num_blocks` blocks of `block_size` tokens for each of `num_layers` layers, as `dtype`.
    pub fn with_dtype(
        num_layers: usize,
        num_blocks: usize,
        block_size: usize,
        num_kv_heads: usize,
        head_dim: usize,
        dtype: KvDtype,
    ) -> Result<Self> {
        let bytes = num_blocks * block_size * num_kv_heads * head_dim * dtype.size();
        let sbytes = num_blocks * block_size * num_kv_heads * dtype.scale_groups(head_dim) * 4;
        let layer = || -> Result<LayerBufs> {
            Ok(LayerBufs {
                k: ZeroBuf::new(bytes)?,
                v: ZeroBuf::new(bytes)?,
                ks: ZeroBuf::new(sbytes)?,
                vs: ZeroBuf::new(sbytes)?,
            })
        };
        Ok(Self {
            layers: (0..num_layers).map(|_| layer()).collect::<Result<_>>()?,
            dtype,
            block_size,
            num_blocks,
            num_kv_heads,
            head_dim,
        })
    }

    /// Bytes one block takes across all layers (K and V, and int8's scales).
    pub fn bytes_per_block(
        num_layers: usize,
        block_size: usize,
        num_kv_heads: usize,
        head_dim: usize,
        dtype: KvDtype,
    ) -> usize {
        2 * num_layers * block_size * num_kv_heads * Self::slot_bytes(head_dim, dtype)
    }

    /// Bytes of one token's K (or V) of one KV head: `head_dim` elements, and int8's scales.
    fn slot_bytes(head_dim: usize, dtype: KvDtype) -> usize {
        head_dim * dtype.size() + 4 * dtype.scale_groups(head_dim)
    }

    /// Bytes of the whole cache, K and V of every layer (address space; resident once written).
    pub fn total_bytes(&self) -> usize {
        Self::bytes_per_block(self.layers.len(), self.block_size, self.num_kv_heads, self.head_dim, self.dtype)
            * self.num_blocks
    }

    /// Layer `layer`'s K and V buffers (every block). Panics unless `T` is the cache's dtype.
    pub fn layer<T: KvElem>(&self, layer: usize) -> (&[T], &[T]) {
        assert_eq!(T::DTYPE, self.dtype, "KV cache element type");
        (self.layers[layer].k.as_slice(), self.layers[layer].v.as_slice())
    }

    /// Layer `layer`'s K and V scales (`[num_blocks, num_kv_heads, groups, block_size]`), or `None`
    /// for an unscaled dtype.
    pub fn layer_scales(&self, layer: usize) -> Option<(&[f32], &[f32])> {
        self.dtype.scaled().then(|| (self.layers[layer].ks.as_slice(), self.layers[layer].vs.as_slice()))
    }

    /// `layer`'s K, V and scales (empty for an unscaled dtype), all writable.
    #[allow(clippy::type_complexity)] // four buffers of one layer, named by the docs
    pub fn layer_mut<T: KvElem>(&mut self, layer: usize) -> (&mut [T], &mut [T], &mut [f32], &mut [f32]) {
        assert_eq!(T::DTYPE, self.dtype, "KV cache element type");
        let l = &mut self.layers[layer];
        (l.k.as_mut_slice(), l.v.as_mut_slice(), l.ks.as_mut_slice(), l.vs.as_mut_slice())
    }

    /// Copies block `from` of `self` to block `to` of `dst` for each pair, in every layer (K
    /// and V). `dst` must have the same layer count, block shape and element type.
    pub fn copy_blocks_to(&self, dst: &mut KvCache, pairs: &[(u32, u32)]) -> Result<()> {
        let shape = |c: &KvCache| (c.layers.len(), c.block_size, c.num_kv_heads, c.head_dim, c.dtype);
        if shape(self) != shape(dst) {
            return Err(Error::internal("KV caches of different shapes cannot exchange blocks"));
        }
        if let Some(p) = pairs.iter().find(|(f, t)| *f as usize >= self.num_blocks || *t as usize >= dst.num_blocks) {
            return Err(Error::internal(format!("block copy {p:?} out of range")));
        }
        let bufs = self.layers.iter().zip(&mut dst.layers).flat_map(|(a, b)| a.all().into_iter().zip(b.all_mut()));
        for (src, out) in bufs {
            let (src, out) = (src.bytes(), out.bytes_mut());
            // Each buffer holds `num_blocks` equal blocks (an empty one: scales of a dtype without).
            let n = src.len() / self.num_blocks.max(1);
            for &(f, t) in pairs {
                let (f, t) = (f as usize * n, t as usize * n);
                out[t..t + n].copy_from_slice(&src[f..f + n]);
            }
        }
        Ok(())
    }

    /// Checks every sequence's block table covers its tokens with valid block ids.
    pub fn check_batch(&self, batch: &ForwardBatch) -> Result<()> {
        for (i, s) in batch.seqs.iter().enumerate() {
            let need = s.end_pos().div_ceil(self.block_size);
            if s.block_table.len() < need {
                return Err(Error::internal(format!(
                    "sequence {i}: block table has {} blocks, {need} needed for {} tokens",
                    s.block_table.len(),
                    s.end_pos()
                )));
            }
            if let Some(b) = s.block_table[..need].iter().find(|&&b| b as usize >= self.num_blocks) {
                return Err(Error::internal(format!("sequence {i}: block id {b} out of range")));
            }
        }
        Ok(())
    }
}
