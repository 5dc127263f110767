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
    let RopeScaling::Llama3(s) = a.rope.scaling else { panic!("{:?}", a.rope.scaling) };
    assert_eq!(s.factor, 32.0);
    assert_eq!(a.eos_token_ids, vec![1, 2]);
    assert_eq!(a.head_dim, 4);
    assert_eq!(a.layer_types, vec![LayerType::Full]);
}

#[test]
fn unknown_architecture_is_named() {
    let json = r#"{"model_type":"foo","vocab_size":10,"hidden_size":8,"intermediate_size":16,
        "num_hidden_layers":1,"num_attention_heads":2}"#;
    let e = ModelArgs::from_hf_config(json).unwrap_err().to_string();
    assert!(e.contains("unknown architecture 'foo'") && e.contains("gemma3"), "{e}");
}

const SHAPE: &str = r#""vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_attention_heads":2,
    "num_key_value_heads":1,"head_dim":4"#;

/// Gemma 3 in transformers 4's layout: layer pattern from `sliding_window_pattern`, local rope
/// from `rope_local_base_freq`, query scale from `query_pre_attn_scalar`, tied head by default.
#[test]
fn gemma3_old_layout() {
    let json = format!(
        r#"{{"model_type":"gemma3_text",{SHAPE},"num_hidden_layers":7,"sliding_window":512,
        "sliding_window_pattern":6,"rope_theta":1000000.0,"rope_local_base_freq":10000.0,
        "rope_scaling":{{"rope_type":"linear","factor":8.0}},"query_pre_attn_scalar":256,
        "hidden_activation":"gelu_pytorch_tanh","final_logit_softcapping":null}}"#
    );
    let a = ModelArgs::from_hf_config(&json).unwrap();
    use LayerType::{Full, Sliding};
    assert_eq!(a.layer_types, vec![Sliding, Sliding, Sliding, Sliding, Sliding, Full, Sliding]);
    assert_eq!(
        (a.sliding_window, a.rope.theta, a.rope.scaling.clone()),
        (Some(512), 1e6, RopeScaling::Linear { factor: 8.0 })
    );
    assert_eq!(a.rope_local, Some(RopeArgs::plain(10000.0)));
    assert_eq!((a.attn_scale, a.embed_scale, a.norm_weight_offset), (1.0 / 16.0, Some(8f32.sqrt()), 1.0));
    assert!(
        a.qk_norm == QkNorm::PerHead && a.sandwich_norm && a.tie_word_embeddings && a.final_logit_softcapping.is_none()
    );
    assert_eq!(a.hidden_act, Activation::GeluTanh);
}

/// A window as long as the context: Mistral's layers become full ones; Gemma 3's stay window
/// layers, since their type also picks the local rope.
#[test]
fn unused_window_dropped_unless_it_picks_a_rope() {
    let mistral = format!(
        r#"{{"model_type":"mistral",{SHAPE},"num_hidden_layers":2,"sliding_window":4096,"max_position_embeddings":4096}}"#
    );
    let a = ModelArgs::from_hf_config(&mistral).unwrap();
    assert_eq!((a.sliding_window, a.layer_types.clone()), (None, vec![LayerType::Full; 2]));
    let gemma3 = format!(
        r#"{{"model_type":"gemma3_text",{SHAPE},"num_hidden_layers":2,"sliding_window":4096,
        "max_position_embeddings":256,"sliding_window_pattern":2,"rope_local_base_freq":10000.0}}"#
    );
    let a = ModelArgs::from_hf_config(&gemma3).unwrap();
    assert_eq!((a.sliding_window, a.layer_types.clone()), (Some(4096), vec![LayerType::Sliding, LayerType::Full]));
    assert_eq!(a.rope_local, Some(RopeArgs::plain(10000.0)));
}

