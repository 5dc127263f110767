//! `ModelArgs`: one architecture description for every supported family, filled either from a
//! Hugging Face `config.json` (`hf.rs`, HF field names) or from GGUF metadata (`gguf.rs`).
//!
//! The family differences are typed parts, not branches on the family in the forward pass:
//! the gate activation, norm placement (`sandwich_norm`) and RMSNorm weight offset, embedding
//! scale, attention options (query scale, soft-caps, sliding window per layer, q/k norms, a
//! second rope for sliding layers), rope scaling and the MLP kind. `Arch` names where the
//! values came from and how tensors are named; the model reads only the typed fields.
//!
//! Invariants after `validate()`: `num_attention_heads % num_key_value_heads == 0`, `head_dim` is
//! even, every size is positive, `layer_types` has one entry per layer and a sliding layer has a
//! window. The rope tables depend only on `RopeArgs` and the loaded length, so the same
//! positions give the same angles whatever the batch.

mod gguf;
mod hf;
#[cfg(test)]
mod tests;

pub(crate) use gguf::gguf_args;
pub(crate) use hf::token_ids;
pub use lmplex_cpu::rowops::Activation;

use lmplex_core::{Error, Result};

/// Supported families: where a checkpoint's shapes come from and how its tensors are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama and SmolLM2: plain GQA decoder, SwiGLU MLP, no biases.
    Llama,
    /// Mistral: Llama with an optional sliding window on every layer.
    Mistral,
    /// Qwen2 / Qwen2.5: Llama with biases on the q/k/v projections (sliding window on the
    /// layers from `max_window_layers` when `use_sliding_window`).
    Qwen2,
    /// Qwen3: Llama with a per-head RMSNorm on q and k before rope.
    Qwen3,
    /// Phi-3 / Phi-3.5: fused qkv and gate/up projections, LongRoPE, sliding window.
    Phi3,
    /// Gemma: GeGLU, `(1 + w)` RMSNorm, embeddings scaled by `sqrt(hidden_size)`.
    Gemma,
    /// Gemma 2: Gemma plus sandwich norms, attention and final-logit soft-caps, and sliding
    /// window on every other layer.
    Gemma2,
    /// Gemma 3 (text): Gemma 2 without soft-caps, with q/k norms, five sliding layers to one
    /// full, and a second rope base for the sliding layers.
    Gemma3,
    /// Mixtral: Mistral with a Mixture-of-Experts MLP (top-k renormalized). GGUF files say
    /// `llama` with an expert count.
    Mixtral,
    /// Qwen2-MoE (Qwen1.5-MoE): Qwen2 with experts and a gated shared expert.
    Qwen2Moe,
    /// Qwen3-MoE: Qwen3 with experts (`norm_topk_prob`).
    Qwen3Moe,
    /// OLMoE: experts, and RMSNorms over the whole q and k projections.
    Olmoe,
}

/// Every family `Arch::from_name` accepts, for error messages.
pub const SUPPORTED: &str =
    "llama, mistral, qwen2, qwen3, phi3, gemma, gemma2, gemma3 (gemma3_text), mixtral, qwen2_moe, qwen3_moe, olmoe";

impl Arch {
    /// From HF `model_type` (or a GGUF `general.architecture`).
    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "llama" => Ok(Self::Llama),
            "mistral" => Ok(Self::Mistral),
            // llama.cpp's Qwen2-VL text model: Qwen2 with M-RoPE (`rope.dimension_sections`).
            "qwen2" | "qwen2vl" => Ok(Self::Qwen2),
            "qwen3" => Ok(Self::Qwen3),
            "phi3" => Ok(Self::Phi3),
            "gemma" => Ok(Self::Gemma),
            "gemma2" => Ok(Self::Gemma2),
            "gemma3" | "gemma3_text" => Ok(Self::Gemma3),
            "mixtral" => Ok(Self::Mixtral),
            "qwen2_moe" | "qwen2moe" => Ok(Self::Qwen2Moe),
            "qwen3_moe" | "qwen3moe" => Ok(Self::Qwen3Moe),
            "olmoe" => Ok(Self::Olmoe),
            other => Err(Error::model_load(format!("unknown architecture '{other}': lmplex supports {SUPPORTED}"))),
        }
    }

    /// The canonical lowercase name (HF `model_type`; Gemma 3 reads as `gemma3`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Mistral => "mistral",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Phi3 => "phi3",
            Self::Gemma => "gemma",
            Self::Gemma2 => "gemma2",
            Self::Gemma3 => "gemma3",
            Self::Mixtral => "mixtral",
            Self::Qwen2Moe => "qwen2_moe",
            Self::Qwen3Moe => "qwen3_moe",
            Self::Olmoe => "olmoe",
        }
    }

    /// The Gemma families: `(1 + w)` norms, scaled embeddings, GeGLU.
    pub fn is_gemma(self) -> bool {
        matches!(self, Self::Gemma | Self::Gemma2 | Self::Gemma3)
    }
}

