//! LoRA adapters on the device (on only when `CudaSizing::max_loras` is set, which the engine
//! does under `LMPLEX_CUDA_LORA=1` until a device run confirms the path): the resident adapters'
//! weights in one pool, and per step the slot tables and row slots the `lora.cu` kernels read.
//!
//! Data flow: the step's batch names its adapters (`SeqChunk::lora`); `DeviceLora::prepare`
//! gives each distinct adapter a slot (in batch order), uploads those not resident into the pool
//! (`A` and `B^T` of every pair in the storage type, `LoraAdapter::pairs`), then one table per
//! (layer, projection) and each row's slot; the forward pass adds each projection's deltas right
//! after its GEMM (`StepLora::add`): two launches for all the step's adapters together.
//!
//! Invariants: the pool keys an adapter by its process-unique id, so a new adapter under an old
//! name is uploaded anew; no adapter of the step is evicted while the step runs; between steps at
//! most `max_loras` stay resident (least recently used out first); when the step's adapters do
//! not fit, the pool grows and what it held is dropped (nothing moves under a live table). A
//! delta lands in the columns of the fused output `weights` builds (`qkv`: q, k, v; `gate_up`:
//! gate, up), before the bias-free activation and after the bias, as on the CPU.

use crate::dtype::Dt;
use crate::gpu::{DevBuf, Gpu};
use crate::kernels::lora::SLOT_BYTES;
use crate::kernels::{LoraExpand, LoraShrink, LoraSlot};
use lmplex_core::{Error, Result};
use lmplex_model::lora::{mark_permuted_heads, LoraAdapter, LoraModule, Target};
use lmplex_model::{Arch, ForwardBatch, ModelArgs};

const TARGETS: usize = Target::ALL.len();

/// The projections an adapter may adapt on the device, as on the CPU: Phi-3's fused ones as
/// stored, q and k in llama.cpp's per-head order for a GGUF Llama.
pub fn modules(a: &ModelArgs) -> Vec<LoraModule> {
    let (h, inter) = (a.hidden_size, a.intermediate_size);
    let (qw, kw) = (a.num_attention_heads * a.head_dim, a.num_key_value_heads * a.head_dim);
    let fused = a.arch == Arch::Phi3;
    let mut out = Vec::new();
    for l in 0..a.num_hidden_layers {
        let m = |t, i, o| LoraModule::new(l, t, i, o);
        match fused {
            true => out.push(m(Target::Qkv, h, qw + 2 * kw)),
            false => out.extend([m(Target::Q, h, qw), m(Target::K, h, kw), m(Target::V, h, kw)]),
        }
        out.push(m(Target::O, qw, h));
        match fused {
            true => out.push(m(Target::GateUp, h, 2 * inter)),
            false => out.extend([m(Target::Gate, h, inter), m(Target::Up, h, inter)]),
        }
        out.push(m(Target::Down, inter, h));
    }
    mark_permuted_heads(&mut out, a);
    out
}

/// Elements an adapter takes in the pool.
fn pool_len(a: &LoraAdapter) -> usize {
    a.pairs().map(|(_, _, lr, _)| lr.rank() * (lr.shape().0 + lr.shape().1)).sum()
}

struct Resident {
    id: u64,
    at: usize,
    len: usize,
    last_used: u64,
    /// By layer and target: the slot as a table holds it.
    slots: Vec<[Option<LoraSlot>; TARGETS]>,
}

/// The adapters resident on the device and the step buffer of their tables.
pub struct DeviceLora {
    pool: Option<DevBuf>,
    /// The pool's size in elements.
    cap: usize,
    resident: Vec<Resident>,
    clock: u64,
    max_resident: usize,
    /// Tables, row slots and the shrink's output, grown to the largest step's.
    step: Option<DevBuf>,
}

/// What one step's deltas read.
pub struct StepLora {
    pool: u64,
    /// By layer and target: its table, when some adapter of the step adapts it.
    tables: Vec<Option<u64>>,
    row_slot: u64,
    v: u64,
    max_rank: usize,
    rows: usize,
}

