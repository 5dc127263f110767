//! `device="cuda"` on a machine without a usable GPU is an `InvalidRequest` that names what is
//! missing, never a panic or a silent CPU run; `device="auto"` runs on the CPU there. A
//! `ModelHost` plans a CUDA model against its device's budget before anything loads, and a
//! load that then fails gives its reservation back. (The CUDA backend's parity tests need a GPU
//! and live in `tests/gpu/test_engine_gpu.py`.)

mod common;

use common::write_tiny_llama;
use lmplex_core::{DeviceKind, Error, ModelConfig};
use lmplex_engine::{place, Engine, EnginePlan, ModelHost, Placement};

/// Whether this machine has an NVIDIA driver (then the error paths cannot be tested here).
fn has_driver() -> bool {
    // SAFETY: only tries to dlopen the driver's names; nothing in it is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

fn expect_unavailable(r: lmplex_core::Result<impl std::any::Any>) {
    match r {
        Err(Error::InvalidRequest(msg)) => assert!(msg.contains("CUDA is not available"), "{msg}"),
        Err(e) => panic!("expected InvalidRequest, got {e:?}"),
        Ok(_) => panic!("device='cuda' loaded without a GPU"),
    }
}

#[test]
fn cuda_without_a_gpu_is_an_invalid_request_and_auto_runs_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(dir.path(), 3);
    let mut cfg = ModelConfig::new(dir.path().to_string_lossy());
    cfg.device = DeviceKind::Auto;
    if has_driver() {
        eprintln!("skipped: this machine has an NVIDIA driver");
        return;
    }
    assert_eq!(place(DeviceKind::Auto), Placement::Cpu);
    let auto = Engine::new(cfg.clone()).unwrap();
    assert_eq!(auto.info().runtime.device, "cpu");
    assert_eq!(auto.memory().workspace, 0);
    for n in [0, 5] {
        cfg.device = DeviceKind::Cuda(n);
        expect_unavailable(Engine::new(cfg.clone()));
    }
}

#[test]
fn a_cuda_plan_counts_the_workspace_and_the_compute_dtype() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(dir.path(), 3);
    let mut cfg = ModelConfig::new(dir.path().to_string_lossy());
    cfg.device = DeviceKind::Cpu;
    let cpu = EnginePlan::new(&cfg).unwrap();
    assert_eq!((cpu.placement, cpu.workspace_bytes), (Placement::Cpu, 0));
    cfg.device = DeviceKind::Cuda(1);
    cfg.dtype = lmplex_core::DType::F32;
    let gpu = EnginePlan::new(&cfg).unwrap();
    assert_eq!(gpu.placement, Placement::Cuda(1));
    // Every weight in f32, and the f32 rotary frequencies.
    let a = &gpu.model.args;
    assert_eq!(gpu.model.weight_bytes, a.num_parameters() * 4 + a.head_dim / 2 * 4);
    // cuBLAS's 32 MiB plus the step buffers for 2048 tokens.
    assert!(gpu.workspace_bytes > 32 << 20, "{}", gpu.workspace_bytes);
    assert_eq!(gpu.device_bytes(), gpu.model.weight_bytes + gpu.kv.kv_cache_bytes() + gpu.workspace_bytes);
}

#[test]
fn a_host_plans_cuda_models_against_the_devices_budget() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(dir.path(), 3);
    let mut cfg = ModelConfig::new(dir.path().to_string_lossy());
    cfg.device = DeviceKind::Cuda(0);
    let plan = EnginePlan::new(&cfg).unwrap();
    let host = ModelHost::new(Some(1 << 30));
    host.set_cuda_budget(0, plan.device_bytes() - 1);
    match host.load(cfg.clone()) {
        Err(Error::Capacity(msg)) => {
            assert!(msg.contains("cuda:0's") && msg.contains("workspace on cuda:0"), "{msg}")
        }
        other => panic!("expected Capacity, got {:?}", other.map(|_| ())),
    }
    let mem = host.memory();
    assert_eq!((mem.cuda["cuda:0"].budget, mem.cuda["cuda:0"].reserved), (plan.device_bytes() - 1, 0));
    // Refused before the device was opened: nothing measured its context yet.
    assert_eq!(mem.cuda["cuda:0"].context, None);
    // The CPU's budget is its own: a CPU model still fits.
    cfg.device = DeviceKind::Cpu;
    cfg.served_model_name = Some("on-cpu".into());
    host.load(cfg.clone()).unwrap();
    assert!(host.reserved() > 0);
    assert_eq!(host.memory().cuda["cuda:0"].reserved, 0);
    if has_driver() {
        return;
    }
    // Room on the device: the plan passes, the load fails, the reservation is given back.
    host.set_cuda_budget(0, plan.device_bytes());
    cfg.device = DeviceKind::Cuda(0);
    cfg.served_model_name = Some("on-gpu".into());
    expect_unavailable(host.load(cfg.clone()));
    assert_eq!(host.memory().cuda["cuda:0"].reserved, 0);
    assert_eq!(host.known_names(), ["on-cpu"]);
    // A device without a set budget is probed first: no GPU, so nothing is reserved.
    cfg.device = DeviceKind::Cuda(1);
    expect_unavailable(host.load(cfg));
    assert!(!host.memory().cuda.contains_key("cuda:1"));
}
