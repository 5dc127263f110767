//! The bf16 attention kernel for prompt rows (`AttnOpts::bf16_prompt`, `dtype="bfloat16"`, on a
//! CPU with AMX-BF16 or AVX512_BF16): flash attention's online softmax over fixed blocks of
//! `KB` keys (positions `0..64`, `64..128`, ...), the two products on a tile unit (`tiles`:
//! AMX's, or `vdpbf16ps` on vectors) in bf16 with f32 sums and the softmax in f32, the
//! precision of torch's bf16 flash attention.
//!
//! Arithmetic, per row (16 rows share a tile, each row's sums its own) and key block:
//! - scores: the query, scaled by `AttnOpts::scale` in f32 and rounded to bf16, times each key
//!   rounded to bf16 (from the cache's f32 or f16, or int8 times its scale), summed by `tdpbf16ps` into f32, 32
//!   dimensions per step in dimension order; then soft-capped in f32 when asked.
//! - weights: keys outside the row's window or past its length get zero weight; a block that
//!   holds none of the row's keys leaves the row untouched. Otherwise `m' = max(m, block max)`,
//!   `p = bf16(exp(s - m'))`, `alpha = exp(m - m')`, `l = l * alpha + sum(p)` (a fixed order),
//!   and the accumulator becomes `acc * alpha + P V`, `P V` the tile unit's f32 sums of the
//!   bf16 weights times the values (int8: times their scale) rounded to bf16, 32 keys per step in key order.
//! - output: `acc / l`.
//!
//! Invariants: a row's result depends only on its query, its context length and its sequence's
//! keys and values: the block grid is fixed by position, a tile row holds one row's sums, and
//! padding rows (zeros) only feed their own dropped results. The keys of a block past a row's
//! length enter its sums with weight exactly zero, so the values must be finite (an f16 cache
//! holds an infinity only if a value overflowed, which the FMA kernel would not read for rows
//! before it). These are not the FMA kernels' bits, so the engine gives this kernel prompt rows
//! only (`Query::prompt`), as it does for the dense prompt kernel.
//!
//! Layouts (u16 bf16 bits, each tile 16 rows of 64 bytes, stored in one piece): queries per
//! 16-row group and 32-dimension step, row-major; keys per block, dimension step and 16-key
//! tile as AMX's B operand (pair-row `p` holds dimensions `2p, 2p + 1` of each key); values per
//! block, 32-key step and 16-dimension tile (pair-row `p` holds keys `2p, 2p + 1`). Requires a
//! head_dim that is a multiple of 32 and a KV block size that is a multiple of 16.

use super::avx512::{exp, load16};
use super::tiles::Tiles;
use super::{AttnOpts, PagedKv, Query, Scratch};
use crate::aligned::Aligned;
use crate::amx::bf16_rne_lanes as rne;
use crate::kv_elem::KvElem;
use std::arch::x86_64::*;

// A 32-dimension step of keys is one int8 scale group (`convert_kv`).
const _: () = assert!(crate::kv_elem::KV_GROUP == 32);

/// Keys per online-softmax block: four 16-key score tiles.
const KB: usize = 64;
/// Rows per tile, and values (u16) per tile.
const TR: usize = 16;
const TILE: usize = 512;

/// The unit `attend` may run this kernel on for rows of this shape: AMX's tiles where the CPU
/// has them, else `vdpbf16ps` on vectors (`tiles`).
pub(super) fn unit(hd: usize, block_size: usize) -> Option<super::tiles::Unit> {
    use super::tiles::Unit;
    if !hd.is_multiple_of(32) || !block_size.is_multiple_of(16) {
        return None;
    }
    // `run` is compiled with AVX512_BF16 enabled for both units, so both need it (every CPU
    // with AMX-BF16 has it; the check keeps a CPU that hid it off the kernel).
    if !std::arch::is_x86_feature_detected!("avx512bf16") {
        return None;
    }
    if crate::amx::available() {
        Some(Unit::Amx)
    } else {
        crate::qmatmul::avx512_bf16().then_some(Unit::Vectors)
    }
}

