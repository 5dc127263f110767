//! Every kernel compiles with NVRTC to a CUBIN for sm_80 (A100) and sm_90 (H100/H200), and the
//! CUBIN holds each of its entry points, with no NVRTC warning; the disk cache serves the second
//! request.
//!
//! No GPU is needed: NVRTC runs on the CPU. Where NVRTC and the CUDA headers are not found the
//! test skips with the reason, unless `LMPLEX_REQUIRE_NVRTC=1` (set by scripts/test, which
//! installs pip's nvidia-cuda-nvrtc and nvidia-cuda-runtime): then a missing NVRTC fails.

use lmplex_kernels::nvrtc::compile_with_log;
use lmplex_kernels::{all_kernels, compile, CudaPaths, KernelCache};

fn cuda() -> Option<CudaPaths> {
    let found = CudaPaths::find(&[]);
    let Some(paths) = found else {
        assert!(
            std::env::var("LMPLEX_REQUIRE_NVRTC").as_deref() != Ok("1"),
            "LMPLEX_REQUIRE_NVRTC=1 but no NVRTC with CUDA headers was found (set LMPLEX_CUDA_HOME)"
        );
        eprintln!("skipped: no NVRTC with CUDA headers (set LMPLEX_CUDA_HOME to pip's site-packages/nvidia/cu13)");
        return None;
    };
    paths.preload().unwrap();
    Some(paths)
}

#[test]
fn every_kernel_compiles_for_sm80_and_sm90_with_all_its_entry_points() {
    let Some(paths) = cuda() else { return };
    let (major, minor) = lmplex_kernels::nvrtc::nvrtc_version().unwrap();
    eprintln!("NVRTC {major}.{minor} from {}", paths.lib_dir.display());
    for k in all_kernels() {
        for arch in [80, 90] {
            let (cubin, log) = compile_with_log(&k, arch, &paths.include_dir).unwrap_or_else(|e| panic!("{e}"));
            assert!(!log.contains("warning"), "{} sm_{arch}: NVRTC warns:\n{log}", k.name);
            assert!(cubin.starts_with(b"\x7fELF"), "{} sm_{arch}: not an ELF CUBIN", k.name);
            for f in k.functions() {
                let found = cubin.windows(f.len() + 1).any(|w| &w[..f.len()] == f.as_bytes() && w[f.len()] == 0);
                assert!(found, "{} sm_{arch}: entry point {f} missing", k.name);
            }
        }
    }
}

#[test]
fn a_broken_kernel_is_an_error_with_nvrtc_log_and_the_cache_serves_repeats() {
    let Some(paths) = cuda() else { return };
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::new(dir.path().to_path_buf(), paths.include_dir.clone());
    let k = &all_kernels()[0];
    let (first, hit) = cache.get(k, 90).unwrap();
    assert!(!hit);
    assert!(cache.path(k, 90).unwrap().is_file(), "written to disk");
    assert!(cache.get(k, 90).unwrap().1, "served from memory");
    // A new process (a new cache object) reads the disk file instead of compiling.
    let again = KernelCache::new(dir.path().to_path_buf(), paths.include_dir.clone());
    let (second, hit) = again.get(k, 90).unwrap();
    assert!(hit && first == second);
    // Another arch is another entry.
    assert_ne!(cache.path(k, 80).unwrap(), cache.path(k, 90).unwrap());
    // Bad include folder: NVRTC cannot find the CUDA headers, and the error carries its log.
    let bad = compile(k, 90, dir.path()).unwrap_err().to_string();
    assert!(bad.contains("cuda_fp16.h") && bad.contains("embedding"), "{bad}");
}

#[test]
fn every_kernel_fits_the_static_shared_memory_of_a_launch() {
    use lmplex_kernels::limits::{static_shared_bytes, MAX_STATIC_SHARED_BYTES};
    let Some(paths) = cuda() else { return };
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::new(dir.path().to_path_buf(), paths.include_dir.clone());
    let mut largest = (0, String::new());
    for k in all_kernels() {
        let (cubin, _) = cache.get(&k, 90).unwrap();
        for f in k.functions() {
            let bytes = static_shared_bytes(&cubin, &f).expect("an ELF64 CUBIN");
            assert!(bytes <= MAX_STATIC_SHARED_BYTES, "{f}: {bytes} bytes of static shared memory");
            largest = largest.max((bytes, f));
        }
    }
    // The sampling kernel's 1024 partial sums (4 KiB) and block_max's 32 floats at least.
    eprintln!("largest static shared memory: {} bytes ({})", largest.0, largest.1);
    assert!(largest.0 >= 4096 + 128, "the CUBIN's shared sections were not read: {largest:?}");
}
