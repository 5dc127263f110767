use super::*;
use half::f16;

/// The kernel families this CPU runs.
fn isas() -> Vec<Isa> {
    let mut v = vec![Isa::Portable];
    if crate::qmatmul::has_avx2() {
        v.push(Isa::Avx2);
    }
    if Isa::detect() == Isa::Avx512 {
        v.push(Isa::Avx512);
    }
    v
}

fn gen(n: usize, seed: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7919 + seed * 104_729) % 1009) as f32 / 504.0 - 1.0).collect()
}

/// A pool of `blocks` blocks with one sequence's keys and values (row-major `[len, kw]`, as
/// stored: rounded to `T`, times their scales for int8) written through a reversed block
/// table, in the cache layout; int8's K and V scales in `ks` and `vs` (else empty).
struct Pool<T> {
    k: Vec<T>,
    v: Vec<T>,
    ks: Vec<f32>,
    vs: Vec<f32>,
    table: Vec<u32>,
    keys: Vec<f32>,
    vals: Vec<f32>,
}

impl<T> Pool<T> {
    /// The pool as the kernel sees it, reading the last of `kvh` KV heads.
    fn view(&self, bs: usize, kvh: usize, hd: usize) -> PagedKv<'_, T> {
        PagedKv {
            k: &self.k,
            v: &self.v,
            block_table: &self.table,
            block_size: bs,
            num_kv_heads: kvh,
            head_dim: hd,
            kv_head: kvh - 1,
            scales: (!self.ks.is_empty()).then_some(KvScales { k: &self.ks, v: &self.vs }),
        }
    }
}

fn pool<T: KvElem>(len: usize, bs: usize, kvh: usize, hd: usize) -> Pool<T> {
    use crate::kv_elem::{inv_scale, row_scale};
    let kw = kvh * hd;
    let blocks = len.div_ceil(bs) + 1;
    let table: Vec<u32> = (0..blocks as u32).rev().collect();
    // Slots past the sequence hold NaN (int8: zeros, with NaN scales): no row may ever read
    // them into its result.
    let nan = T::from_f32(f32::NAN);
    let (mut k, mut v) = (vec![nan; blocks * bs * kw], vec![nan; blocks * bs * kw]);
    let groups = T::DTYPE.scale_groups(hd);
    let (mut ks, mut vs) = (vec![f32::NAN; blocks * bs * kvh * groups], vec![f32::NAN; blocks * bs * kvh * groups]);
    let width = if groups > 0 { crate::kv_elem::KV_GROUP } else { hd };
    // Magnitudes that differ between neighbouring 32-dimension groups, so each int8 group has
    // its own scale.
    let shaped =
        |x: Vec<f32>| -> Vec<f32> { x.iter().enumerate().map(|(i, x)| x * [1.0, 0.5, 0.25][i / 32 % 3]).collect() };
    let (mut keys, mut vals) = (shaped(gen(len * kw, 2)), shaped(gen(len * kw, 3)));
    for pos in 0..len {
        let (b, off) = (table[pos / bs] as usize, pos % bs);
        for h in 0..kvh {
            for g in 0..groups.max(1) {
                let dims = pos * kw + h * hd + g * width..pos * kw + h * hd + ((g + 1) * width).min(hd);
                let (sk, sv) = (row_scale(T::DTYPE, &keys[dims.clone()]), row_scale(T::DTYPE, &vals[dims.clone()]));
                if groups > 0 {
                    (ks[((b * kvh + h) * groups + g) * bs + off], vs[((b * kvh + h) * groups + g) * bs + off]) =
                        (sk, sv);
                }
                for i in dims {
                    let e = i - pos * kw;
                    let (kq, vq) = (T::from_f32(keys[i] * inv_scale(sk)), T::from_f32(vals[i] * inv_scale(sv)));
                    k[b * bs * kw + e * bs + off] = kq;
                    v[(b * bs + off) * kw + e] = vq;
                    (keys[i], vals[i]) = (kq.to_f32() * sk, vq.to_f32() * sv);
                }
            }
        }
    }
    Pool { k, v, ks, vs, table, keys, vals }
}

