//! CUDA graphs: a model's stream recorded once ([`Gpu::begin_capture`], [`Gpu::end_capture`])
//! and replayed ([`Gpu::launch_graph`]).
//!
//! Invariant: a device and the counting executor capture (`can_capture`; the counting executor's
//! graph is the launches it recorded meanwhile, and a replay records one launch, `graph`, moving
//! their bytes, as a replay is one launch on a device); the host executors refuse with an
//! internal error, and the forward pass runs kernel by kernel there.

use super::{de, Exec, Gpu};
use crate::counting::LaunchRecord;
use cudarc::driver::{sys as drv_sys, CudaGraph};
use lmplex_core::{Error, Result};

/// A captured stream of work ([`Gpu::begin_capture`]), replayed by [`Gpu::launch_graph`].
pub struct Graph(Captured);

enum Captured {
    Device(CudaGraph),
    Counted(Vec<LaunchRecord>),
}

// SAFETY: a graph is only used by the `CudaModel` that captured it, from one thread at a time
// (the engine's step loop, which owns the model), as CUDA's thread-safety rules for graphs ask.
unsafe impl Send for Graph {}

impl Gpu {
    /// Whether work can be captured into graphs (a device or the counting executor; not the
    /// executors that compute).
    pub fn can_capture(&self) -> bool {
        matches!(self.exec, Exec::Cuda(_) | Exec::Counting(_))
    }

    /// Starts recording this thread's work on the stream instead of running it, until
    /// [`Gpu::end_capture`]. Nothing may allocate, copy from the host or synchronise meanwhile.
    pub fn begin_capture(&self) -> Result<()> {
        match &self.exec {
            Exec::Cuda(c) => {
                c.stream.begin_capture(drv_sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(de)
            }
            Exec::Counting(c) => c.begin_capture(),
            _ => Err(Error::internal("graph capture without a device")),
        }
    }

    /// Ends the recording and instantiates it, uploaded to the device.
    pub fn end_capture(&self) -> Result<Graph> {
        let c = match &self.exec {
            Exec::Cuda(c) => c,
            Exec::Counting(c) => return Ok(Graph(Captured::Counted(c.end_capture()?))),
            _ => return Err(Error::internal("graph capture without a device")),
        };
        let graph = c.stream.end_capture(drv_sys::CUgraphInstantiate_flags(0)).map_err(de)?;
        let graph = graph.ok_or_else(|| Error::internal("CUDA graph capture recorded nothing"))?;
        graph.upload().map_err(de)?;
        Ok(Graph(Captured::Device(graph)))
    }

    /// Replays a captured graph on the stream.
    pub fn launch_graph(&self, g: &Graph) -> Result<()> {
        match (&self.exec, &g.0) {
            (Exec::Cuda(_), Captured::Device(graph)) => graph.launch().map_err(de),
            (Exec::Counting(c), Captured::Counted(launches)) => {
                c.replay(launches);
                Ok(())
            }
            _ => Err(Error::internal("a graph replayed on another executor than the one that captured it")),
        }
    }
}
