//! AWQ and GPTQ checkpoints: each projection's packed integer weights, zeros and scales
//! (`{prefix}.qweight`, `.qzeros`, `.scales`, GPTQ's `.g_idx`) turned into the dense `[out, in]`
//! matrix they stand for, `w = scale · (q − zero)`, in f32.
//!
//! Layouts (`K` inputs, `N` outputs, `G` the group size, `p = 32 / bits` values per i32 word,
//! value `i` of a word in bits `i·bits ..`):
//! - GPTQ (AutoGPTQ, GPTQModel): `qweight` `[K/p, N]`, packed along K; `qzeros` `[K/G, N/p]`,
//!   packed along N; `scales` `[K/G, N]`; `g_idx` `[K]`, the group of each input (act-order
//!   checkpoints permute it; without it, `k / G`). The `gptq` checkpoint format stores
//!   `zero − 1`, read back as `(stored + 1) mod 2^bits` as AutoGPTQ does; `gptq_v2` stores the
//!   zero. 4 or 8 bits.
//! - AWQ (AutoAWQ's GEMM layout): `qweight` `[K, N/8]` and `qzeros` `[K/G, N/8]`, packed along N
//!   in AutoAWQ's interleaved order (column `j` of a word's eight is its value
//!   `[0, 4, 1, 5, 2, 6, 3, 7][j]`); `scales` `[K/G, N]`; 4 bits.
//!
//! 4-bit weights whose groups are runs of whole 32-input blocks (no act-order, a group size that
//! is a multiple of 32) are instead rewritten as GGUF Q4_1 blocks (`q4_1_blocks`) for the integer
//! kernels: a block's `d` is the group's scale and its `m` is `−scale · zero`, rounded once to
//! f16 (at most 2⁻¹¹ of |scale · zero|, under 0.4% of a quantization step), its 4-bit values the
//! checkpoint's. Other weights take the dense path (`dequantize`).
//!
//! Invariant: every value `dequantize` gives equals the reference dequantizers' (AutoGPTQ's and
//! AutoAWQ's, as vLLM's tests transcribe them): an f16 (or bf16) scale times a small integer is
//! exact in f32.

use lmplex_core::{Error, Result};

/// Which packed layout a checkpoint uses (`config.json`'s `quantization_config`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// AutoAWQ's GEMM layout.
    Awq,
    /// AutoGPTQ's and GPTQModel's layout.
    Gptq {
        /// The `gptq` checkpoint format: zeros stored minus one.
        zero_minus_one: bool,
    },
}

/// An AWQ or GPTQ checkpoint's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packed {
    /// Which layout.
    pub method: Method,
    /// Bits per weight.
    pub bits: usize,
    /// Inputs per group; `None` (`group_size: -1`) is one group over all inputs.
    pub group_size: Option<usize>,
    /// GPTQ's `desc_act`: groups may not be runs of inputs (the checkpoint's `g_idx` decides).
    pub act_order: bool,
}

/// One tensor as read from the checkpoint: its shape and values.
pub struct Raw<T> {
    /// The tensor's dimensions.
    pub shape: Vec<usize>,
    /// Its values, row-major.
    pub values: Vec<T>,
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::model_load(format!("quantization_config: {what}"))
}

