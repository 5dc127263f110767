//! Finding a usable CUDA device without creating a context on it: the driver, the ordinal, the
//! device's name, architecture and memory, then the libraries (none is loaded without a driver). [`crate::Gpu::open`] runs the
//! same checks, then takes the device's shared state (`Device`: the primary context and every
//! kernel loaded), made once per process and device and kept while a model uses it;
//! `device="auto"` decides from [`probe`] and [`VERIFIED_ARCHS`] ([`auto_choice`]).
//!
//! Finding CUDA: NVRTC, the CUDA headers and cuBLAS are looked for in the folders named by
//! `LMPLEX_CUDA_ROOTS` (the Python package sets it to pip's `site-packages/nvidia/cu13`), then
//! `LMPLEX_CUDA_HOME`, `CUDA_HOME`, `CUDA_PATH`, `/usr/local/cuda`; they are preloaded by full
//! path, and each library is checked with cudarc's `is_culib_present` before the first call
//! into it, so a missing driver, library or device is an `InvalidRequest` naming what is
//! missing, never cudarc's panic.
//!
//! Invariants: no CUDA function is called before its library is known to be present; a probe
//! creates no context and allocates nothing on the device.

use crate::exec::de;
use cudarc::cublas::sys as blas_sys;
use cudarc::driver::{result as drv, sys as drv_sys, CudaContext, CudaFunction};
use lmplex_core::{Error, Result};
use lmplex_kernels::{all_kernels, CudaPaths, KernelCache};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// Architectures (`major * 10 + minor`) on which the device tests (`tests/gpu`) have passed, so
/// `device="auto"` may choose CUDA there: sm_90 (H100 80GB HBM3, CUDA 13.0, driver 580).
pub const VERIFIED_ARCHS: &[u32] = &[90];

/// `$LMPLEX_KERNEL_CACHE`, else `kernels/` beside the model cache (as `lmplex.cuda` says).
pub fn kernel_cache_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("LMPLEX_KERNEL_CACHE") {
        return PathBuf::from(p);
    }
    let models = match std::env::var_os("LMPLEX_CACHE_DIR") {
        Some(p) => PathBuf::from(p),
        None => {
            let base = std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from).unwrap_or_else(|| {
                PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| ".".into())).join(".cache")
            });
            base.join("lmplex").join("models")
        }
    };
    models.parent().map(|p| p.join("kernels")).unwrap_or_else(|| PathBuf::from("kernels"))
}

/// What every model on one device shares: its (primary) context and the loaded kernels.
pub(crate) struct Device {
    pub ctx: Arc<CudaContext>,
    pub arch: u32,
    pub name: String,
    pub functions: HashMap<String, CudaFunction>,
    /// What opening took on the device (context and kernels), by NVML's count (`context_bytes`).
    pub context_bytes: Option<usize>,
}

/// The devices open in this process, by ordinal.
static OPEN: Mutex<BTreeMap<u32, Weak<Device>>> = Mutex::new(BTreeMap::new());

/// The bytes device `ordinal`'s context and kernels took when this process opened it: NVML's
/// count of the device's used memory just after, less just before (every process's, so another
/// process allocating in that moment would be counted too). `None` while the device is not open
/// or without NVML (`libnvidia-ml.so.1`, part of the driver).
pub fn context_bytes(ordinal: u32) -> Option<usize> {
    let open = OPEN.lock().unwrap_or_else(PoisonError::into_inner);
    open.get(&ordinal).and_then(Weak::upgrade)?.context_bytes
}

/// NVML's name of a device UUID: `GPU-` and the 16 bytes in hex, grouped 4-2-2-2-6.
fn nvml_uuid(bytes: &[u8; 16]) -> String {
    let hex = |r: std::ops::Range<usize>| bytes[r].iter().map(|b| format!("{b:02x}")).collect::<String>();
    format!("GPU-{}-{}-{}-{}-{}", hex(0..4), hex(4..6), hex(6..8), hex(8..10), hex(10..16))
}

