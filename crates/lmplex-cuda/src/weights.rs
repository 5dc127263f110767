//! The model's weights on the device, in the backend's dtype, with HF names as the source.
//!
//! Layout: every projection is `[out, in]` row-major (as HF stores it). q, k and v are
//! concatenated into one `qkv` matrix (rows q, then k, then v; Phi-3 stores it so) and gate and
//! up into one `gate_up` (rows gate, then up), so a layer runs two GEMMs where the CPU runs five;
//! concatenating rows changes no output value. A safetensors tensor already in the backend's
//! dtype is copied from the mapped file to the device as it is. Every upload goes through the
//! loader's page-locked staging slots (`crate::staging`: reads overlapped with copies). A
//! matrix whose every part is stored in a GGUF block format the kernels read (`QFormat`: GGUF
//! quantized tensors, AWQ/GPTQ projections held as Q4_1) stays in its blocks (`Mat::Quant`,
//! W4A16); a fused matrix whose parts have different formats keeps one run of rows per format.
//! Other tensors are converted on the host (dequantized as candle decodes them) and stored
//! dense. Tied embeddings share one matrix with the head.
//!
//! Invariants: `bytes` is the sum of every buffer's size, counted once; `planned_bytes` makes
//! the same choice per matrix (`kept_formats`) from the headers alone, so a plan counts what a
//! load uploads.

use crate::dtype::Dt;
use crate::gpu::{DevBuf, Gpu};
pub use crate::mat::{Mat, QPart};
use crate::quant::QFormat;
use crate::staging::{Staging, STAGING_CHUNK};
use lmplex_core::{Error, Result};
use lmplex_model::args::{Activation, QkNorm, RopeScaling};
use lmplex_model::{inv_freq, Arch, ModelArgs, WeightSource};

pub struct LayerWeights {
    pub input_layernorm: DevBuf,
    pub post_attention_layernorm: DevBuf,
    pub qkv: Mat,
    pub qkv_bias: Option<DevBuf>,
    pub o_proj: Mat,
    pub q_norm: Option<DevBuf>,
    pub k_norm: Option<DevBuf>,
    pub gate_up: Mat,
    pub down_proj: Mat,
}

pub struct Weights {
    pub embed_tokens: Mat,
    pub layers: Vec<LayerWeights>,
    pub norm: DevBuf,
    /// `None`: tied to `embed_tokens`.
    pub lm_head: Option<Mat>,
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
    stage: Staging<'a>,
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
        let buf = self.stage.upload(&self.dt.encode(&all))?;
        self.bytes += buf.bytes;
        Ok(buf)
    }

    /// The tensors copied straight from the mapped safetensors file when each is stored in the
    /// backend's dtype (no conversion on the host); `None` when one is not.
    fn upload_stored(&mut self, names: &[String], rows: &[usize], cols: usize) -> Result<Option<DevBuf>> {
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
            self.stage.copy(buf.at(off), p)?;
            off += p.len();
        }
        Ok(Some(buf))
    }

    fn one(&mut self, name: String, rows: usize, cols: usize) -> Result<DevBuf> {
        self.upload(&[name], &[rows], cols)
    }

    /// The named matrices, concatenated by rows: kept in their blocks when `kept_formats` says
    /// so, else dense.
    fn matrix(&mut self, m: &MatrixSpec) -> Result<Mat> {
        if let Some(formats) = kept_formats(self.src, m) {
            if let Some(mat) = self.quantized(m, &formats)? {
                self.bytes += mat.bytes();
                return Ok(mat);
            }
        }
        Ok(Mat::Dense(self.upload(&m.names, &m.rows, m.cols)?))
    }

    /// One part per run of names in the same format; `None` when a tensor turns out dense.
    fn quantized(&mut self, m: &MatrixSpec, formats: &[QFormat]) -> Result<Option<Mat>> {
        let mut parts: Vec<(QFormat, usize, Vec<u8>)> = Vec::new();
        for ((name, &rows), &format) in m.names.iter().zip(&m.rows).zip(formats) {
            let Some(b) = self.src.blocks(name)? else { return Ok(None) };
            if (b.rows, b.cols) != (rows, m.cols) || b.data.len() != format.bytes(rows, m.cols) {
                return Err(Error::model_load(format!(
                    "tensor '{name}' is {}x{} in {} bytes, {rows}x{} expected",
                    b.rows,
                    b.cols,
                    b.data.len(),
                    m.cols
                )));
            }
            match parts.last_mut() {
                Some((f, r, data)) if *f == format => {
                    *r += rows;
                    data.extend_from_slice(&b.data);
                }
                _ => parts.push((format, rows, b.data)),
            }
        }
        let parts = parts
            .into_iter()
            .map(|(format, rows, data)| Ok(QPart { format, rows, buf: self.stage.upload(&data)? }))
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(Mat::Quant(parts)))
    }
}

/// A matrix as the checkpoint names it: HF tensors concatenated by rows, `cols` inputs.
pub struct MatrixSpec {
    pub names: Vec<String>,
    pub rows: Vec<usize>,
    pub cols: usize,
}

impl MatrixSpec {
    fn new(names: &[String], rows: &[usize], cols: usize) -> Self {
        Self { names: names.to_vec(), rows: rows.to_vec(), cols }
    }
    fn one(name: String, rows: usize, cols: usize) -> Self {
        Self { names: vec![name], rows: vec![rows], cols }
    }
    fn numel(&self) -> usize {
        self.rows.iter().sum::<usize>() * self.cols
    }
}