/// Two vectors' bf16 parts as 16 pairs (`a` in each pair's low half), stored at `dst`.
#[inline(always)]
unsafe fn store_pairs(dst: *mut u16, a: __m512, b: __m512) {
    _mm512_storeu_si512(dst.cast(), _mm512_or_si512(rne(a), _mm512_slli_epi32::<16>(rne(b))));
}

/// Keys `k0..k0 + nb * KB` (those at or past `last` as zeros) of one KV head in the key and
/// value layouts (module docs), into `kb` and `vb`.
#[inline(always)]
unsafe fn convert_kv<T: KvElem>(
    kv: &PagedKv<'_, T>,
    k0: usize,
    nb: usize,
    last: usize,
    kb: &mut Aligned<u16>,
    vb: &mut Aligned<u16>,
) {
    let (hd, bs) = (kv.head_dim, kv.block_size);
    let kw = kv.num_kv_heads * hd;
    let (ds, cs) = (hd / 32, hd / 16);
    kb.clear();
    kb.resize_zeroed(nb * ds * 4 * TILE);
    vb.clear();
    vb.resize_zeroed(nb * 2 * cs * TILE);
    let zero = _mm512_setzero_ps();
    for b in 0..nb {
        for t in 0..KB / TR {
            let key0 = k0 + b * KB + t * TR;
            if key0 >= last {
                break;
            }
            // The tile's 16 keys lie in one block (block_size is a multiple of 16).
            let (ko, vo) = kv.offsets(key0);
            let live = ((1u32 << (last - key0).min(TR)) - 1) as __mmask16;
            let kp = kv.k.as_ptr().add(ko);
            // A scaled cache's values are dequantized here, before the rounding to bf16: per
            // 32-dimension step `s` (one scale group), the tile's 16 K scales as one vector;
            // per 16-dimension column `c`, each key's V scale of group `c / 2`, broadcast.
            let scales = kv.scales.map(|sv| (sv, kv.scale_offset(key0, &sv)));
            let kscale = |s: usize| match scales {
                Some((sv, at)) => _mm512_loadu_ps(sv.k.as_ptr().add(at + s * bs)),
                None => _mm512_set1_ps(1.0),
            };
            let vscale = |j: usize, c: usize| match scales {
                Some((sv, at)) => _mm512_set1_ps(sv.v[at + (c / 2) * bs + j]),
                None => _mm512_set1_ps(1.0),
            };
            for s in 0..ds {
                let dst = kb.as_mut_ptr().add(((b * ds + s) * 4 + t) * TILE);
                let kscale = kscale(s);
                for p in 0..TR {
                    let d = s * 32 + 2 * p;
                    let lo = _mm512_mask_mul_ps(zero, live, load16(kp.add(d * bs)), kscale);
                    let hi = _mm512_mask_mul_ps(zero, live, load16(kp.add((d + 1) * bs)), kscale);
                    store_pairs(dst.add(p * 32), lo, hi);
                }
            }
            // Values: this tile's 16 keys are 8 pair-rows of 32-key step `t / 2`.
            let vp = kv.v.as_ptr().add(vo);
            for c in 0..cs {
                let dst = vb.as_mut_ptr().add(((b * 2 + t / 2) * cs + c) * TILE + (t % 2) * 8 * 32);
                for p in 0..TR / 2 {
                    let mut pair = [zero; 2];
                    for (e, x) in pair.iter_mut().enumerate() {
                        let j = 2 * p + e;
                        if key0 + j < last {
                            *x = _mm512_mul_ps(load16(vp.add(j * kw + c * 16)), vscale(j, c));
                        }
                    }
                    store_pairs(dst.add(p * 32), pair[0], pair[1]);
                }
            }
        }
    }
}