/// The device's used bytes by NVML (every process), or `None` without NVML or the device.
fn nvml_used(nvml: Option<&nvml_wrapper::Nvml>, uuid: Option<&str>) -> Option<u64> {
    nvml?.device_by_uuid(uuid?).ok()?.memory_info().ok().map(|m| m.used)
}

impl Device {
    /// Device `ordinal`'s shared state: the one already open in this process, else a new one
    /// with every kernel loaded (compiled by NVRTC or read from the disk cache).
    pub fn get(ordinal: u32, include_dir: PathBuf) -> Result<Arc<Self>> {
        let mut open = OPEN.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(d) = open.get(&ordinal).and_then(Weak::upgrade) {
            return Ok(d);
        }
        // NVML reads the device's memory without a context, so the context's own share is
        // the difference across opening it. Only a figure: without it the device still opens.
        let uuid = drv::device::get(ordinal as i32).and_then(drv::device::get_uuid).ok();
        let uuid = uuid.map(|u| nvml_uuid(&u.bytes.map(|b| b as u8)));
        let nvml = uuid.as_ref().and_then(|_| nvml_wrapper::Nvml::init().ok());
        let before = nvml_used(nvml.as_ref(), uuid.as_deref());
        let ctx =
            CudaContext::new(ordinal as usize).map_err(|e| unavailable(format!("cannot create a context: {e:?}")))?;
        // SAFETY: called before any buffer or stream of this context object exists; the backend
        // orders its own work on each model's stream (the module header), and graph capture
        // needs tracking off.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx.compute_capability().map_err(de)?;
        let arch = (major * 10 + minor) as u32;
        let name = ctx.name().map_err(de)?;
        let cache = KernelCache::new(kernel_cache_dir(), include_dir);
        let mut functions = HashMap::new();
        for k in all_kernels() {
            let (cubin, _) = cache.get(&k, arch)?;
            let module = ctx.load_module(cudarc::nvrtc::Ptx::from_binary(cubin.to_vec())).map_err(de)?;
            for f in k.functions() {
                let func = module.load_function(&f).map_err(de)?;
                functions.insert(f, func);
            }
        }
        let after = nvml_used(nvml.as_ref(), uuid.as_deref());
        let context_bytes = before.zip(after).map(|(b, a)| a.saturating_sub(b) as usize);
        let d = Arc::new(Self { ctx, arch, name, functions, context_bytes });
        open.insert(ordinal, Arc::downgrade(&d));
        Ok(d)
    }
}

/// What a probe learns about one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFacts {
    pub ordinal: u32,
    pub name: String,
    /// Compute capability as `major * 10 + minor`.
    pub arch: u32,
    /// The device's memory, in bytes.
    pub total_bytes: usize,
}

/// Folders named in `LMPLEX_CUDA_ROOTS` (colon-separated).
fn env_roots() -> Vec<PathBuf> {
    std::env::var_os("LMPLEX_CUDA_ROOTS")
        .map(|v| std::env::split_paths(&v).filter(|p| !p.as_os_str().is_empty()).collect())
        .unwrap_or_default()
}

pub(crate) fn unavailable(what: impl std::fmt::Display) -> Error {
    Error::invalid(format!("CUDA is not available: {what}"))
}

