//! Every kernel launch of the backend, typed: one struct per kernel whose fields follow the
//! `.cu` signature in order and name, and whose `launch` sets the grid and block size.
//!
//! Invariant: this module is the one place that knows a kernel's argument list and launch
//! shape. The forward pass (`forward.rs`) and the CPU kernel checks (`kernel_check`) both launch
//! through it, so the checks run the launch parameters the backend runs. Addresses are device
//! addresses (`u64`); sizes are `usize`, refused when they do not fit the kernel's `int`.

use crate::dtype::Dt;
use crate::exec::Arg;
use crate::gpu::Gpu;
pub use crate::quant::QFormat;
use lmplex_core::{Error, Result};
use Arg::{F, I, P};

/// Threads per block of the row-wise kernels (embedding, norms, RoPE, KV write, SwiGLU).
pub const THREADS: u32 = 256;
/// Threads per block of the head-wise kernels (head norms, paged attention).
pub const HEAD_THREADS: u32 = 128;
/// Threads per block of argmax and sampling: one block per row of logits.
pub const ROW_THREADS: u32 = 1024;
/// Warps per block of the quantized GEMV: each warp computes one output column.
pub const QGEMV_WARPS: u32 = 4;
/// Keys per attention partition (`PARTITION` in paged_attention.cu).
pub const PARTITION: usize = 512;
/// Most rows of one attention tile (`TILE_ROWS` in paged_attention.cu).
pub const TILE_ROWS: usize = 8;

/// `v` as a kernel's `int` argument.
pub fn int(v: usize) -> Result<Arg> {
    i32::try_from(v).map(I).map_err(|_| Error::internal(format!("{v} does not fit a kernel's int argument")))
}

pub(crate) fn dim(v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::internal(format!("{v} blocks do not fit a grid dimension")))
}

fn name(stem: &str, dt: Dt) -> String {
    format!("{stem}_{}", dt.suffix())
}

/// `out[t] = table[ids[t]]` for `rows` rows (zeros for an id outside the vocabulary).
pub struct Embedding {
    pub table: u64,
    pub ids: u64,
    pub out: u64,
    pub hidden: usize,
    pub vocab: usize,
}

impl Embedding {
    pub fn launch(&self, g: &Gpu, dt: Dt, rows: usize) -> Result<()> {
        let args = [P(self.table), P(self.ids), P(self.out), int(self.hidden)?, int(self.vocab)?];
        g.launch(&name("embedding", dt), (dim(rows)?, 1, 1), THREADS, &args)
    }
}

/// `residual = x (+ residual)`, `out = rmsnorm(residual) * (weight + weight_offset)`, per row.
pub struct FusedAddRmsnorm {
    pub x: u64,
    pub residual: u64,
    pub weight: u64,
    pub out: u64,
    pub hidden: usize,
    pub eps: f32,
    pub weight_offset: f32,
    pub add_residual: bool,
}

impl FusedAddRmsnorm {
    pub fn launch(&self, g: &Gpu, dt: Dt, rows: usize) -> Result<()> {
        let args = [
            P(self.x),
            P(self.residual),
            P(self.weight),
            P(self.out),
            int(self.hidden)?,
            F(self.eps),
            F(self.weight_offset),
            I(self.add_residual as i32),
        ];
        g.launch(&name("fused_add_rmsnorm", dt), (dim(rows)?, 1, 1), THREADS, &args)
    }
}

/// `x[t, i] += bias[i]` over rows of `width`.
pub struct AddBias {
    pub x: u64,
    pub bias: u64,
    pub width: usize,
}

impl AddBias {
    pub fn launch(&self, g: &Gpu, dt: Dt, rows: usize) -> Result<()> {
        g.launch(&name("add_bias", dt), (dim(rows)?, 1, 1), THREADS, &[P(self.x), P(self.bias), int(self.width)?])
    }
}

/// RMSNorm of each of `heads` heads of `head_dim` starting at column `col0` of rows of
/// `row_stride` (Qwen3's q/k norms on the fused qkv buffer), in place.
pub struct RmsnormHeads {
    pub x: u64,
    pub weight: u64,
    pub row_stride: usize,
    pub col0: usize,
    pub head_dim: usize,
    pub eps: f32,
}

impl RmsnormHeads {
    pub fn launch(&self, g: &Gpu, dt: Dt, rows: usize, heads: usize) -> Result<()> {
        let args =
            [P(self.x), P(self.weight), int(self.row_stride)?, int(self.col0)?, int(self.head_dim)?, F(self.eps)];
        g.launch(&name("rmsnorm_heads", dt), (dim(rows)?, dim(heads)?, 1), HEAD_THREADS, &args)
    }
}

/// RoPE in place on the q and k heads of each row at `positions[t]` (i64), frequencies
/// `inv_freq[rot_dim / 2]` (f32); `neox` rotates halves, otherwise adjacent pairs (GPT-J).
pub struct Rope {
    pub q: u64,
    pub k: u64,
    pub positions: u64,
    pub inv_freq: u64,
    pub num_q_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rot_dim: usize,
    pub q_stride: usize,
    pub k_stride: usize,
    pub neox: bool,
}

