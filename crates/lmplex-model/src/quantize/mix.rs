//! Which type each tensor gets: llama.cpp's rules (`llama_tensor_get_type` and the checks around
//! it in `llama_model_quantize_impl`) for the file types lmplex makes, so a model quantized here
//! has the tensor types `llama-quantize` gives it.
//!
//! - Only weights (names ending in `weight`) of two or more dimensions are quantized, never a
//!   norm (`_norm.weight`) or a MoE router (`ffn_gate_inp.weight`); the rest keep their type.
//! - The head (`output.weight`, or `token_embd.weight` when there is no separate head) takes
//!   Q6_K (Q8_0 for `q8_0`, or where its rows are not a multiple of the type's block).
//! - `q4_k_m`/`q5_k_m`: `attn_v.weight` (and a fused `attn_qkv` or MLA `attn_kv_b`, which
//!   llama.cpp treats alike) and `ffn_down` take Q6_K in the layers `use_more_bits` picks (the
//!   first and last eighth of the layers, and every third between), counted in llama.cpp's
//!   tensor order (`super::llama_order`), which the caller gives.
//! - With 8 experts (Mixtral), `attn_v` and `attn_k` take Q8_0 and, for `q4_k_m`,
//!   `attn_output` Q5_K.
//! - Not followed: llama.cpp's 70B rule (80-layer llama: `attn_v` Q5_K instead of Q4_K), and
//!   where llama.cpp stops on a row that Q4_0/Q8_0's 32 does not divide, lmplex writes F16.
//! - A row length that the chosen type's block does not divide falls back: Q4_K to Q5_0, Q5_K to
//!   Q5_1, Q6_K to Q8_0, and to F16 if that does not fit either.

use candle_core::quantized::GgmlDType;

/// A file type `lmplex quantize` writes (llama.cpp's `llama_ftype` values in `ftype`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FileType {
    /// Every quantizable tensor f32.
    F32,
    /// f16.
    F16,
    /// bf16.
    Bf16,
    /// Q8_0 (8.5 bits per weight).
    Q8_0,
    /// Q4_0 (4.5 bits), the head Q6_K.
    Q4_0,
    /// llama.cpp's Q4_K_M mix: Q4_K, some layers' attn_v and ffn_down Q6_K.
    Q4KM,
    /// The Q5_K_M mix: Q5_K, the same layers Q6_K.
    Q5KM,
    /// Q6_K (6.56 bits).
    Q6K,
}

impl FileType {
    /// Every type, by its command-line name.
    pub const ALL: [(&'static str, FileType); 8] = [
        ("f32", Self::F32),
        ("f16", Self::F16),
        ("bf16", Self::Bf16),
        ("q8_0", Self::Q8_0),
        ("q4_0", Self::Q4_0),
        ("q4_k_m", Self::Q4KM),
        ("q5_k_m", Self::Q5KM),
        ("q6_k", Self::Q6K),
    ];

    /// The type named `name` (case-insensitive), or None.
    pub fn from_name(name: &str) -> Option<Self> {
        let name = name.to_ascii_lowercase();
        Self::ALL.iter().find(|(n, _)| *n == name).map(|&(_, t)| t)
    }

    /// llama.cpp's `general.file_type` value.
    pub fn ftype(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q8_0 => 7,
            Self::Q4KM => 15,
            Self::Q5KM => 17,
            Self::Q6K => 18,
            Self::Bf16 => 32,
        }
    }

    /// The type most tensors get.
    pub fn default_type(self) -> GgmlDType {
        match self {
            Self::F32 => GgmlDType::F32,
            Self::F16 => GgmlDType::F16,
            Self::Bf16 => GgmlDType::BF16,
            Self::Q8_0 => GgmlDType::Q8_0,
            Self::Q4_0 => GgmlDType::Q4_0,
            Self::Q4KM => GgmlDType::Q4K,
            Self::Q5KM => GgmlDType::Q5K,
            Self::Q6K => GgmlDType::Q6K,
        }
    }

    fn is_quantized(self) -> bool {
        !matches!(self, Self::F32 | Self::F16 | Self::Bf16)
    }
}

