//! The GGUF block formats with integer kernels: how each GGUF block (ggml's layouts,
//! `ggml-common.h`) reads as 32-value units of exact integers `v` with a float scale, and how
//! the repacked rows (`pack`) store those scales.
//!
//! Every unit's weights are `c * v + mn` (Q6_K: `c[0]` for values 0..16 and `c[1]` for 16..32),
//! with `c` and `mn` exactly representable in f32 (an f16, or an f16 times a small integer).

#![allow(non_camel_case_types)] // ggml's names

use half::f16;

/// How a packed row stores its unit scales (after the value planes).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Scales {
    /// `c: [f16; units]`; `mn = -OFFSET * c`.
    F16,
    /// `c: [f16; units]`, then `mn: [f16; units]`.
    F16Min,
    /// `sc: [u8; units]`, `m: [u8; units]`, then per 8 units `d: [f32]`, `dmin: [f32]`:
    /// `c = d * sc`, `mn = -dmin * m` (Q4_K, Q5_K).
    K,
    /// `sc0: [i8; units]`, `sc1: [i8; units]`, then per 8 units `d: [f32]`: `c[h] = d * sc_h`
    /// (Q6_K).
    K6,
}

/// One unit as read from a GGUF block: values (unsigned for 4, 5 and 6 bits, signed for 8)
/// and the scale fields its `Scales` kind stores.
pub(super) struct RawUnit {
    pub v: [u8; 32],
    /// f16 bits of `c` and `mn` (F16, F16Min).
    pub c16: u16,
    pub m16: u16,
    /// K: `sc`, `m`; K6: `sc0`, `sc1` (i8 bits).
    pub sc: [u8; 2],
    /// K, K6: the super-block scales.
    pub d: f32,
    pub dmin: f32,
}

pub(super) trait Format {
    /// Bytes of one GGUF block.
    const BYTES: usize;
    /// 32-value units per GGUF block.
    const UNITS: usize;
    /// Bits per value: 4, 5 or 6 (unsigned; 6-bit values are offset by -32 when read), or 8
    /// (signed).
    const BITS: usize;
    const SCALES: Scales;
    /// `mn = -OFFSET * c` for `Scales::F16` (Q4_0: values `q - 8`).
    const OFFSET: f32 = 0.0;
    /// Whether units have an additive minimum.
    const MIN: bool = matches!(Self::SCALES, Scales::F16Min | Scales::K) || Self::OFFSET != 0.0;
    /// Reads block `b` as `UNITS` units, in value order.
    fn parse(b: &[u8], f: impl FnMut(usize, RawUnit));
}

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

fn f32_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16_at(b, i)).to_f32()
}

fn unit(v: [u8; 32], c16: u16, m16: u16) -> RawUnit {
    RawUnit { v, c16, m16, sc: [0; 2], d: 0.0, dmin: 0.0 }
}

fn nibbles(qs: &[u8]) -> [u8; 32] {
    std::array::from_fn(|j| if j < 16 { qs[j] & 0xF } else { qs[j - 16] >> 4 })
}

/// Nibbles plus 16 where bit i of the little-endian u32 at `qh` is set.
fn five_bits(qh: &[u8], qs: &[u8]) -> [u8; 32] {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut v = nibbles(qs);
    v.iter_mut().enumerate().for_each(|(i, x)| *x |= (((qh >> i) & 1) << 4) as u8);
    v
}

/// The scale and minimum of K-quant sub-block `j` (6 bits each, packed in 12 bytes).
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

macro_rules! format {
    ($name:ident, $bytes:expr, $units:expr, $bits:expr, $scales:ident, $offset:expr, |$b:ident, $f:ident| $parse:block) => {
        pub(super) struct $name;
        impl Format for $name {
            const BYTES: usize = $bytes;
            const UNITS: usize = $units;
            const BITS: usize = $bits;
            const SCALES: Scales = Scales::$scales;
            const OFFSET: f32 = $offset;
            #[allow(unused_mut)] // some formats hand `f` on
            fn parse($b: &[u8], mut $f: impl FnMut(usize, RawUnit)) $parse
        }
    };
}

