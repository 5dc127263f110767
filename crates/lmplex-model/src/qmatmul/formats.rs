//! The GGUF block formats with integer kernels: bytes per block, 32-value units per block and
//! whether the weights carry an additive minimum. Layouts are ggml's (`ggml-common.h`).

#![allow(non_camel_case_types)] // ggml's names

pub(super) trait Format {
    /// Bytes of one block.
    const BYTES: usize;
    /// 32-value units per block.
    const UNITS: usize;
    /// Whether units have an additive minimum (`mn != 0`).
    const MIN: bool;
}

macro_rules! formats {
    ($($name:ident: $bytes:expr, $units:expr, $min:expr;)*) => {$(
        pub(super) struct $name;
        impl Format for $name {
            const BYTES: usize = $bytes;
            const UNITS: usize = $units;
            const MIN: bool = $min;
        }
    )*};
}

formats! {
    Q4_0: 18, 1, false;   // d f16, 16 B nibbles; value (q - 8) * d
    Q4_1: 20, 1, true;    // d, m f16, 16 B nibbles; q * d + m
    Q5_0: 22, 1, false;   // d, 4 B high bits, 16 B nibbles; (q - 16) * d
    Q5_1: 24, 1, true;    // d, m, 4 B high bits, 16 B nibbles; q * d + m
    Q8_0: 34, 1, false;   // d, 32 i8; q * d
    Q4K: 144, 8, true;    // d, dmin, 12 B 6-bit scales/mins, 128 B nibbles
    Q5K: 176, 8, true;    // as Q4K plus 32 B high bits
    Q6K: 210, 8, false;   // 128 B low nibbles, 64 B high 2 bits, 16 i8 scales, d
}
