//! `ModelArgs` from a Hugging Face `config.json`: field names and defaults as transformers has
//! them, per family, for both rope layouts (`rope_theta` + `rope_scaling`, and transformers 5's
//! `rope_parameters`, per layer type for Gemma 3).
//!
//! Invariant: a config lmplex cannot run exactly (an unknown family, rope type, activation or
//! layer type, a partial rotary factor) is an error naming the field, never a guess.

use super::{
    Activation, Arch, LayerType, Llama3Scaling, LongRope, ModelArgs, MoeArgs, QkNorm, RopeArgs, RopeScaling, SUPPORTED,
};
use lmplex_core::{Error, Result};
use serde::Deserialize;
use serde_json::Value;

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
    rope_scaling: Option<Value>,
    /// transformers >= 5 moves rope settings here (per layer type for Gemma 3).
    rope_parameters: Option<Value>,
    rope_local_base_freq: Option<f64>,
    original_max_position_embeddings: Option<usize>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    sliding_window: Option<Value>,
    use_sliding_window: Option<bool>,
    max_window_layers: Option<usize>,
    layer_types: Option<Vec<String>>,
    sliding_window_pattern: Option<usize>,
    #[serde(rename = "_sliding_window_pattern")]
    sliding_window_pattern_private: Option<usize>,
    bos_token_id: Option<Value>,
    eos_token_id: Option<Value>,
    partial_rotary_factor: Option<f64>,
    hidden_act: Option<String>,
    hidden_activation: Option<String>,
    query_pre_attn_scalar: Option<f64>,
    attn_logit_softcapping: Option<f64>,
    final_logit_softcapping: Option<f64>,
    qkv_bias: Option<bool>,
    // Mixture-of-Experts.
    num_local_experts: Option<usize>,
    num_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    moe_intermediate_size: Option<usize>,
    shared_expert_intermediate_size: Option<usize>,
    norm_topk_prob: Option<bool>,
    decoder_sparse_step: Option<usize>,
    #[serde(default)]
    mlp_only_layers: Vec<usize>,
    clip_qkv: Option<f64>,
}

fn default_eps() -> f64 {
    1e-6
}

/// `eos_token_id` may be a number or a list.
pub(crate) fn token_ids(v: &Option<Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32).collect(),
        _ => Vec::new(),
    }
}

impl ModelArgs {
    /// Parse a Hugging Face `config.json`.
    pub fn from_hf_config(json: &str) -> Result<Self> {
        let v: Value =
            serde_json::from_str(json).map_err(|e| Error::model_load(format!("config.json is not valid JSON: {e}")))?;
        if let Some((text, prefix)) = vlm_text_config(&v)? {
            let mut args = Self::from_hf_value(text)?;
            args.text_prefix = Some(prefix);
            return Ok(args);
        }
        Self::from_hf_value(v)
    }

    /// `from_hf_config` for a text model's config object.
    fn from_hf_value(v: Value) -> Result<Self> {
        // Name the architecture first: an unknown one is the useful error, not a missing field.
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
        if v.get("text_config").is_some() {
            return Err(Error::model_load(format!(
                "multimodal checkpoints ({}) are not supported: use the text-only model; lmplex supports {SUPPORTED}",
                first_arch.unwrap_or("text_config")
            )));
        }
        // The error names the field at fault (`rope_scaling.factor: invalid type: ...`).
        let c: HfConfig = serde_path_to_error::deserialize(v).map_err(|e| {
            let at = e.path().to_string();
            let at = if at == "." { String::new() } else { format!("{at}: ") };
            Error::model_load(format!("config.json is not a valid model config: {at}{}", e.into_inner()))
        })?;
        c.into_args()
    }
}

