//! Weight uploads through page-locked staging buffers, so reading the checkpoint (from the page
//! cache or the disk, into one buffer) overlaps the device's copy out of the other.
//!
//! A copy from pageable memory (a mapped safetensors file, a converted `Vec`) makes the driver
//! stage it through its own small pinned buffer and return only when the copy is done, so the
//! reads and the bus take turns. Here the loader's thread fills slot `i` while the copy engine
//! drains slot `i - 1`, so that a cold start can run at the slower of the two rather than their
//! sum (not yet timed on a device).
//!
//! Invariants:
//! - A slot's memory is written only after the copy last issued from it has finished (its
//!   event), and `finish` (or drop) waits for every issued copy, so no copy outlives its
//!   source and the destination holds the bytes once `finish` returns.
//! - Copies are issued on the model's stream, in order, after the `alloc` that made their
//!   destination (which zeroes it on the same stream).
//! - On the host executors the slots are plain memory written through `Gpu::htod`, with the
//!   same chunking, so the bookkeeping (offsets, partial last chunks, slot reuse) is tested
//!   without a device.

use crate::exec::de;
use crate::gpu::{DevBuf, Gpu};
use cudarc::driver::{sys as drv_sys, CudaEvent, PinnedHostSlice};
use lmplex_core::Result;

/// Bytes per staging slot: large enough that a copy's fixed cost is small, small enough that
/// the two slots (`SLOTS`) cost little page-locked memory.
pub const STAGING_CHUNK: usize = 16 << 20;

/// Slots in flight: one being filled while the other is copied.
const SLOTS: usize = 2;

enum Mem {
    Pinned(PinnedHostSlice<u8>, CudaEvent),
    Plain(Vec<u8>),
}

/// A loader's staging buffers on one `Gpu` (module docs).
pub struct Staging<'a> {
    gpu: &'a Gpu,
    slots: Vec<Mem>,
    next: usize,
    chunk: usize,
    /// Bytes copied through the slots.
    pub copied: usize,
}

impl<'a> Staging<'a> {
    /// `SLOTS` buffers of `chunk` bytes: page-locked on a device, plain on the host executors.
    pub fn new(gpu: &'a Gpu, chunk: usize) -> Result<Self> {
        let chunk = chunk.max(1);
        let slots = (0..SLOTS)
            .map(|_| match gpu.context() {
                Some(ctx) => {
                    // SAFETY: the memory is written (`fill`) before any copy reads it.
                    let pinned = unsafe { ctx.alloc_pinned::<u8>(chunk) }.map_err(de)?;
                    let done = ctx.new_event(Some(drv_sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC)).map_err(de)?;
                    Ok(Mem::Pinned(pinned, done))
                }
                None => Ok(Mem::Plain(vec![0; chunk])),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { gpu, slots, next: 0, chunk, copied: 0 })
    }

    /// `src` copied to `dst` (a buffer of at least `src.len()` bytes) in chunks, each through
    /// the next slot once that slot's previous copy is done; returns before the last copies end.
    pub fn copy(&mut self, dst: u64, src: &[u8]) -> Result<()> {
        for (i, piece) in src.chunks(self.chunk).enumerate() {
            let to = dst + (i * self.chunk) as u64;
            let slot = &mut self.slots[self.next];
            self.next = (self.next + 1) % SLOTS;
            match slot {
                Mem::Pinned(mem, done) => {
                    done.synchronize().map_err(de)?;
                    let mem = mem.as_mut_slice().map_err(de)?;
                    mem[..piece.len()].copy_from_slice(piece);
                    self.gpu.htod(to, &mem[..piece.len()])?;
                    self.gpu.record(done)?;
                }
                Mem::Plain(mem) => {
                    mem[..piece.len()].copy_from_slice(piece);
                    self.gpu.htod(to, &mem[..piece.len()])?;
                }
            }
            self.copied += piece.len();
        }
        Ok(())
    }

    /// A new buffer holding `src` (`Gpu::upload` through the slots).
    pub fn upload(&mut self, src: &[u8]) -> Result<DevBuf> {
        let buf = self.gpu.alloc(src.len())?;
        self.copy(buf.ptr, src)?;
        Ok(buf)
    }

    /// Waits for every copy issued; the uploads are complete on the device when this returns.
    pub fn finish(mut self) -> Result<()> {
        self.wait()
    }

    fn wait(&mut self) -> Result<()> {
        for slot in &self.slots {
            if let Mem::Pinned(_, done) = slot {
                done.synchronize().map_err(de)?;
            }
        }
        Ok(())
    }
}

impl Drop for Staging<'_> {
    /// An early return (a failed load) still waits for the copies before the slots are freed.
    fn drop(&mut self) {
        let _ = self.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Uploads of sizes around the chunk (empty, smaller, exact, several with a partial tail)
    /// through slots reused many times land byte for byte.
    #[test]
    fn chunked_uploads_land_byte_for_byte() {
        let gpu = Gpu::host();
        let mut stage = Staging::new(&gpu, 7).unwrap();
        let sizes = [0usize, 1, 6, 7, 8, 20, 21, 1000];
        let srcs: Vec<Vec<u8>> =
            sizes.iter().enumerate().map(|(s, &n)| (0..n).map(|i| (i * 31 + s * 7) as u8).collect()).collect();
        let bufs: Vec<DevBuf> = srcs.iter().map(|s| stage.upload(s).unwrap()).collect();
        assert_eq!(stage.copied, sizes.iter().sum::<usize>());
        stage.finish().unwrap();
        for (src, buf) in srcs.iter().zip(&bufs) {
            let mut back = vec![0u8; src.len()];
            gpu.dtoh(&mut back, buf.ptr).unwrap();
            assert_eq!(&back, src);
        }
    }

    /// A copy into the middle of a buffer touches only its range.
    #[test]
    fn copy_at_an_offset_keeps_the_rest() {
        let gpu = Gpu::host();
        let mut stage = Staging::new(&gpu, 4).unwrap();
        let buf = gpu.alloc(32).unwrap();
        stage.copy(buf.at(5), &[9u8; 11]).unwrap();
        stage.finish().unwrap();
        let mut back = vec![0u8; 32];
        gpu.dtoh(&mut back, buf.ptr).unwrap();
        let want: Vec<u8> = (0..32).map(|i| if (5..16).contains(&i) { 9 } else { 0 }).collect();
        assert_eq!(back, want);
    }
}