/// An int8 pool's values are within half a step (`scale / 2`) of the f32 ones, and each group's
/// largest magnitude is stored exactly as 127 steps.
#[test]
fn int8_pool_rounds_each_group_to_its_scale() {
    let (len, bs, kvh, hd) = (40, 16, 2, 64);
    let (q, exact) = (pool::<i8>(len, bs, kvh, hd), pool::<f32>(len, bs, kvh, hd).keys);
    let g = crate::kv_elem::KV_GROUP;
    for (row, want) in q.keys.chunks_exact(g).zip(exact.chunks_exact(g)) {
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
        assert!(row.iter().zip(want).all(|(a, b)| (a - b).abs() <= scale * 0.5 + 1e-7));
        assert!(row.iter().any(|a| (a.abs() - scale * 127.0).abs() <= 1e-6));
    }
}

/// Every family matches a naive softmax attention over the stored (f32, f16 or int8) keys and
/// values, and each row's output is bit-identical whether it runs alone, with its item, or
/// with a different set of rows: plain, with sliding windows (inside a chunk, on a chunk
/// boundary, of one key, longer than the context), with a soft-cap, and with both.
#[test]
fn matches_naive_and_rows_are_independent() {
    let scaled = |hd: usize| AttnOpts::scaled(1.0 / (hd as f32).sqrt());
    let variants: [&dyn Fn(usize) -> AttnOpts; 7] = [
        &|hd| scaled(hd),
        &|hd| AttnOpts { window: Some(20), ..scaled(hd) },
        &|hd| AttnOpts { window: Some(16), ..scaled(hd) },
        &|hd| AttnOpts { window: Some(1), ..scaled(hd) },
        &|hd| AttnOpts { window: Some(500), ..scaled(hd) },
        &|hd| AttnOpts { softcap: Some(0.3), ..scaled(hd) },
        &|hd| AttnOpts { softcap: Some(0.5), window: Some(7), scale: 0.2 / (hd as f32).sqrt(), bf16_prompt: false },
    ];
    for opts in variants {
        matches_naive_and_rows_are_independent_for::<f32>(opts);
        matches_naive_and_rows_are_independent_for::<f16>(opts);
        matches_naive_and_rows_are_independent_for::<i8>(opts);
    }
}

