//! One model's CUDA device as the backend sees it: the device's shared context and kernels
//! (`crate::device::Device`), and the model's own stream, cuBLAS handle and workspace; raw
//! device buffers; launches and GEMMs by address.
//!
//! Finding CUDA ([`Gpu::open`]) is `crate::device::find`: a missing driver, library or device
//! is an `InvalidRequest` naming what is missing, never cudarc's panic.
//!
//! Invariants:
//! - Everything of one model runs on its stream, in issue order; cudarc's event tracking is off
//!   (the backend orders its own work), so buffers are addressed by raw device pointers.
//! - A GEMM never sees the batch's size: [`Gpu::gemm`] runs `m` rows as `m / GEMM_ROWS` calls of
//!   the same shape `(GEMM_ROWS, n, k)`, so cuBLAS picks one algorithm for every batch and a
//!   row's result never depends on what else is in the batch (callers pad `m`).
//! - Device memory is allocated only through [`Gpu::alloc`] and [`Gpu::upload`], which count
//!   it, so the memory report knows every byte the backend holds; cuBLAS gets a workspace of
//!   its own at open ([`BLAS_WORKSPACE`], counted too), so a GEMM allocates nothing and can be
//!   captured in a CUDA graph ([`Gpu::begin_capture`]).
//! - [`Gpu::host`] (made in `crate::kernels`, which holds the twins) is the same interface over
//!   [`crate::hostexec`], which runs each kernel's CPU twin on host memory: the forward pass's
//!   orchestration (buffers, offsets, argument lists, GEMM layout) is tested against the CPU
//!   model on machines without a GPU.

