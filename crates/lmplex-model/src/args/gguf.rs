//! `ModelArgs` from GGUF metadata, with llama.cpp's conventions where the file is silent: rope
//! layout by family (llama.cpp permutes Llama's q/k to the interleaved layout), Gemma's fixed
//! sliding patterns (every other layer for Gemma 2, five of six for Gemma 3) and Gemma 3's
//! local rope base of 10000, and norm weights stored with Gemma's `+1` already added.
//!
//! Invariant: bos/eos ids come from the tokenizer when one is given, so a plan (shapes only)
//! and a load agree on every other field.

use super::{Activation, Arch, LayerType, ModelArgs, MoeArgs, QkNorm, RopeArgs, RopeScaling};
use crate::tokenizer::Tokenizer;
use candle_core::quantized::gguf_file;
use lmplex_core::{Error, Result};
use std::path::Path;

fn err(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::model_load(format!("{}: {what}", path.display()))
}

/// llama.cpp's `rope.dimension_sections` (`[t, h, w, 0]`, Qwen2-VL's M-RoPE) as HF's
/// `mrope_section`; absent or all zero: no M-RoPE. A fourth section (Qwen3-VL's) is refused.
fn mrope_section(v: Option<&gguf_file::Value>) -> std::result::Result<Option<[usize; 3]>, String> {
    let Some(v) = v else { return Ok(None) };
    let bad = |e: &dyn std::fmt::Display| format!("rope.dimension_sections: {e}");
    let items = v.to_vec().map_err(|e| bad(&e))?;
    let s: Vec<usize> = items
        .iter()
        .map(|x| x.to_i32().map(|n| n.max(0) as usize).or_else(|_| x.to_u32().map(|n| n as usize)))
        .collect::<candle_core::Result<_>>()
        .map_err(|e| bad(&e))?;
    match s.as_slice() {
        [] => Ok(None),
        s if s.iter().all(|&n| n == 0) => Ok(None),
        [t, h, w, rest @ ..] if rest.iter().all(|&n| n == 0) => Ok(Some([*t, *h, *w])),
        other => Err(bad(&format!("{other:?} is not three sections"))),
    }
}