// d f16, 16 B nibbles; value (q - 8) * d
format!(Q4_0, 18, 1, 4, F16, 8.0, |b, f| { f(0, unit(nibbles(&b[2..18]), u16_at(b, 0), 0)) });
// d, m f16, 16 B nibbles; q * d + m
format!(Q4_1, 20, 1, 4, F16Min, 0.0, |b, f| { f(0, unit(nibbles(&b[4..20]), u16_at(b, 0), u16_at(b, 2))) });
// d, 4 B high bits, 16 B nibbles; (q - 16) * d
format!(Q5_0, 22, 1, 5, F16, 16.0, |b, f| { f(0, unit(five_bits(&b[2..6], &b[6..22]), u16_at(b, 0), 0)) });
// d, m, 4 B high bits, 16 B nibbles; q * d + m
format!(Q5_1, 24, 1, 5, F16Min, 0.0, |b, f| { f(0, unit(five_bits(&b[4..8], &b[8..24]), u16_at(b, 0), u16_at(b, 2))) });
// d, 32 i8; q * d
format!(Q8_0, 34, 1, 8, F16, 0.0, |b, f| { f(0, unit(std::array::from_fn(|j| b[2 + j]), u16_at(b, 0), 0)) });

/// Q4_K and Q5_K: for each 64-value chunk j, the low nibbles of 32 bytes are unit 2j and the
/// high nibbles unit 2j+1; Q5_K adds bit u of each `qh` byte as the fifth bit of unit u.
fn k_quant(b: &[u8], five: bool, mut f: impl FnMut(usize, RawUnit)) {
    let (d, dmin, scales) = (f32_at(b, 0), f32_at(b, 2), &b[4..16]);
    let (qh, qs) = if five { (&b[16..48], &b[48..176]) } else { (&b[0..0], &b[16..144]) };
    for u in 0..8 {
        let (sc, m) = scale_min_k4(u, scales);
        let q = &qs[32 * (u / 2)..];
        let v = std::array::from_fn(|l| {
            let hi = if five { ((qh[l] >> u) & 1) << 4 } else { 0 };
            ((q[l] >> (4 * (u % 2))) & 0xF) | hi
        });
        f(u, RawUnit { v, c16: 0, m16: 0, sc: [sc, m], d, dmin })
    }
}

// d, dmin, 12 B 6-bit scales/mins, 128 B nibbles
format!(Q4K, 144, 8, 4, K, 0.0, |b, f| { k_quant(b, false, f) });
// as Q4K plus 32 B high bits
format!(Q5K, 176, 8, 5, K, 0.0, |b, f| { k_quant(b, true, f) });
// 128 B low nibbles, 64 B high 2 bits, 16 i8 scales, d; value (q - 32) * d * sc
format!(Q6K, 210, 8, 6, K6, 0.0, |b, f| {
    let (ql, qh, sc, d) = (&b[0..128], &b[128..192], &b[192..208], f32_at(b, 208));
    for n in 0..2 {
        let (ql, qh, sc) = (&ql[64 * n..], &qh[32 * n..], &sc[8 * n..]);
        for u in 0..4 {
            // Unit u: the low (u < 2) or high nibbles of ql[32 * (u % 2)..], with bits 2u and
            // 2u+1 of qh on top; its halves have scales sc[2u] and sc[2u + 1].
            let (lo, shift) = (32 * (u % 2), 4 * (u / 2));
            let v = std::array::from_fn(|l| ((ql[lo + l] >> shift) & 0xF) | (((qh[l] >> (2 * u)) & 3) << 4));
            f(4 * n + u, RawUnit { v, c16: 0, m16: 0, sc: [sc[2 * u], sc[2 * u + 1]], d, dmin: 0.0 })
        }
    }
});
