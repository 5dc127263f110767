//! GGUF mutations: the file's fields found by walking its layout, and what to write there.

use proptest::prelude::*;

/// One field of a GGUF file that a mutation may rewrite: its offset, width in bytes, and what
/// it holds.
#[derive(Debug, Clone, Copy)]
pub enum Field {
    /// A count or length (tensor count, key count, string length, array length).
    Len(usize),
    /// A value type tag.
    Tag(usize),
    /// A tensor dimension.
    Dim(usize),
    /// A tensor's ggml type.
    DType(usize),
    /// A tensor's data offset.
    Offset(usize),
    /// A metadata value (`width` bytes).
    Value(usize, usize),
    /// A string's bytes (`len`).
    Text(usize, usize),
}

/// The mutable fields of a GGUF file (v2/v3 layout), in file order.
pub fn gguf_fields(b: &[u8]) -> Vec<Field> {
    let mut at = 8;
    let mut out = Vec::new();
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
    let (tensors, kvs) = (u64_at(8) as usize, u64_at(16) as usize);
    out.push(Field::Len(8));
    out.push(Field::Len(16));
    at += 16;
    let string = |at: &mut usize, out: &mut Vec<Field>| {
        let n = u64_at(*at) as usize;
        out.push(Field::Len(*at));
        out.push(Field::Text(*at + 8, n));
        *at += 8 + n;
    };
    fn width(tag: u32) -> usize {
        match tag {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            10..=12 => 8,
            _ => 0,
        }
    }
    for _ in 0..kvs {
        string(&mut at, &mut out);
        let tag = u32_at(at);
        out.push(Field::Tag(at));
        at += 4;
        match tag {
            8 => string(&mut at, &mut out),
            9 => {
                let elem = u32_at(at);
                out.push(Field::Tag(at));
                let n = u64_at(at + 4) as usize;
                out.push(Field::Len(at + 4));
                at += 12;
                for _ in 0..n {
                    if elem == 8 {
                        string(&mut at, &mut out);
                    } else {
                        out.push(Field::Value(at, width(elem)));
                        at += width(elem);
                    }
                }
            }
            t => {
                out.push(Field::Value(at, width(t)));
                at += width(t);
            }
        }
    }
    for _ in 0..tensors {
        string(&mut at, &mut out);
        let dims = u32_at(at) as usize;
        out.push(Field::Len(at));
        at += 4;
        for _ in 0..dims {
            out.push(Field::Dim(at));
            at += 8;
        }
        out.push(Field::DType(at));
        out.push(Field::Offset(at + 4));
        at += 12;
    }
    out
}

/// Values worth writing into a field of `width` bytes.
pub fn interesting(width: usize, pick: u64) -> Vec<u8> {
    let v: u64 = match pick % 8 {
        0 => 0,
        1 => 1,
        2 => u64::MAX,
        3 => 1 << 40,
        4 => u64::MAX >> 1,
        5 => 0x8000_0000,
        6 => 255,
        _ => pick >> 3,
    };
    v.to_le_bytes()[..width.min(8)].to_vec()
}

/// One mutation of a GGUF file: a field and what to write there, or a cut.
#[derive(Debug, Clone)]
pub enum GgufMutation {
    Write { field: usize, pick: u64 },
    Bytes { field: usize, byte: u8, at: usize },
    Truncate { keep: usize },
}

pub fn gguf_mutation() -> impl Strategy<Value = Vec<GgufMutation>> {
    let one = prop_oneof![
        6 => (any::<usize>(), any::<u64>()).prop_map(|(field, pick)| GgufMutation::Write { field, pick }),
        2 => (any::<usize>(), any::<u8>(), any::<usize>()).prop_map(|(field, byte, at)| GgufMutation::Bytes { field, byte, at }),
        1 => any::<usize>().prop_map(|keep| GgufMutation::Truncate { keep }),
    ];
    prop::collection::vec(one, 1..4)
}

pub fn apply_gguf(mut b: Vec<u8>, fields: &[Field], muts: &[GgufMutation]) -> Vec<u8> {
    for m in muts {
        match *m {
            GgufMutation::Truncate { keep } => b.truncate(keep % (b.len() + 1)),
            GgufMutation::Write { field, pick } => {
                let (at, width) = match fields[field % fields.len()] {
                    Field::Len(at) | Field::Dim(at) | Field::Offset(at) => (at, 8),
                    Field::Tag(at) | Field::DType(at) => (at, 4),
                    Field::Value(at, w) => (at, w),
                    Field::Text(at, n) => (at, n.min(8)),
                };
                let bytes = interesting(width, pick);
                let end = (at + bytes.len()).min(b.len());
                if at < end {
                    b[at..end].copy_from_slice(&bytes[..end - at]);
                }
            }
            GgufMutation::Bytes { field, byte, at } => {
                if let Field::Text(start, n) = fields[field % fields.len()] {
                    if n > 0 && start + n <= b.len() {
                        b[start + at % n] = byte;
                    }
                }
            }
        }
    }
    b
}
