//! The dense kernels against an f64 reference, and the module's invariant: each output is the
//! f32 FMA chain over the row in order, bit for bit, in every family, block size and batch.

use super::kernels::{self, Isa};
use super::*;

fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7919 + seed * 104729) % 1999) as f32 / 999.5 - 1.0).collect()
}

/// The invariant's chain, written plainly.
fn chain(w: &[f32], x: &[f32]) -> f32 {
    w.iter().zip(x).fold(0f32, |acc, (&a, &b)| a.mul_add(b, acc))
}

/// Every family this CPU runs (the portable one always).
fn families() -> Vec<Isa> {
    let mut v = vec![Isa::Portable];
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") && has!("f16c") {
            v.push(Isa::Avx2);
        }
        if has!("avx512f") && has!("avx2") && has!("fma") && has!("f16c") {
            v.push(Isa::Avx512);
        }
    }
    v
}

/// The three stored forms of one matrix, and its f32 values after rounding to each.
fn forms(n: usize, k: usize) -> Vec<(DenseWeight, Vec<f32>)> {
    let w = values(n * k, 1);
    let b: Vec<u16> = w.iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
    let h: Vec<u16> = w.iter().map(|&v| f16::from_f32(v).to_bits()).collect();
    vec![
        (DenseWeight::new(n, k, w.clone()), w),
        (DenseWeight::from_bf16(n, k, &b), b.iter().map(|&v| kernels::Bf16::widen(v)).collect()),
        (DenseWeight::from_f16(n, k, &h), h.iter().map(|&v| kernels::F16::widen(v)).collect()),
    ]
}

#[test]
fn every_row_is_the_fma_chain_in_every_batch() {
    // 70 rows: two full panels and a partial one; 50: a full panel and a partial one, which a
    // single row takes together (`kernels::avx512_row_by_two`); k odd.
    for n in [70, 50] {
        every_row_is_the_fma_chain_for(n);
    }
}

fn every_row_is_the_fma_chain_for(n: usize) {
    let (k, m) = (131, 19);
    let x = values(m * k, 2);
    for (dw, w) in forms(n, k) {
        let y = dw.matmul(&x, m);
        for i in 0..m {
            for r in 0..n {
                let want = chain(&w[r * k..(r + 1) * k], &x[i * k..(i + 1) * k]);
                assert_eq!(y[i * n + r].to_bits(), want.to_bits(), "{:?} ({i}, {r})", dw.dtype());
                let exact: f64 = (0..k).map(|j| w[r * k + j] as f64 * x[i * k + j] as f64).sum();
                assert!((exact - want as f64).abs() < 1e-4 * (1.0 + exact.abs()));
            }
        }
        // Alone and in sub-batches of any size: the same bits.
        for sub in [1, 2, 3, 8, 9] {
            for lo in (0..m).step_by(sub) {
                let hi = (lo + sub).min(m);
                assert_eq!(
                    dw.matmul(&x[lo * k..hi * k], hi - lo),
                    y[lo * n..hi * n],
                    "{:?} rows {lo}..{hi}",
                    dw.dtype()
                );
            }
        }
    }
}

#[test]
fn families_agree_bit_for_bit() {
    let (k, m) = (97, 11);
    let x = values(m * k, 3);
    for (dw, _) in forms(PANEL, k) {
        let mut outs = Vec::new();
        for isa in families() {
            for nr in [PANEL, 17, 1] {
                let mut out = vec![f32::NAN; m * PANEL];
                // SAFETY: `out` holds m rows of PANEL cells.
                unsafe {
                    match &dw.panels {
                        Panels::F32(v) => kernels::panel::<kernels::F32>(isa, v, k, &x, out.as_mut_ptr(), PANEL, nr),
                        Panels::Bf16(v) => kernels::panel::<kernels::Bf16>(isa, v, k, &x, out.as_mut_ptr(), PANEL, nr),
                        Panels::F16(v) => kernels::panel::<kernels::F16>(isa, v, k, &x, out.as_mut_ptr(), PANEL, nr),
                    }
                }
                for row in out.chunks(PANEL) {
                    assert!(row[nr..].iter().all(|v| v.is_nan()), "{isa:?} wrote past column {nr}");
                }
                outs.push((isa, nr, out));
            }
        }
        let (_, _, full) = &outs[0];
        for (isa, nr, out) in &outs {
            for (a, b) in out.chunks(PANEL).zip(full.chunks(PANEL)) {
                assert_eq!(a[..*nr], b[..*nr], "{:?}: {isa:?} with {nr} columns", dw.dtype());
            }
        }
    }
}