/// Llama-3 style frequency scaling (`rope_type: "llama3"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3Scaling {
    /// `factor`: how much longer than `original_max_position_embeddings` the context was stretched.
    pub factor: f32,
    /// `low_freq_factor`: wavelengths above `original / low_freq_factor` are stretched by `factor`.
    pub low_freq_factor: f32,
    /// `high_freq_factor`: wavelengths below `original / high_freq_factor` are kept as they are.
    pub high_freq_factor: f32,
    /// The context length the model was pre-trained for, before scaling.
    pub original_max_position_embeddings: usize,
}

/// Phi-3's LongRoPE (`rope_type: "longrope"`): per-frequency divisors and a magnitude factor.
#[derive(Debug, Clone, PartialEq)]
pub struct LongRope {
    /// Divisors of the inverse frequencies for contexts up to the original length.
    pub short_factor: Vec<f32>,
    /// Divisors for longer contexts.
    pub long_factor: Vec<f32>,
    /// The context length the model was pre-trained for.
    pub original_max_position_embeddings: usize,
    /// cos and sin are multiplied by this (`attention_factor`; by default
    /// `sqrt(1 + ln(max / original) / ln(original))`).
    pub attention_factor: f32,
}

/// How rotary frequencies are stretched for long contexts.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum RopeScaling {
    /// Plain rope.
    #[default]
    None,
    /// Every inverse frequency divided by `factor` (`rope_type: "linear"`, Gemma 3's global layers).
    Linear {
        /// The divisor.
        factor: f32,
    },
    /// Llama 3.1's piecewise scaling.
    Llama3(Llama3Scaling),
    /// Phi-3's LongRoPE. The long factors are used when the model is loaded for more positions
    /// than `original_max_position_embeddings` (as llama.cpp decides, by the context size), so a
    /// sequence's rotation never depends on what else is in the batch or on its own length.
    LongRope(LongRope),
}

/// Rotary position embedding settings: base, scaling and pair layout.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeArgs {
    /// `rope_theta`: the base of the rotary frequencies (default 10000).
    pub theta: f32,
    /// Frequency scaling for long contexts.
    pub scaling: RopeScaling,
    /// Pairs are `(x[2i], x[2i+1])` (GPT-J / GGUF llama layout) instead of `(x[i], x[i + d/2])` (NeoX).
    pub interleaved: bool,
    /// Multimodal rope (Qwen2-VL's `mrope_section`): the `head_dim / 2` frequencies in three
    /// consecutive sections, rotated by a token's temporal, height and width positions
    /// (`InputEmbeds::rope_position`); one position for all three is plain rope.
    pub mrope_section: Option<[usize; 3]>,
}

impl RopeArgs {
    /// Plain NeoX-layout rope of base `theta`.
    pub fn plain(theta: f32) -> Self {
        Self { theta, scaling: RopeScaling::None, interleaved: false, mrope_section: None }
    }
}

/// The RMSNorm on queries and keys before rope, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    /// None (Llama, Qwen2, Gemma 1/2).
    None,
    /// Over each head's `head_dim` values (Qwen3, Gemma 3): `q_norm.weight` is `[head_dim]`.
    PerHead,
    /// Over the whole projection (OLMoE): `q_norm.weight` is `[heads * head_dim]`.
    Whole,
}

/// The Mixture-of-Experts MLP of the sparse layers.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeArgs {
    /// Routed experts per layer.
    pub num_experts: usize,
    /// Experts each token takes (`num_experts_per_tok`).
    pub num_experts_per_tok: usize,
    /// One expert's MLP width (`moe_intermediate_size`; Mixtral's and OLMoE's `intermediate_size`).
    pub expert_intermediate_size: usize,
    /// The chosen experts' weights are renormalized to sum 1 (Mixtral; Qwen3-MoE's configs).
    pub norm_topk_prob: bool,
    /// Qwen2-MoE's shared expert width: every token also takes it, scaled by
    /// `sigmoid(shared_expert_gate(x))`.
    pub shared_expert_intermediate_size: Option<usize>,
    /// Per layer: experts (true) or the dense MLP of `intermediate_size` (Qwen's
    /// `mlp_only_layers` and `decoder_sparse_step`).
    pub sparse_layers: Vec<bool>,
}

/// Which attention a layer uses (HF `layer_types`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerType {
    /// Causal attention over the whole context.
    Full,
    /// Causal attention over the last `sliding_window` keys, with `rope_local` when given.
    Sliding,
}