/// A vision-language checkpoint's text model: its `text_config` as a config of its own, and
/// the prefix of its weights' names (as transformers 5 saves them; `WeightSource` also reads
/// the Hub's older Gemma 3 names). Idefics3 (SmolVLM): transformers' defaults for the text
/// model (`llama`), the top-level `tie_word_embeddings` where the config gives one. Gemma 3:
/// `Gemma3TextConfig`'s defaults for the keys `text_config` leaves out (`GEMMA3_TEXT`), as
/// transformers fills them. Qwen2-VL / Qwen2.5-VL: a Qwen2 with M-RoPE, from `text_config` or,
/// in the Hub's configs, the top level. `None` for any other config.
fn vlm_text_config(v: &Value) -> Result<Option<(Value, &'static str)>> {
    let model_type = v.get("model_type").and_then(|t| t.as_str());
    let (text_type, defaults, prefix): (_, &[(&str, u64)], _) = match model_type {
        Some("idefics3" | "smolvlm") => ("llama", &[], "model.text_model."),
        Some("gemma3") => ("gemma3_text", &GEMMA3_TEXT, "model.language_model."),
        Some("qwen2_vl" | "qwen2_5_vl") => ("qwen2", &[], "model.language_model."),
        _ => return Ok(None),
    };
    let qwen = text_type == "qwen2";
    let mut text = match v.get("text_config") {
        Some(t) => t.clone(),
        // The Hub's Qwen2-VL configs keep the text model's keys at the top level.
        None if qwen => {
            let mut top = v.clone();
            top.as_object_mut().map(|o| o.remove("vision_config"));
            top
        }
        None => Value::Object(Default::default()),
    };
    let obj = text.as_object_mut().ok_or_else(|| bad("text_config is not an object"))?;
    if qwen {
        // `qwen2_vl_text` is Qwen2 with M-RoPE (its `mrope_section`, read with the rope).
        obj.insert("model_type".into(), Value::from(text_type));
    }
    obj.entry("model_type").or_insert_with(|| Value::from(text_type));
    // The top level's token ids where the text model names none (Gemma 3's configs give them
    // there), then the family's defaults.
    for key in ["bos_token_id", "eos_token_id"] {
        if let Some(ids) = v.get(key).filter(|_| !obj.contains_key(key)) {
            obj.insert(key.into(), ids.clone());
        }
    }
    for &(key, value) in defaults {
        obj.entry(key).or_insert_with(|| Value::from(value));
    }
    if let Some(tie) = v.get("tie_word_embeddings") {
        obj.insert("tie_word_embeddings".into(), tie.clone());
    }
    Ok(Some((text, prefix)))
}

/// `Gemma3TextConfig`'s defaults for the keys lmplex reads that have none of their own here
/// (rope thetas, the layer pattern and the norms default as for a text-only Gemma 3).
const GEMMA3_TEXT: [(&str, u64); 12] = [
    ("vocab_size", 262_208),
    ("hidden_size", 2304),
    ("intermediate_size", 9216),
    ("num_hidden_layers", 26),
    ("num_attention_heads", 8),
    ("num_key_value_heads", 4),
    ("head_dim", 256),
    ("query_pre_attn_scalar", 256),
    ("sliding_window", 4096),
    ("max_position_embeddings", 131_072),
    ("bos_token_id", 2),
    ("eos_token_id", 1),
];

fn bad(what: impl std::fmt::Display) -> Error {
    Error::model_load(format!("config.json: {what}"))
}

/// One rope settings object (`rope_scaling`, `rope_parameters` or one of its per-layer-type
/// entries) with the base `theta`; `max_positions` and `original` feed LongRoPE's defaults.
fn parse_rope(obj: Option<&Value>, theta: f64, max_positions: usize, original: Option<usize>) -> Result<RopeArgs> {
    let f = |k: &str| obj.and_then(|o| o.get(k)).and_then(|v| v.as_f64());
    let theta = f("rope_theta").unwrap_or(theta) as f32;
    if f("partial_rotary_factor").is_some_and(|p| p != 1.0) {
        return Err(bad("partial_rotary_factor != 1 is not supported"));
    }
    let kind =
        obj.and_then(|o| o.get("rope_type").or_else(|| o.get("type"))).and_then(|v| v.as_str()).unwrap_or("default");
    let need = |k: &str| f(k).ok_or_else(|| bad(format!("{kind} rope scaling lacks '{k}'")));
    let mrope_section = match obj.and_then(|o| o.get("mrope_section")) {
        None => None,
        Some(v) => {
            let s: Vec<usize> = serde_json::from_value(v.clone()).map_err(|e| bad(format!("mrope_section: {e}")))?;
            Some(<[usize; 3]>::try_from(s.as_slice()).map_err(|_| bad("mrope_section needs 3 sections"))?)
        }
    };
    let scaling = match kind {
        // Qwen2-VL's configs on the Hub name M-RoPE a rope type; transformers reads it as default.
        "default" | "mrope" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: need("factor")? as f32 },
        "llama3" => RopeScaling::Llama3(Llama3Scaling {
            factor: need("factor")? as f32,
            low_freq_factor: need("low_freq_factor")? as f32,
            high_freq_factor: need("high_freq_factor")? as f32,
            original_max_position_embeddings: need("original_max_position_embeddings")? as usize,
        }),
        "longrope" | "su" => {
            let list = |k: &str| -> Result<Vec<f32>> {
                let a = obj.and_then(|o| o.get(k)).and_then(|v| v.as_array());
                let a = a.ok_or_else(|| bad(format!("longrope scaling lacks '{k}'")))?;
                a.iter()
                    .map(|x| x.as_f64().map(|x| x as f32).ok_or_else(|| bad(format!("'{k}' holds a non-number"))))
                    .collect()
            };
            let original = f("original_max_position_embeddings")
                .map(|x| x as usize)
                .or(original)
                .ok_or_else(|| bad("longrope scaling needs original_max_position_embeddings"))?;
            let factor = f("factor").unwrap_or(max_positions as f64 / original as f64);
            let attention_factor = f("attention_factor").unwrap_or(if factor <= 1.0 {
                1.0
            } else {
                (1.0 + factor.ln() / (original as f64).ln()).sqrt()
            });
            RopeScaling::LongRope(LongRope {
                short_factor: list("short_factor")?,
                long_factor: list("long_factor")?,
                original_max_position_embeddings: original,
                attention_factor: attention_factor as f32,
            })
        }
        other => return Err(bad(format!("rope scaling type '{other}' is not supported"))),
    };
    Ok(RopeArgs { theta, scaling, interleaved: false, mrope_section })
}

