//! `ModelArgs`: one architecture description for every supported family, filled either from a
//! Hugging Face `config.json` (serde, HF field names) or from GGUF metadata (`gguf.rs`).
//!
//! Invariants after `validate()`: `num_attention_heads % num_key_value_heads == 0`, `head_dim` is
//! even, every size is positive. The rope table depends only on `RopeArgs`, so the same positions
//! give the same angles whatever the batch.

use lmplex_core::{Error, Result};
use serde::Deserialize;

/// Supported families. Mistral (without sliding window) and SmolLM2 are `Llama`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama, Mistral (no sliding window) and SmolLM2: plain GQA decoder, SwiGLU MLP, no biases.
    Llama,
    /// Qwen2 / Qwen2.5: Llama with biases on the q/k/v projections.
    Qwen2,
    /// Qwen3: Llama with a per-head RMSNorm on q and k before rope.
    Qwen3,
    /// Phi-3: Llama-like, with fused qkv and gate/up projections in the checkpoint.
    Phi3,
}

impl Arch {
    /// From HF `model_type` (or a GGUF `general.architecture`).
    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "llama" | "mistral" => Ok(Self::Llama),
            "qwen2" => Ok(Self::Qwen2),
            "qwen3" => Ok(Self::Qwen3),
            "phi3" => Ok(Self::Phi3),
            other => Err(Error::model_load(format!(
                "unknown architecture '{other}': lmplex supports llama, mistral, qwen2, qwen3 and phi3"
            ))),
        }
    }

    /// The canonical lowercase name (`llama`, `qwen2`, `qwen3`, `phi3`); Mistral reads as `llama`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Phi3 => "phi3",
        }
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

/// Rotary position embedding settings: base, optional Llama-3 scaling and pair layout.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeArgs {
    /// `rope_theta`: the base of the rotary frequencies (default 10000).
    pub theta: f32,
    /// Llama-3 frequency scaling, if the checkpoint uses it (`rope_type: "llama3"`).
    pub llama3: Option<Llama3Scaling>,
    /// Pairs are `(x[2i], x[2i+1])` (GPT-J / GGUF llama layout) instead of `(x[i], x[i + d/2])` (NeoX).
    pub interleaved: bool,
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
    /// Rotary embedding settings.
    pub rope: RopeArgs,
    /// Context length the checkpoint was trained for (caps `max_model_len`).
    pub max_position_embeddings: usize,
    /// The LM head shares the token embedding's weights.
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry biases (qwen2).
    pub attention_bias: bool,
    /// Per-head RMSNorm on q and k before rope (qwen3).
    pub qk_norm: bool,
    /// The beginning-of-sequence token, if the checkpoint names one.
    pub bos_token_id: Option<u32>,
    /// Tokens that end generation (`eos_token_id`, a number or a list); may be empty.
    pub eos_token_ids: Vec<u32>,
}

impl ModelArgs {
    /// Checks what the model code relies on: positive sizes, KV heads dividing heads, even `head_dim`.
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
        if !self.num_attention_heads.is_multiple_of(self.num_key_value_heads) {
            return Err(Error::model_load(format!(
                "model config: num_attention_heads ({}) is not a multiple of num_key_value_heads ({})",
                self.num_attention_heads, self.num_key_value_heads
            )));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(Error::model_load(format!("model config: head_dim {} is odd", self.head_dim)));
        }
        Ok(())
    }

    /// Parameters held by the weights (embeddings counted once when tied).
    pub fn num_parameters(&self) -> usize {
        let (h, i, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let q = self.num_attention_heads * self.head_dim;
        let kv = self.num_key_value_heads * self.head_dim;
        let per_layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h;
        let head = if self.tie_word_embeddings { 0 } else { v * h };
        v * h + self.num_hidden_layers * per_layer + h + head
    }

    /// Parse a Hugging Face `config.json`.
    pub fn from_hf_config(json: &str) -> Result<Self> {
        // Name the architecture first: an unknown one is the useful error, not a missing field.
        let v: serde_json::Value =
            serde_json::from_str(json).map_err(|e| Error::model_load(format!("config.json is not valid JSON: {e}")))?;
        let model_type = v.get("model_type").and_then(|t| t.as_str());
        let first_arch = v.get("architectures").and_then(|a| a.get(0)).and_then(|a| a.as_str());
        if let Some(name) = model_type.or(first_arch) {
            Arch::from_name(name)
                .or_else(|e| {
                    let from_class = first_arch.map(|a| a.trim_end_matches("ForCausalLM").to_ascii_lowercase());
                    from_class.as_deref().map(Arch::from_name).unwrap_or(Err(e))
                })
                .map_err(|e| match first_arch {
                    Some(a) => Error::model_load(format!("{e} (config.json architectures: {a})")),
                    None => e,
                })?;
        }
        let c: HfConfig = serde_json::from_value(v)
            .map_err(|e| Error::model_load(format!("config.json is not a valid model config: {e}")))?;
        c.into_args()
    }
}