/// A tensor as the rules see it: its name, `ne[0]` (the row length) and number of dimensions.
pub struct TensorDesc<'a> {
    /// GGUF name (`blk.0.attn_v.weight`).
    pub name: &'a str,
    /// Values per row (`ne[0]`).
    pub row: usize,
    /// Number of dimensions.
    pub dims: usize,
}

/// Whether llama.cpp quantizes `name` as an `attn_v` (its `category_is_attn_v`): V, a fused QKV,
/// or an MLA `attn_kv_b`.
fn is_attn_v(name: &str) -> bool {
    ["attn_v.weight", "attn_qkv.weight", "attn_kv_b.weight"].iter().any(|p| name.contains(p))
}

/// The types of a file's tensors (in `super::llama_order`) for `ft`, in a model of `n_layer`
/// layers (0: count the `ffn_down` tensors) and `n_expert` experts (0 or 1 for a dense model):
/// None keeps a tensor's own type.
pub fn plan(ft: FileType, tensors: &[TensorDesc<'_>], n_layer: usize, n_expert: usize) -> Vec<Option<GgmlDType>> {
    let has_output = tensors.iter().any(|t| t.name == "output.weight");
    let n_attn_v = tensors.iter().filter(|t| is_attn_v(t.name)).count();
    let n_ffn_down = if n_layer > 0 { n_layer } else { tensors.iter().filter(|t| t.name.contains("ffn_down")).count() };
    let (mut i_attn_v, mut i_ffn_down) = (0usize, 0usize);
    let more_bits = |i: usize, n: usize| i < n / 8 || i >= 7 * n / 8 || (i as i64 - (n / 8) as i64) % 3 == 2;
    let mut out = Vec::with_capacity(tensors.len());
    for t in tensors {
        let name = t.name;
        let quantize = name.ends_with("weight")
            && t.dims >= 2
            && !name.contains("_norm.weight")
            && !name.contains("ffn_gate_inp.weight");
        if !quantize {
            out.push(None);
            continue;
        }
        let mut ty = ft.default_type();
        if ft.is_quantized() {
            if name == "output.weight" || (!has_output && name == "token_embd.weight") {
                if !t.row.is_multiple_of(ty.block_size()) {
                    ty = GgmlDType::Q8_0;
                } else if ty != GgmlDType::Q8_0 {
                    ty = GgmlDType::Q6K;
                }
            } else if is_attn_v(name) {
                if matches!(ft, FileType::Q4KM | FileType::Q5KM) && more_bits(i_attn_v, n_attn_v) {
                    ty = GgmlDType::Q6K;
                }
                if n_expert == 8 {
                    ty = GgmlDType::Q8_0;
                }
                i_attn_v += 1;
            } else if name.contains("attn_k.weight") {
                if n_expert == 8 {
                    ty = GgmlDType::Q8_0;
                }
            } else if name.contains("ffn_down") {
                // With experts, llama.cpp takes the layer from the name; otherwise the count so
                // far (one `ffn_down` per layer).
                let layer = if n_expert > 1 { layer_of(name).unwrap_or(i_ffn_down) } else { i_ffn_down };
                if matches!(ft, FileType::Q4KM | FileType::Q5KM) && more_bits(layer, n_ffn_down) {
                    ty = GgmlDType::Q6K;
                }
                i_ffn_down += 1;
            } else if name.contains("attn_output.weight") && n_expert == 8 && ft == FileType::Q4KM {
                ty = GgmlDType::Q5K;
            }
        }
        if !t.row.is_multiple_of(ty.block_size()) {
            ty = match ty {
                GgmlDType::Q4K => GgmlDType::Q5_0,
                GgmlDType::Q5K => GgmlDType::Q5_1,
                GgmlDType::Q6K => GgmlDType::Q8_0,
                other => other,
            };
            if !t.row.is_multiple_of(ty.block_size()) {
                ty = GgmlDType::F16;
            }
        }
        out.push(Some(ty));
    }
    out
}

/// N of a `blk.N.` name.
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}
