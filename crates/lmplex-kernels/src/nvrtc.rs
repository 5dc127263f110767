//! Compiling a kernel source to a CUBIN with NVRTC, and the caches in front of it.
//!
//! Invariants: `compile` is only reached after [`crate::libs::nvrtc_available`] says cudarc can
//! load NVRTC (otherwise it returns an error, so cudarc's own panic on a missing library never
//! fires); compilation errors carry NVRTC's log; a disk-cache entry is named by a hash of
//! everything that shapes the binary (prelude and source, options, arch, NVRTC version) and
//! written by rename, so a reader never sees half a file.

use crate::libs::nvrtc_available;
use crate::sources::KernelSource;
use cudarc::nvrtc::{result, sys};
use lmplex_core::{Error, Result};
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

/// NVRTC's version, (major, minor).
pub fn nvrtc_version() -> Result<(i32, i32)> {
    if !nvrtc_available() {
        return Err(Error::invalid("CUDA: NVRTC (libnvrtc.so.13) is not loadable"));
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loadable (checked above); the pointers are valid for the call.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| Error::internal(format!("nvrtcVersion: {e:?}")))?;
    Ok((major, minor))
}

fn options(arch: u32, include_dir: &Path) -> Vec<String> {
    vec![
        format!("--gpu-architecture=sm_{arch}"),
        format!("--include-path={}", include_dir.display()),
        "--std=c++17".into(),
        "--device-as-default-execution-space".into(),
    ]
}

/// Compiles `k` to a CUBIN for `sm_{arch}` (e.g. 80, 90), with the CUDA headers in `include_dir`.
pub fn compile(k: &KernelSource, arch: u32, include_dir: &Path) -> Result<Vec<u8>> {
    compile_with_log(k, arch, include_dir).map(|(cubin, _)| cubin)
}

/// As `compile`, with NVRTC's log (its warnings) beside the CUBIN.
pub fn compile_with_log(k: &KernelSource, arch: u32, include_dir: &Path) -> Result<(Vec<u8>, String)> {
    if !nvrtc_available() {
        return Err(Error::invalid("CUDA: NVRTC (libnvrtc.so.13) is not loadable"));
    }
    let src = CString::new(k.full_source()).map_err(|_| Error::internal("a kernel source holds a NUL byte"))?;
    let name = CString::new(format!("{}.cu", k.name)).map_err(Error::internal)?;
    let prog = result::create_program(&src, Some(&name)).map_err(|e| Error::internal(format!("nvrtc: {e:?}")))?;
    // SAFETY: `prog` is a live program until destroyed at the end of this function.
    let out = unsafe { compiled(prog, k.name, &options(arch, include_dir)) };
    // SAFETY: destroyed once, after its last use.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// Compiles `prog` and reads its CUBIN. Safety: `prog` must be a live NVRTC program.
unsafe fn compiled(prog: sys::nvrtcProgram, name: &str, opts: &[String]) -> Result<(Vec<u8>, String)> {
    let compiled = result::compile_program(prog, opts);
    let log = result::get_program_log(prog).unwrap_or_default();
    let log = if log.is_empty() { String::new() } else { CStr::from_ptr(log.as_ptr()).to_string_lossy().into_owned() };
    if let Err(e) = compiled {
        return Err(Error::internal(format!("NVRTC could not compile kernel '{name}' ({e:?}) with {opts:?}:\n{log}")));
    }
    let mut size = 0usize;
    sys::nvrtcGetCUBINSize(prog, &mut size).result().map_err(|e| Error::internal(format!("{e:?}")))?;
    let mut cubin = vec![0u8; size];
    sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast()).result().map_err(|e| Error::internal(format!("{e:?}")))?;
    Ok((cubin, log))
}

/// FNV-1a, 64 bits: stable across runs and platforms (unlike `std`'s hasher).
pub(crate) fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for p in parts {
        for &b in *p {
            h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
        h = (h ^ 0xff).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// CUBINs in memory, by (kernel name, arch).
type MemoryCache = Mutex<HashMap<(String, u32), Arc<Vec<u8>>>>;

/// CUBINs by kernel and arch: in memory for the process, on disk (`dir`) across processes.
pub struct KernelCache {
    dir: PathBuf,
    include_dir: PathBuf,
    memory: MemoryCache,
}

impl KernelCache {
    pub fn new(dir: PathBuf, include_dir: PathBuf) -> Self {
        Self { dir, include_dir, memory: Mutex::new(HashMap::new()) }
    }

    /// The disk file for `k` at `arch` under the loaded NVRTC.
    pub fn path(&self, k: &KernelSource, arch: u32) -> Result<PathBuf> {
        let (major, minor) = nvrtc_version()?;
        let opts = options(arch, Path::new("")).join(" ");
        let key = fnv1a(&[k.full_source().as_bytes(), opts.as_bytes(), format!("{major}.{minor}").as_bytes()]);
        Ok(self.dir.join(format!("{}-sm{arch}-{key:016x}.cubin", k.name)))
    }

    /// The CUBIN of `k` for `arch`, and whether it came from a cache (memory or disk).
    pub fn get(&self, k: &KernelSource, arch: u32) -> Result<(Arc<Vec<u8>>, bool)> {
        let key = (k.name.to_string(), arch);
        if let Some(c) = self.memory.lock().unwrap_or_else(PoisonError::into_inner).get(&key) {
            return Ok((c.clone(), true));
        }
        let path = self.path(k, arch)?;
        let (cubin, hit) = match std::fs::read(&path) {
            Ok(bytes) if bytes.starts_with(b"\x7fELF") => (bytes, true),
            _ => {
                let bytes = compile(k, arch, &self.include_dir)?;
                // A cache that cannot be written only costs a recompile next time.
                let _ = std::fs::create_dir_all(&self.dir).and_then(|()| {
                    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
                    std::fs::write(&tmp, &bytes).and_then(|()| std::fs::rename(&tmp, &path))
                });
                (bytes, false)
            }
        };
        let cubin = Arc::new(cubin);
        self.memory.lock().unwrap_or_else(PoisonError::into_inner).insert(key, cubin.clone());
        Ok((cubin, hit))
    }
}
