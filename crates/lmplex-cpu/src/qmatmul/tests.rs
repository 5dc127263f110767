//! The kernels against the dequantized reference, across formats, row lengths (whole and
//! partial groups of units), kernel families and batch sizes.

use super::*;
use candle_core::{Device, Tensor};

/// The prompt kernel over many tiles (rows not multiples of its blocking, several input
/// tiles): every row equals that row alone.
#[test]
fn prompt_kernel_tiles_are_batch_invariant() {
    let (n, k, m) = (101, 4096, 150); // 4096: input tiles of 32 rows
    let w: Vec<f32> = (0..n * k).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let x: Vec<f32> = (0..m * k).map(|i| ((i * 104729) % 997) as f32 / 498.0 - 1.0).collect();
    let wt = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
    let qw = QWeight::from_qtensor(&QTensor::quantize(&wt, GgmlDType::Q4K).unwrap()).unwrap();
    let all = qw.matmul_prompt(&x, m);
    for i in [0, 7, 8, 31, 32, 33, 100, 149] {
        assert_eq!(qw.matmul_prompt(&x[i * k..(i + 1) * k], 1), all[i * n..(i + 1) * n], "row {i}");
    }
    let some = qw.matmul_prompt(&x[40 * k..77 * k], 37);
    assert_eq!(some, all[40 * n..77 * n]);
}

/// Tiles over many input and weight rows land in the right cells.
#[test]
fn tiles_cover_the_product() {
    let (n, m) = (70, 130);
    let y = by_weight_rows(n, m, |b, _| (0..b.li).for_each(|j| b.set(j, 0, (b.r * 1000 + b.i0 + j) as f32)));
    for i in 0..m {
        for r in 0..n {
            assert_eq!(y[i * n + r], (r * 1000 + i) as f32);
        }
    }
    // Blocks of up to three weight rows (an odd row count leaves a short block), for many
    // input rows and for one (decode's tiling), down to a single weight row.
    for (n, m) in [(71, 130), (71, 1), (1, 1), (2, 1)] {
        let y = by_weight_row_blocks(n, m, 3, |b, _| {
            let (li, nr) = (b.li, b.nr);
            for (j, k) in (0..li).flat_map(|j| (0..nr).map(move |k| (j, k))) {
                b.set(j, k, ((b.r + k) * 1000 + b.i0 + j) as f32);
            }
        });
        for i in 0..m {
            for r in 0..n {
                assert_eq!(y[i * n + r], (r * 1000 + i) as f32);
            }
        }
    }
}

/// The AVX2 activation quantizer gives the portable one's values.
#[test]
fn quantizers_agree() {
    if !has_avx2() {
        return;
    }
    let x: Vec<f32> = (0..32).map(|i| ((i * 7919) % 1000) as f32 / 333.0 - 1.5).collect();
    let (mut a, mut b) = ([0i16; 32], [0i16; 32]);
    let pa = acts::quantize_block(&x, &mut a);
    // SAFETY: avx2 detected above.
    let pb = unsafe { acts::quantize_block_avx2(&x, &mut b) };
    assert_eq!((pa, a), (pb, b));
}

/// Every supported type: fused or generic kernel equals dequantize-then-f32-matmul, and a
/// row's output is bit-identical for batch sizes 1 and 5. Rows of one whole group of 16
/// units (512), of a whole and a partial group (896: 16 + 12; K-quants 768: 16 + 8) and of
/// one partial group (64; K-quants 256).
#[test]
fn matches_dequantized_reference_and_is_batch_invariant() {
    for dt in [
        GgmlDType::Q4_0,
        GgmlDType::Q4_1,
        GgmlDType::Q5_0,
        GgmlDType::Q5_1,
        GgmlDType::Q8_0,
        GgmlDType::Q2K,
        GgmlDType::Q3K,
        GgmlDType::Q4K,
        GgmlDType::Q5K,
        GgmlDType::Q6K,
        GgmlDType::F16,
    ] {
        let ks: &[usize] = if dt.block_size() == 256 { &[512, 768, 256, 1280] } else { &[512, 896, 64, 576, 1152] };
        for &k in ks {
            check_format(dt, k);
        }
    }
}