impl HfConfig {
    /// The experts of a MoE family, with transformers' defaults per family.
    fn moe_args(&self, arch: Arch) -> Result<Option<MoeArgs>> {
        let (count, norm_default) = match arch {
            // transformers 5 names some of them `num_local_experts`; checkpoints say `num_experts`.
            Arch::Mixtral => (self.num_local_experts.or(self.num_experts), true),
            Arch::Qwen2Moe | Arch::Qwen3Moe | Arch::Olmoe => (self.num_experts.or(self.num_local_experts), false),
            _ => return Ok(None),
        };
        let num_experts = count.ok_or_else(|| bad(format!("{} config lacks its expert count", arch.name())))?;
        let per_tok = self.num_experts_per_tok.ok_or_else(|| bad("num_experts_per_tok is missing"))?;
        let width = match arch {
            Arch::Qwen2Moe | Arch::Qwen3Moe => {
                self.moe_intermediate_size.ok_or_else(|| bad("moe_intermediate_size is missing"))?
            }
            _ => self.intermediate_size,
        };
        let step = self.decoder_sparse_step.unwrap_or(1).max(1);
        let sparse_layers =
            (0..self.num_hidden_layers).map(|i| !self.mlp_only_layers.contains(&i) && (i + 1) % step == 0).collect();
        Ok(Some(MoeArgs {
            num_experts,
            num_experts_per_tok: per_tok,
            expert_intermediate_size: width,
            norm_topk_prob: if arch == Arch::Mixtral { true } else { self.norm_topk_prob.unwrap_or(norm_default) },
            shared_expert_intermediate_size: if arch == Arch::Qwen2Moe {
                self.shared_expert_intermediate_size.filter(|&s| s > 0)
            } else {
                None
            },
            sparse_layers,
        }))
    }

