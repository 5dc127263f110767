//! CUDA graphs: a model's stream recorded once ([`Gpu::begin_capture`], [`Gpu::end_capture`])
//! and replayed ([`Gpu::launch_graph`]).
//!
//! Invariant: only a device captures (`can_capture`); the host executors refuse with an
//! internal error, and the forward pass runs kernel by kernel there.

use super::{de, Exec, Gpu};
use cudarc::driver::{sys as drv_sys, CudaGraph};
use lmplex_core::{Error, Result};

/// A captured stream of work ([`Gpu::begin_capture`]), replayed by [`Gpu::launch_graph`].
pub struct Graph(CudaGraph);

// SAFETY: a graph is only used by the `CudaModel` that captured it, from one thread at a time
// (the engine's step loop, which owns the model), as CUDA's thread-safety rules for graphs ask.
unsafe impl Send for Graph {}

impl Gpu {
    /// Whether work can be captured into graphs (a device; not the host executors).
    pub fn can_capture(&self) -> bool {
        matches!(self.exec, Exec::Cuda(_))
    }

    /// Starts recording this thread's work on the stream instead of running it, until
    /// [`Gpu::end_capture`]. Nothing may allocate, copy from the host or synchronise meanwhile.
    pub fn begin_capture(&self) -> Result<()> {
        let Exec::Cuda(c) = &self.exec else { return Err(Error::internal("graph capture without a device")) };
        c.stream.begin_capture(drv_sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(de)
    }

    /// Ends the recording and instantiates it, uploaded to the device.
    pub fn end_capture(&self) -> Result<Graph> {
        let Exec::Cuda(c) = &self.exec else { return Err(Error::internal("graph capture without a device")) };
        let graph = c.stream.end_capture(drv_sys::CUgraphInstantiate_flags(0)).map_err(de)?;
        let graph = graph.ok_or_else(|| Error::internal("CUDA graph capture recorded nothing"))?;
        graph.upload().map_err(de)?;
        Ok(Graph(graph))
    }

    /// Replays a captured graph on the stream.
    pub fn launch_graph(&self, g: &Graph) -> Result<()> {
        g.0.launch().map_err(de)
    }
}
