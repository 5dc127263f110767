//! The host executor: host memory addressed like device memory, where each kernel's CPU twin
//! (beside its launch in `crate::kernels`) runs by name with the kernel's own argument list, and
//! a reference GEMM. This file holds the arena, the typed argument list, the lookup of a twin by
//! its entry point's name (`HostExec::run_twin`) and the loop the GEMM twins share.
//!
//! Purpose: `Gpu::host()` runs the whole CUDA forward pass (`forward.rs`) without a GPU, so its
//! orchestration (buffer sizes, byte offsets, strides, argument order, the GEMM's row-major
//! layout, padding rows) is checked against the CPU model in `cargo test` on any machine. The
//! kernels themselves are checked on the device against NumPy (`tests/gpu`).
//!
//! Invariants: every twin follows its `.cu` file line by line (same storage rounding: values are
//! rounded to the storage type exactly where the kernel's `from_f32` stores them); addresses
//! start at `BASE` (a sparse arena's unbacked ones at `VIRTUAL`), so a null or stray pointer is
//! an error, as is any access outside the arena or an argument of the wrong kind; nothing here
//! panics on bad input.

use crate::dtype::Dt;
use crate::exec::Arg;
use lmplex_core::{Error, Result};
use std::sync::Mutex;

const BASE: u64 = 1 << 40;
/// Where a sparse arena's unbacked allocations start (`HostExec::sparse`).
const VIRTUAL: u64 = 1 << 46;
const ALIGN: usize = 256;

#[derive(Default)]
pub struct HostExec {
    mem: Mutex<Arena>,
    /// Allocations of at least this many bytes get addresses but no memory (`sparse`).
    unbacked_from: Option<usize>,
}

/// Host memory addressed like device memory: 16-byte-aligned words viewed as `len` bytes, so a
/// kernel compiled for the CPU may read any type through an address the backend hands it.
#[derive(Default)]
struct Arena {
    words: Vec<u128>,
    len: usize,
    /// Bytes of unbacked address space handed out, from `VIRTUAL`.
    unbacked: usize,
}

impl Arena {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `words` holds at least `len` initialised bytes; u8 has no alignment needs.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), self.len) }
    }
    fn grow(&mut self, len: usize) {
        self.words.resize(len.div_ceil(16), 0);
        self.len = len;
    }
}

pub(crate) fn bad(what: impl std::fmt::Display) -> Error {
    Error::internal(format!("host executor: {what}"))
}

/// Typed access to a kernel's argument list.
pub(crate) struct Args<'a>(pub(crate) &'a [Arg]);

impl Args<'_> {
    pub(crate) fn p(&self, i: usize) -> Result<u64> {
        match self.0.get(i) {
            Some(Arg::P(p)) => Ok(*p),
            other => Err(bad(format!("argument {i} should be a pointer, is {other:?}"))),
        }
    }
    pub(crate) fn n(&self, i: usize) -> Result<usize> {
        match self.0.get(i) {
            Some(Arg::I(v)) if *v >= 0 => Ok(*v as usize),
            other => Err(bad(format!("argument {i} should be a non-negative int, is {other:?}"))),
        }
    }
    pub(crate) fn f(&self, i: usize) -> Result<f32> {
        match self.0.get(i) {
            Some(Arg::F(v)) => Ok(*v),
            other => Err(bad(format!("argument {i} should be a float, is {other:?}"))),
        }
    }
    pub(crate) fn count(&self, n: usize) -> Result<()> {
        if self.0.len() == n {
            Ok(())
        } else {
            Err(bad(format!("{} arguments where the kernel takes {n}", self.0.len())))
        }
    }
}

/// One launch as a twin sees it: the entry point's name without its dtype suffix (`rope`,
/// `qgemv_q4_k`), the dtype of that suffix, the grid and the argument list.
pub(crate) struct TwinCall<'a> {
    pub(crate) stem: &'a str,
    pub(crate) dt: Dt,
    pub(crate) grid: (u32, u32, u32),
    pub(crate) args: Args<'a>,
}

