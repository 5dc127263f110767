//! Every CUDA kernel instance (every entry point of every source, every dtype) runs on the CPU
//! and passes its checks: against its CPU twin or a float64 reference, bit-identical in forward,
//! reverse and random thread order, and row-for-row the same alone as in a batch. See
//! `lmplex_cuda::kernel_check` for the cases and tolerances. Needs a C++ compiler, no GPU.

use lmplex_cuda::kernel_check::run_all;

#[test]
fn every_kernel_instance_passes_on_the_cpu() {
    let reports = run_all("");
    let names: Vec<String> = lmplex_kernels::all_kernels().iter().flat_map(|k| k.functions()).collect();
    for n in &names {
        // The passes of paged attention (by rows, by tiles or on the tensor cores, then the
        // reduction) are launched, and checked, together, as are LoRA's shrink and expand.
        let stem = n.replace("_partition", "").replace("_tiles", "").replace("_reduce", "").replace("_tc", "");
        let stem = stem.replace("_one", "").replace("_shrink", "").replace("_expand", "");
        assert!(reports.iter().any(|r| r.kernel == *n || r.kernel == stem), "kernel {n} has no check");
    }
    let failed: Vec<_> = reports.iter().filter(|r| !r.passed()).collect();
    for r in &reports {
        eprintln!("{:<30} {:>2} cases  max error {:.2e}", r.kernel, r.cases, r.max_err);
    }
    assert!(failed.is_empty(), "{failed:#?}");
    assert!(reports.iter().all(|r| r.cases > 0));
}