fn check_format(dt: GgmlDType, k: usize) {
    {
        let (n, m) = (49, 7); // input groups of 4, 2 and 1; weight rows in pairs and one alone
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
        let x: Vec<f32> = (0..m * k).map(|i| ((i * 104729) % 997) as f32 / 498.0 - 1.0).collect();
        let wt = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&wt, dt).unwrap();
        let deq = q.dequantize(&Device::Cpu).unwrap().to_vec2::<f32>().unwrap();
        let qw = QWeight::from_qtensor(&q).unwrap();
        let mut row = vec![0f32; k];
        for (r, want) in deq.iter().enumerate() {
            qw.dequantize_row(r, &mut row);
            for (a, b) in want.iter().zip(&row) {
                assert!((a - b).abs() <= 1e-6 * a.abs().max(1e-3), "{dt:?} k={k}: row {r} dequantizes to {b}, not {a}");
            }
        }
        let y = qw.matmul(&x, m);
        // Every family this CPU runs: the same exact integer sums, rounded apart.
        for isa in [Isa::Avx512, Isa::Avx2, Isa::Portable] {
            let runs = match isa {
                Isa::Avx512 => Isa::detect() == Isa::Avx512,
                Isa::Avx2 => has_avx2(),
                Isa::Portable => true,
            };
            if !runs {
                continue;
            }
            let p = qw.matmul_with(&x, m, isa);
            if isa == Isa::Avx512 && super::family::vnni() {
                // `vpdpwssd` or `vpmaddwd` and an add: the same exact sums, so the same bits
                // (m = 7 runs four input rows fused, then two and one unfused)
                let plain = qw.matmul_with_vnni(&x, m, isa, false);
                assert_eq!(p, plain, "{dt:?} k={k}: AVX-512 with and without VNNI differ");
            }
            for (a, b) in y.iter().zip(&p) {
                assert!((a - b).abs() < 1e-4 * (1.0 + a.abs()), "{dt:?}: default {a} vs {isa:?} {b}");
            }
            assert_eq!(p[..n], qw.matmul_with(&x[..k], 1, isa)[..], "{dt:?}: {isa:?} changes with the batch");
            let pp = qw.matmul_prompt_with(&x, m, isa);
            for (a, b) in y.iter().zip(&pp) {
                assert!((a - b).abs() < 1e-3 * (1.0 + a.abs()), "{dt:?}: decode {a} vs {isa:?} prompt {b}");
            }
            for i in 0..m {
                let alone = qw.matmul_prompt_with(&x[i * k..(i + 1) * k], 1, isa);
                assert_eq!(alone, pp[i * n..(i + 1) * n], "{dt:?}: {isa:?} prompt row {i} changes with the batch");
            }
        }
        // The prompt kernel: f32 weights and activations, so within f32 rounding of the
        // dequantized product, and a row's value independent of m and of the tiles.
        let yp = qw.matmul_prompt(&x, m);
        for i in 0..m {
            for r in 0..n {
                let want: f32 = (0..k).map(|j| deq[r][j] * x[i * k + j]).sum();
                let got = y[i * n + r];
                assert!((want - got).abs() < 1e-3 * (1.0 + want.abs()), "{dt:?} [{i},{r}]: {want} vs {got}");
                let got = yp[i * n + r];
                assert!((want - got).abs() < 1e-4 * (1.0 + want.abs()), "{dt:?} prompt [{i},{r}]: {want} vs {got}");
            }
            let alone = qw.matmul_prompt(&x[i * k..(i + 1) * k], 1);
            assert_eq!(alone, yp[i * n..(i + 1) * n].to_vec(), "{dt:?}: prompt row {i} changes with the batch");
            let alone = qw.matmul(&x[i * k..(i + 1) * k], 1);
            assert_eq!(alone, y[i * n..(i + 1) * n].to_vec(), "{dt:?}: row {i} changes with the batch");
        }
    }
}

/// Joined weights give each part's products bit for bit; differing formats do not join.
#[test]
fn concat_equals_the_parts() {
    let k = 576; // a last group of 2 units: the quad tails run too
    let mk = |n: usize, seed: usize, dt: GgmlDType| {
        let w: Vec<f32> = (0..n * k).map(|i| (((i + seed) * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
        let t = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        QWeight::from_qtensor(&QTensor::quantize(&t, dt).unwrap()).unwrap()
    };
    let (a, b) = (mk(5, 1, GgmlDType::Q4_1), mk(7, 2, GgmlDType::Q4_1));
    let ab = QWeight::concat(&[&a, &b]).unwrap();
    assert_eq!(ab.dims(), (12, k));
    let m = 9;
    let x: Vec<f32> = (0..m * k).map(|i| ((i * 104729) % 997) as f32 / 498.0 - 1.0).collect();
    for prompt in [false, true] {
        let mul = |w: &QWeight| if prompt { w.matmul_prompt(&x, m) } else { w.matmul(&x, m) };
        let (ya, yb, yab) = (mul(&a), mul(&b), mul(&ab));
        for i in 0..m {
            assert_eq!(yab[i * 12..i * 12 + 5], ya[i * 5..(i + 1) * 5], "row {i} (prompt {prompt})");
            assert_eq!(yab[i * 12 + 5..(i + 1) * 12], yb[i * 7..(i + 1) * 7], "row {i} (prompt {prompt})");
        }
    }
    assert!(QWeight::concat(&[&a, &mk(3, 3, GgmlDType::Q8_0)]).is_none());
}