impl<'a> TwinCall<'a> {
    /// The launch of entry point `name` (`rope_bf16`: stem `rope`, bf16).
    pub(crate) fn of(name: &'a str, grid: (u32, u32, u32), args: &'a [Arg]) -> Result<Self> {
        let (stem, dt) = [("_f32", Dt::F32), ("_f16", Dt::F16), ("_bf16", Dt::Bf16)]
            .iter()
            .find_map(|(s, dt)| name.strip_suffix(s).map(|stem| (stem, *dt)))
            .ok_or_else(|| bad(format!("kernel '{name}' has no dtype suffix")))?;
        Ok(Self { stem, dt, grid, args: Args(args) })
    }

    /// `grid.0`: the rows of a row-wise kernel (the columns' blocks of the GEMV).
    pub(crate) fn rows(&self) -> usize {
        self.grid.0 as usize
    }
}

/// A kernel's CPU twin.
pub(crate) type Twin = fn(&HostExec, &TwinCall) -> Result<()>;
/// Finds the twin of an entry point's stem (`crate::kernels`' table).
pub(crate) type Twins = fn(&str) -> Option<Twin>;

/// What one launch must move through the device's global memory (every byte it reads or writes
/// at least once, from its arguments) and compute; `tensor_cores` when its products run there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    pub bytes: u64,
    pub flops: u64,
    pub tensor_cores: bool,
}

impl Traffic {
    /// `bytes` moved, nothing computed worth counting.
    pub(crate) fn moves(bytes: usize) -> Self {
        Self { bytes: bytes as u64, ..Self::default() }
    }
}

/// A kernel's traffic, from its launch (metadata such as contexts and slots read from the arena).
pub(crate) type TrafficOf = fn(&HostExec, &TwinCall) -> Result<Traffic>;
/// Finds the traffic function of an entry point's stem (`crate::kernels`' table).
pub(crate) type Traffics = fn(&str) -> Option<TrafficOf>;

impl HostExec {
    /// An arena that holds memory only for allocations under `bytes`: larger ones (weights, the
    /// KV pool, activations) get addresses of their own, writes to them are dropped and reads
    /// give zeros. The counting executor's memory, so a model of any size "loads" in host RAM
    /// of its small buffers (the batch's metadata, which its launches' traffic is read from).
    pub fn sparse(bytes: usize) -> Self {
        Self { mem: Mutex::default(), unbacked_from: Some(bytes) }
    }

    pub fn alloc(&self, bytes: usize) -> u64 {
        let mut m = self.mem.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.unbacked_from.is_some_and(|from| bytes >= from) {
            let at = m.unbacked.next_multiple_of(ALIGN);
            m.unbacked = at + bytes;
            return VIRTUAL + at as u64;
        }
        let at = m.len.next_multiple_of(ALIGN);
        m.grow(at + bytes);
        BASE + at as u64
    }

    /// Whether `len` bytes at `ptr` are unbacked (an error when they run past what was handed out).
    fn unbacked(&self, m: &Arena, ptr: u64, len: usize) -> Result<bool> {
        let Some(start) = ptr.checked_sub(VIRTUAL) else { return Ok(false) };
        match (start as usize).checked_add(len) {
            Some(end) if end <= m.unbacked => Ok(true),
            _ => Err(bad(format!("access of {len} bytes at {ptr:#x} outside the unbacked allocations"))),
        }
    }

    fn range(&self, ptr: u64, len: usize, size: usize) -> Result<std::ops::Range<usize>> {
        let start = ptr.checked_sub(BASE).ok_or_else(|| bad(format!("address {ptr:#x} below the arena")))? as usize;
        match start.checked_add(len) {
            Some(end) if end <= size => Ok(start..end),
            _ => Err(bad(format!("access of {len} bytes at {ptr:#x} outside the arena"))),
        }
    }

    pub fn write_bytes(&self, dst: u64, src: &[u8]) -> Result<()> {
        let mut m = self.mem.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.unbacked(&m, dst, src.len())? {
            return Ok(());
        }
        let r = self.range(dst, src.len(), m.len)?;
        m.bytes_mut()[r].copy_from_slice(src);
        Ok(())
    }

    pub fn read_bytes(&self, dst: &mut [u8], src: u64) -> Result<()> {
        let m = self.mem.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.unbacked(&m, src, dst.len())? {
            dst.fill(0);
            return Ok(());
        }
        let r = self.range(src, dst.len(), m.len)?;
        dst.copy_from_slice(&m.bytes()[r]);
        Ok(())
    }