/// The softmax step of a group's rows over one block (module docs). `s` holds the rows'
/// scores, `KB` apart; row `r`'s keys in the block are `spans[r]` (empty: the row has none
/// here, or is padding). Updates `m` and `l`, writes the bf16 weights (zero outside a row's
/// keys) into the two P tiles at `pt`, and returns each row's accumulator factor (1 for a row
/// without keys, whose state stays as it was). The running maxima and factors of the 16 rows
/// are one vector, so the rows' dependency chains overlap.
#[inline(always)]
unsafe fn softmax_group(
    s: &mut [f32],
    spans: &[(usize, usize); TR],
    opts: &AttnOpts,
    m: &mut [f32; TR],
    l: &mut [f32; TR],
    pt: *mut u16,
) -> [f32; TR] {
    let below = |e: usize| if e >= KB { u64::MAX } else { (1u64 << e) - 1 };
    let mask = |r: usize, i: usize| ((below(spans[r].1) & !below(spans[r].0)) >> (16 * i)) as __mmask16;
    let mut rowmax = [f32::NEG_INFINITY; TR];
    for (r, &(start, end)) in spans.iter().enumerate() {
        if start >= end {
            continue;
        }
        let row = &mut s[r * KB..(r + 1) * KB];
        if let Some(cap) = opts.softcap {
            row[start..end].iter_mut().for_each(|x| *x = cap * (*x / cap).tanh());
        }
        let mut mx = _mm512_set1_ps(f32::NEG_INFINITY);
        for i in 0..KB / 16 {
            mx = _mm512_mask_max_ps(mx, mask(r, i), mx, _mm512_loadu_ps(row.as_ptr().add(16 * i)));
        }
        rowmax[r] = _mm512_reduce_max_ps(mx);
    }
    let (mv, rm) = (_mm512_loadu_ps(m.as_ptr()), _mm512_loadu_ps(rowmax.as_ptr()));
    let took = _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(rm, _mm512_set1_ps(f32::NEG_INFINITY));
    let new_m = _mm512_mask_max_ps(mv, took, mv, rm);
    let alpha = _mm512_mask_mov_ps(_mm512_set1_ps(1.0), took, exp(_mm512_sub_ps(mv, new_m)));
    let mut mn = [0f32; TR];
    _mm512_storeu_ps(mn.as_mut_ptr(), new_m);
    let mut sums = [0f32; TR];
    for (r, &(start, end)) in spans.iter().enumerate() {
        let (p0, p1) = (pt.add(r * 32), pt.add(TILE + r * 32));
        if start >= end {
            std::ptr::write_bytes(p0, 0, 32);
            std::ptr::write_bytes(p1, 0, 32);
            continue;
        }
        let mut total = _mm512_setzero_ps();
        for i in 0..KB / 16 {
            let x = _mm512_loadu_ps(s.as_ptr().add(r * KB + 16 * i));
            let b = rne(_mm512_maskz_mov_ps(mask(r, i), exp(_mm512_sub_ps(x, _mm512_set1_ps(mn[r])))));
            total = _mm512_add_ps(total, _mm512_castsi512_ps(_mm512_slli_epi32::<16>(b)));
            _mm256_storeu_si256([p0, p1][i / 2].add(16 * (i % 2)).cast(), _mm512_cvtepi32_epi16(b));
        }
        sums[r] = _mm512_reduce_add_ps(total);
    }
    let lv = _mm512_loadu_ps(l.as_ptr());
    _mm512_storeu_ps(l.as_mut_ptr(), _mm512_mask_fmadd_ps(lv, took, alpha, _mm512_loadu_ps(sums.as_ptr())));
    *m = mn;
    let mut out = [0f32; TR];
    _mm512_storeu_ps(out.as_mut_ptr(), alpha);
    out
}

