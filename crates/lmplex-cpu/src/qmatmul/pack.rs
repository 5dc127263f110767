//! The packed row layout the integer kernels read: GGUF blocks are repacked once at load so
//! that one vector lane holds one 32-value unit, 16 units side by side.
//!
//! A row of `units` units is cut into groups of 16 (the last may have `L < 16` lanes). Each
//! value is split into bit planes of 32 bits per unit; the planes of group `g` start at
//! `g * 64 * BITS` and plane `P` of a group with `L` lanes holds unit `j`'s word at
//! `P * 4 * L + 4 * j`. Slot `(t, h)` of a unit (t in 0..16, h in 0..2) is its value `2t + h`,
//! and the planes are laid out so that a few shifts and masks turn plane words into vector
//! `t`, lane `j` = the `i16` pair (value `2t`, value `2t + 1`) of unit `j`:
//! - 4 bits: plane `P = t / 4`, nibble `t % 4` of each 16-bit half (half `h` for value `2t+h`);
//! - 5 bits: the same nibbles, plus plane 4 with the fifth bit of value `2t + h` at bit
//!   `16h + t`;
//! - 6 bits: the nibbles, plus planes 4 and 5 (`t / 8`) with the top two bits at bits
//!   `16h + 2 (t % 8)`; values are read minus 32;
//! - 8 bits: plane `t / 2`, byte `h * 2 + t % 2`, signed.
//!
//! The unit scales follow the planes (`formats::Scales`). Rows are stored back to back, and
//! the buffer ends in `SLACK` zero bytes so a kernel may load whole 16-lane vectors of the
//! last, partial group (the lanes past `L` are garbage and are masked off or meet zero
//! activations, never a NaN: the kernels zero the scales of missing lanes).
//!
//! Activations use the same order (`acts`), and `permute_x` gives the prompt kernel's f32 rows
//! in the order `tile` decodes weight rows.

use super::formats::{Format, RawUnit, Scales};

/// Zero bytes after the last row: a full vector read of any plane or scale array stays inside.
pub(super) const SLACK: usize = 128;

/// Lanes of group `g` in a row of `units` units.
#[inline(always)]
pub(super) fn lanes(units: usize, g: usize) -> usize {
    (units - 16 * g).min(16)
}

/// Bytes of one packed row of `units` units.
pub(super) fn row_bytes<F: Format>(units: usize) -> usize {
    units * 4 * F::BITS
        + match F::SCALES {
            Scales::F16 => 2 * units,
            Scales::F16Min => 4 * units,
            Scales::K => 2 * units + 8 * units.div_ceil(8),
            Scales::K6 => 2 * units + 4 * units.div_ceil(8),
        }
}

/// Where unit `u`'s plane words start and the stride between its planes.
#[inline(always)]
fn plane_pos<F: Format>(units: usize, u: usize) -> (usize, usize) {
    let (g, j) = (u / 16, u % 16);
    (g * 64 * F::BITS + 4 * j, 4 * lanes(units, g))
}

/// Repacks one row of GGUF blocks (`units / F::UNITS` blocks) into `out` (`row_bytes` long).
pub(super) fn pack_row<F: Format>(blocks: &[u8], units: usize, out: &mut [u8]) {
    let s0 = units * 4 * F::BITS;
    let sb = units.div_ceil(8);
    for (bi, b) in blocks.chunks_exact(F::BYTES).enumerate() {
        F::parse(b, |ui, raw: RawUnit| {
            let u = bi * F::UNITS + ui;
            let (base, stride) = plane_pos::<F>(units, u);
            for (p, word) in planes::<F>(&raw.v).into_iter().take(F::BITS).enumerate() {
                out[base + p * stride..][..4].copy_from_slice(&word.to_le_bytes());
            }
            let s = &mut out[s0..];
            match F::SCALES {
                Scales::F16 => s[2 * u..][..2].copy_from_slice(&raw.c16.to_le_bytes()),
                Scales::F16Min => {
                    s[2 * u..][..2].copy_from_slice(&raw.c16.to_le_bytes());
                    s[2 * units + 2 * u..][..2].copy_from_slice(&raw.m16.to_le_bytes());
                }
                Scales::K | Scales::K6 => {
                    (s[u], s[units + u]) = (raw.sc[0], raw.sc[1]);
                    s[2 * units + 4 * (u / 8)..][..4].copy_from_slice(&raw.d.to_le_bytes());
                    if F::SCALES == Scales::K {
                        s[2 * units + 4 * sb + 4 * (u / 8)..][..4].copy_from_slice(&raw.dmin.to_le_bytes());
                    }
                }
            }
        });
    }
}