/// One architecture's shape and options, from `config.json` or GGUF metadata; see
/// [`ModelArgs::validate`].
#[derive(Debug, Clone)]
pub struct ModelArgs {
    /// The model family.
    pub arch: Arch,
    /// Rows of the token embedding (and of the LM head).
    pub vocab_size: usize,
    /// The residual stream's width.
    pub hidden_size: usize,
    /// The MLP's hidden width (gate/up output, down input).
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads per layer.
    pub num_attention_heads: usize,
    /// Key/value heads per layer (GQA); divides `num_attention_heads`.
    pub num_key_value_heads: usize,
    /// Width of one head; even (rope rotates pairs). Usually `hidden_size / num_attention_heads`.
    pub head_dim: usize,
    /// The epsilon of every RMSNorm.
    pub rms_norm_eps: f32,
    /// Rotary embedding settings (of every layer, or of the full-attention layers when
    /// `rope_local` is given).
    pub rope: RopeArgs,
    /// The sliding-window layers' rope when it differs (Gemma 3's `rope_local_base_freq`).
    pub rope_local: Option<RopeArgs>,
    /// Context length the checkpoint was trained for (caps `max_model_len`).
    pub max_position_embeddings: usize,
    /// The LM head shares the token embedding's weights.
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry biases (qwen2).
    pub attention_bias: bool,
    /// RMSNorm on q and k before rope (per head: qwen3, gemma3; whole: olmoe).
    pub qk_norm: QkNorm,
    /// The MLP gate's activation.
    pub hidden_act: Activation,
    /// Added to every RMSNorm weight at load: 1 for Gemma's `x * (1 + w)` in HF checkpoints
    /// (llama.cpp's converter stores the 1 added, so GGUF files get 0).
    pub norm_weight_offset: f32,
    /// Gemma 2/3's four norms per layer: the attention output and the MLP output are normalized
    /// too before they join the residual (`post_attention_layernorm`,
    /// `post_feedforward_layernorm`), and the MLP input by `pre_feedforward_layernorm`.
    pub sandwich_norm: bool,
    /// Token embeddings are multiplied by this (Gemma: `sqrt(hidden_size)`).
    pub embed_scale: Option<f32>,
    /// Queries are multiplied by this before the dot products: `1 / sqrt(head_dim)`, or Gemma's
    /// `1 / sqrt(query_pre_attn_scalar)`.
    pub attn_scale: f32,
    /// Attention scores become `cap * tanh(score / cap)` (Gemma 2).
    pub attn_logit_softcapping: Option<f32>,
    /// Logits become `cap * tanh(logit / cap)` (Gemma 2).
    pub final_logit_softcapping: Option<f32>,
    /// Keys a sliding layer attends to: the token's own and the `sliding_window - 1` before it.
    pub sliding_window: Option<usize>,
    /// Per layer, full or sliding attention.
    pub layer_types: Vec<LayerType>,
    /// The experts of a Mixture-of-Experts model.
    pub moe: Option<MoeArgs>,
    /// The beginning-of-sequence token, if the checkpoint names one.
    pub bos_token_id: Option<u32>,
    /// Tokens that end generation (`eos_token_id`, a number or a list); may be empty.
    pub eos_token_ids: Vec<u32>,
    /// Where a multimodal checkpoint keeps this text model's weights: the prefix that stands
    /// for `model.` in their names (`model.text_model.` in an Idefics3 folder). `None`: the
    /// checkpoint is the text model.
    pub text_prefix: Option<&'static str>,
}

/// The most decoder layers a checkpoint may name (the largest models have a few hundred):
/// per-layer lists are built from the count before any weight is read.
pub(crate) const MAX_LAYERS: usize = 1 << 12;

