//! A Llama-shaped checkpoint of any size that costs no disk: `config.json`, a word-level
//! tokenizer and a `model.safetensors` whose header names every tensor and whose data is a
//! hole (a sparse file, zeros when read), so the real loader opens it and the counting
//! executor "uploads" it without memory. Shapes only: every weight is zero.

use lmplex_core::{Error, Result};
use std::io::Write;
use std::path::Path;

/// A Llama-3 family shape (rope theta 500,000, bf16).
#[derive(Clone, Copy, Debug)]
pub struct LlamaShape {
    pub name: &'static str,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub vocab_size: usize,
    pub tie_word_embeddings: bool,
}

/// Llama-3.2-1B (16 layers, tied head).
pub const LLAMA_3_2_1B: LlamaShape = LlamaShape {
    name: "llama-3.2-1b",
    hidden_size: 2048,
    intermediate_size: 8192,
    num_hidden_layers: 16,
    num_attention_heads: 32,
    num_key_value_heads: 8,
    vocab_size: 128256,
    tie_word_embeddings: true,
};

/// Llama-3-8B (32 layers, untied head).
pub const LLAMA_3_8B: LlamaShape = LlamaShape {
    name: "llama-3-8b",
    hidden_size: 4096,
    intermediate_size: 14336,
    num_hidden_layers: 32,
    num_attention_heads: 32,
    num_key_value_heads: 8,
    vocab_size: 128256,
    tie_word_embeddings: false,
};

/// The shape of `name` (`llama-3.2-1b`, `llama-3-8b`).
pub fn shape_named(name: &str) -> Option<LlamaShape> {
    [LLAMA_3_2_1B, LLAMA_3_8B].into_iter().find(|s| s.name == name)
}

fn io(dir: &Path, e: impl std::fmt::Display) -> Error {
    Error::internal(format!("{}: {e}", dir.display()))
}

impl LlamaShape {
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// Every tensor of the checkpoint with `layers` layers: its HF name and shape.
    fn tensors(&self, layers: usize) -> Vec<(String, Vec<usize>)> {
        let (h, i, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let (q, kv) = (self.num_attention_heads * self.head_dim(), self.num_key_value_heads * self.head_dim());
        let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, h])];
        for l in 0..layers {
            let p = format!("model.layers.{l}");
            out.extend([
                (format!("{p}.input_layernorm.weight"), vec![h]),
                (format!("{p}.self_attn.q_proj.weight"), vec![q, h]),
                (format!("{p}.self_attn.k_proj.weight"), vec![kv, h]),
                (format!("{p}.self_attn.v_proj.weight"), vec![kv, h]),
                (format!("{p}.self_attn.o_proj.weight"), vec![h, q]),
                (format!("{p}.post_attention_layernorm.weight"), vec![h]),
                (format!("{p}.mlp.gate_proj.weight"), vec![i, h]),
                (format!("{p}.mlp.up_proj.weight"), vec![i, h]),
                (format!("{p}.mlp.down_proj.weight"), vec![h, i]),
            ]);
        }
        out.push(("model.norm.weight".into(), vec![h]));
        if !self.tie_word_embeddings {
            out.push(("lm_head.weight".into(), vec![v, h]));
        }
        out
    }

    /// Writes the checkpoint of this shape with `layers` layers into `dir`.
    pub fn write(&self, dir: &Path, layers: usize) -> Result<()> {
        let config = serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_hidden_layers": layers, "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "vocab_size": self.vocab_size,
            "tie_word_embeddings": self.tie_word_embeddings, "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu", "torch_dtype": "bfloat16",
            "bos_token_id": 0, "eos_token_id": 1,
        });
        std::fs::write(dir.join("config.json"), config.to_string()).map_err(|e| io(dir, e))?;
        lmplex_model::testing::write_word_tokenizer(dir, self.vocab_size).map_err(|e| io(dir, e))?;
        let mut header = serde_json::Map::new();
        let mut at = 0usize;
        for (name, shape) in self.tensors(layers) {
            let bytes = shape.iter().product::<usize>() * 2;
            header.insert(name, serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [at, at + bytes]}));
            at += bytes;
        }
        let mut text = serde_json::Value::Object(header).to_string();
        text.push_str(&" ".repeat(text.len().next_multiple_of(8) - text.len()));
        let path = dir.join("model.safetensors");
        let mut f = std::fs::File::create(&path).map_err(|e| io(&path, e))?;
        f.write_all(&(text.len() as u64).to_le_bytes()).map_err(|e| io(&path, e))?;
        f.write_all(text.as_bytes()).map_err(|e| io(&path, e))?;
        // The data: a hole the file system stores as nothing and reads as zeros.
        f.set_len((8 + text.len() + at) as u64).map_err(|e| io(&path, e))
    }
}
