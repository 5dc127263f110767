//! Where each patch row of a batch of images sits: its 2D position for the rotary, the frames
//! that full attention runs over, and Qwen2.5-VL's windows (transformers' `vision_utils`:
//! `get_vision_position_ids`, `get_vision_cu_seqlens`, `get_vision_window_index`).
//!
//! The processor emits an image's `t * h * w` patch rows frame after frame, each frame in
//! merged units of `m x m` patches (`m = spatial_merge_size`): units row-major over the
//! `h / m x w / m` unit grid, and inside a unit its `m x m` patches row-major. A unit's `m^2`
//! rows are consecutive and become one image token.
//!
//! Invariants: an image's rows, units, frames and windows are a contiguous range of the batch's,
//! at the offset of the images before it; positions, windows and the window order of an image
//! depend on its own grid only, so no segment of attention ever holds rows of two images (nor
//! of two frames) and an image's layout is the same alone or in any batch.

use super::args::Qwen2VlVisionArgs;
use lmplex_core::{Error, Result};
use std::ops::Range;

/// Checks `grids` against `patches` values of `args`: every side positive, `h` and `w`
/// multiples of the merge size, and `sum t * h * w * patch_len == patches`. Returns the rows
/// (patches) of the batch. Never overflows: a product that would is refused.
pub(super) fn check(args: &Qwen2VlVisionArgs, patches: usize, grids: &[[usize; 3]]) -> Result<usize> {
    let m = args.spatial_merge_size;
    let mut rows = 0usize;
    for (i, &[t, h, w]) in grids.iter().enumerate() {
        if t == 0 || h == 0 || w == 0 {
            return Err(Error::invalid(format!("image {i}: grid [{t}, {h}, {w}] has an empty side")));
        }
        if !h.is_multiple_of(m) || !w.is_multiple_of(m) {
            return Err(Error::invalid(format!(
                "image {i}: grid [{t}, {h}, {w}] is not divisible by the spatial merge size {m}"
            )));
        }
        rows = t
            .checked_mul(h)
            .and_then(|n| n.checked_mul(w))
            .and_then(|n| n.checked_add(rows))
            .ok_or_else(|| Error::invalid(format!("image {i}: grid [{t}, {h}, {w}] is too large")))?;
    }
    let want = rows.checked_mul(args.patch_len());
    if want != Some(patches) {
        return Err(Error::invalid(format!(
            "{patches} patch values for grids {grids:?}: {rows} patches of {} values each",
            args.patch_len()
        )));
    }
    Ok(rows)
}

/// `(h, w)` of every patch row of `grids`, in the processor's order: within a frame, row `i`
/// is patch `(i % m^2) / m, i % m` of unit `i / m^2`, units row-major; every frame repeats the
/// first's positions.
pub(super) fn positions(grids: &[[usize; 3]], m: usize) -> Vec<[usize; 2]> {
    let mut out = Vec::new();
    for &[t, h, w] in grids {
        let units_w = w / m;
        let frame = (0..h * w).map(|i| {
            let (unit, inner) = (i / (m * m), i % (m * m));
            [unit / units_w * m + inner / m, unit % units_w * m + inner % m]
        });
        let frame: Vec<[usize; 2]> = frame.collect();
        for _ in 0..t {
            out.extend_from_slice(&frame);
        }
    }
    out
}

/// The frames of `grids` as ranges of rows: full attention's segments (`cu_seqlens`).
pub(super) fn frames(grids: &[[usize; 3]]) -> Vec<Range<usize>> {
    let mut start = 0;
    let mut out = Vec::new();
    for &[t, h, w] in grids {
        for _ in 0..t {
            out.push(start..start + h * w);
            start += h * w;
        }
    }
    out
}

/// Qwen2.5-VL's window order: `order[k]` is the unit (of the batch, in the processor's order)
/// that comes `k`-th once units are grouped by window, and `windows` the windows as ranges of
/// that order, in units. Per frame, windows of `side x side` units tile the unit grid from its
/// top-left corner (those at the right and bottom edges are cut short), row-major; a window's
/// units keep their row-major order.
pub(super) fn window_order(grids: &[[usize; 3]], m: usize, side: usize) -> (Vec<usize>, Vec<Range<usize>>) {
    let (mut order, mut windows) = (Vec::new(), Vec::new());
    let mut base = 0;
    for &[t, h, w] in grids {
        let (uh, uw) = (h / m, w / m);
        for _ in 0..t {
            for wy in (0..uh).step_by(side) {
                for wx in (0..uw).step_by(side) {
                    let start = order.len();
                    for y in wy..(wy + side).min(uh) {
                        order.extend((wx..(wx + side).min(uw)).map(|x| base + y * uw + x));
                    }
                    windows.push(start..order.len());
                }
            }
            base += uh * uw;
        }
    }
    (order, windows)
}