impl ModelArgs {
    /// Checks what the model code relies on: positive sizes, KV heads dividing heads, even
    /// `head_dim`, one layer type per layer, a window for sliding layers.
    pub fn validate(&self) -> Result<()> {
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
        ];
        for (name, v) in sizes {
            if v == 0 {
                return Err(Error::model_load(format!("model config: {name} must be positive")));
            }
        }
        // Tables are sized from these before any weight is read: bound them well above any
        // real model's, so a corrupt header is an error rather than a huge allocation.
        let bounds = [
            ("vocab_size", self.vocab_size, 1 << 22),
            ("hidden_size", self.hidden_size, 1 << 17),
            ("intermediate_size", self.intermediate_size, 1 << 19),
            ("num_hidden_layers", self.num_hidden_layers, MAX_LAYERS),
            ("num_attention_heads", self.num_attention_heads, 1 << 12),
            ("num_key_value_heads", self.num_key_value_heads, 1 << 12),
            ("head_dim", self.head_dim, 1 << 12),
        ];
        for (name, v, max) in bounds {
            if v > max {
                return Err(Error::model_load(format!("model config: {name} {v} is more than {max}")));
            }
        }
        if !self.num_attention_heads.is_multiple_of(self.num_key_value_heads) {
            return Err(Error::model_load(format!(
                "model config: num_attention_heads ({}) is not a multiple of num_key_value_heads ({})",
                self.num_attention_heads, self.num_key_value_heads
            )));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(Error::model_load(format!("model config: head_dim {} is odd", self.head_dim)));
        }
        if let Some(m) = self.rope.mrope_section.filter(|m| m.iter().sum::<usize>() != self.head_dim / 2) {
            return Err(Error::model_load(format!(
                "model config: mrope_section {m:?} does not sum to head_dim / 2 ({})",
                self.head_dim / 2
            )));
        }
        if self.layer_types.len() != self.num_hidden_layers {
            return Err(Error::model_load(format!(
                "model config: layer_types has {} entries for {} layers",
                self.layer_types.len(),
                self.num_hidden_layers
            )));
        }
        if self.layer_types.contains(&LayerType::Sliding) && self.sliding_window.is_none_or(|w| w == 0) {
            return Err(Error::model_load("model config: sliding layers need a positive sliding_window"));
        }
        if let RopeScaling::LongRope(l) = &self.rope.scaling {
            let half = self.head_dim / 2;
            if l.short_factor.len() != half || l.long_factor.len() != half {
                return Err(Error::model_load(format!(
                    "model config: longrope factors have {} and {} entries, head_dim / 2 is {half}",
                    l.short_factor.len(),
                    l.long_factor.len()
                )));
            }
        }
        if let Some(m) = &self.moe {
            if m.num_experts == 0 || m.num_experts_per_tok == 0 || m.num_experts_per_tok > m.num_experts {
                return Err(Error::model_load(format!(
                    "model config: {} experts per token of {}",
                    m.num_experts_per_tok, m.num_experts
                )));
            }
            if m.expert_intermediate_size == 0 || m.sparse_layers.len() != self.num_hidden_layers {
                return Err(Error::model_load("model config: bad expert sizes or sparse layer list"));
            }
        }
        let caps = [self.attn_logit_softcapping, self.final_logit_softcapping];
        if caps.iter().flatten().any(|c| !(c.is_finite() && *c > 0.0)) {
            return Err(Error::model_load("model config: soft-caps must be positive"));
        }
        Ok(())
    }

    /// Parameters held by the weights (embeddings counted once when tied; every expert counted;
    /// the q/k/v biases and the q/k norms too).
    pub fn num_parameters(&self) -> usize {
        let (h, i, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let q = self.num_attention_heads * self.head_dim;
        let kv = self.num_key_value_heads * self.head_dim;
        let norms = if self.sandwich_norm { 4 } else { 2 };
        let bias = if self.attention_bias { q + 2 * kv } else { 0 };
        let qk_norms = match self.qk_norm {
            QkNorm::None => 0,
            QkNorm::PerHead => 2 * self.head_dim,
            QkNorm::Whole => q + kv,
        };
        let attn = h * (q + 2 * kv) + q * h + norms * h + bias + qk_norms;
        let mlp = |layer: usize| match &self.moe {
            Some(m) if m.sparse_layers[layer] => {
                let shared = m.shared_expert_intermediate_size.map_or(0, |s| 3 * h * s + h);
                m.num_experts * (3 * h * m.expert_intermediate_size + h) + shared
            }
            _ => 3 * h * i,
        };
        let head = if self.tie_word_embeddings { 0 } else { v * h };
        v * h + (0..self.num_hidden_layers).map(|l| attn + mlp(l)).sum::<usize>() + h + head
    }

    /// The attention of layer `layer`.
    pub fn layer_type(&self, layer: usize) -> LayerType {
        self.layer_types[layer]
    }

    /// A window as long as the trained context changes nothing: such layers become full ones
    /// (Phi-3 and Qwen2 configs often carry one), so no backend needs window support for them.
    /// Not when the window layers have a rope of their own (Gemma 3's `rope_local`): a layer's
    /// type also picks its rope, so they stay window layers.
    pub(crate) fn drop_unused_window(&mut self) {
        if self.rope_local.is_none() && self.sliding_window.is_some_and(|w| w >= self.max_position_embeddings) {
            self.sliding_window = None;
            self.layer_types.iter_mut().for_each(|t| *t = LayerType::Full);
        }
    }

    /// Whether any layer uses a sliding window.
    pub fn has_sliding_window(&self) -> bool {
        self.layer_types.contains(&LayerType::Sliding)
    }
}