use crate::counting::{Counting, LaunchRecord};
use crate::device::{find, Device};
use crate::dtype::Dt;
use crate::emulated::Emulated;
use crate::exec::{de, Arg, GemmKind};
use crate::hostexec::{HostExec, Traffics, Twins};
use cudarc::cublas::{result as blas, sys as blas_sys, CudaBlas};
use cudarc::driver::{result as drv, CudaContext, CudaSlice, CudaStream, DevicePtr, LaunchConfig};
use cudarc::driver::{CudaEvent, PushKernelArg};
use lmplex_core::{Error, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Rows per GEMM call: every GEMM has this many rows, whatever the batch (see the header).
pub const GEMM_ROWS: usize = 64;

/// cuBLAS's workspace: NVIDIA's recommended size for Hopper.
pub const BLAS_WORKSPACE: usize = 32 << 20;

mod capture;
mod host_memory;
pub use capture::Graph;
pub use host_memory::HostBuf;

fn be(e: cudarc::cublas::result::CublasError) -> Error {
    Error::internal(format!("cuBLAS: {e:?}"))
}

/// A device allocation, addressed by its raw pointer; freed (and uncounted) on drop.
pub struct DevBuf {
    /// `None` for host-executed buffers (their arena lives as long as the `Gpu`).
    _slice: Option<CudaSlice<u8>>,
    pub ptr: u64,
    pub bytes: usize,
    counter: Arc<AtomicUsize>,
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

impl DevBuf {
    /// The address `off` bytes in.
    pub fn at(&self, off: usize) -> u64 {
        debug_assert!(off <= self.bytes);
        self.ptr + off as u64
    }
}

/// One model's view of its device: its own stream, cuBLAS handle and workspace (so models step
/// concurrently), and the device's shared context and kernels (dropped last).
struct CudaExec {
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    _blas_workspace: CudaSlice<u8>,
    dev: Arc<Device>,
}

enum Exec {
    Cuda(CudaExec),
    Host(HostExec, Twins),
    Emulated(Emulated),
    Counting(Counting),
}

pub struct Gpu {
    exec: Exec,
    /// Compute capability as `major * 10 + minor` (90 on H100/H200).
    pub arch: u32,
    pub name: String,
    /// How matrices multiply a batch (`crate::mat`); `Vendor` unless set, or `LMPLEX_CUDA_GEMM`
    /// chooses at [`Gpu::open`].
    pub gemm_kind: GemmKind,
    /// Whether the forward pass issues the fused kernels (`crate::forward`'s header); off unless
    /// set, or `LMPLEX_CUDA_FUSED` chooses at [`Gpu::open`].
    pub fused: bool,
    /// Whether attention's first pass runs on the tensor cores (f16 and bf16, head_dim <= 128;
    /// `crate::kernels::PagedAttention`); off unless set, or `LMPLEX_CUDA_ATTENTION` chooses at
    /// [`Gpu::open`].
    pub tensor_attention: bool,
    allocated: Arc<AtomicUsize>,
}

impl Gpu {
    /// Device `ordinal` with every kernel loaded; an `InvalidRequest` saying what is missing
    /// otherwise (`crate::device`).
    pub fn open(ordinal: u32) -> Result<Self> {
        let (gemm_kind, fused) = (GemmKind::from_env()?, crate::exec::fused_from_env()?);
        let tensor_attention = crate::exec::tensor_attention_from_env()?;
        let (paths, _) = find(ordinal)?;
        let dev = Device::get(ordinal, paths.include_dir.clone())?;
        let (arch, name) = (dev.arch, dev.name.clone());
        let stream = dev.ctx.new_stream().map_err(de)?;
        let blas = CudaBlas::new(stream.clone()).map_err(be)?;
        let workspace = stream.alloc_zeros::<u8>(BLAS_WORKSPACE).map_err(de)?;
        {
            let (ptr, _sync) = workspace.device_ptr(&stream);
            // SAFETY: the workspace outlives the handle (both live in `CudaExec`, the handle is
            // never given another stream, which would reset it).
            let status = unsafe { blas_sys::cublasSetWorkspace_v2(*blas.handle(), ptr as _, BLAS_WORKSPACE) };
            status.result().map_err(be)?;
        }
        let exec = Exec::Cuda(CudaExec { stream, blas, _blas_workspace: workspace, dev });
        Ok(Self {
            exec,
            arch,
            name,
            gemm_kind,
            fused,
            tensor_attention,
            allocated: Arc::new(AtomicUsize::new(BLAS_WORKSPACE)),
        })
    }

    /// An executor without a device, `name`d, with every switch off (the tests and the profile
    /// turn them on).
    fn off_device(exec: Exec, name: &str) -> Self {
        let (name, gemm_kind, allocated) = (name.into(), GemmKind::Vendor, Arc::new(AtomicUsize::new(0)));
        Self { exec, arch: 0, name, gemm_kind, fused: false, tensor_attention: false, allocated }
    }

    /// The host executor (no GPU): every kernel's CPU twin, found by `twins`, over host memory
    /// (`Gpu::host()` gives it the twins of `crate::kernels`).
    pub(crate) fn with_twins(twins: Twins) -> Self {
        let exec = Exec::Host(HostExec::default(), twins);
        Self::off_device(exec, "host executor")
    }

    /// The counting executor (no GPU, no kernel work): records each launch with the traffic
    /// `traffics` gives it (`Gpu::counting()` gives it the kernels' own, `crate::kernels`).
    pub(crate) fn with_traffics(traffics: Traffics) -> Self {
        let exec = Exec::Counting(Counting::new(traffics));
        Self::off_device(exec, "counting executor")
    }

    /// The launches the counting executor recorded since the last call (none on the others).
    pub fn take_launches(&self) -> Vec<LaunchRecord> {
        match &self.exec {
            Exec::Counting(c) => c.take(),
            _ => Vec::new(),
        }
    }

    /// The real kernels compiled for the CPU (no GPU; needs a C++ compiler), the threads of
    /// every phase run in `order`; GEMMs as on the host executor.
    pub fn emulated(order: lmplex_kernels::Order) -> Result<Self> {
        let exec = Exec::Emulated(Emulated::new(order)?);
        Ok(Self::off_device(exec, "CPU kernels"))
    }

    /// The device, or the host arena of the executors without one.
    fn target(&self) -> std::result::Result<&CudaExec, &HostExec> {
        match &self.exec {
            Exec::Cuda(c) => Ok(c),
            Exec::Host(h, _) => Err(h),
            Exec::Emulated(e) => Err(&e.mem),
            Exec::Counting(c) => Err(&c.mem),
        }
    }

    /// The CUDA context (`None` on the host executor).
    pub fn context(&self) -> Option<Arc<CudaContext>> {
        match &self.exec {
            Exec::Cuda(c) => Some(c.dev.ctx.clone()),
            _ => None,
        }
    }

    /// Makes this device's context current on the calling thread (the step loop's thread).
    pub fn bind(&self) -> Result<()> {
        match &self.exec {
            Exec::Cuda(c) => c.dev.ctx.bind_to_thread().map_err(de),
            _ => Ok(()),
        }
    }

    /// Bytes held now through `alloc` and `upload`.
    pub fn allocated(&self) -> usize {
        self.allocated.load(Ordering::Relaxed)
    }

    /// (free, total) bytes on the device now, for the whole device (the host executor reports
    /// its arena as used, of itself).
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        match &self.exec {
            Exec::Cuda(c) => {
                c.dev.ctx.bind_to_thread().map_err(de)?;
                drv::mem_get_info().map_err(de)
            }
            _ => Ok((0, self.allocated())),
        }
    }

    /// `bytes` zeroed bytes on the device.
    pub fn alloc(&self, bytes: usize) -> Result<DevBuf> {
        let bytes = bytes.max(1);
        let (ptr, slice) = match self.target() {
            Ok(c) => {
                let slice = c.stream.alloc_zeros::<u8>(bytes).map_err(|e| {
                    Error::capacity(format!("CUDA: cannot allocate {bytes} bytes on the device: {e:?}"))
                })?;
                let ptr = {
                    let (ptr, _sync) = slice.device_ptr(&c.stream);
                    ptr
                };
                (ptr, Some(slice))
            }
            Err(h) => (h.alloc(bytes), None),
        };
        self.allocated.fetch_add(bytes, Ordering::Relaxed);
        Ok(DevBuf { ptr, bytes, _slice: slice, counter: self.allocated.clone() })
    }

    /// A copy of `host` on the device.
    pub fn upload(&self, host: &[u8]) -> Result<DevBuf> {
        let buf = self.alloc(host.len())?;
        self.htod(buf.ptr, host)?;
        Ok(buf)
    }

    /// Copies `host` to the device address `dst` (in stream order).
    pub fn htod<T: Copy>(&self, dst: u64, host: &[T]) -> Result<()> {
        if host.is_empty() {
            return Ok(());
        }
        let c = match self.target() {
            Ok(c) => c,
            Err(h) => return h.write_bytes(dst, as_bytes(host)),
        };
        // SAFETY: `dst` addresses at least `size_of_val(host)` bytes of a live `DevBuf` (callers
        // size their buffers for it); the copy is synchronous with respect to `host` because the
        // stream is synchronised before `host` can be freed (pageable memory is staged by the
        // driver before the call returns).
        unsafe { drv::memcpy_htod_async(dst, host, c.stream.cu_stream()) }.map_err(de)
    }

    /// Records the stream's work so far in `event` (a device's event; nothing on the host
    /// executors, whose copies are done when issued).
    pub(crate) fn record(&self, event: &CudaEvent) -> Result<()> {
        match &self.exec {
            Exec::Cuda(c) => event.record(&c.stream).map_err(de),
            _ => Ok(()),
        }
    }

    /// Copies from the device address `src` into `host`, waiting for the stream.
    pub fn dtoh<T: Copy>(&self, host: &mut [T], src: u64) -> Result<()> {
        if host.is_empty() {
            return Ok(());
        }
        let c = match self.target() {
            Ok(c) => c,
            Err(h) => return h.read_bytes(as_bytes_mut(host), src),
        };
        // SAFETY: `src` addresses at least `size_of_val(host)` bytes of a live `DevBuf`; the
        // stream is synchronised before `host` is read.
        unsafe { drv::memcpy_dtoh_async(host, src, c.stream.cu_stream()) }.map_err(de)?;
        c.stream.synchronize().map_err(de)
    }

    /// Launches kernel `name` over `grid` blocks of `block` threads.
    pub fn launch(&self, name: &str, grid: (u32, u32, u32), block: u32, args: &[Arg]) -> Result<()> {
        lmplex_kernels::check_launch(name, grid, block)?;
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        let c = match &self.exec {
            Exec::Cuda(c) => c,
            Exec::Host(h, twins) => return h.run_twin(*twins, name, grid, args),
            Exec::Emulated(e) => return e.launch(name, grid, block, args),
            Exec::Counting(c) => return c.launch(name, grid, block, args),
        };
        let f = c.dev.functions.get(name).ok_or_else(|| Error::internal(format!("no CUDA kernel '{name}'")))?;
        let mut b = c.stream.launch_builder(f);
        for a in args {
            match a {
                Arg::P(p) => b.arg(p),
                Arg::I(i) => b.arg(i),
                Arg::F(x) => b.arg(x),
            };
        }
        let cfg = LaunchConfig { grid_dim: grid, block_dim: (block, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: each kernel's argument list is written next to its `.cu` signature (forward.rs);
        // every pointer addresses a live `DevBuf` large enough for the grid.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(de)
    }

    /// `y[m, n] = x[m, k] · w[n, k]ᵀ` (row-major; `x`, `w` in `dt`, `y` in `out`), f32 accumulation,
    /// as `m / GEMM_ROWS` calls of one shape. `m` must be a multiple of `GEMM_ROWS`.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm(&self, x: u64, w: u64, y: u64, m: usize, n: usize, k: usize, dt: Dt, out: Dt) -> Result<()> {
        if !m.is_multiple_of(GEMM_ROWS) {
            return Err(Error::internal(format!("GEMM with {m} rows, not a multiple of {GEMM_ROWS}")));
        }
        let (alpha, beta) = (1.0f32, 0.0f32);
        let to_i32 = |v: usize| i32::try_from(v).map_err(|_| Error::internal("GEMM dimension over i32"));
        let (ni, ki, ri) = (to_i32(n)?, to_i32(k)?, to_i32(GEMM_ROWS)?);
        for r in (0..m).step_by(GEMM_ROWS) {
            let xr = x + (r * k * dt.size()) as u64;
            let yr = y + (r * n * out.size()) as u64;
            let c = match (self.target(), &self.exec) {
                (_, Exec::Counting(c)) => {
                    c.gemm(GEMM_ROWS, n, k, dt, out);
                    continue;
                }
                (Ok(c), _) => c,
                (Err(h), _) => {
                    h.gemm(xr, w, yr, GEMM_ROWS, n, k, dt, out)?;
                    continue;
                }
            };
            // Column-major view: Yᵀ[n, rows] = W[k, n]ᵀ · Xᵀ[k, rows], with W and X as stored.
            // SAFETY: `w` holds n*k, `x` m*k and `y` m*n elements (the callers' buffers); the
            // handle is bound to this backend's stream; alpha/beta live across the call.
            unsafe {
                blas::gemm_ex(
                    *c.blas.handle(),
                    blas_sys::cublasOperation_t::CUBLAS_OP_T,
                    blas_sys::cublasOperation_t::CUBLAS_OP_N,
                    ni,
                    ri,
                    ki,
                    (&alpha as *const f32).cast(),
                    w as usize as *const _,
                    dt.cuda(),
                    ki,
                    xr as usize as *const _,
                    dt.cuda(),
                    ki,
                    (&beta as *const f32).cast(),
                    yr as usize as *mut _,
                    out.cuda(),
                    ni,
                    blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .map_err(be)?;
        }
        Ok(())
    }

    /// Bytes of cuBLAS's own workspace (0 on the host executors).
    pub fn blas_workspace_bytes(&self) -> usize {
        if self.can_capture() {
            BLAS_WORKSPACE
        } else {
            0
        }
    }

    /// Waits for every queued operation.
    pub fn synchronize(&self) -> Result<()> {
        match &self.exec {
            Exec::Cuda(c) => c.stream.synchronize().map_err(de),
            _ => Ok(()),
        }
    }
}

fn as_bytes<T: Copy>(x: &[T]) -> &[u8] {
    // SAFETY: any initialised `T: Copy` value (the plain numbers this module copies) may be
    // read as bytes; the length covers exactly the slice.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<u8>(), std::mem::size_of_val(x)) }
}

fn as_bytes_mut<T: Copy>(x: &mut [T]) -> &mut [u8] {
    // SAFETY: callers pass slices of plain numbers (u8, f32), for which every byte pattern is a
    // valid value; the length covers exactly the slice.
    unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(x)) }
}
