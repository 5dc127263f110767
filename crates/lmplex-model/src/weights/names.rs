//! HF tensor names to llama.cpp's GGUF names: a text model's per architecture (`gguf_name`), a
//! multimodal projector file's (`clip_names`); the one place the naming schemes meet (weights are
//! always asked for by HF name).

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

/// How the tensors `clip_names` lists make up the HF tensor asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Join {
    /// One tensor, as stored.
    One,
    /// Concatenated along the first dimension (a fused `qkv` the converter split into q, k, v).
    Rows,
    /// Stacked along a new third dimension (Qwen's Conv3d patch kernel, which the converter
    /// splits into its two frames: `[out, in, p, p]` each, `[out, in, 2, p, p]` joined).
    Frames,
}

/// Prefixes a vision tower's tensors are asked for under (`vision::Prefixes`, Qwen's
/// `PREFIXES`, as a GGUF source answers `first_prefix`): an mmproj file has one tower, so
/// the prefix only says which family's names follow.
const TOWER_PREFIXES: [&str; 5] = [
    "model.vision_tower.vision_model.",
    "model.vision_model.",
    "model.visual.",
    "model.connector.",
    "model.multi_modal_projector.",
];

/// Names within a tower (after its prefix), as llama.cpp's converter writes them.
const CLIP_FIXED: [(&str, &str); 9] = [
    ("embeddings.patch_embedding.", "v.patch_embd."),
    ("embeddings.position_embedding.", "v.position_embd."),
    ("post_layernorm.", "v.post_ln."),
    ("merger.ln_q.", "v.post_ln."),
    ("merger.mlp.0.", "mm.0."),
    ("merger.mlp.2.", "mm.2."),
    ("modality_projection.proj.", "mm.model.fc."),
    ("mm_input_projection_weight", "mm.input_projection.weight"),
    ("mm_soft_emb_norm.", "mm.soft_emb_norm."),
];

/// Names within an encoder layer (SigLIP's `encoder.layers.N.`, Qwen's `blocks.N.`).
const CLIP_LAYER: [(&str, &str); 15] = [
    ("self_attn.q_proj.", "attn_q."),
    ("self_attn.k_proj.", "attn_k."),
    ("self_attn.v_proj.", "attn_v."),
    ("self_attn.out_proj.", "attn_out."),
    ("attn.proj.", "attn_out."),
    ("layer_norm1.", "ln1."),
    ("layer_norm2.", "ln2."),
    ("norm1.", "ln1."),
    ("norm2.", "ln2."),
    ("mlp.fc1.", "ffn_up."),
    ("mlp.fc2.", "ffn_down."),
    ("mlp.gate_proj.", "ffn_gate."),
    ("mlp.up_proj.", "ffn_up."),
    ("mlp.down_proj.", "ffn_down."),
    ("attn.qkv.", "attn_qkv."),
];

/// llama.cpp's names in a multimodal projector (`mmproj`) file for the HF tensor `hf` of a
/// vision tower (Idefics3, Gemma 3, Qwen2-VL, Qwen2.5-VL), and how they join into it; an
/// unknown name is returned as asked (the missing-tensor error names it).
pub(crate) fn clip_names(hf: &str) -> (Vec<String>, Join) {
    let one = |n: String| (vec![n], Join::One);
    let Some(rest) = TOWER_PREFIXES.iter().find_map(|p| hf.strip_prefix(p)) else { return one(hf.to_string()) };
    if rest == "patch_embed.proj.weight" {
        return (vec!["v.patch_embd.weight".into(), "v.patch_embd.weight.1".into()], Join::Frames);
    }
    if let Some((h, g)) = CLIP_FIXED.iter().find(|(h, _)| rest.starts_with(h)) {
        return one(format!("{g}{}", &rest[h.len()..]));
    }
    let layer = rest.strip_prefix("encoder.layers.").or_else(|| rest.strip_prefix("blocks."));
    let Some((i, within)) = layer.and_then(|l| l.split_once('.')) else { return one(hf.to_string()) };
    let Some((h, g)) = CLIP_LAYER.iter().find(|(h, _)| within.starts_with(h)) else { return one(hf.to_string()) };
    let suffix = &within[h.len()..];
    if *g == "attn_qkv." {
        let parts = ["attn_q", "attn_k", "attn_v"].map(|p| format!("v.blk.{i}.{p}.{suffix}"));
        return (parts.to_vec(), Join::Rows);
    }
    one(format!("v.blk.{i}.{g}{suffix}"))
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

    #[test]
    fn maps_vision_tower_names_to_mmproj() {
        let one = |n: &str| (vec![n.to_string()], Join::One);
        let siglip = "model.vision_model.encoder.layers.3";
        assert_eq!(clip_names(&format!("{siglip}.self_attn.q_proj.weight")), one("v.blk.3.attn_q.weight"));
        assert_eq!(clip_names(&format!("{siglip}.mlp.fc2.bias")), one("v.blk.3.ffn_down.bias"));
        assert_eq!(clip_names(&format!("{siglip}.layer_norm2.weight")), one("v.blk.3.ln2.weight"));
        let gemma = "model.vision_tower.vision_model.embeddings.position_embedding.weight";
        assert_eq!(clip_names(gemma), one("v.position_embd.weight"));
        let proj = "model.multi_modal_projector.mm_input_projection_weight";
        assert_eq!(clip_names(proj), one("mm.input_projection.weight"));
        assert_eq!(clip_names("model.connector.modality_projection.proj.weight"), one("mm.model.fc.weight"));
        assert_eq!(clip_names("model.visual.merger.mlp.2.bias"), one("mm.2.bias"));
        assert_eq!(clip_names("model.visual.merger.ln_q.weight"), one("v.post_ln.weight"));
        assert_eq!(clip_names("model.visual.blocks.0.mlp.gate_proj.weight"), one("v.blk.0.ffn_gate.weight"));
        let (qkv, join) = clip_names("model.visual.blocks.2.attn.qkv.bias");
        assert_eq!(
            (qkv.join(" "), join),
            ("v.blk.2.attn_q.bias v.blk.2.attn_k.bias v.blk.2.attn_v.bias".into(), Join::Rows)
        );
        let (patch, join) = clip_names("model.visual.patch_embed.proj.weight");
        assert_eq!((patch.join(" "), join), ("v.patch_embd.weight v.patch_embd.weight.1".into(), Join::Frames));
        assert_eq!(clip_names("model.visual.unknown.weight"), one("model.visual.unknown.weight"));
    }
}