    fn into_args(self) -> Result<ModelArgs> {
        let name = match (&self.model_type, self.architectures.first()) {
            (Some(t), _) => t.clone(),
            (None, Some(a)) => a.trim_end_matches("ForCausalLM").to_ascii_lowercase(),
            (None, None) => return Err(bad("names neither model_type nor architectures")),
        };
        let arch = Arch::from_name(&name)?;
        if self.partial_rotary_factor.is_some_and(|f| f != 1.0) {
            return Err(bad("partial_rotary_factor != 1 is not supported"));
        }
        let layers = self.num_hidden_layers;
        // Per-layer lists are built from this count before any weight is read: bound it.
        if layers > super::MAX_LAYERS {
            return Err(bad(format!("num_hidden_layers {layers} is more than {}", super::MAX_LAYERS)));
        }
        let max_positions = self.max_position_embeddings.unwrap_or(match arch {
            Arch::Gemma | Arch::Gemma2 => 8192,
            Arch::Gemma3 => 131_072,
            _ => 4096,
        });
        // Rope: `rope_parameters` (transformers >= 5; Gemma 3 keeps one per layer type) or
        // `rope_theta` + `rope_scaling`.
        let default_theta = if arch == Arch::Gemma3 { 1_000_000.0 } else { 10_000.0 };
        let rope_obj = self.rope_parameters.as_ref().or(self.rope_scaling.as_ref()).filter(|v| !v.is_null());
        let per_type = |t: &str| rope_obj.and_then(|o| o.get(t));
        let theta = self.rope_theta.unwrap_or(default_theta);
        let original = self.original_max_position_embeddings;
        let (rope, rope_local) = if let Some(full) = per_type("full_attention") {
            let local = per_type("sliding_attention").map(|l| parse_rope(Some(l), 10_000.0, max_positions, original));
            (parse_rope(Some(full), theta, max_positions, original)?, local.transpose()?)
        } else {
            let rope = parse_rope(rope_obj, theta, max_positions, original)?;
            let local =
                (arch == Arch::Gemma3).then(|| RopeArgs::plain(self.rope_local_base_freq.unwrap_or(10_000.0) as f32));
            (rope, local)
        };
        let head_dim = self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1));
        let window = self.sliding_window.as_ref().and_then(|v| v.as_u64()).map(|w| w as usize);
        let layer_types = match &self.layer_types {
            Some(types) => types
                .iter()
                .map(|t| match t.as_str() {
                    "full_attention" => Ok(LayerType::Full),
                    "sliding_attention" => Ok(LayerType::Sliding),
                    other => Err(bad(format!("layer type '{other}' is not supported"))),
                })
                .collect::<Result<Vec<_>>>()?,
            None => (0..layers)
                .map(|i| {
                    let sliding = match arch {
                        Arch::Gemma2 => i % 2 == 0,
                        Arch::Gemma3 => {
                            let pattern =
                                self.sliding_window_pattern.or(self.sliding_window_pattern_private).unwrap_or(6);
                            pattern == 0 || (i + 1) % pattern != 0
                        }
                        Arch::Mistral | Arch::Phi3 | Arch::Mixtral => window.is_some(),
                        Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen2Moe | Arch::Qwen3Moe => {
                            window.is_some()
                                && self.use_sliding_window == Some(true)
                                && i >= self.max_window_layers.unwrap_or(layers)
                        }
                        Arch::Llama | Arch::Gemma | Arch::Olmoe => false,
                    };
                    if sliding {
                        LayerType::Sliding
                    } else {
                        LayerType::Full
                    }
                })
                .collect(),
        };
        let gemma = arch.is_gemma();
        let sandwich = matches!(arch, Arch::Gemma2 | Arch::Gemma3);
        let act_name = self.hidden_activation.as_deref().or(self.hidden_act.as_deref()).unwrap_or("silu");
        let hidden_act = match act_name {
            "silu" | "swish" => Activation::Silu,
            "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast" => Activation::GeluTanh,
            // transformers runs Gemma's "gelu" as the tanh approximation.
            "gelu" if gemma => Activation::GeluTanh,
            other => return Err(bad(format!("activation '{other}' is not supported (silu, gelu_pytorch_tanh)"))),
        };
        let window = if layer_types.contains(&LayerType::Sliding) {
            Some(window.unwrap_or(if gemma { 4096 } else { 0 }))
        } else {
            window
        };
        if self.clip_qkv.is_some() {
            return Err(bad("clip_qkv is not supported"));
        }
        let moe = self.moe_args(arch)?;
        let mut args = ModelArgs {
            arch,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_hidden_layers: layers,
            num_attention_heads: self.num_attention_heads,
            num_key_value_heads: self.num_key_value_heads.unwrap_or(self.num_attention_heads),
            head_dim,
            rms_norm_eps: self.rms_norm_eps as f32,
            rope,
            rope_local,
            max_position_embeddings: max_positions,
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(gemma),
            // Qwen2 always has q/k/v biases (its config has no attention_bias field).
            attention_bias: match arch {
                Arch::Qwen2 => true,
                Arch::Qwen2Moe => self.qkv_bias.unwrap_or(true),
                _ => self.attention_bias.unwrap_or(false),
            },
            qk_norm: match arch {
                Arch::Qwen3 | Arch::Gemma3 | Arch::Qwen3Moe => QkNorm::PerHead,
                Arch::Olmoe => QkNorm::Whole,
                _ => QkNorm::None,
            },
            hidden_act,
            norm_weight_offset: if gemma { 1.0 } else { 0.0 },
            sandwich_norm: sandwich,
            embed_scale: gemma.then(|| (self.hidden_size as f32).sqrt()),
            attn_scale: match (gemma, self.query_pre_attn_scalar) {
                (true, Some(s)) => (1.0 / s.sqrt()) as f32,
                _ => 1.0 / (head_dim as f32).sqrt(),
            },
            attn_logit_softcapping: self.attn_logit_softcapping.map(|c| c as f32),
            final_logit_softcapping: self.final_logit_softcapping.map(|c| c as f32),
            sliding_window: window,
            layer_types,
            moe,
            bos_token_id: token_ids(&self.bos_token_id).first().copied(),
            eos_token_ids: token_ids(&self.eos_token_id),
            text_prefix: None,
        };
        args.drop_unused_window();
        args.validate()?;
        Ok(args)
    }
}