/// `values` in units of `unit_len` values, reordered so that unit `k` of the result is unit
/// `order[k]` of `values`.
pub(super) fn gather_units<T: Copy>(values: &[T], order: &[usize], unit_len: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(values.len());
    for &u in order {
        out.extend_from_slice(&values[u * unit_len..(u + 1) * unit_len]);
    }
    out
}

/// The inverse of `gather_units` for rows of `width` values: row `order[k]` of the result is
/// row `k` of `rows`.
pub(super) fn scatter_rows(rows: &[f32], order: &[usize], width: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows.len()];
    for (k, &u) in order.iter().enumerate() {
        out[u * width..(u + 1) * width].copy_from_slice(&rows[k * width..(k + 1) * width]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 4x6 grid with 2x2 units: rows go unit by unit (3 units a row), each unit row-major.
    #[test]
    fn positions_follow_the_processors_merge_order() {
        let p = positions(&[[1, 4, 6]], 2);
        assert_eq!(p.len(), 24);
        assert_eq!(p[..8], [[0, 0], [0, 1], [1, 0], [1, 1], [0, 2], [0, 3], [1, 2], [1, 3]]);
        assert_eq!(p[12..16], [[2, 0], [2, 1], [3, 0], [3, 1]]);
        assert_eq!(p[23], [3, 5]);
        // transformers' reshape(h/m, m, w/m, m).transpose(1, 2).flatten() of the meshgrid.
        let (h, w, m) = (6, 4, 2);
        let mut want = Vec::new();
        for bh in 0..h / m {
            for bw in 0..w / m {
                for ih in 0..m {
                    for iw in 0..m {
                        want.push([bh * m + ih, bw * m + iw]);
                    }
                }
            }
        }
        let two = positions(&[[1, 4, 6], [2, h, w]], m);
        assert_eq!(two[24..48], want);
        assert_eq!(two[48..], want, "each frame repeats the positions");
        assert_eq!(frames(&[[1, 4, 6], [2, h, w]]), [0..24, 24..48, 48..72]);
    }

    /// The fixtures' grids with windows of 2x2 units, against `get_vision_window_index`'s
    /// output for them (window_index and cu_window_seqlens / 4).
    #[test]
    fn window_order_matches_transformers() {
        let (order, windows) = window_order(&[[1, 4, 6], [1, 8, 4]], 2, 2);
        // Image 0: 2x3 units -> windows {0, 1, 3, 4}, {2, 5}. Image 1: 4x2 units (from 6) ->
        // windows {6, 7, 8, 9}, {10, 11, 12, 13}.
        assert_eq!(order, [0, 1, 3, 4, 2, 5, 6, 7, 8, 9, 10, 11, 12, 13]);
        assert_eq!(windows, [0..4, 4..6, 6..10, 10..14]);
        // A 5x5 unit grid with windows of 2: 9 windows, the edges cut short; two frames.
        let (order, windows) = window_order(&[[2, 10, 10]], 2, 2);
        assert_eq!(order[..8], [0, 1, 5, 6, 2, 3, 7, 8]);
        assert_eq!(windows.len(), 18);
        assert_eq!(windows[2], 8..10); // units 4 and 9
        assert_eq!(order[8..10], [4, 9]);
        assert_eq!(windows[8], 24..25); // unit 24, the corner
        assert_eq!(order[25..27], [25, 26], "the second frame's units follow");
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
    }

    #[test]
    fn gathering_and_scattering_units_are_inverse() {
        let rows: Vec<f32> = (0..24).map(|i| i as f32).collect(); // 6 units of 4 values
        let order = [2, 0, 1, 5, 3, 4];
        let g = gather_units(&rows, &order, 4);
        assert_eq!(g[..4], [8.0, 9.0, 10.0, 11.0]);
        assert_eq!(scatter_rows(&g, &order, 4), rows);
    }

    #[test]
    fn bad_grids_are_invalid_requests() {
        let a = Qwen2VlVisionArgs::from_hf_config(r#"{"model_type": "qwen2_vl"}"#).unwrap();
        let len = a.patch_len();
        assert_eq!(check(&a, 24 * len + 32 * len, &[[1, 4, 6], [1, 8, 4]]).unwrap(), 56);
        assert_eq!(check(&a, 0, &[]).unwrap(), 0);
        for (patches, grids) in [
            (24 * len - 1, vec![[1, 4, 6]]),
            (24 * len, vec![[1, 4, 6], [1, 2, 2]]),
            (15 * len, vec![[1, 3, 5]]),
            (0, vec![[0, 4, 6]]),
            (len, vec![[usize::MAX, 2, 2]]),
            (len, vec![[1, usize::MAX - 1, usize::MAX - 1]]),
        ] {
            match check(&a, patches, &grids) {
                Err(Error::InvalidRequest(_)) => {}
                other => panic!("{grids:?}: {other:?}"),
            }
        }
    }
}
