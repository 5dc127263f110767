//! The product `[m, n]` of `m` input rows by `n` weight rows cut into tiles and run on the
//! forward pass's thread team (`team`): a tile is up to `INPUT_TILE` input rows by a run of
//! weight rows, and its kernel writes each result straight to its cell of the output (`Block`).
//!
//! Invariant: a cell's value comes from the caller's `f` for that weight row and input row
//! alone; the tiling decides only who computes it and when, never how. Tiles own disjoint
//! cells, and a `Block` lets its kernel write its own cells only. `f` must write every cell of
//! its block: the output is not zero-filled first.

use crate::thread_team::{parallel_for, Cells};

/// Input rows per tile: a tile's activations stay in L2 while its weight rows are swept.
const INPUT_TILE: usize = 64;

/// Tiles per thread for one input row (batch-1 decode), which streams each weight from memory
/// once: long runs of rows keep each thread's prefetch stream going. A step of the synthetic
/// MoE's products (`step_timing`, 2 threads) streamed at 24-25.5 GB/s in 64-row tiles taken
/// in turn, 28-30 at two tiles per thread and 26-36 at one (where a thread the OS delays
/// holds up the whole product).
const DECODE_TILES_PER_THREAD: usize = 2;

thread_local! {
    /// Per-thread scratch of the kernels (a dequantized row).
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One block of a tile: weight rows `r..r + nr` (output columns) by input rows `i0..i0 + li`
/// (output rows), written in place in the `[m, n]` output.
pub(crate) struct Block<'a> {
    pub r: usize,
    pub nr: usize,
    pub i0: usize,
    pub li: usize,
    n: usize,
    cells: &'a Cells,
}

impl Block<'_> {
    /// `out[i0 + i, r + k] = v`.
    #[inline]
    pub fn set(&mut self, i: usize, k: usize, v: f32) {
        assert!(i < self.li && k < self.nr, "cell ({i}, {k}) outside its block");
        // SAFETY: inside the block (asserted), which only this task writes; the output outlives
        // the loop.
        unsafe { *self.cells.ptr((self.i0 + i) * self.n + self.r + k) = v };
    }

    /// Where `out[i0 + i, r]` is and the distance between output rows, for a kernel that
    /// writes input rows `i..i + rows` of every weight row of the block (asserted inside it).
    #[inline]
    pub fn at(&mut self, i: usize, rows: usize) -> (*mut f32, usize) {
        assert!(i + rows <= self.li, "rows {i}..{} outside its block", i + rows);
        // SAFETY: as in `set`; the pointer is in bounds (the block is inside the output).
        (unsafe { self.cells.ptr((self.i0 + i) * self.n + self.r) }, self.n)
    }
}

/// The `[m, n]` product computed by weight row: `f(block, scratch)` fills the block's cells
/// for its one weight row (`nr == 1`). The product is cut into tiles of up to `INPUT_TILE`
/// input rows by a run of weight rows (small enough for eight tiles per thread when the
/// matrix allows; for one input row, `DECODE_TILES_PER_THREAD`), run on the forward pass's
/// thread team.
pub(crate) fn by_weight_rows(n: usize, m: usize, f: impl Fn(&mut Block<'_>, &mut Vec<f32>) + Sync + Send) -> Vec<f32> {
    by_weight_row_blocks(n, m, 1, f)
}

/// `by_weight_rows` for blocks of up to `w` weight rows (`block.nr`); tiles hold whole blocks
/// but the last.
pub(crate) fn by_weight_row_blocks(
    n: usize,
    m: usize,
    w: usize,
    f: impl Fn(&mut Block<'_>, &mut Vec<f32>) + Sync + Send,
) -> Vec<f32> {
    let mut out = Vec::new();
    let ib = m.clamp(1, INPUT_TILE);
    let threads = rayon::current_num_threads();
    let rb = if m == 1 {
        n.div_ceil(DECODE_TILES_PER_THREAD * threads).max(1)
    } else {
        (4096 / ib).clamp(1, 64).min(n.div_ceil(8 * threads).max(8))
    }
    .next_multiple_of(w);
    let (tiles_i, tiles_r) = (m.div_ceil(ib), n.div_ceil(rb));
    let cells = Cells::uninit(&mut out, m * n);
    parallel_for(tiles_i * tiles_r, &|t| {
        let (i0, r0) = (t % tiles_i * ib, t / tiles_i * rb);
        let (li, lr) = (ib.min(m - i0), rb.min(n - r0));
        SCRATCH.with_borrow_mut(|buf| {
            for j in (0..lr).step_by(w) {
                let mut block = Block { r: r0 + j, nr: w.min(lr - j), i0, li, n, cells: &cells };
                f(&mut block, buf);
            }
        });
    });
    // SAFETY: the tiles cover the `[m, n]` product (`tiles_cover_the_product`) and each block's
    // kernel writes every cell of its block (the kernels' contract); a panicking task is
    // raised again by `parallel_for` before this line, so no unwritten cell is ever exposed.
    unsafe { out.set_len(m * n) };
    out
}
