//! The model's weights on the device, in the backend's dtype, with HF names as the source.
//!
//! Layout: every projection is `[out, in]` row-major (as HF stores it). q, k and v are
//! concatenated into one `qkv` matrix (rows q, then k, then v; Phi-3 stores it so) and gate and
//! up into one `gate_up` (rows gate, then up), so a layer runs two GEMMs where the CPU runs five;
//! concatenating rows changes no output value. A safetensors tensor already in the backend's
//! dtype is copied from the mapped file to the device as it is; others are converted on the
//! host (GGUF tensors dequantized as candle decodes them) and stored dense; tied embeddings
//! share one buffer with the head.
//!
//! Invariant: `bytes` is the sum of every buffer's size, counted once.

use crate::dtype::Dt;
use crate::gpu::{DevBuf, Gpu};
use lmplex_core::{Error, Result};
use lmplex_model::args::{Activation, QkNorm, RopeScaling};
use lmplex_model::{inv_freq, Arch, ModelArgs, WeightSource};

pub struct LayerWeights {
    pub input_layernorm: DevBuf,
    pub post_attention_layernorm: DevBuf,
    pub qkv: DevBuf,
    pub qkv_bias: Option<DevBuf>,
    pub o_proj: DevBuf,
    pub q_norm: Option<DevBuf>,
    pub k_norm: Option<DevBuf>,
    pub gate_up: DevBuf,
    pub down_proj: DevBuf,
}

pub struct Weights {
    pub embed_tokens: DevBuf,
    pub layers: Vec<LayerWeights>,
    pub norm: DevBuf,
    /// `None`: tied to `embed_tokens`.
    pub lm_head: Option<DevBuf>,
    /// Rotary inverse frequencies `[head_dim / 2]`, f32.
    pub inv_freq: DevBuf,
    pub bytes: usize,
}

/// A tensor's values as f32 (dequantized when GGUF-quantized), checked to hold `numel` values.
fn values(src: &WeightSource, name: &str, numel: usize) -> Result<Vec<f32>> {
    let v = src.vector(name)?;
    if v.len() != numel {
        return Err(Error::model_load(format!("tensor '{name}' has {} values, {numel} expected", v.len())));
    }
    Ok(v)
}

struct Loader<'a> {
    gpu: &'a Gpu,
    src: &'a WeightSource,
    dt: Dt,
    bytes: usize,
}

impl Loader<'_> {
    /// Uploads the named tensors, concatenated in order (each `rows x cols`).
    fn upload(&mut self, names: &[String], rows: &[usize], cols: usize) -> Result<DevBuf> {
        if let Some(buf) = self.upload_stored(names, rows, cols)? {
            self.bytes += buf.bytes;
            return Ok(buf);
        }
        let mut all = Vec::with_capacity(rows.iter().sum::<usize>() * cols);
        for (name, r) in names.iter().zip(rows) {
            all.extend(values(self.src, name, r * cols)?);
        }
        let buf = self.gpu.upload(&self.dt.encode(&all))?;
        self.bytes += buf.bytes;
        Ok(buf)
    }

    /// The tensors copied straight from the mapped safetensors file when each is stored in the
    /// backend's dtype (no conversion on the host); `None` when one is not.
    fn upload_stored(&self, names: &[String], rows: &[usize], cols: usize) -> Result<Option<DevBuf>> {
        use safetensors::Dtype;
        let want = match self.dt {
            Dt::F32 => Dtype::F32,
            Dt::F16 => Dtype::F16,
            Dt::Bf16 => Dtype::BF16,
        };
        let mut parts = Vec::with_capacity(names.len());
        for (name, r) in names.iter().zip(rows) {
            match self.src.stored_bytes(name) {
                Some((d, bytes)) if d == want && bytes.len() == r * cols * self.dt.size() => parts.push(bytes),
                _ => return Ok(None),
            }
        }
        let buf = self.gpu.alloc(parts.iter().map(|p| p.len()).sum())?;
        let mut off = 0;
        for p in parts {
            self.gpu.htod(buf.at(off), p)?;
            off += p.len();
        }
        Ok(Some(buf))
    }

    fn one(&mut self, name: String, rows: usize, cols: usize) -> Result<DevBuf> {
        self.upload(&[name], &[rows], cols)
    }
}

