//! The GPU path measured without a GPU: the real forward pass (`CudaModel::forward_pick`) of
//! Llama-3.2-1B and Llama-3-8B shapes on the counting executor (`Gpu::counting()`), which runs no
//! kernel and records each launch with the bytes it must move and the products it computes.
//! Per step: launches per step and per layer, bytes moved against the step's minimum, and a
//! modeled H100 time (`cost`) with its share of the bandwidth roofline.
//!
//! Method: every layer of a Llama issues the same launches with the same traffic, so a shape is
//! measured on checkpoints of 1 and 2 layers (`shape`, sparse files of zeros) and a step of L
//! layers is `one + (L - 1) * (two - one)`, exactly: per-layer figures are `two - one`. The
//! step's minimum is every weight it reads once (`decode_weight_bytes`: an untied embedding only
//! by its gathered rows), the K and V of every attended position once, the new positions' K and
//! V written once, the gathered embedding rows and the f32 logits of the picked rows.
//!
//! Each step is also measured with the tile GEMM (`tile_gemm`: the tensor cores, every weight
//! read once per step), with the tile GEMM and the fused kernels (`fused`: RoPE with the KV
//! write, one-pass attention, the norms and SwiGLU in the GEMMs; `forward.rs`'s header), and with
//! attention on the tensor cores too (`every_switch`), the paths that stay off until a device run
//! confirms them.
//!
//! Invariant: nothing here is estimated but `cost`'s modeled time; launches and bytes are those
//! of the launches the backend issued, as its kernel modules count them from their arguments.

pub mod cost;
pub mod shape;

pub use shape::{shape_named, LlamaShape, LLAMA_3_2_1B, LLAMA_3_8B};

