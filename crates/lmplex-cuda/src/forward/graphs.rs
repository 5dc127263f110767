//! CUDA graphs of decode steps (see `forward`'s header) and the model's live device bytes.
//!
//! Invariants: a graph is captured once per `GraphKey`, and every graph is dropped (and its
//! bytes uncounted) before a buffer it addresses moves; `LiveBytes` is only written here and by
//! the step loop's thread, and read anywhere.

use super::{BatchMeta, CudaModel, GraphKey, Offsets};
use crate::gpu::Graph;
use lmplex_core::Result;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Captured decode steps by shape.
pub(super) struct Graphs {
    pub(super) enabled: bool,
    pub(super) by_key: HashMap<GraphKey, Graph>,
}

/// A model's device bytes that change while it runs, published for its memory report.
#[derive(Debug, Default)]
pub struct LiveBytes {
    /// `CudaModel::workspace_bytes` now.
    pub workspace: AtomicUsize,
    /// What the captured graphs hold, by the driver's count (0 on the host executors).
    pub graphs: AtomicUsize,
    /// `CudaModel::lora_bytes` now: the adapters' pool and tables on the device.
    pub lora: AtomicUsize,
}

impl CudaModel {
    /// The workspace and graph bytes as they change, for a report read on another thread.
    pub fn live_bytes(&self) -> Arc<LiveBytes> {
        self.live.clone()
    }

    pub(super) fn publish_workspace(&self) {
        self.live.workspace.store(self.workspace_bytes(), Ordering::Relaxed);
        self.live.lora.store(self.lora_bytes(), Ordering::Relaxed);
    }

    /// Drops every captured graph (a step buffer they address is about to move).
    pub(super) fn drop_graphs(&mut self) {
        self.graphs.by_key.clear();
        self.live.graphs.store(0, Ordering::Relaxed);
    }

    /// Whether decode steps are replayed from CUDA graphs (on a device, unless `enforce_eager` or
    /// a failed capture turned them off); the host executors run the graph layout eagerly.
    pub fn graphs_enabled(&self) -> bool {
        self.graphs.enabled
    }

    /// Turns graphs on or off (off drops the captured ones).
    pub fn set_graphs(&mut self, on: bool) {
        self.graphs.enabled = on;
        if !on {
            self.drop_graphs();
        }
    }

    /// How many decode shapes are captured.
    pub fn num_graphs(&self) -> usize {
        self.graphs.by_key.len()
    }

    /// Replays the graph of `key`, capturing it first when it is new.
    pub(super) fn replay(&mut self, key: GraphKey, m: &BatchMeta, off: &Offsets) -> Result<()> {
        if self.graphs.by_key.contains_key(&key) {
            return self.gpu.launch_graph(&self.graphs.by_key[&key]);
        }
        let (free_before, _) = self.gpu.mem_info()?;
        self.gpu.begin_capture()?;
        let recorded = self.layers(m, off, None);
        let captured = self.gpu.end_capture();
        match recorded.and(captured) {
            Ok(graph) => {
                self.gpu.launch_graph(&graph)?;
                self.graphs.by_key.insert(key, graph);
                // The executable graph's memory, allocated by the instantiation and the first
                // launch (another model allocating meanwhile would be counted here too).
                let (free_after, _) = self.gpu.mem_info()?;
                self.live.graphs.fetch_add(free_before.saturating_sub(free_after), Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                tracing::warn!("CUDA graph capture failed, decoding without graphs from now on: {e}");
                self.set_graphs(false);
                self.layers(m, off, None)
            }
        }
    }
}