    /// Runs `f` with the arena locked: a translation of device addresses to host pointers (an
    /// error for one outside the arena), valid only during `f`.
    pub fn with_host_pointers<R>(&self, f: impl FnOnce(&dyn Fn(u64) -> Result<*mut u8>) -> Result<R>) -> Result<R> {
        let mut m = self.mem.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let len = m.len;
        let base = m.bytes_mut().as_mut_ptr();
        let translate = |p: u64| -> Result<*mut u8> {
            let off = self.range(p, 0, len)?.start;
            // SAFETY: `off <= len`, inside (or one past) the arena's allocation.
            Ok(unsafe { base.add(off) })
        };
        f(&translate)
    }

    pub(crate) fn rd(&self, ptr: u64, dt: Dt, n: usize) -> Result<Vec<f32>> {
        let mut b = vec![0u8; n * dt.size()];
        self.read_bytes(&mut b, ptr)?;
        Ok(dt.decode(&b))
    }

    pub(crate) fn wr(&self, ptr: u64, dt: Dt, x: &[f32]) -> Result<()> {
        self.write_bytes(ptr, &dt.encode(x))
    }

    pub(crate) fn rd_u32(&self, ptr: u64, n: usize) -> Result<Vec<u32>> {
        let mut b = vec![0u8; n * 4];
        self.read_bytes(&mut b, ptr)?;
        Ok(b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }

    pub(crate) fn rd_i64(&self, ptr: u64, n: usize) -> Result<Vec<i64>> {
        let mut b = vec![0u8; n * 8];
        self.read_bytes(&mut b, ptr)?;
        Ok(b.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect())
    }

    /// Runs the twin of kernel `name` (`rope_bf16`, `argmax_f32`) over `grid`, found by `twins`.
    pub(crate) fn run_twin(&self, twins: Twins, name: &str, grid: (u32, u32, u32), args: &[Arg]) -> Result<()> {
        let call = TwinCall::of(name, grid, args)?;
        let twin = twins(call.stem).ok_or_else(|| bad(format!("no twin for kernel '{name}'")))?;
        twin(self, &call)
    }

    /// `len` bytes at `ptr`, as stored.
    pub(crate) fn rd_bytes(&self, ptr: u64, len: usize) -> Result<Vec<u8>> {
        let mut b = vec![0u8; len];
        self.read_bytes(&mut b, ptr)?;
        Ok(b)
    }

    /// The GEMM twins' loop: row `r` of `y` (at `y + r * ldy` elements, in `out`) = row `r` of
    /// `x[m, k]` (in `dt`) times each row of `w[n, k]`, f32 in index order.
    pub(crate) fn matmul_rows(
        &self,
        w: &[f32],
        x: u64,
        y: u64,
        (m, k, ldy): (usize, usize, usize),
        dt: Dt,
        out: Dt,
    ) -> Result<()> {
        let x = self.rd(x, dt, m * k)?;
        for r in 0..m {
            let xr = &x[r * k..(r + 1) * k];
            let yr: Vec<f32> = w.chunks_exact(k).map(|wr| xr.iter().zip(wr).map(|(a, b)| a * b).sum()).collect();
            self.wr(y + (r * ldy * out.size()) as u64, out, &yr)?;
        }
        Ok(())
    }

    /// `y[rows, n] = x[rows, k] · w[n, k]ᵀ`, f32 accumulation in index order.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm(&self, x: u64, w: u64, y: u64, rows: usize, n: usize, k: usize, dt: Dt, out: Dt) -> Result<()> {
        let (xv, wv) = (self.rd(x, dt, rows * k)?, self.rd(w, dt, n * k)?);
        let mut yv = vec![0f32; rows * n];
        for (r, yr) in yv.chunks_exact_mut(n).enumerate() {
            let xr = &xv[r * k..(r + 1) * k];
            for (j, o) in yr.iter_mut().enumerate() {
                *o = xr.iter().zip(&wv[j * k..(j + 1) * k]).map(|(a, b)| a * b).sum();
            }
        }
        self.wr(y, out, &yv)
    }
}