/// The model's shapes from GGUF metadata; bos/eos ids come from `tokenizer` when given (a plan
/// needs only the shapes, so it skips building the tokenizer).
pub(crate) fn gguf_args(c: &gguf_file::Content, path: &Path, tokenizer: Option<&Tokenizer>) -> Result<ModelArgs> {
    let arch_name = c
        .metadata
        .get("general.architecture")
        .and_then(|v| v.to_string().ok().cloned())
        .ok_or_else(|| err(path, "GGUF has no general.architecture"))?;
    let arch = Arch::from_name(&arch_name).map_err(|e| err(path, e))?;
    let get = |key: &str| -> Option<&gguf_file::Value> { c.metadata.get(&format!("{arch_name}.{key}")) };
    let usize_of = |key: &str| -> Result<usize> {
        let v = get(key).ok_or_else(|| err(path, format!("GGUF has no '{arch_name}.{key}'")))?;
        v.to_u32().map(|x| x as usize).or_else(|_| v.to_u64().map(|x| x as usize)).map_err(|e| err(path, e))
    };
    let experts = usize_of("expert_count").ok().filter(|&n| n > 0);
    // llama.cpp writes Mixtral as `llama` with experts.
    let arch = if arch == Arch::Llama && experts.is_some() { Arch::Mixtral } else { arch };
    let f32_of = |key: &str| get(key).and_then(|v| v.to_f32().ok());
    let hidden = usize_of("embedding_length")?;
    let heads = usize_of("attention.head_count")?;
    let layers = usize_of("block_count")?;
    // Per-layer lists are built from this count before any weight is read: bound it.
    if layers > super::MAX_LAYERS {
        return Err(err(path, format!("{arch_name}.block_count {layers} is more than {}", super::MAX_LAYERS)));
    }
    let head_dim = usize_of("attention.key_length").unwrap_or(hidden / heads.max(1));
    let vocab = c
        .tensor_infos
        .get("token_embd.weight")
        .map(|t| t.shape.dims()[0])
        .ok_or_else(|| err(path, "GGUF has no token_embd.weight"))?;
    let gemma = arch.is_gemma();
    let window = usize_of("attention.sliding_window").ok().filter(|&w| w > 0);
    // llama.cpp's `set_swa_pattern(n)`: layer i slides when `i % n < n - 1`.
    let pattern = match arch {
        Arch::Gemma2 => Some(2),
        Arch::Gemma3 => Some(usize_of("attention.sliding_window_pattern").unwrap_or(6)),
        Arch::Phi3 | Arch::Mistral | Arch::Mixtral => Some(0),
        _ => None,
    };
    let layer_types = (0..layers)
        .map(|i| match (window, pattern) {
            (Some(_), Some(n)) if n == 0 || i % n < n - 1 => LayerType::Sliding,
            _ => LayerType::Full,
        })
        .collect();
    let scaling = match get("rope.scaling.type").and_then(|v| v.to_string().ok()).map(String::as_str) {
        Some("linear") => RopeScaling::Linear { factor: f32_of("rope.scaling.factor").unwrap_or(1.0) },
        None | Some("none") => RopeScaling::None,
        Some(other) => return Err(err(path, format!("GGUF rope scaling type '{other}' is not supported"))),
    };
    let moe = match experts {
        None => None,
        Some(num_experts) => Some(MoeArgs {
            num_experts,
            num_experts_per_tok: usize_of("expert_used_count")?,
            expert_intermediate_size: usize_of("expert_feed_forward_length")
                .or_else(|_| usize_of("feed_forward_length"))?,
            // llama.cpp renormalizes for Mixtral and Qwen3-MoE, not for Qwen2-MoE and OLMoE.
            norm_topk_prob: get("expert_weights_norm")
                .and_then(|v| v.to_bool().ok())
                .unwrap_or(matches!(arch, Arch::Mixtral | Arch::Qwen3Moe)),
            shared_expert_intermediate_size: usize_of("expert_shared_feed_forward_length").ok().filter(|&s| s > 0),
            sparse_layers: (0..layers)
                .map(|i| c.tensor_infos.contains_key(&format!("blk.{i}.ffn_gate_inp.weight")))
                .collect(),
        }),
    };
    let qk_norm = match c.tensor_infos.get("blk.0.attn_q_norm.weight") {
        None => QkNorm::None,
        Some(t) if t.shape.elem_count() == head_dim => QkNorm::PerHead,
        Some(_) => QkNorm::Whole,
    };
    // llama.cpp runs the 27B Gemmas with the query scale 1 / sqrt(hidden / heads).
    let big_gemma = matches!((arch, layers), (Arch::Gemma2, 46) | (Arch::Gemma3, 62));
    let mut args = ModelArgs {
        arch,
        vocab_size: vocab,
        hidden_size: hidden,
        intermediate_size: usize_of("feed_forward_length").or_else(|_| usize_of("expert_feed_forward_length"))?,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: usize_of("attention.head_count_kv").unwrap_or(heads),
        head_dim,
        rms_norm_eps: f32_of("attention.layer_norm_rms_epsilon").unwrap_or(1e-5),
        // llama.cpp permutes llama q/k weights to the interleaved (GPT-J) rope layout.
        rope: RopeArgs {
            theta: f32_of("rope.freq_base").unwrap_or(10_000.0),
            scaling,
            interleaved: matches!(arch, Arch::Llama | Arch::Mistral | Arch::Mixtral),
            mrope_section: mrope_section(get("rope.dimension_sections")).map_err(|e| err(path, e))?,
        },
        rope_local: (arch == Arch::Gemma3).then(|| RopeArgs::plain(10_000.0)),
        max_position_embeddings: usize_of("context_length").unwrap_or(4096),
        tie_word_embeddings: !c.tensor_infos.contains_key("output.weight"),
        attention_bias: c.tensor_infos.contains_key("blk.0.attn_q.bias"),
        qk_norm,
        hidden_act: if gemma { Activation::GeluTanh } else { Activation::Silu },
        norm_weight_offset: 0.0,
        sandwich_norm: matches!(arch, Arch::Gemma2 | Arch::Gemma3),
        embed_scale: gemma.then(|| (hidden as f32).sqrt()),
        attn_scale: 1.0 / (if big_gemma { hidden / heads } else { head_dim } as f32).sqrt(),
        attn_logit_softcapping: f32_of("attn_logit_softcapping").filter(|_| arch == Arch::Gemma2),
        final_logit_softcapping: f32_of("final_logit_softcapping").filter(|_| arch == Arch::Gemma2),
        sliding_window: window,
        layer_types,
        moe,
        bos_token_id: tokenizer.and_then(|t| t.bos_token_id),
        eos_token_ids: tokenizer.map(|t| t.eos_token_ids.clone()).unwrap_or_default(),
        text_prefix: None,
    };
    args.drop_unused_window();
    args.validate().map_err(|e| err(path, e))?;
    Ok(args)
}
