//! The element types of a KV cache (`KvDtype`, `KvElem`: f32, `half::f16` or i8) and the exact
//! f16-to-f32 widening the attention kernel applies as it loads keys and values. The cache
//! itself (layout, blocks, batches) is the model's (`lmplex_model::kv`); kernels see only
//! these element types.
//!
//! Invariants: K and V are rounded to the element type once, when written; every read widens
//! them back to f32 exactly, so the choice changes what is stored, never how it is computed
//! with. An int8 cache is *scaled* (`KvDtype::scaled`): each token's K and V of each KV head
//! carry one f32 scale per group of `KV_GROUP` dimensions, `max |x| / 127` over the group
//! (`row_scale`), and the stored integers are `round(x / scale)`; the attention kernel
//! multiplies them back as it reads them. Before they are stored, K (with Q) and V are rotated
//! by an orthonormal Walsh-Hadamard matrix (`KvRotation`, llama.cpp's rotation for a quantized
//! cache), which spreads outlier channels over the group: attention scores are unchanged by a
//! rotation of both Q and K, and the attention output is rotated back. On KJV Genesis,
//! Qwen2.5's outlier key channels cost 2.5% perplexity with one scale per token and head
//! (LMDeploy's `quant_policy=8` granularity), 1.7% with groups of 32, and 0.3% with the
//! rotation too (as llama.cpp's q8_0 cache).

/// The element type of a KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    /// 32-bit floats: K and V stored exactly as computed.
    F32,
    /// IEEE half floats: half the memory; values rounded once when written.
    F16,
    /// Signed bytes with one f32 scale per token, KV head and `KV_GROUP` dimensions: a quarter
    /// of f32's memory plus 4 bytes per 32 values.
    I8,
}

impl KvDtype {
    /// Bytes per element (4 or 2).
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 => 2,
            Self::I8 => 1,
        }
    }

    /// Whether each token's K and V carry scales (int8: per KV head and `KV_GROUP` dimensions).
    pub fn scaled(self) -> bool {
        self == Self::I8
    }

    /// Scales per token and KV head of width `head_dim`: `head_dim / KV_GROUP` rounded up for a
    /// scaled dtype, else none.
    pub fn scale_groups(self, head_dim: usize) -> usize {
        if self.scaled() {
            head_dim.div_ceil(KV_GROUP)
        } else {
            0
        }
    }

    /// The name `info()` and the config use.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::F16 => "float16",
            Self::I8 => "int8",
        }
    }
}

/// A value type a KV cache holds (f32, `half::f16` or i8; sealed: plain data, every bit pattern
/// valid, alignment at most 4).
pub trait KvElem: Copy + Send + Sync + sealed::Sealed + 'static {
    /// The `KvDtype` that names this type.
    const DTYPE: KvDtype;
    /// The nearest value (ties to even; for i8, clamped to -127..=127: `x` is already divided
    /// by the row's scale).
    fn from_f32(x: f32) -> Self;
    /// The exact f32 value, with plain integer and float operations so that loops over it
    /// vectorize.
    fn to_f32(self) -> f32;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for i8 {}
}

/// The rotations of a scaled cache (llama.cpp's `attn_rot_k` and `attn_rot_v`): Q and K of each
/// head are rotated in blocks of `k` dimensions (the largest power of two dividing `head_dim`),
/// V and the attention output in blocks of 64; none unless `head_dim` is a multiple of 64.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvRotation {
    /// Block size of the Q and K rotation.
    pub k: usize,
    /// Block size of the V rotation (and of its inverse on the output).
    pub v: usize,
}

impl KvRotation {
    /// The rotation a cache of `dtype` applies to heads of width `head_dim`, if any.
    pub fn of(dtype: KvDtype, head_dim: usize) -> Option<Self> {
        if !dtype.scaled() || head_dim == 0 || !head_dim.is_multiple_of(64) {
            return None;
        }
        Some(Self { k: 1 << head_dim.trailing_zeros(), v: 64 })
    }
}

/// `x` (a multiple of `n` long, `n` a power of two) times the orthonormal Walsh-Hadamard matrix
/// of size `n` (Sylvester's order, scaled by `1 / sqrt(n)`), block by block, in place: the
/// fast transform's butterflies, a fixed order. The matrix is symmetric and its own inverse.
pub fn hadamard(x: &mut [f32], n: usize) {
    debug_assert!(n.is_power_of_two() && x.len().is_multiple_of(n));
    let norm = 1.0 / (n as f32).sqrt();
    for b in x.chunks_exact_mut(n) {
        let mut h = 1;
        while h < n {
            for pair in b.chunks_exact_mut(2 * h) {
                let (lo, hi) = pair.split_at_mut(h);
                for (a, c) in lo.iter_mut().zip(hi) {
                    (*a, *c) = (*a + *c, *a - *c);
                }
            }
            h *= 2;
        }
        b.iter_mut().for_each(|v| *v *= norm);
    }
}

/// Dimensions of one head that share a scale in a scaled (int8) cache.
pub const KV_GROUP: usize = 32;

/// The scale a group of K or V values (one token, one KV head, `KV_GROUP` dimensions) is stored with: `max |x| / 127` for a
/// scaled dtype (0 for an all-zero row), else 1. Values are stored as `from_f32(x * inv)`
/// with `inv` from `inv_scale`, so an unscaled row is stored exactly as before.
#[inline]
pub fn row_scale(dtype: KvDtype, row: &[f32]) -> f32 {
    if dtype.scaled() {
        row.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0
    } else {
        1.0
    }
}

/// `1 / scale`, or 0 for a zero (or non-finite) scale, whose row is stored as zeros.
#[inline]
pub fn inv_scale(scale: f32) -> f32 {
    if scale > 0.0 && scale.is_finite() {
        1.0 / scale
    } else {
        0.0
    }
}

impl KvElem for f32 {
    const DTYPE: KvDtype = KvDtype::F32;
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl KvElem for half::f16 {
    const DTYPE: KvDtype = KvDtype::F16;
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16_bits_to_f32(self.to_bits())
    }
}

impl KvElem for i8 {
    const DTYPE: KvDtype = KvDtype::I8;
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x.round_ties_even().clamp(-127.0, 127.0) as i8
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from(self)
    }
}

/// The f32 of an IEEE half, exactly: exponent and mantissa moved into f32's fields, then times
/// 2^112 to rebias (which also turns a subnormal half, an f32 subnormal here, into its normal
/// f32 exactly); infinities and NaNs keep an all-ones exponent. (`half`'s conversion checks
/// the CPU per call, which keeps loops over it from vectorizing.)
#[inline(always)]
pub fn f16_bits_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let em = h & 0x7fff;
    let finite = f32::from_bits(em << 13) * f32::from_bits(0x7780_0000);
    let mag = if em >= 0x7c00 { f32::from_bits((em << 13) | 0x7f80_0000) } else { finite };
    f32::from_bits(mag.to_bits() | (h & 0x8000) << 16)
}