impl DeviceLora {
    /// Room for `max_resident` adapters between steps (`max_loras`).
    pub fn new(max_resident: usize) -> Self {
        Self { pool: None, cap: 0, resident: Vec::new(), clock: 0, max_resident, step: None }
    }

    /// Bytes held on the device: the pool and the step buffer.
    pub fn bytes(&self) -> usize {
        self.pool.as_ref().map_or(0, |b| b.bytes) + self.step.as_ref().map_or(0, |b| b.bytes)
    }

    /// The step's adapters resident and its tables uploaded, for a batch of `rows` rows over
    /// `layers` layers; `None` when no sequence names an adapter.
    pub fn prepare(&mut self, g: &Gpu, dt: Dt, batch: &ForwardBatch, layers: usize) -> Result<Option<StepLora>> {
        let mut adapters: Vec<&LoraAdapter> = Vec::new();
        let mut row_slot: Vec<i32> = Vec::with_capacity(batch.num_tokens());
        for s in &batch.seqs {
            let slot = match s.lora {
                None => -1,
                Some(a) => match adapters.iter().position(|b| b.id() == a.id()) {
                    Some(i) => i as i32,
                    None => {
                        adapters.push(a);
                        adapters.len() as i32 - 1
                    }
                },
            };
            row_slot.extend(std::iter::repeat_n(slot, s.token_ids.len()));
        }
        if adapters.is_empty() {
            return Ok(None);
        }
        self.make_resident(g, dt, &adapters)?;
        let pool = self.pool.as_ref().ok_or_else(|| Error::internal("no LoRA pool"))?.ptr;
        let n = adapters.len();
        let mut table = vec![0u8; layers * TARGETS * n * SLOT_BYTES];
        let mut adapted = vec![false; layers * TARGETS];
        for (s, a) in adapters.iter().enumerate() {
            let r = self.resident.iter().find(|r| r.id == a.id()).ok_or_else(|| Error::internal("not resident"))?;
            for (l, by_target) in r.slots.iter().enumerate().take(layers) {
                for (t, slot) in by_target.iter().enumerate() {
                    if let Some(slot) = slot {
                        let at = ((l * TARGETS + t) * n + s) * SLOT_BYTES;
                        table[at..at + SLOT_BYTES].copy_from_slice(&slot.bytes()?);
                        adapted[l * TARGETS + t] = true;
                    }
                }
            }
        }
        let max_rank = adapters.iter().map(|a| a.rank()).max().unwrap_or(0).max(1);
        let rows = row_slot.len();
        let (slot_at, v_at) = (table.len().next_multiple_of(16), (table.len() + 4 * rows).next_multiple_of(16) + 16);
        let bytes = v_at + rows * max_rank * 4;
        if self.step.as_ref().is_none_or(|b| b.bytes < bytes) {
            self.step = None;
            self.step = Some(g.alloc(bytes.next_power_of_two())?);
        }
        let step = self.step.as_ref().ok_or_else(|| Error::internal("no LoRA step buffer"))?;
        g.htod(step.ptr, &table)?;
        g.htod(step.at(slot_at), &row_slot)?;
        let tables = (0..layers * TARGETS).map(|i| adapted[i].then(|| step.at(i * n * SLOT_BYTES))).collect();
        Ok(Some(StepLora { pool, tables, row_slot: step.at(slot_at), v: step.at(v_at), max_rank, rows }))
    }

