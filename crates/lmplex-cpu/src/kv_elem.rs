//! The element types of a KV cache (`KvDtype`, `KvElem`: f32 or `half::f16`) and the exact
//! f16-to-f32 widening the attention kernel applies as it loads keys and values. The cache
//! itself (layout, blocks, batches) is the model's (`lmplex_model::kv`); kernels see only
//! these element types.
//!
//! Invariant: K and V are rounded to the element type once, when written; every read widens
//! them back to f32 exactly, so the choice changes what is stored, never how it is computed
//! with.

/// The element type of a KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    /// 32-bit floats: K and V stored exactly as computed.
    F32,
    /// IEEE half floats: half the memory; values rounded once when written.
    F16,
}

impl KvDtype {
    /// Bytes per element (4 or 2).
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 => 2,
        }
    }

    /// The name `info()` and the config use.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::F16 => "float16",
        }
    }
}

/// A value type a KV cache holds (f32 or `half::f16`; sealed: plain data, every bit pattern
/// valid, alignment at most 4).
pub trait KvElem: Copy + Send + Sync + sealed::Sealed + 'static {
    /// The `KvDtype` that names this type.
    const DTYPE: KvDtype;
    /// The nearest value (ties to even).
    fn from_f32(x: f32) -> Self;
    /// The exact f32 value, with plain integer and float operations so that loops over it
    /// vectorize.
    fn to_f32(self) -> f32;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
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
