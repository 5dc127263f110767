//! LoRA adapters on a base model (PEFT's format): per adapted projection, `y += scale * B(A x)`
//! added to the base projection's output, for the rows of the sequences that name the adapter.
//!
//! Data flow: `LoraAdapter::load(dir, model, max_rank)` checks a PEFT folder against the base's
//! own projections (`Model::lora_modules`) and keeps every pair as stored (bf16, else f32;
//! `lmplex_cpu::lora::LowRank`); a sequence of a `ForwardBatch` names its adapter
//! (`SeqChunk::lora`); the forward pass groups the batch's rows by sequence once (`LoraRows`)
//! and each layer adds the deltas of its projections, every adapted row in one parallel loop
//! (`lmplex_cpu::lora::add_deltas`).
//!
//! Invariants: an adapter is immutable once loaded and is named by a process-unique `id` (the
//! engine keys the prefix cache by it, so K/V computed under one adapter never serve another,
//! nor a later adapter loaded under the same name); a row's delta is computed from that row
//! alone in a fixed order (`lmplex_cpu::lora`), so a row's result is the same alone, among rows
//! of other adapters and among rows of the base, and a base row computes exactly what it
//! computes without adapters in the batch.

mod config;
mod load;

pub use config::LoraConfig;
pub use lmplex_cpu::lora::LowRank;
pub use load::planned_bytes;

use lmplex_cpu::lora::{add_deltas, DeltaRows};
use std::sync::atomic::{AtomicU64, Ordering};

/// A projection an adapter may adapt, by its Hugging Face module name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// `self_attn.q_proj`.
    Q,
    /// `self_attn.k_proj`.
    K,
    /// `self_attn.v_proj`.
    V,
    /// `self_attn.qkv_proj` (Phi-3's fused projection).
    Qkv,
    /// `self_attn.o_proj`.
    O,
    /// `mlp.gate_proj`.
    Gate,
    /// `mlp.up_proj`.
    Up,
    /// `mlp.gate_up_proj` (Phi-3's fused projection).
    GateUp,
    /// `mlp.down_proj`.
    Down,
}

impl Target {
    /// Every target, in `LayerLora`'s slot order.
    pub const ALL: [Target; 9] =
        [Self::Q, Self::K, Self::V, Self::Qkv, Self::O, Self::Gate, Self::Up, Self::GateUp, Self::Down];

    /// The module's name under its layer (`self_attn.q_proj`).
    pub fn module(self) -> &'static str {
        match self {
            Self::Q => "self_attn.q_proj",
            Self::K => "self_attn.k_proj",
            Self::V => "self_attn.v_proj",
            Self::Qkv => "self_attn.qkv_proj",
            Self::O => "self_attn.o_proj",
            Self::Gate => "mlp.gate_proj",
            Self::Up => "mlp.up_proj",
            Self::GateUp => "mlp.gate_up_proj",
            Self::Down => "mlp.down_proj",
        }
    }

    /// Its index in `ALL`.
    pub fn slot(self) -> usize {
        Self::ALL.iter().position(|&t| t == self).unwrap_or(0)
    }
}

/// One projection of the base an adapter may adapt: where it is and its shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoraModule {
    /// Its layer.
    pub layer: usize,
    /// Which projection.
    pub target: Target,
    /// Input width.
    pub in_features: usize,
    /// Output width.
    pub out_features: usize,
    /// The base keeps this projection's output rows in llama.cpp's order (a GGUF Llama's q and
    /// k, permuted per head for GPT-J-style rope): its head count. `B`'s rows, in Hugging Face's
    /// order, are permuted the same way at load.
    pub permuted_heads: Option<usize>,
}

impl LoraModule {
    /// Projection `target` of layer `layer`, `in_features` to `out_features`, in Hugging Face's
    /// row order.
    pub fn new(layer: usize, target: Target, in_features: usize, out_features: usize) -> Self {
        Self { layer, target, in_features, out_features, permuted_heads: None }
    }

    /// Its full name (`model.layers.3.self_attn.q_proj`), as PEFT's configs match it.
    pub fn name(&self) -> String {
        format!("model.layers.{}.{}", self.layer, self.target.module())
    }
}

/// Marks the q and k projections of `modules` as permuted per head when the base `a` keeps them
/// in llama.cpp's order (a GGUF Llama, `RopeArgs::interleaved`), so an adapter's `B` rows are
/// permuted the same way at load.
pub fn mark_permuted_heads(modules: &mut [LoraModule], a: &crate::args::ModelArgs) {
    if !a.rope.interleaved {
        return;
    }
    for m in modules {
        m.permuted_heads = match m.target {
            Target::Q => Some(a.num_attention_heads),
            Target::K => Some(a.num_key_value_heads),
            _ => None,
        };
    }
}

/// One adapted projection: `scale * B (A x)`.
pub struct LoraPair {
    low_rank: LowRank,
    scale: f32,
}

impl std::fmt::Debug for LoraPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoraPair").field("rank", &self.low_rank.rank()).field("scale", &self.scale).finish()
    }
}

impl LoraPair {
    pub(crate) fn new(low_rank: LowRank, scale: f32) -> Self {
        Self { low_rank, scale }
    }
}