impl Packed {
    /// The `quantization_config` of a parsed `config.json`; `None` when there is none. A method
    /// or layout lmplex does not read is an error naming it.
    pub fn from_config(cfg: &serde_json::Value) -> Result<Option<Self>> {
        let Some(q) = cfg.get("quantization_config") else { return Ok(None) };
        let text = |k: &str| q.get(k).and_then(|v| v.as_str()).map(str::to_ascii_lowercase);
        let method = text("quant_method").ok_or_else(|| bad("no quant_method"))?;
        if method != "awq" && method != "gptq" {
            return Err(bad(format!("quant_method '{method}' is not supported (awq and gptq are)")));
        }
        let bits = q.get("bits").and_then(|v| v.as_u64()).ok_or_else(|| bad("no bits"))? as usize;
        let group_size = match q.get("group_size").and_then(|v| v.as_i64()) {
            None | Some(-1) => None,
            Some(g) if g > 0 => Some(g as usize),
            Some(g) => return Err(bad(format!("group_size {g}"))),
        };
        let method = match method.as_str() {
            "awq" => {
                let version = text("version").unwrap_or_else(|| "gemm".into());
                if version != "gemm" {
                    return Err(bad(format!("AWQ version '{version}' is not read (only AutoAWQ's GEMM layout)")));
                }
                if q.get("zero_point").and_then(|v| v.as_bool()) == Some(false) {
                    return Err(bad("AWQ without zero points is not read"));
                }
                if bits != 4 {
                    return Err(bad(format!("AWQ with {bits} bits (4 expected)")));
                }
                Method::Awq
            }
            "gptq" => {
                if bits != 4 && bits != 8 {
                    return Err(bad(format!("GPTQ with {bits} bits is not read (4 or 8)")));
                }
                let format = text("checkpoint_format").unwrap_or_else(|| "gptq".into());
                match format.as_str() {
                    "gptq" => Method::Gptq { zero_minus_one: true },
                    "gptq_v2" => Method::Gptq { zero_minus_one: false },
                    other => return Err(bad(format!("GPTQ checkpoint_format '{other}' is not read"))),
                }
            }
            other => return Err(bad(format!("quant_method '{other}' is not supported (awq and gptq are)"))),
        };
        let act_order = q.get("desc_act").and_then(|v| v.as_bool()).unwrap_or(false);
        Ok(Some(Self { method, bits, group_size, act_order }))
    }

    /// Whether a projection of `inputs` inputs will be held as Q4_1 blocks (`q4_1_blocks`), as
    /// far as the config tells (an act-order checkpoint whose `g_idx` is in order is too).
    pub fn holds_q4_1(&self, inputs: usize) -> bool {
        self.bits == 4
            && !self.act_order
            && inputs.is_multiple_of(32)
            && self.group_size.is_none_or(|g| g.is_multiple_of(32))
    }

    /// Values per i32 word.
    pub fn pack(&self) -> usize {
        32 / self.bits
    }

    /// The weights as GGUF Q4_1 blocks, `[out, in / 32]` blocks row-major (see the header), with
    /// `(out, in)`; `None` when they are not 4-bit or a 32-input block would span two groups.
    pub fn q4_1_blocks(
        &self,
        qweight: &Raw<i32>,
        qzeros: &Raw<i32>,
        scales: &Raw<f32>,
        g_idx: Option<&Raw<i32>>,
    ) -> Result<Option<(Vec<u8>, usize, usize)>> {
        let (q, z, s, group, n, k) = self.unpack(qweight, qzeros, scales, g_idx)?;
        let runs = self.group_size.is_none_or(|g| g.is_multiple_of(32));
        if self.bits != 4
            || !k.is_multiple_of(32)
            || !runs
            || group.iter().enumerate().any(|(i, &g)| g != group[i / 32 * 32])
        {
            return Ok(None);
        }
        let mut out = Vec::with_capacity(n * k / 32 * 20);
        for col in 0..n {
            for b in 0..k / 32 {
                let g = group[b * 32];
                let (scale, zero) = (s[g * n + col], z[g * n + col]);
                out.extend(half::f16::from_f32(scale).to_le_bytes());
                out.extend(half::f16::from_f32(-scale * zero as f32).to_le_bytes());
                let at = |j: usize| q[(b * 32 + j) * n + col] as u8;
                out.extend((0..16).map(|j| at(j) | (at(j + 16) << 4)));
            }
        }
        Ok(Some((out, n, k)))
    }