/// Gemma 3 in transformers 5's layout: `layer_types` and `rope_parameters` per layer type.
#[test]
fn gemma3_new_layout() {
    let json = format!(
        r#"{{"model_type":"gemma3_text",{SHAPE},"num_hidden_layers":2,"sliding_window":8,
        "layer_types":["full_attention","sliding_attention"],
        "rope_parameters":{{"full_attention":{{"rope_theta":1000000.0,"rope_type":"default"}},
        "sliding_attention":{{"rope_theta":10000.0,"rope_type":"default"}}}}}}"#
    );
    let a = ModelArgs::from_hf_config(&json).unwrap();
    assert_eq!(a.layer_types, vec![LayerType::Full, LayerType::Sliding]);
    assert_eq!((a.rope.theta, a.rope_local.unwrap().theta), (1e6, 1e4));
}

/// Gemma 2: alternating layers (the first sliding), both soft-caps.
#[test]
fn gemma2_defaults() {
    let json = format!(
        r#"{{"model_type":"gemma2",{SHAPE},"num_hidden_layers":3,"sliding_window":4096,
        "attn_logit_softcapping":50.0,"final_logit_softcapping":30.0,"query_pre_attn_scalar":144}}"#
    );
    let a = ModelArgs::from_hf_config(&json).unwrap();
    assert_eq!(a.layer_types, vec![LayerType::Sliding, LayerType::Full, LayerType::Sliding]);
    assert_eq!((a.attn_logit_softcapping, a.final_logit_softcapping), (Some(50.0), Some(30.0)));
    assert!(a.qk_norm == QkNorm::None && a.sandwich_norm && a.rope_local.is_none());
    assert_eq!(a.attn_scale, 1.0 / 12.0);
}

/// Phi-3's LongRoPE: factors, the original length from the top level, the default attention
/// factor `sqrt(1 + ln(s) / ln(original))`; a sliding window on every layer.
#[test]
fn phi3_longrope() {
    let json = format!(
        r#"{{"model_type":"phi3",{SHAPE},"num_hidden_layers":2,"max_position_embeddings":1024,
        "original_max_position_embeddings":256,"sliding_window":100,
        "rope_scaling":{{"type":"longrope","short_factor":[1.0,1.5],"long_factor":[2.0,3.0]}}}}"#
    );
    let a = ModelArgs::from_hf_config(&json).unwrap();
    let RopeScaling::LongRope(l) = &a.rope.scaling else { panic!("{:?}", a.rope.scaling) };
    assert_eq!(
        (l.short_factor.clone(), l.long_factor.clone(), l.original_max_position_embeddings),
        (vec![1.0, 1.5], vec![2.0, 3.0], 256)
    );
    let want = (1.0 + 4f64.ln() / 256f64.ln()).sqrt() as f32;
    assert!((l.attention_factor - want).abs() < 1e-6);
    assert_eq!(a.layer_types, vec![LayerType::Sliding; 2]);
    // A wrong factor count is refused.
    let bad = json.replace("[1.0,1.5]", "[1.0]");
    assert!(ModelArgs::from_hf_config(&bad).unwrap_err().to_string().contains("longrope factors"));
}

