//! The product `[m, n]` of `m` input rows by `n` weight rows cut into tiles and run on the
//! forward pass's thread team (`team`): a tile is up to `INPUT_TILE` input rows by a run of
//! weight rows, filled through a per-thread buffer and then copied to its place.
//!
//! Invariant: a cell's value comes from the caller's `f` for that weight row and input row
//! alone; the tiling decides only who computes it and when, never how.

use crate::team::{parallel_for, Cells};

/// Input rows per tile: a tile's activations stay in L2 while its weight rows are swept.
const INPUT_TILE: usize = 64;

thread_local! {
    /// Per-thread scratch of the tiles: a dequantized row and the tile's outputs.
    static SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<f32>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// The `[m, n]` product computed by weight row: `f(r, i0, o, scratch)` fills
/// `o[j] = out[i0 + j, r]`. The product is cut into tiles of up to `INPUT_TILE` input rows by a
/// run of weight rows (small enough for eight tiles per thread when the matrix allows), run on
/// the forward pass's thread team.
pub(crate) fn by_weight_rows(
    n: usize,
    m: usize,
    f: impl Fn(usize, usize, &mut [f32], &mut Vec<f32>) + Sync + Send,
) -> Vec<f32> {
    by_weight_row_blocks(n, m, 1, |r, _, i0, o, buf| f(r, i0, o, buf))
}

/// `by_weight_rows` for blocks of up to `w` weight rows: `f(r, nr, i0, o, scratch)` fills
/// `o[k * li + j] = out[i0 + j, r + k]` for the block's `nr` rows (`li = o.len() / nr`).
/// Tiles hold whole blocks but the last.
pub(crate) fn by_weight_row_blocks(
    n: usize,
    m: usize,
    w: usize,
    f: impl Fn(usize, usize, usize, &mut [f32], &mut Vec<f32>) + Sync + Send,
) -> Vec<f32> {
    let mut out = vec![0f32; m * n];
    let ib = m.clamp(1, INPUT_TILE);
    let threads = rayon::current_num_threads();
    let rb = (4096 / ib).clamp(1, 64).min(n.div_ceil(8 * threads).max(8)).next_multiple_of(w);
    let (tiles_i, tiles_r) = (m.div_ceil(ib), n.div_ceil(rb));
    let dst = Cells::new(&mut out);
    parallel_for(tiles_i * tiles_r, &|t| {
        let (i0, r0) = (t % tiles_i * ib, t / tiles_i * rb);
        let (li, lr) = (ib.min(m - i0), rb.min(n - r0));
        SCRATCH.with_borrow_mut(|(buf, tile)| {
            tile.clear();
            tile.resize(li * lr, 0f32);
            for j in (0..lr).step_by(w) {
                let nr = w.min(lr - j);
                f(r0 + j, nr, i0, &mut tile[j * li..(j + nr) * li], buf);
            }
            for i in 0..li {
                // SAFETY: row i0 + i, columns r0..r0 + lr are inside [m, n] and this tile's alone.
                let o = unsafe { dst.slice((i0 + i) * n + r0, lr) };
                for (j, oj) in o.iter_mut().enumerate() {
                    *oj = tile[j * li + i];
                }
            }
        });
    });
    out
}