    /// Uploads the adapters not resident; evicts idle ones, or grows the pool, to make room.
    fn make_resident(&mut self, g: &Gpu, dt: Dt, adapters: &[&LoraAdapter]) -> Result<()> {
        self.clock += 1;
        let step: Vec<u64> = adapters.iter().map(|a| a.id()).collect();
        let total: usize = adapters.iter().map(|a| pool_len(a)).sum();
        if total > self.cap {
            self.grow(g, dt, total.max(2 * self.cap))?;
        }
        for a in adapters {
            if let Some(r) = self.resident.iter_mut().find(|r| r.id == a.id()) {
                r.last_used = self.clock;
                continue;
            }
            let len = pool_len(a);
            let at = loop {
                if let Some(at) = self.gap(len) {
                    break at;
                }
                if !self.evict_one(&step) {
                    // Fragmented: start again in a larger pool.
                    self.grow(g, dt, 2 * self.cap.max(total))?;
                    return self.make_resident(g, dt, adapters);
                }
            };
            self.upload(g, dt, a, at, len)?;
        }
        while self.resident.len() > self.max_resident.max(step.len()) && self.evict_one(&step) {}
        Ok(())
    }

    /// A new, empty pool of `cap` elements.
    fn grow(&mut self, g: &Gpu, dt: Dt, cap: usize) -> Result<()> {
        self.resident.clear();
        self.pool = None;
        self.pool = Some(g.alloc(cap * dt.size())?);
        self.cap = cap;
        Ok(())
    }

    /// The first free run of `len` elements, residents in address order.
    fn gap(&mut self, len: usize) -> Option<usize> {
        self.resident.sort_by_key(|r| r.at);
        let mut from = 0;
        for r in &self.resident {
            if r.at - from >= len {
                return Some(from);
            }
            from = r.at + r.len;
        }
        (self.cap - from >= len).then_some(from)
    }

    /// Evicts the least recently used resident the step does not use; whether there was one.
    fn evict_one(&mut self, step: &[u64]) -> bool {
        let victim = self
            .resident
            .iter()
            .enumerate()
            .filter(|(_, r)| !step.contains(&r.id))
            .min_by_key(|(_, r)| r.last_used)
            .map(|(i, _)| i);
        victim.map(|i| self.resident.swap_remove(i)).is_some()
    }

    /// Writes `a`'s pairs (`A` then `B^T` each) at element `at` of the pool.
    fn upload(&mut self, g: &Gpu, dt: Dt, a: &LoraAdapter, at: usize, len: usize) -> Result<()> {
        let mut values = Vec::with_capacity(len);
        let mut slots = Vec::new();
        for (l, t, lr, scale) in a.pairs() {
            if slots.len() <= l {
                slots.resize(l + 1, [None; TARGETS]);
            }
            let (av, btv) = lr.values();
            let (a_at, bt_at) = (at + values.len(), at + values.len() + av.len());
            values.extend(av);
            values.extend(btv);
            slots[l][t.slot()] = Some(LoraSlot { a: a_at, bt: bt_at, rank: lr.rank(), scale });
        }
        let pool = self.pool.as_ref().ok_or_else(|| Error::internal("no LoRA pool"))?;
        g.htod(pool.at(at * dt.size()), &dt.encode(&values))?;
        self.resident.push(Resident { id: a.id(), at, len, last_used: self.clock, slots });
        Ok(())
    }
}

impl StepLora {
    /// Adds the step's deltas of (`layer`, `target`) to `y` (rows `ldy` apart, at the
    /// projection's first column), from `x` (rows of `in_features`).
    #[allow(clippy::too_many_arguments)] // the projection, its input and where its output lands
    pub fn add(
        &self,
        g: &Gpu,
        dt: Dt,
        (layer, target): (usize, Target),
        x: u64,
        in_features: usize,
        y: u64,
        (out_features, ldy): (usize, usize),
    ) -> Result<()> {
        let Some(slots) = self.tables.get(layer * TARGETS + target.slot()).copied().flatten() else {
            return Ok(());
        };
        let (pool, row_slot, v, max_rank) = (self.pool, self.row_slot, self.v, self.max_rank);
        LoraShrink { pool, slots, row_slot, x, v, in_features, max_rank }.launch(g, dt, self.rows)?;
        LoraExpand { pool, slots, row_slot, v, y, out_features, max_rank, ldy }.launch(g, dt, self.rows)
    }
}