/// Qwen2's window applies from `max_window_layers` on, and only with `use_sliding_window`.
#[test]
fn qwen2_window_layers() {
    let base =
        format!(r#"{{"model_type":"qwen2",{SHAPE},"num_hidden_layers":3,"sliding_window":64,"max_window_layers":1"#);
    let on = ModelArgs::from_hf_config(&format!(r#"{base},"use_sliding_window":true}}"#)).unwrap();
    assert_eq!(on.layer_types, vec![LayerType::Full, LayerType::Sliding, LayerType::Sliding]);
    let off = ModelArgs::from_hf_config(&format!(r#"{base},"use_sliding_window":false}}"#)).unwrap();
    assert!(!off.has_sliding_window());
}

/// What lmplex cannot run exactly is refused by name.
#[test]
fn unsupported_variants_are_named() {
    let cases = [
        (r#""model_type":"llama","num_hidden_layers":1,"rope_scaling":{"rope_type":"yarn","factor":4.0}"#, "'yarn'"),
        (r#""model_type":"llama","num_hidden_layers":1,"hidden_act":"relu""#, "activation 'relu'"),
        (r#""model_type":"llama","num_hidden_layers":1,"partial_rotary_factor":0.5"#, "partial_rotary_factor"),
        (r#""model_type":"llama","num_hidden_layers":1,"text_config":{}"#, "multimodal"),
        (r#""model_type":"llama","num_hidden_layers":1,"layer_types":["chunked_attention"]"#, "'chunked_attention'"),
    ];
    for (extra, want) in cases {
        let e = ModelArgs::from_hf_config(&format!("{{{SHAPE},{extra}}}")).unwrap_err().to_string();
        assert!(e.contains(want), "{extra}: {e}");
    }
}

/// MoE configs: expert counts and widths per family, Qwen's dense layers, the shared expert.
#[test]
fn moe_families() {
    let mixtral = ModelArgs::from_hf_config(&format!(
        r#"{{"model_type":"mixtral",{SHAPE},"num_hidden_layers":2,"num_local_experts":8,"num_experts_per_tok":2}}"#
    ))
    .unwrap();
    let m = mixtral.moe.unwrap();
    assert_eq!((m.num_experts, m.num_experts_per_tok, m.expert_intermediate_size, m.norm_topk_prob), (8, 2, 16, true));
    assert_eq!(m.sparse_layers, vec![true, true]);
    let qwen = ModelArgs::from_hf_config(&format!(
        r#"{{"model_type":"qwen2_moe",{SHAPE},"num_hidden_layers":3,"num_experts":4,"num_experts_per_tok":2,
        "moe_intermediate_size":8,"shared_expert_intermediate_size":12,"mlp_only_layers":[1],"decoder_sparse_step":1}}"#
    ))
    .unwrap();
    let m = qwen.moe.unwrap();
    assert_eq!((m.expert_intermediate_size, m.shared_expert_intermediate_size, m.norm_topk_prob), (8, Some(12), false));
    assert_eq!(m.sparse_layers, vec![true, false, true]);
    assert!(qwen.attention_bias);
    let olmoe = ModelArgs::from_hf_config(&format!(
        r#"{{"model_type":"olmoe",{SHAPE},"num_hidden_layers":1,"num_experts":4,"num_experts_per_tok":2}}"#
    ))
    .unwrap();
    assert_eq!(olmoe.qk_norm, QkNorm::Whole);
    let e = ModelArgs::from_hf_config(&format!(
        r#"{{"model_type":"olmoe",{SHAPE},"num_hidden_layers":1,"num_experts":4,"num_experts_per_tok":5}}"#
    ))
    .unwrap_err();
    assert!(e.to_string().contains("5 experts per token of 4"), "{e}");
}

#[test]
fn a_config_field_of_the_wrong_type_is_named() {
    let json = r#"{"model_type":"llama","vocab_size":10,"hidden_size":"eight","intermediate_size":16,
        "num_hidden_layers":1,"num_attention_heads":2}"#;
    let e = ModelArgs::from_hf_config(json).unwrap_err().to_string();
    assert!(e.contains("config.json") && e.contains("hidden_size: invalid type"), "{e}");
}

/// An Idefics3 (SmolVLM) folder's text model: its `text_config` (a Llama unless it says
/// otherwise), the top-level tying, weights under `model.text_model.`.
#[test]
fn idefics3_text_model() {
    let cfg = format!(
        r#"{{"model_type":"idefics3","image_token_id":70,"scale_factor":2,"tie_word_embeddings":true,
            "vision_config":{{"hidden_size":32}},"text_config":{{{SHAPE},"num_hidden_layers":3,"tie_word_embeddings":false,"rms_norm_eps":1e-5}}}}"#
    );
    let args = ModelArgs::from_hf_config(&cfg).unwrap();
    assert_eq!(args.arch, Arch::Llama);
    assert_eq!((args.num_hidden_layers, args.rms_norm_eps, args.tie_word_embeddings), (3, 1e-5, true));
    assert_eq!(args.text_prefix, Some("model.text_model."));
    let plain = ModelArgs::from_hf_config(&format!(r#"{{"model_type":"llama",{SHAPE},"num_hidden_layers":1}}"#));
    assert_eq!(plain.unwrap().text_prefix, None);
    let e = ModelArgs::from_hf_config(r#"{"model_type":"idefics3","text_config":[]}"#).unwrap_err();
    assert!(e.to_string().contains("text_config is not an object"), "{e}");
}
