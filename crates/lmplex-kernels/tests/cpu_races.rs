//! The CPU execution layer's race check catches planted bugs: a kernel is run with the threads
//! of each phase in forward, reverse and random order, and a missing `__syncthreads` changes the
//! result with the order, also where only warps drifting apart between barriers expose it (the
//! tile GEMM's staging); a block reduction that only half the block reaches is an error (a
//! device would hang or read garbage), not a wrong number. The unaltered kernels give the same
//! bits in every order. Needs a C++ compiler (g++ or clang++), nothing CUDA.

use lmplex_kernels::{all_kernels, CpuKernels, KernelSource, Order};
use std::ffi::c_void;

const ORDERS: [Order; 4] = [Order::Forward, Order::Reverse, Order::Random(1), Order::Random(2)];

/// `argmax.cu` or `rmsnorm.cu` with `edit` applied (which must change the text).
fn altered(name: &'static str, edit: impl Fn(&str) -> String, functions: &'static [&'static str]) -> KernelSource {
    let original = all_kernels().into_iter().find(|k| k.name == name).unwrap().code();
    let code = edit(original);
    assert_ne!(code, original, "the edit did not apply");
    KernelSource::custom(name, Box::leak(code.into_boxed_str()), functions)
}

fn build(sources: Vec<KernelSource>) -> (tempfile::TempDir, CpuKernels) {
    let dir = tempfile::tempdir().unwrap();
    let k = CpuKernels::build_sources(dir.path(), sources).unwrap_or_else(|e| panic!("{e}"));
    (dir, k)
}

/// Row-wise argmax of 4 rows of 3000 pseudo-random logits, one output per order.
fn argmaxes(k: &CpuKernels) -> Vec<Vec<u32>> {
    let vocab = 3000i32;
    let logits: Vec<f32> = (0..4 * 3000u32).map(|i| ((i.wrapping_mul(2654435761) >> 8) % 10007) as f32).collect();
    ORDERS
        .iter()
        .map(|&order| {
            let mut out = vec![0u32; 4];
            let (mut lp, mut op, mut v) = (logits.as_ptr(), out.as_mut_ptr(), vocab);
            let mut args: Vec<*mut c_void> = vec![
                (&mut lp as *mut *const f32).cast(),
                (&mut op as *mut *mut u32).cast(),
                (&mut v as *mut i32).cast(),
            ];
            // SAFETY: argmax_f32(const float*, u32*, int) over 4 rows of `vocab` logits.
            unsafe { k.launch("argmax_f32", (4, 1, 1), (1024, 1, 1), &mut args, order) }.unwrap();
            out
        })
        .collect()
}

#[test]
fn argmax_gives_the_same_bits_in_every_order() {
    let (_d, k) = build(vec![all_kernels().into_iter().find(|k| k.name == "argmax").unwrap()]);
    let outs = argmaxes(&k);
    assert!(outs.iter().all(|o| o == &outs[0]), "{outs:?}");
}

#[test]
fn a_missing_barrier_in_argmax_changes_the_result_with_the_order() {
    let racy = altered("argmax", |c| c.replacen("        __syncthreads();\n    }\n", "    }\n", 1), &["argmax_f32"]);
    let (_d, k) = build(vec![racy]);
    let outs = argmaxes(&k);
    assert!(outs.iter().any(|o| o != &outs[0]), "the race went unseen: {outs:?}");
}

/// fused_add_rmsnorm_f32 over one row of 64 with 256 threads, in `order`.
fn rmsnorm_row(k: &CpuKernels, order: Order) -> lmplex_core::Result<()> {
    let (x, mut res, w, mut out) = (vec![1f32; 64], vec![0f32; 64], vec![1f32; 64], vec![0f32; 64]);
    let (mut xp, mut rp, mut wp, mut op) = (x.as_ptr(), res.as_mut_ptr(), w.as_ptr(), out.as_mut_ptr());
    let (mut h, mut eps, mut off, mut add) = (64i32, 1e-6f32, 0f32, 0i32);
    let mut args: Vec<*mut c_void> = vec![
        (&mut xp as *mut *const f32).cast(),
        (&mut rp as *mut *mut f32).cast(),
        (&mut wp as *mut *const f32).cast(),
        (&mut op as *mut *mut f32).cast(),
        (&mut h as *mut i32).cast(),
        (&mut eps as *mut f32).cast(),
        (&mut off as *mut f32).cast(),
        (&mut add as *mut i32).cast(),
    ];
    // SAFETY: fused_add_rmsnorm_f32's parameter list over one row of 64.
    unsafe { k.launch("fused_add_rmsnorm_f32", (1, 1, 1), (256, 1, 1), &mut args, order) }
}

#[test]
fn a_block_reduction_reached_by_half_the_block_is_an_error() {
    let half = altered(
        "rmsnorm",
        |c| {
            c.replace(
                "    ss = block_sum(ss);",
                "    if (threadIdx.x >= blockDim.x / 2) return;\n    ss = block_sum(ss);",
            )
        },
        &["fused_add_rmsnorm_f32"],
    );
    let (_d, k) = build(vec![half]);
    let err = rmsnorm_row(&k, Order::Forward).unwrap_err().to_string();
    assert!(err.contains("__syncthreads reached by 128 of 256 threads"), "{err}");
    // The layer recovers: the same kernels run again after the error (and fail the same way).
    let again = rmsnorm_row(&k, Order::Reverse);
    assert!(again.is_err());
}

#[test]
fn a_shuffle_that_a_lane_never_reaches_is_an_error() {
    let skip = altered(
        "rmsnorm",
        |c| c.replace("    ss = block_sum(ss);", "    if (threadIdx.x == 3) return;\n    ss = block_sum(ss);"),
        &["fused_add_rmsnorm_f32"],
    );
    let (_d, k) = build(vec![skip]);
    let err = rmsnorm_row(&k, Order::Random(3)).unwrap_err().to_string();
    assert!(err.contains("lane 3 of the mask never reaches the warp operation"), "{err}");
}

/// tgemm_dense_f16 over 64 rows x 64 columns x k 64 (two steps of k), one output per order.
fn tgemm_outputs(k: &CpuKernels) -> Vec<Vec<f32>> {
    let (m, n, kk) = (64usize, 64usize, 64usize);
    // Small integers in f16: exact products and sums, so only a race can change a bit.
    let f16 = |v: u32| half::f16::from_f32((v % 7) as f32 - 3.0).to_bits();
    let w: Vec<u16> = (0..(n * kk) as u32).map(|i| f16(i.wrapping_mul(2654435761) >> 7)).collect();
    let x: Vec<u16> = (0..(m * kk) as u32).map(|i| f16(i.wrapping_mul(40503) >> 3)).collect();
    ORDERS
        .iter()
        .map(|&order| {
            let mut y = vec![0f32; m * n];
            let (mut wp, mut xp, mut yp) = (w.as_ptr(), x.as_ptr(), y.as_mut_ptr());
            let (mut ni, mut ki, mut mi, mut ldy, mut f32_out) = (n as i32, kk as i32, m as i32, n as i32, 1i32);
            let mut args: Vec<*mut c_void> = vec![
                (&mut wp as *mut *const u16).cast(),
                (&mut xp as *mut *const u16).cast(),
                (&mut yp as *mut *mut f32).cast(),
                (&mut ni as *mut i32).cast(),
                (&mut ki as *mut i32).cast(),
                (&mut mi as *mut i32).cast(),
                (&mut ldy as *mut i32).cast(),
                (&mut f32_out as *mut i32).cast(),
            ];
            // SAFETY: tgemm_dense_f16(w, x, y, n_out, k, m, ldy, y_f32) over one 64x64 tile.
            unsafe { k.launch("tgemm_dense_f16", (1, 1, 1), (128, 1, 1), &mut args, order) }.unwrap();
            y
        })
        .collect()
}

#[test]
fn warps_drift_between_barriers_so_a_missing_one_in_tgemm_shows() {
    let tgemm = || all_kernels().into_iter().find(|k| k.name == "tgemm").unwrap();
    let (_d, k) = build(vec![tgemm()]);
    let outs = tgemm_outputs(&k);
    assert!(outs.iter().all(|o| o == &outs[0]), "the unaltered kernel differs by order");
    // Without the barrier that ends a step of k, a warp that runs ahead stages the next tiles
    // while the others still read this step's: each warp does as many mma as the others, so only
    // warps drifting apart between barriers exposes it.
    let racy = altered(
        "tgemm",
        |c| c.replacen("        __syncthreads();\n    }\n    for (int i", "    }\n    for (int i", 1),
        &["tgemm_dense_f16"],
    );
    let (_d2, k2) = build(vec![racy]);
    let bad = tgemm_outputs(&k2);
    assert!(bad.iter().any(|o| o != &outs[0]), "the race went unseen");
}