#[test]
fn storage_round_trips_and_concat_keeps_the_type() {
    for (dw, w) in forms(40, 9) {
        let mut row = vec![0f32; 9];
        for r in 0..40 {
            dw.row_into(r, &mut row);
            assert_eq!(row, w[r * 9..(r + 1) * 9]);
        }
        let both = DenseWeight::concat(&[&dw, &dw]).unwrap();
        assert_eq!((both.dims(), both.dtype()), ((80, 9), dw.dtype()));
        both.row_into(45, &mut row);
        assert_eq!(row, w[5 * 9..6 * 9]);
        // bf16 panels pad their k-steps to 32 for the AMX kernel.
        let kp = if dw.dtype() == DenseDtype::Bf16 { 32 } else { 9 };
        assert_eq!(dw.size_in_bytes(), 64 * kp * dw.dtype().size());
    }
    let (a, b) = (DenseWeight::new(1, 4, vec![0.0; 4]), DenseWeight::from_bf16(1, 4, &[0; 4]));
    assert!(DenseWeight::concat(&[&a, &b]).is_none(), "mixed element types");
}

#[test]
fn prompt_rows_are_close_and_batch_invariant() {
    // k odd and not a multiple of 32; 37 rows: two full 16-row tiles and a partial one.
    let (n, k, m) = (70, 131, 37);
    let x = values(m * k, 4);
    let kernels = TileKernel::all();
    if kernels.is_empty() {
        eprintln!("no AMX-BF16 or AVX512_BF16 here: prompt rows take the FMA chain (checked by the other tests)");
    }
    for act in [Activations::Split, Activations::Bf16] {
        for (dw, w) in forms(n, k) {
            let dw = dw.with_activations(act);
            let y = dw.matmul_prompt(&x, m);
            if dw.tile_kernel().is_none() {
                assert_eq!(y, dw.matmul(&x, m), "{:?} {act:?}: the FMA chain", dw.dtype());
            }
            if dw.dtype() == DenseDtype::F32 {
                continue;
            }
            // Each kernel this CPU has, whether or not it is chosen for this case.
            for &t in &kernels {
                prompt_rows_of(&dw, &w, &x, m, act, t);
            }
        }
    }
}

/// `dw`'s prompt rows with kernel `t` are close to the exact products and the same in every
/// sub-batch.
fn prompt_rows_of(dw: &DenseWeight, w: &[f32], x: &[f32], m: usize, act: Activations, t: TileKernel) {
    let (n, k) = dw.dims();
    let y = dw.matmul_prompt_with(x, m, Some(t));
    // Split: hi + lo carry 16 significant bits, 2^-16 of each product, and f32 sums;
    // f16 weights (always split) also drop `lo(w) * lo(x)`, below 2^-16 of a product.
    // Bf16: the products of the rounded activations, exact but for the f32 sums.
    let (xs, tol) = match (act, dw.dtype()) {
        (_, DenseDtype::F16) => (x.to_vec(), 4e-5),
        (Activations::Split, _) => (x.to_vec(), 2e-5),
        (Activations::Bf16, _) => (x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect(), 2e-6),
    };
    for i in 0..m {
        for r in 0..n {
            let (wr, xr) = (&w[r * k..(r + 1) * k], &xs[i * k..(i + 1) * k]);
            let exact: f64 = wr.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum();
            let size: f64 = wr.iter().zip(xr).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
            let err = (y[i * n + r] as f64 - exact).abs();
            assert!(err <= size * tol + 1e-6, "{t:?} {act:?} ({i}, {r}): {} vs {exact}", y[i * n + r]);
        }
    }
    for sub in [1, 5, 16, 17, 33] {
        for lo in (0..m).step_by(sub) {
            let hi = (lo + sub).min(m);
            let part = dw.matmul_prompt_with(&x[lo * k..hi * k], hi - lo, Some(t));
            assert_eq!(part, y[lo * n..hi * n], "{t:?} {act:?} rows {lo}..{hi}");
        }
    }
}