/// Checks the driver and that device `ordinal` exists, then finds and preloads NVRTC, the
/// headers and cuBLAS; an `InvalidRequest` naming what is missing otherwise.
pub(crate) fn find(ordinal: u32) -> Result<(CudaPaths, DeviceFacts)> {
    // The driver first: without one (a CPU machine) nothing else is loaded, so `device="auto"`
    // costs a CPU process no NVRTC or cuBLAS mappings.
    // SAFETY: this only tries to dlopen the driver's names; nothing in it is called.
    if !unsafe { drv_sys::is_culib_present() } {
        return Err(unavailable("no NVIDIA driver (libcuda.so.1) on this machine"));
    }
    let driver = |e: drv::DriverError| unavailable(format!("the driver reports {e:?}"));
    drv::init().map_err(driver)?;
    let count = drv::device::get_count().map_err(driver)?;
    if count <= 0 {
        return Err(unavailable("the driver sees no CUDA device"));
    }
    if ordinal >= count as u32 {
        return Err(unavailable(format!(
            "there is no CUDA device {ordinal}: the driver sees {count} (ordinals 0 to {})",
            count - 1
        )));
    }
    let dev = drv::device::get(ordinal as i32).map_err(driver)?;
    let attr = |a| {
        // SAFETY: `dev` is a valid device handle from `get`; the attribute is a plain query.
        unsafe { drv::device::get_attribute(dev, a) }.map_err(driver)
    };
    let major = attr(drv_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(drv_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    // SAFETY: as above.
    let total_bytes = unsafe { drv::device::total_mem(dev) }.map_err(driver)?;
    let name = drv::device::get_name(dev).map_err(driver)?;
    let facts = DeviceFacts { ordinal, name, arch: (major * 10 + minor) as u32, total_bytes };
    let roots = env_roots();
    let paths = CudaPaths::find(&roots).ok_or_else(|| {
        unavailable(format!(
            "NVRTC and the CUDA headers were not found (looked in {roots:?}, $LMPLEX_CUDA_HOME, $CUDA_HOME, \
             /usr/local/cuda); `pip install nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cublas` provides them"
        ))
    })?;
    paths.preload()?;
    paths.preload_cublas()?;
    // SAFETY: this only tries to dlopen candidate names; nothing in them is called.
    if !unsafe { blas_sys::is_culib_present() } {
        return Err(unavailable(format!("cuBLAS (libcublas.so.13) is not in {}", paths.lib_dir.display())));
    }
    Ok((paths, facts))
}

/// The facts of device `ordinal`, or why it cannot be used; creates no context.
pub fn probe(ordinal: u32) -> Result<DeviceFacts> {
    find(ordinal).map(|(_, facts)| facts)
}

/// What `device="auto"` makes of a probe of device 0: the device when it is usable and its
/// architecture is in `VERIFIED_ARCHS`, else why the CPU is chosen.
pub fn auto_choice(probe: Result<DeviceFacts>) -> std::result::Result<DeviceFacts, String> {
    match probe {
        Ok(f) if VERIFIED_ARCHS.contains(&f.arch) => Ok(f),
        Ok(f) => Err(format!(
            "CUDA device {} ({}, sm_{}) is not an architecture the device tests have passed on ({}); \
             ask for device=\"cuda\" to use it anyway",
            f.ordinal,
            f.name,
            f.arch,
            VERIFIED_ARCHS.iter().map(|a| format!("sm_{a}")).collect::<Vec<_>>().join(", ")
        )),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(arch: u32) -> DeviceFacts {
        DeviceFacts { ordinal: 0, name: "NVIDIA Test".into(), arch, total_bytes: 80 << 30 }
    }

    #[test]
    fn auto_takes_verified_architectures_only() {
        assert_eq!(auto_choice(Ok(facts(90))), Ok(facts(90)));
        let why = auto_choice(Ok(facts(80))).unwrap_err();
        assert!(why.contains("sm_80") && why.contains("sm_90") && why.contains("device=\"cuda\""), "{why}");
        let why = auto_choice(Err(unavailable("no NVIDIA driver (libcuda.so.1) on this machine"))).unwrap_err();
        assert!(why.contains("no NVIDIA driver"), "{why}");
    }

    #[test]
    fn uuids_are_spelled_as_nvml_spells_them() {
        let bytes: [u8; 16] = std::array::from_fn(|i| (i * 17) as u8);
        assert_eq!(nvml_uuid(&bytes), "GPU-00112233-4455-6677-8899-aabbccddeeff");
        assert_eq!(context_bytes(7), None, "no device is open on a machine without one");
    }
}