fn matches_naive_and_rows_are_independent_for<T: KvElem + std::fmt::Debug>(opts_for: &dyn Fn(usize) -> AttnOpts) {
    // (block_size, kv heads, head_dim): 16/64 and 32/128 and 16/80 take the AVX-512 build
    // where present (80: a 16-wide tail); 2/8 and 16/72 the portable one.
    for (bs, kvh, hd) in [(16usize, 2usize, 64usize), (32, 2, 128), (16, 1, 80), (2, 2, 8), (16, 2, 72)] {
        let positions = [0usize, 1, 5, 15, 16, 17, 31, 33, 40, 63, 64, 70];
        let len = positions[positions.len() - 1] + 1;
        let p = pool::<T>(len, bs, kvh, hd);
        let kw = kvh * hd;
        let heads = 3;
        let q = gen(positions.len() * heads * hd, 1);
        let lens: Vec<usize> = positions.iter().flat_map(|&pos| [pos + 1; 3]).collect();
        let opts = opts_for(hd);
        let kv = p.view(bs, kvh, hd);
        let mut results = Vec::new();
        for isa in isas() {
            let mut out = vec![0f32; q.len()];
            attend_with(
                isa,
                Query { q: &q, lens: &lens, prompt: false },
                &kv,
                &opts,
                &mut out,
                &mut Scratch::default(),
            );
            for (r, &n) in lens.iter().enumerate() {
                let qr = &q[r * hd..(r + 1) * hd];
                let first = opts.window.map_or(0, |w| n.saturating_sub(w));
                let cap = |x: f64| opts.softcap.map_or(x, |c| c as f64 * (x / c as f64).tanh());
                let s: Vec<f64> = (first..n)
                    .map(|j| {
                        let dot =
                            (0..hd).map(|c| (qr[c] * opts.scale) as f64 * p.keys[j * kw + (kvh - 1) * hd + c] as f64);
                        cap(dot.sum())
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for c in 0..hd {
                    let want: f64 =
                        (first..n).map(|j| e[j - first] / z * p.vals[j * kw + (kvh - 1) * hd + c] as f64).sum();
                    let got = out[r * hd + c];
                    assert!(
                        (want - got as f64).abs() < 2e-5,
                        "{isa:?} bs{bs} hd{hd} {opts:?} row {r} dim {c}: {want} vs {got}"
                    );
                }
                let mut alone = vec![0f32; hd];
                attend_with(
                    isa,
                    Query { q: qr, lens: &lens[r..r + 1], prompt: false },
                    &kv,
                    &opts,
                    &mut alone,
                    &mut Scratch::default(),
                );
                assert_eq!(alone, out[r * hd..(r + 1) * hd], "{isa:?} bs{bs} hd{hd}: row {r} changes with its item");
            }
            // The second half of the rows on its own (other tile boundaries, fewer rows).
            let h = lens.len() / 2 + 1;
            let mut tail = vec![0f32; (lens.len() - h) * hd];
            attend_with(
                isa,
                Query { q: &q[h * hd..], lens: &lens[h..], prompt: false },
                &kv,
                &opts,
                &mut tail,
                &mut Scratch::default(),
            );
            assert_eq!(tail, out[h * hd..], "{isa:?} bs{bs} hd{hd}: rows change with the rows before them");
            results.push((isa, out));
        }
        // The AVX2 build of the portable kernel gives the portable kernel's bits.
        let of = |i: Isa| results.iter().find(|(x, _)| *x == i).map(|(_, o)| o);
        if let (Some(a), Some(b)) = (of(Isa::Portable), of(Isa::Avx2)) {
            assert_eq!(a, b, "bs{bs} hd{hd}: the AVX2 build differs from the portable one");
        }
    }
}

/// A row of a long context gets (nearly) all its weight on one key when that key's score
/// dominates, across chunk boundaries: the running maximum and rescaling are right.
#[test]
fn a_dominant_key_wins_in_every_chunk_position() {
    let (bs, hd, len) = (16usize, 16usize, 50usize);
    for isa in isas() {
        for hot in [0usize, 15, 16, 33, 49] {
            let mut p = pool::<f32>(len, bs, 1, hd);
            let b = p.table[hot / bs] as usize;
            for c in 0..hd {
                p.k[b * bs * hd + c * bs + hot % bs] = 4.0;
            }
            let kv = p.view(bs, 1, hd);
            let q = vec![4.0f32; hd];
            let mut out = vec![0f32; hd];
            attend_with(
                isa,
                Query { q: &q, lens: &[len], prompt: false },
                &kv,
                &AttnOpts::scaled(1.0),
                &mut out,
                &mut Scratch::default(),
            );
            for (c, (o, want)) in out.iter().zip(&p.vals[hot * hd..]).enumerate() {
                assert!((o - want).abs() < 1e-6, "{isa:?} hot {hot} dim {c}");
            }
        }
    }
}

/// Half to single conversion (`KvElem::to_f32`, the portable kernel's) is exact for all 65,536
/// halves: subnormals, infinities and NaN payloads included.
#[test]
fn f16_widening_is_exact() {
    for h in 0..=u16::MAX {
        let (got, want) = (crate::kv_elem::f16_bits_to_f32(h), f16::from_bits(h).to_f32());
        assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{h:#06x}: {got} vs {want}");
    }
}

/// bf16 of `x` as f64 (round to nearest even), what the AMX kernel feeds the tile unit.
fn bf16(x: f32) -> f64 {
    half::bf16::from_f32(x).to_f64()
}

/// Prompt rows with `bf16_prompt` on a CPU with AMX or AVX512_BF16 (the unit `amx::unit`
/// picks): every row is within bf16's error of a naive softmax attention over the bf16-rounded
/// query, keys and values (and not the f32 kernel's result, so the tile path really ran), and
/// bit-identical alone, in its item, or with other rows before it, across 64-key blocks,
/// windows, soft-caps, f32 and f16 caches and head sizes of 64, 96 and 128.
#[test]
fn bf16_prompt_rows_are_bf16_attention_and_independent() {
    if Isa::detect() != Isa::Avx512 || super::amx::unit(64, 16).is_none() {
        return; // without AMX or AVX512_BF16 no tile unit runs: the other tests cover this CPU
    }
    let scaled = |hd: usize| AttnOpts { bf16_prompt: true, ..AttnOpts::scaled(1.0 / (hd as f32).sqrt()) };
    let variants: [&dyn Fn(usize) -> AttnOpts; 4] = [
        &|hd| scaled(hd),
        &|hd| AttnOpts { window: Some(70), ..scaled(hd) },
        &|hd| AttnOpts { window: Some(1), ..scaled(hd) },
        &|hd| AttnOpts { softcap: Some(0.5), window: Some(20), ..scaled(hd) },
    ];
    for opts in variants {
        amx_rows_for::<f32>(opts);
        amx_rows_for::<f16>(opts);
        amx_rows_for::<i8>(opts);
    }
}

fn amx_rows_for<T: KvElem + std::fmt::Debug>(opts_for: &dyn Fn(usize) -> AttnOpts) {
    for (bs, kvh, hd) in [(16usize, 2usize, 64usize), (32, 1, 96), (16, 2, 128)] {
        let positions = [0usize, 1, 5, 15, 16, 31, 63, 64, 65, 100, 127, 128, 150];
        let len = positions[positions.len() - 1] + 1;
        let (p, kw, heads) = (pool::<T>(len, bs, kvh, hd), kvh * hd, 3);
        let q: Vec<f32> = gen(positions.len() * heads * hd, 1).iter().map(|x| x * 3.0).collect();
        let lens: Vec<usize> = positions.iter().flat_map(|&pos| [pos + 1; 3]).collect();
        let opts = opts_for(hd);
        let kv = p.view(bs, kvh, hd);
        let run = |q: &[f32], lens: &[usize], prompt: bool| {
            let mut out = vec![0f32; q.len()];
            attend_with(Isa::Avx512, Query { q, lens, prompt }, &kv, &opts, &mut out, &mut Scratch::default());
            out
        };
        let out = run(&q, &lens, true);
        assert_ne!(out, run(&q, &lens, false), "bs{bs} hd{hd}: the prompt rows took the f32 kernel");
        let at = |j: usize, c: usize| j * kw + (kvh - 1) * hd + c;
        for (r, &n) in lens.iter().enumerate() {
            let qr = &q[r * hd..(r + 1) * hd];
            let first = opts.first_key(n);
            let cap = |x: f64| opts.softcap.map_or(x, |c| c as f64 * (x / c as f64).tanh());
            let s: Vec<f64> = (first..n)
                .map(|j| cap((0..hd).map(|c| bf16(qr[c] * opts.scale) * bf16(p.keys[at(j, c)])).sum()))
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for c in 0..hd {
                let want: f64 = (first..n).map(|j| e[j - first] / z * bf16(p.vals[at(j, c)])).sum();
                // The weights are rounded to bf16 (2^-9 each, relative): at most 2^-9 of max |v|.
                let got = out[r * hd + c] as f64;
                assert!((want - got).abs() < 2.5e-3, "bs{bs} hd{hd} {opts:?} row {r} dim {c}: {want} vs {got}");
            }
            let alone = run(qr, &lens[r..r + 1], true);
            assert_eq!(alone, out[r * hd..(r + 1) * hd], "bs{bs} hd{hd} {opts:?}: row {r} changes with its item");
        }
        for h in [1, 7, lens.len() / 2 + 1] {
            let tail = run(&q[h * hd..], &lens[h..], true);
            assert_eq!(tail, out[h * hd..], "bs{bs} hd{hd}: rows change with the rows before them ({h})");
        }
    }
}

/// The rotation is llama.cpp's matrix (`ggml_gen_hadamard`: Sylvester's order, scaled by
/// `1 / sqrt(n)`), orthonormal and its own inverse, block by block.
#[test]
fn hadamard_is_llama_cpp_rotation_and_its_own_inverse() {
    use crate::kv_elem::{hadamard, KvDtype, KvRotation};
    for n in [1usize, 2, 4, 64, 128] {
        // llama.cpp's generator.
        let mut m = vec![0f32; n * n];
        m[0] = 1.0 / (n as f32).sqrt();
        let mut s = 1;
        while s < n {
            for i in 0..s {
                for j in 0..s {
                    let v = m[i * n + j];
                    (m[(i + s) * n + j], m[i * n + j + s], m[(i + s) * n + j + s]) = (v, v, -v);
                }
            }
            s *= 2;
        }
        let x = gen(2 * n, 7);
        let mut y = x.clone();
        hadamard(&mut y, n);
        for b in 0..2 {
            for i in 0..n {
                let want: f32 = (0..n).map(|j| m[i * n + j] * x[b * n + j]).sum();
                assert!((want - y[b * n + i]).abs() < 1e-5, "n{n} block {b} row {i}");
            }
        }
        hadamard(&mut y, n);
        assert!(x.iter().zip(&y).all(|(a, b)| (a - b).abs() < 1e-5), "n{n}: not its own inverse");
    }
    assert_eq!(KvRotation::of(KvDtype::I8, 64), Some(KvRotation { k: 64, v: 64 }));
    assert_eq!(KvRotation::of(KvDtype::I8, 128), Some(KvRotation { k: 128, v: 64 }));
    assert_eq!(KvRotation::of(KvDtype::I8, 192), Some(KvRotation { k: 64, v: 64 }));
    assert_eq!(KvRotation::of(KvDtype::I8, 80), None);
    assert_eq!(KvRotation::of(KvDtype::F16, 128), None);
}