#[test]
fn split_carries_sixteen_bits_and_pads_with_zeros() {
    let (m, k) = (3, 40);
    let x: Vec<f32> = values(m * k, 5).iter().enumerate().map(|(i, v)| v * (1.0 + i as f32 * 0.37)).collect();
    let mut out = crate::aligned::Aligned::new();
    amx::split(&x, m, k, Activations::Split, &mut out);
    let kp = amx::padded(k);
    assert_eq!((kp, out.len()), (64, 2 * 16 * 64));
    let widen = kernels::Bf16::widen;
    for i in 0..16 {
        for j in 0..kp {
            let at = amx::split_at(i, j, kp, Activations::Split);
            let (h, l) = (widen(out[at]), widen(out[at + amx::TILE]));
            let want = if i < m && j < k { x[i * k + j] } else { 0.0 };
            assert!(((h + l) - want).abs() <= want.abs() * 2f32.powi(-16), "({i}, {j}): {h} + {l} vs {want}");
        }
    }
    // One part: each value rounded to bf16, tiles of `hi` alone.
    amx::split(&x, m, k, Activations::Bf16, &mut out);
    assert_eq!(out.len(), 16 * 64);
    for i in 0..16 {
        for j in 0..kp {
            let want = if i < m && j < k { bf16::from_f32(x[i * k + j]).to_bits() } else { 0 };
            assert_eq!(out[amx::split_at(i, j, kp, Activations::Bf16)], want, "({i}, {j})");
        }
    }
}

/// The vector split gives the scalar split's bits, for every run length, both signs, tiny
/// and huge values.
#[cfg(target_arch = "x86_64")]
#[test]
fn split_runs_agree_in_every_family() {
    if Isa::detect() != Isa::Avx512 {
        return;
    }
    let src: Vec<f32> = values(32, 9).iter().enumerate().map(|(i, v)| v * 10f32.powi(i as i32 - 16) * 3.3).collect();
    for len in [0, 1, 15, 16, 17, 31, 32] {
        let mut a = [[0xaaaau16; 32]; 2];
        let mut b = [[0x5555u16; 32]; 2];
        // SAFETY: each run writes 32 values of `hi` and `lo`; AVX-512 F detected.
        unsafe {
            let [ah, al] = &mut a;
            amx::split_run(&src[..len], ah.as_mut_ptr(), Some(al.as_mut_ptr()));
            let [bh, bl] = &mut b;
            amx::split_run_avx512(&src[..len], bh.as_mut_ptr(), Some(bl.as_mut_ptr()));
        }
        assert_eq!(a, b, "a run of {len}");
        assert!(a[0][len..].iter().chain(&a[1][len..]).all(|&v| v == 0), "zeros past {len}");
    }
}

