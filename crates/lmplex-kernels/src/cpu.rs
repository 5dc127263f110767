//! Every kernel executed on the CPU: the unchanged `kernels/*.cu` sources compiled as C++ with
//! `cpu/lmplex_cuda_cpu.h` (the CUDA subset they use, on fibers) by the system's C++ compiler
//! at run time, as NVRTC compiles them for a device, and called with the same launch shape and
//! argument list a device launch takes.
//!
//! Purpose: the CUDA code itself (indexing, reduction order, barriers) is tested on any machine,
//! against each kernel's CPU twin, with the threads of every phase run in several orders so a
//! missing barrier or a shared-memory race changes the result (see the header for the model).
//!
//! Invariants: a build is keyed by everything that shapes it (header, prelude and source, the
//! compiler's version, the flags), written by rename, so a stale or half-written library is never
//! loaded; a kernel error (a barrier not every thread reaches, a warp operation a lane of its mask
//! never reaches) comes back as an `Error`, never a hang or a crash of the caller; nothing here
//! checks the launch limits, which `lmplex_kernels::check_launch` does for every executor.

use crate::nvrtc::fnv1a;
use crate::sources::{all as all_kernels, KernelSource};
use lmplex_core::{Error, Result};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The emulation layer, written beside each build.
pub const HEADER: &str = include_str!("../cpu/lmplex_cuda_cpu.h");
const FP16_STANDIN: &str = include_str!("../cpu/cuda_fp16.h");

/// The order in which the threads of each phase (and the blocks of the grid) run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    Forward,
    Reverse,
    /// A permutation drawn from this seed, new for every phase.
    Random(u64),
}

/// The launch as the header's `lmplex_cpu::Launch` reads it.
#[repr(C)]
struct Launch {
    grid: [u32; 3],
    block: [u32; 3],
    order: c_int,
    seed: u64,
}

type LaunchFn = unsafe extern "C" fn(*const Launch, *mut *mut c_void, *mut c_char, usize) -> c_int;

/// The compiled kernels: one shared library per source, every entry point by name.
pub struct CpuKernels {
    functions: HashMap<String, LaunchFn>,
    _libs: Vec<libloading::Library>,
}

/// The compiler: `$CXX`, else `c++`.
fn compiler() -> String {
    std::env::var("CXX").ok().filter(|c| !c.is_empty()).unwrap_or_else(|| "c++".into())
}