/// The kernel's `attend` (`super::attend_with`'s contract) on the tile unit `tiles`.
///
/// # Safety
/// `unit(kv.head_dim, kv.block_size)` is `tiles`' unit (so the CPU has AVX-512 with BF16, and
/// for AMX, Linux granted the tiles).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")]
pub(super) unsafe fn run<T: KvElem, U: Tiles>(
    query: Query<'_>,
    kv: &PagedKv<'_, T>,
    opts: &AttnOpts,
    out: &mut [f32],
    sc: &mut Scratch,
    mut tiles: U,
) {
    let (n, hd, lens) = (query.lens.len(), kv.head_dim, query.lens);
    if n == 0 {
        return;
    }
    let (ds, cs) = (hd / 32, hd / 16);
    let last = lens[n - 1];
    let k0 = opts.first_key(lens[0]) / KB * KB;
    let nb = (last - k0).div_ceil(KB);
    let Scratch { qs: acc_buf, amx_o: o_buf, amx_s: s_buf, amx_q: qa, amx_k: kb, amx_v: vb, .. } = sc;
    convert_kv(kv, k0, nb, last, kb, vb);
    // Queries, scaled in f32 then rounded, per 16-row group and 32-dimension step.
    let groups = n.div_ceil(TR);
    qa.clear();
    qa.resize_zeroed(groups * ds * TILE);
    let scale = _mm512_set1_ps(opts.scale);
    for (i, row) in query.q.chunks_exact(hd).enumerate() {
        for d in (0..hd).step_by(16) {
            // 16 dimensions: scaled, rounded (`bf16_rne` per lane), stored as 16 u16.
            let x = _mm512_mul_ps(_mm512_loadu_ps(row.as_ptr().add(d)), scale);
            let at = ((i / TR) * ds + d / 32) * TILE + (i % TR) * 32 + d % 32;
            _mm256_storeu_si256(qa.as_mut_ptr().add(at).cast(), _mm512_cvtepi32_epi16(rne(x)));
        }
    }
    acc_buf.clear();
    acc_buf.resize(TR * hd, 0.0);
    o_buf.resize_zeroed(TR * hd);
    s_buf.resize_zeroed(TR * KB);
    // The weights' two tiles, on a cache line (`Aligned`'s reason).
    #[repr(C, align(64))]
    struct Weights([u16; 2 * TILE]);
    let mut pt = Weights([0; 2 * TILE]);
    let pt = &mut pt.0;
    tiles.begin();
    for g in 0..groups {
        let rows = (n - g * TR).min(TR);
        let glens = &lens[g * TR..g * TR + rows];
        let (mut m, mut l) = ([f32::NEG_INFINITY; TR], [0f32; TR]);
        acc_buf.fill(0.0);
        pt.fill(0);
        let b0 = (opts.first_key(glens[0]) - k0) / KB;
        let b1 = (glens[rows - 1] - k0).div_ceil(KB);
        for b in b0..b1 {
            let key0 = k0 + b * KB;
            // Scores: 16 rows by 64 keys in tiles 0-3.
            let (q, k) = (qa.as_ptr(), kb.as_ptr());
            let (q_at, k_at) = (|s| q.add((g * ds + s) * TILE), |s, t| k.add(((b * ds + s) * 4 + t) * TILE));
            tiles.product(ds, q_at, k_at, 4, s_buf.as_mut_ptr(), KB * 4);
            let mut spans = [(0, 0); TR];
            for (span, &len) in spans.iter_mut().zip(glens) {
                *span = (opts.first_key(len).saturating_sub(key0).min(KB), len.saturating_sub(key0).min(KB));
            }
            let alpha = softmax_group(s_buf, &spans, opts, &mut m, &mut l, pt.as_mut_ptr());
            // P V: 16 rows by 64 dimensions at a time in tiles 0-3.
            let (p, v) = (pt.as_ptr(), vb.as_ptr());
            for c0 in (0..cs).step_by(4) {
                let nc = (cs - c0).min(4);
                let (p_at, v_at) = (|ks| p.add(ks * TILE), |ks, t| v.add(((b * 2 + ks) * cs + c0 + t) * TILE));
                tiles.product(2, p_at, v_at, nc, o_buf.as_mut_ptr().add(c0 * 16), hd * 4);
            }
            for r in (0..rows).filter(|&r| spans[r].0 < spans[r].1) {
                let (a, o) = (acc_buf.as_mut_ptr().add(r * hd), o_buf.as_ptr().add(r * hd));
                let f = _mm512_set1_ps(alpha[r]);
                for c in (0..hd).step_by(16) {
                    let v = _mm512_fmadd_ps(_mm512_loadu_ps(a.add(c)), f, _mm512_loadu_ps(o.add(c)));
                    _mm512_storeu_ps(a.add(c), v);
                }
            }
        }
        for r in 0..rows {
            let dst = &mut out[(g * TR + r) * hd..][..hd];
            dst.iter_mut().zip(&acc_buf[r * hd..(r + 1) * hd]).for_each(|(o, a)| *o = a / l[r]);
        }
    }
}