/// Refuses what the CUDA forward pass does not run yet (it has the Llama layer: SiLU MLP,
/// plain RMSNorm, full attention, one rope), naming the part and the way out.
fn unsupported(a: &ModelArgs) -> Result<()> {
    let parts = [
        (a.has_sliding_window(), "sliding-window attention"),
        (a.moe.is_some(), "Mixture-of-Experts layers"),
        (a.qk_norm == QkNorm::Whole, "whole-projection q/k norms"),
        (a.sandwich_norm || a.norm_weight_offset != 0.0, "Gemma's norms"),
        (a.hidden_act != Activation::Silu, "a GELU MLP"),
        (a.embed_scale.is_some(), "scaled embeddings"),
        (a.attn_logit_softcapping.is_some() || a.final_logit_softcapping.is_some(), "soft-capping"),
        (a.rope_local.is_some() || matches!(a.rope.scaling, RopeScaling::LongRope(_)), "this rope variant"),
        ((a.attn_scale * (a.head_dim as f32).sqrt() - 1.0).abs() > 1e-6, "a custom query scale"),
    ];
    match parts.iter().find(|(has, _)| *has) {
        Some((_, what)) => Err(Error::model_load(format!(
            "the CUDA backend does not run {what} yet ({} checkpoint); load it with device='cpu'",
            a.arch.name()
        ))),
        None => Ok(()),
    }
}

impl Weights {
    pub fn load(gpu: &Gpu, args: &ModelArgs, src: &WeightSource, dt: Dt) -> Result<Self> {
        let a = args;
        unsupported(a)?;
        let (h, hd, inter) = (a.hidden_size, a.head_dim, a.intermediate_size);
        let (qw, kw) = (a.num_attention_heads * hd, a.num_key_value_heads * hd);
        let mut l = Loader { gpu, src, dt, bytes: 0 };
        let mut layers = Vec::with_capacity(a.num_hidden_layers);
        for i in 0..a.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let (qkv, qkv_bias) = if a.arch == Arch::Phi3 {
                (l.one(format!("{p}.self_attn.qkv_proj.weight"), qw + 2 * kw, h)?, None)
            } else {
                let names = |s: &str| ["q", "k", "v"].map(|x| format!("{p}.self_attn.{x}_proj.{s}"));
                let qkv = l.upload(&names("weight"), &[qw, kw, kw], h)?;
                let bias = if a.attention_bias { Some(l.upload(&names("bias"), &[qw, kw, kw], 1)?) } else { None };
                (qkv, bias)
            };
            let gate_up = if a.arch == Arch::Phi3 {
                l.one(format!("{p}.mlp.gate_up_proj.weight"), 2 * inter, h)?
            } else {
                let names = ["gate", "up"].map(|x| format!("{p}.mlp.{x}_proj.weight"));
                l.upload(&names, &[inter, inter], h)?
            };
            let (q_norm, k_norm) = if a.qk_norm == QkNorm::PerHead {
                (
                    Some(l.one(format!("{p}.self_attn.q_norm.weight"), hd, 1)?),
                    Some(l.one(format!("{p}.self_attn.k_norm.weight"), hd, 1)?),
                )
            } else {
                (None, None)
            };
            layers.push(LayerWeights {
                input_layernorm: l.one(format!("{p}.input_layernorm.weight"), h, 1)?,
                post_attention_layernorm: l.one(format!("{p}.post_attention_layernorm.weight"), h, 1)?,
                qkv,
                qkv_bias,
                o_proj: l.one(format!("{p}.self_attn.o_proj.weight"), h, qw)?,
                q_norm,
                k_norm,
                gate_up,
                down_proj: l.one(format!("{p}.mlp.down_proj.weight"), h, inter)?,
            });
        }
        let embed_tokens = l.one("model.embed_tokens.weight".into(), a.vocab_size, h)?;
        let lm_head =
            if src.has("lm_head.weight") { Some(l.one("lm_head.weight".into(), a.vocab_size, h)?) } else { None };
        let norm = l.one("model.norm.weight".into(), h, 1)?;
        let freqs = inv_freq(&a.rope, hd, a.max_position_embeddings, src.rope_freq_factors()?.as_deref());
        let inv_freq = gpu.upload(&Dt::F32.encode(&freqs))?;
        let bytes = l.bytes + inv_freq.bytes;
        Ok(Self { embed_tokens, layers, norm, lm_head, inv_freq, bytes })
    }

    /// The head's matrix `[vocab, hidden]`.
    pub fn head(&self) -> &DevBuf {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }
}
