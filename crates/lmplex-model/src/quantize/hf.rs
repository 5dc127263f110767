//! A Hugging Face folder as the source of `lmplex quantize`: convert_hf_to_gguf.py's part of
//! llama.cpp's two-step recipe, done in memory. The GGUF metadata comes from `config.json`
//! (llama.cpp's keys for the architecture) and the tokenizer folder
//! (`lmplex_text::hf_vocab`); tensors get llama.cpp's names (`gguf_name`).
//!
//! Invariants: a llama model's q/k rows (weights and biases) are permuted to llama.cpp's
//! interleaved rope layout (the inverse of `export::unpermute_rows`); a tied `lm_head.weight`
//! and `rotary_emb.inv_freq` buffers are not written; tensors
//! are read one at a time, widened to f32 exactly, and a tensor the plan leaves alone (norms,
//! biases: 1-D) is written as F32, as convert_hf_to_gguf.py writes it. Families other than
//! llama, qwen2 and qwen3 without rope scaling, and tokenizers other than byte-level BPE, are
//! refused before anything is written.

use crate::args::{Arch, ModelArgs, RopeScaling};
use crate::loader::Checkpoint;
use crate::weights::{gguf_name, WeightSource};
use candle_core::quantized::gguf_file::Value;
use candle_core::Tensor;
use lmplex_core::{Error, Result};
use std::collections::HashMap;
use std::path::Path;

/// An open HF folder: its GGUF metadata and tensors by GGUF name.
pub(super) struct HfSource {
    pub metadata: Vec<(String, Value)>,
    /// GGUF name -> (HF name, dims).
    pub tensors: HashMap<String, (String, Vec<usize>)>,
    args: ModelArgs,
    src: WeightSource,
}

/// llama.cpp's metadata for the model's shapes (convert_hf_to_gguf.py's keys and types).
fn arch_metadata(args: &ModelArgs, name: &str) -> Vec<(String, Value)> {
    let a = args.arch.name();
    let u = |v: usize| Value::U32(v as u32);
    let mut md = vec![
        ("general.architecture".to_string(), Value::String(a.into())),
        ("general.name".to_string(), Value::String(name.into())),
        (format!("{a}.vocab_size"), u(args.vocab_size)),
        (format!("{a}.context_length"), u(args.max_position_embeddings)),
        (format!("{a}.embedding_length"), u(args.hidden_size)),
        (format!("{a}.block_count"), u(args.num_hidden_layers)),
        (format!("{a}.feed_forward_length"), u(args.intermediate_size)),
        (format!("{a}.attention.head_count"), u(args.num_attention_heads)),
        (format!("{a}.attention.head_count_kv"), u(args.num_key_value_heads)),
        (format!("{a}.attention.layer_norm_rms_epsilon"), Value::F32(args.rms_norm_eps)),
        (format!("{a}.rope.freq_base"), Value::F32(args.rope.theta)),
        (format!("{a}.attention.key_length"), u(args.head_dim)),
        (format!("{a}.attention.value_length"), u(args.head_dim)),
    ];
    if args.arch == Arch::Llama {
        md.push((format!("{a}.rope.dimension_count"), u(args.head_dim)));
    }
    md
}

/// llama.cpp's q/k permutation: rows `(head, 2, pair)` to `(head, pair, 2)`.
fn permute_rows(t: &Tensor, heads: usize) -> candle_core::Result<Tensor> {
    let (rows, cols) = t.dims2()?;
    t.reshape((heads, 2, rows / heads / 2, cols))?.transpose(1, 2)?.contiguous()?.reshape((rows, cols))
}

impl HfSource {
    pub fn open(dir: &Path) -> Result<Self> {
        let Checkpoint { args, src, info, .. } = crate::loader::open(dir, None)?;
        if info.quantization != "none" {
            return Err(Error::invalid(format!(
                "{}: an {} folder cannot be quantized yet; quantize the model it was made from",
                dir.display(),
                info.quantization.to_uppercase()
            )));
        }
        if !matches!(args.arch, Arch::Llama | Arch::Qwen2 | Arch::Qwen3) {
            return Err(Error::invalid(format!(
                "{}: quantizing a {} Hugging Face folder is not supported yet (llama, qwen2 and qwen3 are; \
                 a GGUF of it is)",
                dir.display(),
                args.arch.name()
            )));
        }
        if !matches!(args.rope.scaling, RopeScaling::None) {
            return Err(Error::invalid(format!(
                "{}: rope scaling cannot be written to a GGUF yet; quantize a GGUF of this model instead",
                dir.display()
            )));
        }
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let mut metadata = arch_metadata(&args, &name);
        metadata.extend(lmplex_text::hf_vocab::gguf_metadata(dir, args.vocab_size)?);
        let mut tensors = HashMap::new();
        for (hf, dims) in src.tensor_shapes() {
            // A tied head, and rope buffers some checkpoints save, are not written (as
            // convert_hf_to_gguf.py skips them).
            if (hf == "lm_head.weight" && args.tie_word_embeddings) || hf.ends_with("rotary_emb.inv_freq") {
                continue;
            }
            let g = gguf_name(args.arch, &hf);
            if g == hf {
                return Err(Error::invalid(format!("{}: tensor '{hf}' has no llama.cpp name", dir.display())));
            }
            tensors.insert(g, (hf, dims));
        }
        Ok(Self { metadata, tensors, args, src })
    }

    /// The tensor `gguf` (a key of `tensors`) as f32 values in llama.cpp's layout.
    pub fn tensor(&self, gguf: &str) -> Result<Vec<f32>> {
        let (hf, _) = &self.tensors[gguf];
        let mut t = self.src.tensor(hf)?;
        let (q, k) = (gguf.contains(".attn_q."), gguf.contains(".attn_k."));
        if self.args.arch == Arch::Llama && (q || k) {
            // Weights and biases alike: a bias is a one-column matrix here.
            let heads = if q { self.args.num_attention_heads } else { self.args.num_key_value_heads };
            let dims = t.dims().to_vec();
            let rows = t.reshape((dims[0], t.elem_count() / dims[0])).and_then(|m| permute_rows(&m, heads));
            t = rows.and_then(|m| m.reshape(dims)).map_err(Error::internal)?;
        }
        t.flatten_all().and_then(|t| t.to_vec1::<f32>()).map_err(|e| Error::model_load(format!("{hf}: {e}")))
    }
}