/// A loaded adapter: its pairs by layer and target.
#[derive(Debug)]
pub struct LoraAdapter {
    id: u64,
    rank: usize,
    bytes: usize,
    layers: Vec<[Option<LoraPair>; 9]>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl LoraAdapter {
    fn new(layers: Vec<[Option<LoraPair>; 9]>) -> Self {
        let pairs = || layers.iter().flatten().flatten();
        let rank = pairs().map(|p| p.low_rank.rank()).max().unwrap_or(0);
        let bytes = pairs().map(|p| p.low_rank.size_in_bytes()).sum();
        Self { id: NEXT_ID.fetch_add(1, Ordering::Relaxed), rank, bytes, layers }
    }

    /// Unique in the process, never reused: keys the prefix cache.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The largest rank among its pairs.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Bytes its weights take in memory.
    pub fn size_in_bytes(&self) -> usize {
        self.bytes
    }

    fn pair(&self, layer: usize, target: Target) -> Option<&LoraPair> {
        self.layers.get(layer)?[target.slot()].as_ref()
    }

    /// Each adapted projection: its layer and target, `A` and `B^T` (`LowRank`) and its scale.
    pub fn pairs(&self) -> impl Iterator<Item = (usize, Target, &LowRank, f32)> {
        self.layers.iter().enumerate().flat_map(|(l, slots)| {
            Target::ALL.iter().zip(slots).filter_map(move |(&t, p)| p.as_ref().map(|p| (l, t, &p.low_rank, p.scale)))
        })
    }

    /// Whether it adapts any of `targets` in `layer`.
    pub fn adapts(&self, layer: usize, targets: &[Target]) -> bool {
        targets.iter().any(|&t| self.pair(layer, t).is_some())
    }
}

/// Where a delta's output column `o` lands in a row of the projection's output.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Cols {
    /// Column `o` at `o + start`.
    From(usize),
    /// Gate column `o` of an interleaved `[gate | up]` product (`rowops::gated_interleaved`).
    InterleavedGate,
    /// Up column `o` of an interleaved `[gate | up]` product.
    InterleavedUp,
    /// Column `o` of a `[gate | up]` delta of this half width, placed in an interleaved product.
    InterleavedHalves(usize),
}

impl Cols {
    fn at(self, o: usize) -> usize {
        let run = crate::rowops::GATE_RUN;
        match self {
            Self::From(start) => start + o,
            Self::InterleavedGate => (o / run) * 2 * run + o % run,
            Self::InterleavedUp => (o / run) * 2 * run + run + o % run,
            Self::InterleavedHalves(w) if o < w => Self::InterleavedGate.at(o),
            Self::InterleavedHalves(w) => Self::InterleavedUp.at(o - w),
        }
    }
}

/// The batch's rows grouped by adapter: each adapter a sequence names, with the rows of every
/// sequence that names it, in batch order.
#[derive(Default)]
pub struct LoraRows<'a> {
    groups: Vec<(&'a LoraAdapter, Vec<usize>)>,
}

impl<'a> LoraRows<'a> {
    /// The groups of a batch whose sequences, in order, have `len` rows under `adapter` each
    /// (`ForwardBatch`'s `SeqChunk::lora`).
    pub fn new(seqs: impl Iterator<Item = (usize, Option<&'a LoraAdapter>)>) -> Self {
        let mut groups: Vec<(&'a LoraAdapter, Vec<usize>)> = Vec::new();
        let mut row = 0;
        for (len, adapter) in seqs {
            if let Some(a) = adapter {
                let rows = row..row + len;
                match groups.iter_mut().find(|(b, _)| b.id == a.id) {
                    Some((_, r)) => r.extend(rows),
                    None => groups.push((a, rows.collect())),
                }
            }
            row += len;
        }
        Self { groups }
    }

    /// Whether some row adapts one of `targets` in `layer`.
    pub(crate) fn adapts(&self, layer: usize, targets: &[Target]) -> bool {
        self.groups.iter().any(|(a, _)| a.adapts(layer, targets))
    }

    /// Adds each adapted row's `scale * B (A x)` of (`layer`, `target`) into `y`: `x` rows of
    /// `x_width`, `y` rows of `y_width`, the delta's columns placed by `cols`.
    pub(crate) fn add(&self, layer: usize, target: Target, x: &[f32], x_width: usize, y: &mut [f32], cols: Cols) {
        let groups: Vec<DeltaRows<'_>> = self
            .groups
            .iter()
            .filter_map(|(a, rows)| {
                let p = a.pair(layer, target)?;
                Some(DeltaRows { rows, lr: &p.low_rank, scale: p.scale })
            })
            .collect();
        if groups.is_empty() {
            return;
        }
        let rows = x.len() / x_width.max(1);
        let y_width = y.len() / rows.max(1);
        add_deltas(&groups, x, x_width, y, y_width, |o| cols.at(o));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaved_columns_follow_gate_runs() {
        let run = crate::rowops::GATE_RUN;
        assert_eq!(Cols::InterleavedGate.at(0), 0);
        assert_eq!(Cols::InterleavedGate.at(run), 2 * run);
        assert_eq!(Cols::InterleavedUp.at(0), run);
        assert_eq!(Cols::InterleavedUp.at(run + 3), 3 * run + 3);
        assert_eq!(Cols::From(5).at(2), 7);
        assert_eq!(Cols::InterleavedHalves(2 * run).at(2 * run + 1), run + 1);
    }
}