impl Rope {
    pub fn launch(&self, g: &Gpu, dt: Dt, rows: usize) -> Result<()> {
        let args = [
            P(self.q),
            P(self.k),
            P(self.positions),
            P(self.inv_freq),
            int(self.num_q_heads)?,
            int(self.num_kv_heads)?,
            int(self.head_dim)?,
            int(self.rot_dim)?,
            int(self.q_stride)?,
            int(self.k_stride)?,
            I(self.neox as i32),
        ];
        g.launch(&name("rope", dt), (dim(rows)?, 1, 1), THREADS, &args)
    }
}

/// Writes each row's k and v into the cache at `slot_mapping[t]` (i64; −1 writes nothing).
pub struct ReshapeAndCache {
    pub k: u64,
    pub v: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub slot_mapping: u64,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub k_stride: usize,
    pub v_stride: usize,
}

impl ReshapeAndCache {
    pub fn launch(&self, g: &Gpu, dt: Dt, rows: usize) -> Result<()> {
        let args = [
            P(self.k),
            P(self.v),
            P(self.k_cache),
            P(self.v_cache),
            P(self.slot_mapping),
            int(self.num_kv_heads)?,
            int(self.head_dim)?,
            int(self.k_stride)?,
            int(self.v_stride)?,
        ];
        g.launch(&name("reshape_and_cache", dt), (dim(rows)?, 1, 1), THREADS, &args)
    }
}

/// Paged attention of `rows` query rows over the cache, both passes: partitions of `PARTITION`
/// keys into the f32 scratch (`part_out`, `part_max`, `part_sum`), then their combination.
pub struct PagedAttention {
    pub q: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    /// `u32[num_seqs, max_blocks_per_seq]`.
    pub block_tables: u64,
    /// `u32[rows]`: each row's sequence (its block-table row).
    pub row_seq: u64,
    /// `u32[rows]`: how many positions each row attends to.
    pub row_ctx: u64,
    pub part_out: u64,
    pub part_max: u64,
    pub part_sum: u64,
    pub out: u64,
    pub scale: f32,
    pub num_q_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub max_blocks_per_seq: usize,
    /// Partitions per row in the scratch: at least `ceil(max row_ctx / PARTITION)`.
    pub max_partitions: usize,
    pub q_stride: usize,
    /// The first pass by tiles of rows of one sequence (`paged_attention_tiles`, the same bits):
    /// the address of `(first row, rows)` u32 pairs, their count, and the row the launch's
    /// row 0 is in their numbering; `None` runs it row by row.
    pub tiles: Option<(u64, usize, usize)>,
}

impl PagedAttention {
    pub fn launch(&self, g: &Gpu, dt: Dt, rows: usize) -> Result<()> {
        let (h, r) = (dim(self.num_q_heads)?, dim(rows)?);
        let args = [
            P(self.q),
            P(self.k_cache),
            P(self.v_cache),
            P(self.block_tables),
            P(self.row_seq),
            P(self.row_ctx),
            P(self.part_out),
            P(self.part_max),
            P(self.part_sum),
            F(self.scale),
            int(self.num_q_heads)?,
            int(self.num_kv_heads)?,
            int(self.head_dim)?,
            int(self.block_size)?,
            int(self.max_blocks_per_seq)?,
            int(self.max_partitions)?,
            int(self.q_stride)?,
        ];
        let parts = dim(self.max_partitions)?;
        match self.tiles {
            None => g.launch(&name("paged_attention_partition", dt), (h, r, parts), HEAD_THREADS, &args)?,
            Some((tiles, n, row0)) => {
                let mut args = args.to_vec();
                args.extend([P(tiles), int(row0)?]);
                g.launch(&name("paged_attention_tiles", dt), (h, dim(n)?, parts), HEAD_THREADS, &args)?
            }
        }
        let args = [
            P(self.part_out),
            P(self.part_max),
            P(self.part_sum),
            P(self.row_ctx),
            P(self.out),
            int(self.num_q_heads)?,
            int(self.head_dim)?,
            int(self.max_partitions)?,
        ];
        g.launch(&name("paged_attention_reduce", dt), (h, r, 1), HEAD_THREADS, &args)
    }
}

/// `out[t, i] = silu(gate[t, i]) * up[t, i]`, inputs in rows of `in_stride`.
pub struct SiluAndMul {
    pub gate: u64,
    pub up: u64,
    pub out: u64,
    pub inter: usize,
    pub in_stride: usize,
}

impl SiluAndMul {
    pub fn launch(&self, g: &Gpu, dt: Dt, rows: usize) -> Result<()> {
        let args = [P(self.gate), P(self.up), P(self.out), int(self.inter)?, int(self.in_stride)?];
        g.launch(&name("silu_and_mul", dt), (dim(rows)?, 1, 1), THREADS, &args)
    }
}

