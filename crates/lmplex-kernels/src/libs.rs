//! Finding NVRTC and the CUDA headers, and loading NVRTC by full path.
//!
//! Search order: the folders the caller names (Python passes pip's `site-packages/nvidia/cu13`),
//! `LMPLEX_CUDA_HOME`, `CUDA_HOME`, `CUDA_PATH`, `/usr/local/cuda`. A folder qualifies when it
//! holds `lib/` or `lib64/` with `libnvrtc.so.13` (or `libnvrtc.so`) and `include/cuda_bf16.h`.
//!
//! Invariants: pip's wheels ship versioned names only and cudarc dlopens bare names, so
//! [`CudaPaths::preload`] opens `libnvrtc-builtins` and then `libnvrtc` by full path with
//! `RTLD_GLOBAL` and keeps them loaded for the life of the process; after that cudarc's own
//! lookup finds them. [`CudaPaths::preload_cublas`] does the same for `libcublasLt` and
//! `libcublas` (the GPU backend's GEMMs), from the same folder. Nothing here panics when CUDA
//! is absent: it returns `None` or an error.

use lmplex_core::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaPaths {
    pub lib_dir: PathBuf,
    pub include_dir: PathBuf,
}

/// Libraries opened by `preload`, kept open for the life of the process.
static LOADED: Mutex<Vec<libloading::os::unix::Library>> = Mutex::new(Vec::new());

const NVRTC_NAMES: [&str; 2] = ["libnvrtc.so.13", "libnvrtc.so"];

impl CudaPaths {
    /// The first qualifying folder among `extra` and the usual places.
    pub fn find(extra: &[PathBuf]) -> Option<Self> {
        let env = ["LMPLEX_CUDA_HOME", "CUDA_HOME", "CUDA_PATH"]
            .iter()
            .filter_map(|v| std::env::var_os(v).map(PathBuf::from));
        extra
            .iter()
            .cloned()
            .chain(env)
            .chain(std::iter::once(PathBuf::from("/usr/local/cuda")))
            .find_map(|root| Self::at(&root))
    }

    /// `root` if it holds NVRTC and the headers.
    pub fn at(root: &Path) -> Option<Self> {
        let include_dir = root.join("include");
        if !include_dir.join("cuda_bf16.h").is_file() {
            return None;
        }
        ["lib", "lib64"]
            .iter()
            .map(|l| root.join(l))
            .find(|d| NVRTC_NAMES.iter().any(|n| d.join(n).is_file()))
            .map(|lib_dir| Self { lib_dir, include_dir })
    }

    /// Loads NVRTC (its builtins first) from `lib_dir` by full path, globally, once.
    pub fn preload(&self) -> Result<()> {
        let mut loaded = LOADED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !loaded.is_empty() {
            return Ok(());
        }
        let builtins = std::fs::read_dir(&self.lib_dir)
            .map_err(|e| Error::invalid(format!("CUDA: cannot list {}: {e}", self.lib_dir.display())))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                n.starts_with("libnvrtc-builtins.so") && !n.contains(".alt.")
            })
            .min();
        let nvrtc = NVRTC_NAMES.iter().map(|n| self.lib_dir.join(n)).find(|p| p.is_file());
        let flags = libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL;
        let mut opened = Vec::new();
        for path in builtins.into_iter().chain(nvrtc) {
            // SAFETY: loading NVRTC runs its initialisers, which have no preconditions.
            let lib = unsafe { libloading::os::unix::Library::open(Some(&path), flags) }
                .map_err(|e| Error::invalid(format!("CUDA: cannot load {}: {e}", path.display())))?;
            opened.push(lib);
        }
        if opened.is_empty() {
            return Err(Error::invalid(format!("CUDA: no libnvrtc in {}", self.lib_dir.display())));
        }
        *loaded = opened;
        Ok(())
    }
}

const CUBLAS_NAMES: [&str; 2] = ["libcublasLt.so.13", "libcublas.so.13"];

/// cuBLAS libraries opened by `preload_cublas`, kept open for the life of the process.
static LOADED_CUBLAS: Mutex<Vec<libloading::os::unix::Library>> = Mutex::new(Vec::new());

impl CudaPaths {
    /// Loads cuBLAS (cuBLASLt first, which cuBLAS links against) from `lib_dir` by full path,
    /// globally, once; libraries not in `lib_dir` are left to the system's search path.
    pub fn preload_cublas(&self) -> Result<()> {
        let mut loaded = LOADED_CUBLAS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !loaded.is_empty() {
            return Ok(());
        }
        let flags = libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL;
        for path in CUBLAS_NAMES.iter().map(|n| self.lib_dir.join(n)).filter(|p| p.is_file()) {
            // SAFETY: loading cuBLAS runs its initialisers, which have no preconditions.
            let lib = unsafe { libloading::os::unix::Library::open(Some(&path), flags) }
                .map_err(|e| Error::invalid(format!("CUDA: cannot load {}: {e}", path.display())))?;
            loaded.push(lib);
        }
        Ok(())
    }
}

/// Whether cudarc can reach NVRTC now (after `preload`, or on the system's library path).
pub fn nvrtc_available() -> bool {
    // SAFETY: this only tries to dlopen candidate names; cudarc calls nothing in them.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}