    /// The dense `[out, in]` matrix (row-major, f32) and its `(out, in)`.
    pub fn dequantize(
        &self,
        qweight: &Raw<i32>,
        qzeros: &Raw<i32>,
        scales: &Raw<f32>,
        g_idx: Option<&Raw<i32>>,
    ) -> Result<(Vec<f32>, usize, usize)> {
        let (q, z, s, group, n, k) = self.unpack(qweight, qzeros, scales, g_idx)?;
        let mut w = vec![0f32; n * k];
        for (row, &g) in group.iter().enumerate() {
            for col in 0..n {
                w[col * k + row] = s[g * n + col] * (q[row * n + col] as f32 - z[g * n + col] as f32);
            }
        }
        Ok((w, n, k))
    }

    /// The integer weights `[in][out]`, zeros `[group][out]`, scales `[group][out]`, the group
    /// of each input, and `(out, in)`.
    #[allow(clippy::type_complexity)]
    fn unpack(
        &self,
        qweight: &Raw<i32>,
        qzeros: &Raw<i32>,
        scales: &Raw<f32>,
        g_idx: Option<&Raw<i32>>,
    ) -> Result<(Vec<u32>, Vec<u32>, Vec<f32>, Vec<usize>, usize, usize)> {
        let (p, mask) = (self.pack(), (1u32 << self.bits) - 1);
        let dims = |r: &[usize], what: &str| -> Result<(usize, usize)> {
            match *r {
                [a, b] => Ok((a, b)),
                _ => Err(bad(format!("{what} is {r:?}, expected 2-D"))),
            }
        };
        let (sg, n) = dims(&scales.shape, "scales")?;
        let k = match self.method {
            Method::Awq => dims(&qweight.shape, "qweight")?.0,
            Method::Gptq { .. } => dims(&qweight.shape, "qweight")?.0 * p,
        };
        let groups = self.group_size.map_or(1, |g| k.div_ceil(g));
        let (wq, zq) = match self.method {
            Method::Awq => ((k, n / 8), (groups, n / 8)),
            Method::Gptq { .. } => ((k / p, n), (groups, n / p)),
        };
        if sg != groups || dims(&qweight.shape, "qweight")? != wq || dims(&qzeros.shape, "qzeros")? != zq || n % p != 0
        {
            return Err(bad(format!(
                "shapes qweight {:?}, qzeros {:?}, scales {:?} do not fit {k} inputs, {n} outputs, {groups} groups",
                qweight.shape, qzeros.shape, scales.shape
            )));
        }
        let group: Vec<usize> = match g_idx {
            Some(g) => {
                if g.values.len() != k || g.values.iter().any(|&x| x < 0 || x as usize >= groups) {
                    return Err(bad(format!("g_idx has {} entries or a group outside 0..{groups}", g.values.len())));
                }
                g.values.iter().map(|&x| x as usize).collect()
            }
            None => (0..k).map(|i| self.group_size.map_or(0, |g| i / g)).collect(),
        };
        // Column `j` of a word's `p` values sits in value slot `slot[j]`.
        const AWQ_SLOT: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];
        let slot = |j: usize| if self.method == Method::Awq { AWQ_SLOT[j] } else { j };
        let nibble = |word: i32, i: usize| (word as u32 >> (self.bits * i)) & mask;
        let zero = |g: usize, col: usize| -> u32 {
            let z = nibble(qzeros.values[g * zq.1 + col / p], slot(col % p));
            match self.method {
                Method::Gptq { zero_minus_one: true } => (z + 1) & mask,
                _ => z,
            }
        };
        let zeros = (0..groups * n).map(|i| zero(i / n, i % n)).collect();
        let q = (0..k * n)
            .map(|i| {
                let (row, col) = (i / n, i % n);
                match self.method {
                    Method::Awq => nibble(qweight.values[row * wq.1 + col / 8], slot(col % 8)),
                    Method::Gptq { .. } => nibble(qweight.values[(row / p) * n + col], row % p),
                }
            })
            .collect();
        Ok((q, zeros, scales.values.clone(), group, n, k))
    }
}