/// The argument list of every matmul kernel (`qgemv_*`, `tgemm_*`): `w, x, y, n_out, k, m, ldy,
/// y_f32`.
pub(crate) fn matmul_args(
    w: u64,
    x: u64,
    y: u64,
    (n_out, k, m, ldy): (usize, usize, usize, usize),
    y_f32: bool,
) -> Result<[Arg; 8]> {
    Ok([P(w), P(x), P(y), int(n_out)?, int(k)?, int(m)?, int(ldy)?, int(y_f32 as usize)?])
}

/// `y[r, n] = x[m, k] · W[n_out, k]ᵀ` with W as GGUF rows of `format` blocks, row `r` of y at
/// `y + r * ldy` elements, in the storage type or f32 (`y_f32`).
pub struct Qgemv {
    pub format: QFormat,
    pub w: u64,
    pub x: u64,
    pub y: u64,
    pub n_out: usize,
    pub k: usize,
    pub m: usize,
    pub ldy: usize,
    pub y_f32: bool,
}

impl Qgemv {
    pub fn launch(&self, g: &Gpu, dt: Dt) -> Result<()> {
        if !self.k.is_multiple_of(self.format.block().0) {
            return Err(Error::internal(format!("qgemv: k = {} is not a whole number of blocks", self.k)));
        }
        if self.ldy < self.n_out {
            return Err(Error::internal(format!("qgemv: ldy {} < n_out {}", self.ldy, self.n_out)));
        }
        let args = matmul_args(self.w, self.x, self.y, (self.n_out, self.k, self.m, self.ldy), self.y_f32)?;
        let grid = dim(self.n_out.div_ceil(QGEMV_WARPS as usize))?;
        let kernel = format!("qgemv_{}", self.format.suffix());
        g.launch(&name(&kernel, dt), (grid, 1, 1), QGEMV_WARPS * 32, &args)
    }
}

/// `out[t, :]` = row `ids[t]` of a `[vocab, hidden]` table in GGUF blocks, dequantized (a zero
/// row for an id outside the vocabulary).
pub struct QEmbedding {
    pub format: QFormat,
    pub table: u64,
    pub ids: u64,
    pub out: u64,
    pub hidden: usize,
    pub vocab: usize,
}

impl QEmbedding {
    pub fn launch(&self, g: &Gpu, dt: Dt, rows: usize) -> Result<()> {
        if !self.hidden.is_multiple_of(self.format.block().0) {
            return Err(Error::internal(format!("qembedding: {} is not a whole number of blocks", self.hidden)));
        }
        let args = [P(self.table), P(self.ids), P(self.out), int(self.hidden)?, int(self.vocab)?];
        let kernel = format!("qembedding_{}", self.format.suffix());
        g.launch(&name(&kernel, dt), (dim(rows)?, 1, 1), THREADS, &args)
    }
}

/// `out[r]` (u32) = the index of the largest of the f32 `logits[r, vocab]`, per row.
pub struct Argmax {
    pub logits: u64,
    pub out: u64,
    pub vocab: usize,
}

impl Argmax {
    pub fn launch(&self, g: &Gpu, rows: usize) -> Result<()> {
        let args = [P(self.logits), P(self.out), int(self.vocab)?];
        g.launch("argmax_f32", (dim(rows)?, 1, 1), ROW_THREADS, &args)
    }
}

/// One seeded draw per row of f32 logits (`lmplex_model::sample::draw`, bit for bit), overwriting the
/// rows with their weights; rows whose temperature is 0 are left to `Argmax`. Per-row
/// parameters: `temperature`, `top_p` and `min_p` (f32), `top_k` (i32, 0 for none), `seed` and
/// `step` (u64); `out[r]` is a u32 id.
pub struct Sample {
    pub logits: u64,
    pub out: u64,
    pub temperature: u64,
    pub top_k: u64,
    pub top_p: u64,
    pub min_p: u64,
    pub seed: u64,
    pub step: u64,
    pub vocab: usize,
}

impl Sample {
    pub fn launch(&self, g: &Gpu, rows: usize) -> Result<()> {
        let args = [
            P(self.logits),
            P(self.out),
            P(self.temperature),
            P(self.top_k),
            P(self.top_p),
            P(self.min_p),
            P(self.seed),
            P(self.step),
            int(self.vocab)?,
        ];
        g.launch("sample_f32", (dim(rows)?, 1, 1), ROW_THREADS, &args)
    }
}

/// Each row's logit edits (`lmplex_model::sample::pick`, packed by `meta::pack_edits`) applied to the
/// f32 `logits[r, vocab]` in place: row `r`'s edits are `edits[row_start[r]..row_start[r + 1]]`.
pub struct LogitEdits {
    pub logits: u64,
    pub edits: u64,
    pub row_start: u64,
    pub vocab: usize,
}

impl LogitEdits {
    pub fn launch(&self, g: &Gpu, rows: usize) -> Result<()> {
        let args = [P(self.logits), P(self.edits), P(self.row_start), int(self.vocab)?];
        g.launch("logit_edits_f32", (dim(rows)?, 1, 1), THREADS, &args)
    }
}
