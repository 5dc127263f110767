//! `device="cuda"` on a machine without a usable GPU is an `InvalidRequest` that names what is
//! missing, never a panic or a silent CPU run; `device="auto"` runs on the CPU. (The CUDA
//! backend's parity tests need a GPU and live in `tests/gpu/test_engine_gpu.py`.)

mod common;

use common::write_tiny_llama;
use lmplex_core::{DeviceKind, Error, ModelConfig};
use lmplex_engine::Engine;

/// Whether this machine has an NVIDIA driver (then the error path cannot be tested here).
fn has_driver() -> bool {
    // SAFETY: only tries to dlopen the driver's names; nothing in it is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

#[test]
fn cuda_without_a_gpu_is_an_invalid_request_and_auto_runs_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(dir.path(), 3);
    let mut cfg = ModelConfig::new(dir.path().to_string_lossy());
    cfg.device = DeviceKind::Auto;
    let auto = Engine::new(cfg.clone(), dir.path()).unwrap();
    assert_eq!(auto.info().runtime.device, "cpu");
    assert_eq!(auto.memory().workspace, 0);
    if has_driver() {
        eprintln!("skipped the error path: this machine has an NVIDIA driver");
        return;
    }
    cfg.device = DeviceKind::Cuda;
    match Engine::new(cfg, dir.path()) {
        Err(Error::InvalidRequest(msg)) => assert!(msg.contains("CUDA is not available"), "{msg}"),
        Err(e) => panic!("expected InvalidRequest, got {e:?}"),
        Ok(_) => panic!("device='cuda' loaded without a GPU"),
    }
}