#[test]
fn f16_parts_are_exact_in_every_family() {
    // Spread f16 bit patterns with exponent bit 0x0400 cleared (so all finite: subnormals,
    // zeros and both signs included), in a panel of 70 k-steps (padded to 96).
    let k = 70;
    let src: Vec<u16> = (0..PANEL * k).map(|i| ((i * 2654435761) % 0x10000) as u16).map(|b| b & 0xfbff).collect();
    let (mut hi, mut lo) = (crate::aligned::Aligned::new(), crate::aligned::Aligned::new());
    amx::f16_parts(&src, k, &mut hi, &mut lo);
    assert_eq!((hi.len(), lo.len()), (PANEL * 96, PANEL * 96));
    let widen = kernels::Bf16::widen;
    for j in 0..96 {
        for c in 0..PANEL {
            let at = kernels::Bf16::at(c, j);
            let want = if j < k { f16::from_bits(src[j * PANEL + c]).to_f32() } else { 0.0 };
            assert_eq!(widen(hi[at]) + widen(lo[at]), want, "({c}, {j})");
            assert_eq!(hi[at], bf16::from_f32(want).to_bits(), "({c}, {j}): hi is the nearest bf16");
        }
    }
    // Two f16 matrices of one shape taken in turn: each thread's converted panel is keyed by
    // its matrix, so neither borrows the other's.
    let (n, m) = (64, 20);
    let x = values(m * k, 6);
    let (a, b) = (values(n * k, 7), values(n * k, 8));
    let to16 = |w: &[f32]| w.iter().map(|&v| f16::from_f32(v).to_bits()).collect::<Vec<_>>();
    let (wa, wb) = (DenseWeight::from_f16(n, k, &to16(&a)), DenseWeight::from_f16(n, k, &to16(&b)));
    let (ya, yb) = (wa.matmul_prompt(&x, m), wb.matmul_prompt(&x, m));
    assert_ne!(ya, yb);
    assert_eq!((wa.matmul_prompt(&x, m), wb.matmul_prompt(&x, m)), (ya, yb));
    let (mut hp, mut lp) = (vec![0; hi.len()], vec![0; lo.len()]);
    amx::f16_parts_portable(&src, k, &mut hp, &mut lp);
    assert!(hp[..] == hi[..] && lp[..] == lo[..], "the portable build gives the same parts");
}

/// An interleaved gated matrix gives, for prompt and generated rows, the bits of the
/// `[gate | up]` matrix's product followed by `rowops::gated` (the AMX kernel's fused
/// activation included), alone and in any batch.
#[test]
fn gated_products_equal_product_then_activation() {
    use crate::rowops::{gated, Activation};
    let (width, k) = (48, 80); // three panels of 16 outputs; k not a multiple of 32
    for act in [Activations::Split, Activations::Bf16] {
        for (dw, _) in forms(2 * width, k) {
            let dw = dw.with_activations(act);
            let il = dw.interleave_halves().expect("48 outputs interleave");
            assert!(il.is_interleaved() && il.interleave_halves().is_none());
            for m in [1, 5, 33, 64] {
                let x = values(m * k, m);
                for f in [Activation::Silu, Activation::GeluTanh] {
                    assert_eq!(il.matmul_prompt_gated(&x, m, f), gated(f, dw.matmul_prompt(&x, m), None, width));
                    assert_eq!(il.matmul_gated(&x, m, f), gated(f, dw.matmul(&x, m), None, width));
                    for t in TileKernel::all().into_iter().map(Some).chain([None]) {
                        let want = gated(f, dw.matmul_prompt_with(&x, m, t), None, width);
                        let got = il.matmul_prompt_gated_with(&x, m, f, t);
                        assert_eq!(got, want, "{:?} {act:?} {t:?} m={m} {f:?}: prompt rows", dw.dtype());
                        let last = il.matmul_prompt_gated_with(&x[(m - 1) * k..], 1, f, t);
                        assert_eq!(last, got[(m - 1) * width..], "{:?} {t:?} m={m}: the last row alone", dw.dtype());
                    }
                }
            }
        }
    }
    assert!(forms(2 * 40, 8)[0].0.interleave_halves().is_none(), "40 is not a multiple of 16");
}