/// The plane words of one unit's values (the first `F::BITS` are used).
fn planes<F: Format>(v: &[u8; 32]) -> [u32; 8] {
    let mut w = [0u32; 8];
    for t in 0..16 {
        for h in 0..2 {
            let x = v[2 * t + h] as u32;
            if F::BITS == 8 {
                w[t / 2] |= x << (8 * (2 * h + t % 2));
                continue;
            }
            w[t / 4] |= (x & 0xF) << (16 * h + 4 * (t % 4));
            match F::BITS {
                5 => w[4] |= ((x >> 4) & 1) << (16 * h + t),
                6 => w[4 + t / 8] |= ((x >> 4) & 3) << (16 * h + 2 * (t % 8)),
                _ => {}
            }
        }
    }
    w
}

/// One unit of a packed row, as the kernels read it: exact integer values and scales, so that
/// value `e` is `c[e / 16] * v[e] + mn`.
pub(super) struct Unit {
    pub v: [i32; 32],
    pub c: [f32; 2],
    pub mn: f32,
}

/// Unit `u` of a packed row of `units` units (the portable kernel and `dequantize_row`).
pub(super) fn unit<F: Format>(row: &[u8], units: usize, u: usize) -> Unit {
    let (base, stride) = plane_pos::<F>(units, u);
    let word = |p: usize| u32::from_le_bytes(row[base + p * stride..][..4].try_into().unwrap());
    // No allocation: the portable kernel and embedding lookups call this per unit.
    let w: [u32; 8] = std::array::from_fn(|p| if p < F::BITS { word(p) } else { 0 });
    let v = std::array::from_fn(|e| {
        let (t, h) = (e / 2, e % 2);
        if F::BITS == 8 {
            return (w[t / 2] >> (8 * (2 * h + t % 2))) as u8 as i8 as i32;
        }
        let mut x = (w[t / 4] >> (16 * h + 4 * (t % 4))) & 0xF;
        match F::BITS {
            5 => x |= ((w[4] >> (16 * h + t)) & 1) << 4,
            6 => x |= ((w[4 + t / 8] >> (16 * h + 2 * (t % 8))) & 3) << 4,
            _ => {}
        }
        x as i32 - if F::BITS == 6 { 32 } else { 0 }
    });
    let s = &row[units * 4 * F::BITS..];
    let f16_at = |i: usize| half::f16::from_le_bytes([s[i], s[i + 1]]).to_f32();
    let f32_at = |i: usize| f32::from_le_bytes(s[i..i + 4].try_into().unwrap());
    let sb = units.div_ceil(8);
    let (c, mn) = match F::SCALES {
        Scales::F16 => ([f16_at(2 * u); 2], -F::OFFSET * f16_at(2 * u)),
        Scales::F16Min => ([f16_at(2 * u); 2], f16_at(2 * units + 2 * u)),
        Scales::K => {
            let (d, dmin) = (f32_at(2 * units + 4 * (u / 8)), f32_at(2 * units + 4 * sb + 4 * (u / 8)));
            ([d * s[u] as f32; 2], -(dmin * s[units + u] as f32))
        }
        Scales::K6 => {
            let d = f32_at(2 * units + 4 * (u / 8));
            ([d * s[u] as i8 as f32, d * s[units + u] as i8 as f32], 0.0)
        }
    };
    Unit { v, c, mn }
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the prompt kernel's, x86 only
/// `x` (one row of `k` values) in packed order into `out`: group `g` (lanes `L`) starts at
/// `512 g`, and value `2t + h` of unit `16g + j` goes to `512 g + 2 L t + 2 j + h`.
pub(super) fn permute_x(x: &[f32], out: &mut [f32]) {
    let units = x.len() / 32;
    for g in 0..units.div_ceil(16) {
        let l = lanes(units, g);
        let (src, dst) = (&x[512 * g..], &mut out[512 * g..]);
        for t in 0..16 {
            for j in 0..l {
                dst[2 * l * t + 2 * j..][..2].copy_from_slice(&src[32 * j + 2 * t..][..2]);
            }
        }
    }
}