/// The subset of HF `config.json` fields lmplex reads (names as in transformers).
#[derive(Debug, Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    #[serde(default)]
    architectures: Vec<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    rope_theta: Option<f64>,
    rope_scaling: Option<serde_json::Value>,
    /// transformers >= 5 moves rope settings here.
    rope_parameters: Option<serde_json::Value>,
    max_position_embeddings: Option<usize>,
    #[serde(default)]
    tie_word_embeddings: bool,
    attention_bias: Option<bool>,
    sliding_window: Option<serde_json::Value>,
    use_sliding_window: Option<bool>,
    bos_token_id: Option<serde_json::Value>,
    eos_token_id: Option<serde_json::Value>,
    partial_rotary_factor: Option<f64>,
}

fn default_eps() -> f64 {
    1e-6
}

/// `eos_token_id` may be a number or a list.
pub(crate) fn token_ids(v: &Option<serde_json::Value>) -> Vec<u32> {
    match v {
        Some(serde_json::Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(serde_json::Value::Array(a)) => a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32).collect(),
        _ => Vec::new(),
    }
}

impl HfConfig {
    fn into_args(self) -> Result<ModelArgs> {
        let name = match (&self.model_type, self.architectures.first()) {
            (Some(t), _) => t.clone(),
            (None, Some(a)) => a.trim_end_matches("ForCausalLM").to_ascii_lowercase(),
            (None, None) => return Err(Error::model_load("config.json names neither model_type nor architectures")),
        };
        let arch = Arch::from_name(&name)?;
        if self.partial_rotary_factor.is_some_and(|f| f != 1.0) {
            return Err(Error::model_load("partial_rotary_factor != 1 is not supported"));
        }
        let sliding =
            self.use_sliding_window != Some(false) && self.sliding_window.as_ref().and_then(|v| v.as_u64()).is_some();
        if sliding && arch == Arch::Llama {
            return Err(Error::model_load(
                "sliding-window attention (Mistral v0.1 style) is not supported; use a checkpoint with sliding_window: null",
            ));
        }
        // Rope settings: `rope_parameters` (transformers >= 5) or `rope_theta` + `rope_scaling`.
        let rope_obj = self.rope_parameters.as_ref().or(self.rope_scaling.as_ref());
        let theta = self
            .rope_theta
            .or_else(|| self.rope_parameters.as_ref().and_then(|p| p.get("rope_theta")).and_then(|v| v.as_f64()))
            .unwrap_or(10_000.0) as f32;
        let llama3 = match rope_obj {
            None | Some(serde_json::Value::Null) => None,
            Some(o) => {
                let kind = o.get("rope_type").or_else(|| o.get("type")).and_then(|v| v.as_str()).unwrap_or("default");
                match kind {
                    "default" => None,
                    "llama3" => {
                        let f = |k: &str| o.get(k).and_then(|v| v.as_f64());
                        let missing = |k: &str| Error::model_load(format!("llama3 rope scaling lacks '{k}'"));
                        Some(Llama3Scaling {
                            factor: f("factor").ok_or_else(|| missing("factor"))? as f32,
                            low_freq_factor: f("low_freq_factor").ok_or_else(|| missing("low_freq_factor"))? as f32,
                            high_freq_factor: f("high_freq_factor").ok_or_else(|| missing("high_freq_factor"))? as f32,
                            original_max_position_embeddings: f("original_max_position_embeddings")
                                .ok_or_else(|| missing("original_max_position_embeddings"))?
                                as usize,
                        })
                    }
                    other => return Err(Error::model_load(format!("rope scaling type '{other}' is not supported"))),
                }
            }
        };
        let head_dim = self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1));
        let args = ModelArgs {
            arch,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: self.num_attention_heads,
            num_key_value_heads: self.num_key_value_heads.unwrap_or(self.num_attention_heads),
            head_dim,
            rms_norm_eps: self.rms_norm_eps as f32,
            rope: RopeArgs { theta, llama3, interleaved: false },
            max_position_embeddings: self.max_position_embeddings.unwrap_or(4096),
            tie_word_embeddings: self.tie_word_embeddings,
            // Qwen2 always has q/k/v biases (its config has no attention_bias field).
            attention_bias: arch == Arch::Qwen2 || self.attention_bias.unwrap_or(false),
            qk_norm: arch == Arch::Qwen3,
            bos_token_id: token_ids(&self.bos_token_id).first().copied(),
            eos_token_ids: token_ids(&self.eos_token_id),
        };
        args.validate()?;
        Ok(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rope_parameters_and_llama3_scaling() {
        let json = r#"{"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":16,
            "num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":1,
            "rope_parameters":{"rope_type":"llama3","rope_theta":500000.0,"factor":32.0,
            "low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192},
            "eos_token_id":[1,2]}"#;
        let a = ModelArgs::from_hf_config(json).unwrap();
        assert_eq!(a.rope.theta, 500000.0);
        assert_eq!(a.rope.llama3.unwrap().factor, 32.0);
        assert_eq!(a.eos_token_ids, vec![1, 2]);
        assert_eq!(a.head_dim, 4);
    }

    #[test]
    fn unknown_architecture_is_named() {
        let json = r#"{"model_type":"foo","vocab_size":10,"hidden_size":8,"intermediate_size":16,
            "num_hidden_layers":1,"num_attention_heads":2}"#;
        let e = ModelArgs::from_hf_config(json).unwrap_err().to_string();
        assert!(e.contains("unknown architecture 'foo'"), "{e}");
    }
}