use crate::counting::LaunchRecord;
use crate::dtype::Dt;
use crate::exec::GemmKind;
use crate::forward::CudaModel;
use crate::gpu::Gpu;
use crate::workspace::CudaSizing;
use lmplex_core::{Error, Result, DEFAULT_MAX_NUM_BATCHED_TOKENS};
use lmplex_model::sample::draw::DrawParams;
use lmplex_model::sample::pick::Pick;
use lmplex_model::{ForwardBatch, LogitsSelect, SeqChunk};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Positions each decoding sequence attends to (the benchmark's 16-token prompt and 128 tokens
/// reach 144; this is their order of magnitude).
pub const DECODE_CONTEXT: usize = 128;
/// The prompt of the prefill step.
pub const PREFILL_TOKENS: usize = 1000;
/// The decode batches measured.
pub const DECODE_BATCHES: [usize; 3] = [1, 64, 256];
const BLOCK: usize = 16;

/// A step: `seqs` sequences, each adding `new` tokens to reach `context` positions.
#[derive(Clone, Copy, Debug)]
pub struct Scenario {
    pub seqs: usize,
    pub new: usize,
    pub context: usize,
}

/// One step's totals on a model of some number of layers, additive in the layers.
#[derive(Clone, Copy, Debug, Default)]
struct Totals {
    launches: f64,
    bytes: f64,
    min_bytes: f64,
    seconds: f64,
}

impl Totals {
    /// `self + k * (other - self)`, figure by figure.
    fn towards(&self, other: &Totals, k: f64) -> Totals {
        let f = |a: f64, b: f64| a + k * (b - a);
        Totals {
            launches: f(self.launches, other.launches),
            bytes: f(self.bytes, other.bytes),
            min_bytes: f(self.min_bytes, other.min_bytes),
            seconds: f(self.seconds, other.seconds),
        }
    }
}

/// One step measured: its totals and its launches by kernel (dtype suffix dropped).
struct Raw {
    totals: Totals,
    by_kernel: BTreeMap<String, f64>,
}

/// The kernel's name without its dtype suffix, or the cuBLAS call's.
fn family(name: &str) -> String {
    ["_bf16", "_f16", "_f32"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name).to_string()
}

/// Runs `s` once on `model` (loaded on the counting executor) and measures it.
fn measure(model: &mut CudaModel, s: Scenario) -> Result<Raw> {
    let a = model.args.clone();
    let blocks = s.context.div_ceil(BLOCK);
    let tables: Vec<Vec<u32>> =
        (0..s.seqs).map(|j| ((j * blocks) as u32..((j + 1) * blocks) as u32).collect()).collect();
    let ids: Vec<u32> = (0..s.new as u32).map(|t| 2 + t % 1000).collect();
    let seqs = tables
        .iter()
        .map(|table| SeqChunk {
            token_ids: &ids,
            start_pos: s.context - s.new,
            block_table: table,
            logits: LogitsSelect::Last,
            num_prompt_tokens: usize::MAX,
            lora: None,
            embeds: None,
        })
        .collect();
    let greedy = DrawParams { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 0, step: 0 };
    let picks = vec![Pick { draw: greedy, edits: Vec::new() }; s.seqs];
    model.gpu.take_launches();
    model.forward_pick(&ForwardBatch { seqs }, &picks)?;
    let launches: Vec<LaunchRecord> = model.gpu.take_launches();
    let mut by_kernel = BTreeMap::new();
    for l in &launches {
        *by_kernel.entry(family(&l.name)).or_insert(0.0) += 1.0;
    }
    let (dt, layers) = (model.dt.size(), a.num_hidden_layers);
    let kv_row = layers * a.num_key_value_heads * a.head_dim * 2 * dt;
    let per_seq = s.context * kv_row + s.new * (kv_row + a.hidden_size * dt) + a.vocab_size * 4;
    let totals = Totals {
        launches: launches.len() as f64,
        bytes: launches.iter().map(|l| l.traffic.bytes as f64).sum(),
        min_bytes: (model.decode_weight_bytes() + s.seqs * per_seq) as f64,
        seconds: cost::seconds(&launches),
    };
    Ok(Raw { totals, by_kernel })
}

/// The JSON of one step of `layers` layers from its 1- and 2-layer measurements.
fn figures(one: &Raw, two: &Raw, layers: usize) -> Value {
    let step = one.totals.towards(&two.totals, (layers - 1) as f64);
    let count = |r: &Raw, k: &String| r.by_kernel.get(k).copied().unwrap_or(0.0);
    let per_layer: BTreeMap<&String, f64> =
        two.by_kernel.keys().map(|k| (k, count(two, k) - count(one, k))).filter(|(_, v)| *v != 0.0).collect();
    let roofline_s = step.min_bytes / cost::BANDWIDTH;
    json!({
        "launches_per_step": step.launches.round() as u64,
        "launches_per_layer": (two.totals.launches - one.totals.launches).round() as u64,
        "layer_launches": per_layer,
        "bytes_per_step": step.bytes.round() as u64,
        "min_bytes_per_step": step.min_bytes.round() as u64,
        "bytes_ratio": (step.bytes / step.min_bytes * 1000.0).round() / 1000.0,
        "modeled_step_ms": (step.seconds * 1e6).round() / 1000.0,
        "modeled_roofline_pct": (roofline_s / step.seconds * 1000.0).round() / 10.0,
    })
}

/// The counting executor's model of `shape` with `layers` layers, sized for every scenario.
fn load(shape: &LlamaShape, layers: usize) -> Result<CudaModel> {
    let dir = tempfile::tempdir().map_err(|e| Error::internal(format!("a temporary folder: {e}")))?;
    shape.write(dir.path(), layers)?;
    let ckpt = lmplex_model::open(dir.path(), Some(2048))?;
    let blocks = DECODE_BATCHES.iter().max().copied().unwrap_or(1) * DECODE_CONTEXT.div_ceil(BLOCK)
        + PREFILL_TOKENS.div_ceil(BLOCK);
    let sizing = CudaSizing {
        num_blocks: blocks,
        num_warm_blocks: 0,
        block_size: BLOCK,
        max_num_batched_tokens: DEFAULT_MAX_NUM_BATCHED_TOKENS,
        max_num_seqs: DECODE_BATCHES.iter().max().copied().unwrap_or(1),
        enforce_eager: true,
        max_loras: 0,
    };
    CudaModel::load(Gpu::counting(), &ckpt, Dt::Bf16, sizing)
}

/// The figures of `shape`: `{"decode": {"1": {...}, "64": {...}, "256": {...}}, "prefill_1000": {...}}`.
pub fn profile(shape: &LlamaShape) -> Result<Value> {
    let mut decode = serde_json::Map::new();
    let scenarios: Vec<(Option<usize>, Scenario)> = DECODE_BATCHES
        .iter()
        .map(|&b| (Some(b), Scenario { seqs: b, new: 1, context: DECODE_CONTEXT }))
        .chain([(None, Scenario { seqs: 1, new: PREFILL_TOKENS, context: PREFILL_TOKENS })])
        .collect();
    let (mut one, mut two) = (load(shape, 1)?, load(shape, 2)?);
    let mut prefill = Value::Null;
    for (batch, s) in scenarios {
        let mut f = figures(&measure(&mut one, s)?, &measure(&mut two, s)?, shape.num_hidden_layers);
        // The same step with the tensor-core tile GEMM (`LMPLEX_CUDA_GEMM=tiles`), then with the
        // fused kernels too (`LMPLEX_CUDA_FUSED=1`), then with attention on the tensor cores too
        // (`LMPLEX_CUDA_ATTENTION=tensor`), all off by default.
        let keys = ["launches_per_step", "launches_per_layer", "layer_launches", "bytes_ratio"];
        let keys = [&keys[..], &["modeled_step_ms", "modeled_roofline_pct"]].concat();
        let variants = [("tile_gemm", false, false), ("fused", true, false), ("every_switch", true, true)];
        for (name, fused, tensor) in variants {
            for m in [&mut one, &mut two] {
                (m.gpu.gemm_kind, m.gpu.fused, m.gpu.tensor_attention) = (GemmKind::Tiles, fused, tensor);
            }
            let v = figures(&measure(&mut one, s)?, &measure(&mut two, s)?, shape.num_hidden_layers);
            f[name] = keys.iter().map(|k| (k.to_string(), v[*k].clone())).collect();
        }
        for m in [&mut one, &mut two] {
            (m.gpu.gemm_kind, m.gpu.fused, m.gpu.tensor_attention) = (GemmKind::Vendor, false, false);
        }
        match batch {
            Some(b) => {
                decode.insert(b.to_string(), f);
            }
            None => prefill = f,
        }
    }
    Ok(json!({"decode": decode, format!("prefill_{PREFILL_TOKENS}"): prefill}))
}

/// Every shape's figures, with the settings and the cost model they were measured under.
pub fn report() -> Result<Value> {
    let mut shapes = serde_json::Map::new();
    for shape in [LLAMA_3_2_1B, LLAMA_3_8B] {
        shapes.insert(shape.name.into(), profile(&shape)?);
    }
    let launch_us: BTreeMap<&str, f64> =
        cost::PROFILE.iter().map(|p| (p.0, (cost::launch_cost(p.0) * 1e8).round() / 100.0)).collect();
    Ok(json!({
        "shapes": shapes,
        "settings": {
            "dtype": "bfloat16", "gemm": "vendor", "decode_context": DECODE_CONTEXT,
            "prefill_tokens": PREFILL_TOKENS, "max_num_batched_tokens": DEFAULT_MAX_NUM_BATCHED_TOKENS,
            "block_size": BLOCK,
        },
        "cost_model": {
            "bandwidth_bytes_per_s": cost::BANDWIDTH, "tensor_core_flops": cost::TENSOR_PEAK,
            "cuda_core_flops": cost::CUDA_CORE_PEAK, "launch_cost_us": launch_us,
        },
    }))
}
