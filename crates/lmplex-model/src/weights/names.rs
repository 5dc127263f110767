//! HF tensor names to llama.cpp's GGUF names, per architecture: the one place the two naming
//! schemes meet (weights are always asked for by HF name).

use crate::args::Arch;

/// llama.cpp's name for an HF tensor name, for architecture `arch`.
pub fn gguf_name(arch: Arch, hf: &str) -> String {
    let fixed = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
    ];
    if let Some((_, g)) = fixed.iter().find(|(h, _)| *h == hf) {
        return g.to_string();
    }
    let Some(rest) = hf.strip_prefix("model.layers.") else { return hf.to_string() };
    let (layer, rest) = rest.split_once('.').unwrap_or((rest, ""));
    let up = if arch == Arch::Phi3 { "mlp.gate_up_proj" } else { "mlp.up_proj" };
    // Gemma 2/3 have four norms per layer: HF's `post_attention_layernorm` normalizes the
    // attention output there, and `pre_feedforward_layernorm` is llama.cpp's `ffn_norm`.
    let post_attn = if matches!(arch, Arch::Gemma2 | Arch::Gemma3) { "post_attention_norm" } else { "ffn_norm" };
    // Longer names first: `mlp.gate.` (the router) must not catch `mlp.gate_proj`.
    let parts = [
        ("mlp.shared_expert_gate", "ffn_gate_inp_shexp"),
        ("mlp.shared_expert.gate_proj", "ffn_gate_shexp"),
        ("mlp.shared_expert.up_proj", "ffn_up_shexp"),
        ("mlp.shared_expert.down_proj", "ffn_down_shexp"),
        ("mlp.experts.gate_proj", "ffn_gate_exps"),
        ("mlp.experts.up_proj", "ffn_up_exps"),
        ("mlp.experts.down_proj", "ffn_down_exps"),
        ("mlp.gate.", "ffn_gate_inp."),
        ("self_attn.q_proj", "attn_q"),
        ("self_attn.k_proj", "attn_k"),
        ("self_attn.v_proj", "attn_v"),
        ("self_attn.qkv_proj", "attn_qkv"),
        ("self_attn.o_proj", "attn_output"),
        ("self_attn.q_norm", "attn_q_norm"),
        ("self_attn.k_norm", "attn_k_norm"),
        ("input_layernorm", "attn_norm"),
        ("post_attention_layernorm", post_attn),
        ("pre_feedforward_layernorm", "ffn_norm"),
        ("post_feedforward_layernorm", "post_ffw_norm"),
        ("mlp.gate_proj", "ffn_gate"),
        (up, "ffn_up"),
        ("mlp.down_proj", "ffn_down"),
    ];
    for (h, g) in parts {
        if let Some(suffix) = rest.strip_prefix(h) {
            return format!("blk.{layer}.{g}{suffix}");
        }
    }
    hf.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_hf_names_to_gguf() {
        assert_eq!(gguf_name(Arch::Llama, "model.layers.3.self_attn.q_proj.weight"), "blk.3.attn_q.weight");
        assert_eq!(gguf_name(Arch::Qwen2, "model.layers.0.self_attn.k_proj.bias"), "blk.0.attn_k.bias");
        assert_eq!(gguf_name(Arch::Phi3, "model.layers.1.mlp.gate_up_proj.weight"), "blk.1.ffn_up.weight");
        assert_eq!(gguf_name(Arch::Llama, "model.layers.1.mlp.up_proj.weight"), "blk.1.ffn_up.weight");
        assert_eq!(gguf_name(Arch::Llama, "lm_head.weight"), "output.weight");
        assert_eq!(gguf_name(Arch::Qwen3, "model.layers.2.self_attn.k_norm.weight"), "blk.2.attn_k_norm.weight");
        assert_eq!(gguf_name(Arch::Llama, "model.layers.4.post_attention_layernorm.weight"), "blk.4.ffn_norm.weight");
        let moe = |hf: &str| gguf_name(Arch::Qwen2Moe, &format!("model.layers.1.mlp.{hf}"));
        assert_eq!(moe("gate.weight"), "blk.1.ffn_gate_inp.weight");
        assert_eq!(moe("gate_proj.weight"), "blk.1.ffn_gate.weight");
        assert_eq!(moe("experts.up_proj.weight"), "blk.1.ffn_up_exps.weight");
        assert_eq!(moe("shared_expert.down_proj.weight"), "blk.1.ffn_down_shexp.weight");
        assert_eq!(moe("shared_expert_gate.weight"), "blk.1.ffn_gate_inp_shexp.weight");
        let gemma = |hf: &str| gguf_name(Arch::Gemma3, &format!("model.layers.4.{hf}.weight"));
        assert_eq!(gemma("post_attention_layernorm"), "blk.4.post_attention_norm.weight");
        assert_eq!(gemma("pre_feedforward_layernorm"), "blk.4.ffn_norm.weight");
        assert_eq!(gemma("post_feedforward_layernorm"), "blk.4.post_ffw_norm.weight");
    }
}