/// Flags of every build; `LMPLEX_CPU_KERNEL_FLAGS` adds more (e.g. `-fsanitize=undefined`).
fn flags() -> Vec<String> {
    let mut f: Vec<String> = [
        "-std=c++17",
        "-O2",
        "-fPIC",
        "-shared",
        "-ffp-contract=off",
        "-fno-strict-aliasing",
        "-U_FORTIFY_SOURCE",
        "-Wall",
        "-Wno-unused-function",
        "-Wno-sign-compare",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Ok(extra) = std::env::var("LMPLEX_CPU_KERNEL_FLAGS") {
        f.extend(extra.split_whitespace().map(String::from));
    }
    f
}

/// The C++ text of one source: the kernel as NVRTC sees it, then one export per entry point.
pub fn cpu_source(k: &KernelSource) -> String {
    let mut s = k.full_source();
    s.push_str("\n#line 1 \"lmplex_cpu_exports\"\n");
    for f in k.functions() {
        s.push_str(&format!("LMPLEX_CPU_EXPORT({f})\n"));
    }
    s
}

fn tool_error(what: impl std::fmt::Display) -> Error {
    Error::invalid(format!("CPU kernels: {what}"))
}

impl CpuKernels {
    /// The process's build, compiled on first use into `dir` (`kernel_cache_dir()/cpu` by the
    /// backend's choice); later calls return the same kernels.
    pub fn shared(dir: &Path) -> Result<&'static CpuKernels> {
        static BUILT: OnceLock<std::result::Result<CpuKernels, String>> = OnceLock::new();
        BUILT.get_or_init(|| CpuKernels::build(dir).map_err(|e| e.to_string())).as_ref().map_err(tool_error)
    }

    /// Compiles every kernel source (or reuses a cached build in `dir`) and loads it.
    pub fn build(dir: &Path) -> Result<Self> {
        Self::build_sources(dir, all_kernels())
    }

    /// As `build`, for the given sources.
    pub fn build_sources(dir: &Path, sources: Vec<KernelSource>) -> Result<Self> {
        let cxx = compiler();
        let version = Command::new(&cxx)
            .arg("--version")
            .output()
            .map_err(|e| tool_error(format!("no C++ compiler `{cxx}` ({e}); install g++ or clang++, or set CXX")))?;
        let flags = flags();
        std::fs::create_dir_all(dir).map_err(|e| tool_error(format!("cannot create {}: {e}", dir.display())))?;
        for (name, text) in
            [("lmplex_cuda_cpu.h", HEADER), ("cuda_fp16.h", FP16_STANDIN), ("cuda_bf16.h", FP16_STANDIN)]
        {
            write_if_changed(&dir.join(name), text)?;
        }
        let mut pending = Vec::new();
        let mut libs = Vec::new();
        for k in sources {
            let src = cpu_source(&k);
            let key = fnv1a(&[HEADER.as_bytes(), src.as_bytes(), &version.stdout, flags.join(" ").as_bytes()]);
            let lib = dir.join(format!("{}-{key:016x}.so", k.name));
            if !lib.is_file() {
                let cpp = dir.join(format!("{}-{key:016x}.cpp", k.name));
                write_if_changed(&cpp, &src)?;
                let tmp = lib.with_extension(format!("tmp{}", std::process::id()));
                let child = Command::new(&cxx)
                    .args(&flags)
                    .arg("-I")
                    .arg(dir)
                    .arg(&cpp)
                    .arg("-o")
                    .arg(&tmp)
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .map_err(|e| tool_error(format!("cannot run `{cxx}`: {e}")))?;
                pending.push((k.name, child, tmp, lib.clone()));
            }
            libs.push((k, lib));
        }
        for (name, child, tmp, lib) in pending {
            let out = child.wait_with_output().map_err(|e| tool_error(format!("`{cxx}`: {e}")))?;
            let log = String::from_utf8_lossy(&out.stderr);
            if !out.status.success() || log.contains("warning") {
                let _ = std::fs::remove_file(&tmp);
                return Err(tool_error(format!("{name}.cu does not compile cleanly with `{cxx}`:\n{log}")));
            }
            std::fs::rename(&tmp, &lib).map_err(|e| tool_error(format!("cannot write {}: {e}", lib.display())))?;
        }
        let mut functions = HashMap::new();
        let mut loaded = Vec::new();
        for (k, path) in libs {
            // SAFETY: the library is our own build of the kernel source; loading it runs no code
            // beyond the C++ runtime's static initialisers, which the header does not use.
            let lib = unsafe { libloading::Library::new(&path) }
                .map_err(|e| tool_error(format!("cannot load {}: {e}", path.display())))?;
            for f in k.functions() {
                let sym = format!("lmplex_cpu_{f}\0");
                // SAFETY: `LMPLEX_CPU_EXPORT` defines the symbol with exactly `LaunchFn`'s signature.
                let func: LaunchFn = *unsafe { lib.get::<LaunchFn>(sym.as_bytes()) }
                    .map_err(|e| tool_error(format!("{}: no entry point {f}: {e}", path.display())))?;
                functions.insert(f, func);
            }
            loaded.push(lib);
        }
        Ok(Self { functions, _libs: loaded })
    }

    /// Every entry point, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.functions.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }

    /// Runs kernel `name` over `grid` blocks of `block` threads, the threads of each phase in
    /// `order`. `args[i]` points to the value of the kernel's i-th parameter, as
    /// `cuLaunchKernel` takes them.
    ///
    /// # Safety
    /// `args` must match the kernel's parameter list in number and type, and every pointer
    /// argument must address host memory large enough for what the kernel reads and writes.
    pub unsafe fn launch(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        args: &mut [*mut c_void],
        order: Order,
    ) -> Result<()> {
        let f = self.functions.get(name).ok_or_else(|| Error::internal(format!("no CPU kernel '{name}'")))?;
        let (order, seed) = match order {
            Order::Forward => (0, 0),
            Order::Reverse => (1, 0),
            Order::Random(s) => (2, s),
        };
        let l = Launch { grid: [grid.0, grid.1, grid.2], block: [block.0, block.1, block.2], order, seed };
        let mut err = vec![0u8; 512];
        // SAFETY: the caller guarantees the argument list; `l` and `err` outlive the call.
        let rc = unsafe { f(&l, args.as_mut_ptr(), err.as_mut_ptr().cast(), err.len()) };
        if rc == 0 {
            return Ok(());
        }
        let end = err.iter().position(|&b| b == 0).unwrap_or(err.len());
        Err(Error::internal(format!("kernel {name}: {}", String::from_utf8_lossy(&err[..end]))))
    }
}

fn write_if_changed(path: &PathBuf, text: &str) -> Result<()> {
    if std::fs::read(path).map(|b| b == text.as_bytes()).unwrap_or(false) {
        return Ok(());
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| tool_error(format!("cannot write {}: {e}", path.display())))
}