/// The format each named tensor stays in on the device, or `None` when the matrix is held
/// dense: a part is dense or of a type the kernels do not read (Q2_K, Q3_K), or `cols` is not a
/// whole number of its blocks. From the headers alone.
fn kept_formats(src: &WeightSource, m: &MatrixSpec) -> Option<Vec<QFormat>> {
    m.names
        .iter()
        .map(|n| {
            let format = src.quantized_type(n, m.cols).and_then(QFormat::of)?;
            m.cols.is_multiple_of(format.block().0).then_some(format)
        })
        .collect()
}

/// Layer `i`'s matrices: `qkv`, `o_proj`, `gate_up`, `down_proj`.
fn layer_matrices(a: &ModelArgs, i: usize) -> [MatrixSpec; 4] {
    let (h, hd, inter) = (a.hidden_size, a.head_dim, a.intermediate_size);
    let (qw, kw) = (a.num_attention_heads * hd, a.num_key_value_heads * hd);
    let p = format!("model.layers.{i}");
    let qkv = if a.arch == Arch::Phi3 {
        MatrixSpec::one(format!("{p}.self_attn.qkv_proj.weight"), qw + 2 * kw, h)
    } else {
        MatrixSpec::new(&["q", "k", "v"].map(|x| format!("{p}.self_attn.{x}_proj.weight")), &[qw, kw, kw], h)
    };
    let gate_up = if a.arch == Arch::Phi3 {
        MatrixSpec::one(format!("{p}.mlp.gate_up_proj.weight"), 2 * inter, h)
    } else {
        MatrixSpec::new(&["gate", "up"].map(|x| format!("{p}.mlp.{x}_proj.weight")), &[inter, inter], h)
    };
    let o_proj = MatrixSpec::one(format!("{p}.self_attn.o_proj.weight"), h, qw);
    let down = MatrixSpec::one(format!("{p}.mlp.down_proj.weight"), h, inter);
    [qkv, o_proj, gate_up, down]
}

/// Every matrix of the model: the layers', the embedding table, and an untied head.
fn all_matrices(a: &ModelArgs, src: &WeightSource) -> Vec<MatrixSpec> {
    let mut all: Vec<MatrixSpec> = (0..a.num_hidden_layers).flat_map(|i| layer_matrices(a, i)).collect();
    all.push(MatrixSpec::one("model.embed_tokens.weight".into(), a.vocab_size, a.hidden_size));
    if src.has("lm_head.weight") {
        all.push(MatrixSpec::one("lm_head.weight".into(), a.vocab_size, a.hidden_size));
    }
    all
}

/// The device bytes `Weights::load` will upload in `dt`, from the headers alone: the dense
/// count (`num_parameters` in `dt`, plus the f32 rotary frequencies) less what each matrix kept
/// in its blocks saves.
pub fn planned_bytes(a: &ModelArgs, src: &WeightSource, dt: Dt) -> usize {
    let dense = a.num_parameters() * dt.size() + a.head_dim / 2 * 4;
    all_matrices(a, src).iter().fold(dense, |total, m| match kept_formats(src, m) {
        Some(formats) => {
            let kept: usize = formats.iter().zip(&m.rows).map(|(f, &r)| f.bytes(r, m.cols)).sum();
            total.saturating_sub(m.numel() * dt.size()).saturating_add(kept)
        }
        None => total,
    })
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
        let (h, hd) = (a.hidden_size, a.head_dim);
        let (qw, kw) = (a.num_attention_heads * hd, a.num_key_value_heads * hd);
        let stage = Staging::new(gpu, STAGING_CHUNK)?;
        let mut l = Loader { gpu, src, dt, bytes: 0, stage };
        let mut layers = Vec::with_capacity(a.num_hidden_layers);
        for i in 0..a.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let [qkv, o_proj, gate_up, down_proj] = layer_matrices(a, i);
            let qkv_bias = if a.attention_bias && a.arch != Arch::Phi3 {
                let names = ["q", "k", "v"].map(|x| format!("{p}.self_attn.{x}_proj.bias"));
                Some(l.upload(&names, &[qw, kw, kw], 1)?)
            } else {
                None
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
                qkv: l.matrix(&qkv)?,
                qkv_bias,
                o_proj: l.matrix(&o_proj)?,
                q_norm,
                k_norm,
                gate_up: l.matrix(&gate_up)?,
                down_proj: l.matrix(&down_proj)?,
            });
        }
        let embed_tokens = l.matrix(&MatrixSpec::one("model.embed_tokens.weight".into(), a.vocab_size, h))?;
        let lm_head = if src.has("lm_head.weight") {
            Some(l.matrix(&MatrixSpec::one("lm_head.weight".into(), a.vocab_size, h))?)
        } else {
            None
        };
        let norm = l.one("model.norm.weight".into(), h, 1)?;
        let freqs = inv_freq(&a.rope, hd, a.max_position_embeddings, src.rope_freq_factors()?.as_deref());
        let inv_freq = l.stage.upload(&Dt::F32.encode(&freqs))?;
        let bytes = l.bytes + inv_freq.bytes;
        l.stage.finish()?;
        Ok(Self { embed_tokens, layers, norm, lm_head, inv_freq, bytes })
    }

    /// The head's matrix `[vocab, hidden]`.
    pub fn head(&self) -> &Mat {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }
}
