"""Paged attention, the dequantizing GEMV, the tensor-core tile GEMM and device sampling against
NumPy, on the device; and the batch invariance of attention and GEMM rows (bit-identical alone
and among 64 or 70)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from .test_kernels_gpu import DTYPES, close, dev, host, rounded

Kernel = Callable[[str], Any]
i32, f32 = np.int32, np.float32
PARTITION = 512
BLOCK = 16


def attention(
    cp: Any,
    kernel: Kernel,
    dt: str,
    q: np.ndarray,
    kc: Any,
    vc: Any,
    tables: np.ndarray,
    row_seq: np.ndarray,
    row_ctx: np.ndarray,
    hk: int,
    tiles: np.ndarray | None = None,
) -> np.ndarray:
    rows, hq, d = q.shape
    parts = int(np.ceil(row_ctx.max() / PARTITION))
    po = cp.zeros((rows, hq, parts, d), dtype=cp.float32)
    pm, ps = cp.zeros((rows, hq, parts), dtype=cp.float32), cp.zeros((rows, hq, parts), dtype=cp.float32)
    dq, out = dev(cp, q, dt), dev(cp, np.zeros((rows, hq, d)), dt)
    tab, rs, rc = cp.asarray(tables), cp.asarray(row_seq), cp.asarray(row_ctx)
    scale = f32(1 / np.sqrt(d))
    args = (dq, kc, vc, tab, rs, rc, po, pm, ps, scale, i32(hq), i32(hk), i32(d), i32(BLOCK))
    pass1 = (*args, i32(tables.shape[1]), i32(parts), i32(hq * d))
    if tiles is None:
        kernel(f"paged_attention_partition_{dt}")((hq, rows, parts), (128,), pass1)
    else:
        pairs = cp.asarray(tiles.astype(np.uint32).reshape(-1))
        kernel(f"paged_attention_tiles_{dt}")((hq, len(tiles), parts), (128,), (*pass1, pairs, i32(0)))
    kernel(f"paged_attention_reduce_{dt}")(
        (hq, rows), (128,), (po, pm, ps, rc, out, i32(hq), i32(d), i32(parts))
    )
    return host(out, dt)


@pytest.mark.parametrize("dt", DTYPES)
def test_paged_attention_matches_softmax_attention_and_is_batch_invariant(
    cp: Any, kernel: Kernel, dt: str
) -> None:
    rng = np.random.default_rng(1)
    hq, hk, d, seqs = 8, 2, 64, 4
    lens = np.array([1, 37, 600, 1500], dtype=np.uint32)  # 600 and 1500 span several partitions
    nblocks = [int(np.ceil(n / BLOCK)) for n in lens]
    perm = rng.permutation(sum(nblocks)).astype(np.uint32)  # blocks scattered in the pool
    tables = np.zeros((seqs, max(nblocks)), dtype=np.uint32)
    at = 0
    for s, n in enumerate(nblocks):
        tables[s, :n], at = perm[at : at + n], at + n
    slots = sum(nblocks) * BLOCK
    kcache, vcache = (rounded(rng.normal(size=(slots, hk, d)), dt) for _ in range(2))
    kc, vc = dev(cp, kcache, dt), dev(cp, vcache, dt)
    # Rows: each sequence's last token (decode) plus three prefill rows of sequence 3 (causal).
    row_seq = np.array([0, 1, 2, 3, 3, 3, 3], dtype=np.uint32)
    row_ctx = np.array([1, 37, 600, 1500, 1, 513, 1024], dtype=np.uint32)
    q = rounded(rng.normal(size=(len(row_seq), hq, d)), dt)
    got = attention(cp, kernel, dt, q, kc, vc, tables, row_seq, row_ctx, hk)
    for r, (s, n) in enumerate(zip(row_seq, row_ctx)):
        pos = np.arange(n)
        slot = tables[s, pos // BLOCK].astype(np.int64) * BLOCK + pos % BLOCK
        for h in range(hq):
            k, v = kcache[slot, h // (hq // hk)], vcache[slot, h // (hq // hk)]
            w = q[r, h] @ k.T / np.sqrt(d)
            w = np.exp(w - w.max())
            close(got[r, h], (w / w.sum()) @ v, dt)
    # The same row among 64 others gives the same bits.
    many_seq = np.resize(row_seq, 64).astype(np.uint32)
    many_ctx = np.resize(row_ctx, 64).astype(np.uint32)
    many_q = np.resize(q, (64, hq, d))
    many_q[: len(row_seq)] = q
    together = attention(cp, kernel, dt, many_q, kc, vc, tables, many_seq, many_ctx, hk)
    np.testing.assert_array_equal(together[: len(row_seq)], got)
    # By tiles of rows of one sequence (a prefill chunk's pass): the same bits as row by row.
    tiles = np.array([[0, 1], [1, 1], [2, 1], [3, 4]])
    tiled = attention(cp, kernel, dt, q, kc, vc, tables, row_seq, row_ctx, hk, tiles)
    np.testing.assert_array_equal(tiled, got)


def q8_0(rng: np.random.Generator, n: int, k: int) -> tuple[bytes, np.ndarray]:
    d = rng.uniform(0.001, 0.02, size=(n, k // 32)).astype(np.float16)
    q = rng.integers(-128, 128, size=(n, k // 32, 32), dtype=np.int8)
    raw = b"".join(d[i, b].tobytes() + q[i, b].tobytes() for i in range(n) for b in range(k // 32))
    return raw, (d.astype(np.float32)[..., None] * q).reshape(n, k)


def scale_min(j: int, s: np.ndarray) -> tuple[int, int]:
    if j < 4:
        return int(s[j] & 63), int(s[j + 4] & 63)
    return int((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4)), int((s[j + 4] >> 4) | ((s[j] >> 6) << 4))


def q4_k(rng: np.random.Generator, n: int, k: int) -> tuple[bytes, np.ndarray]:
    raw, w = b"", np.zeros((n, k), dtype=np.float32)
    for i in range(n):
        for b in range(k // 256):
            d, dmin = np.float16(rng.uniform(0.001, 0.01)), np.float16(rng.uniform(0.0, 0.01))
            scales = rng.integers(0, 256, size=12, dtype=np.uint8)
            qs = rng.integers(0, 256, size=128, dtype=np.uint8)
            raw += d.tobytes() + dmin.tobytes() + scales.tobytes() + qs.tobytes()
            for g in range(8):
                sc, m = scale_min(g, scales)
                byte = qs[32 * (g // 2) : 32 * (g // 2) + 32].astype(np.int64)
                nib = byte & 0xF if g % 2 == 0 else byte >> 4
                w[i, b * 256 + g * 32 : b * 256 + g * 32 + 32] = float(d) * sc * nib - float(dmin) * m
    return raw, w


def q6_k(rng: np.random.Generator, n: int, k: int) -> tuple[bytes, np.ndarray]:
    raw, w = b"", np.zeros((n, k), dtype=np.float32)
    for i in range(n):
        for b in range(k // 256):
            ql = rng.integers(0, 256, size=128, dtype=np.uint8)
            qh = rng.integers(0, 256, size=64, dtype=np.uint8)
            sc = rng.integers(-128, 128, size=16, dtype=np.int8)
            d = np.float16(rng.uniform(0.0005, 0.005))
            raw += ql.tobytes() + qh.tobytes() + sc.tobytes() + d.tobytes()
            out = np.zeros(256, dtype=np.float32)
            for half in range(2):
                l_, h_, s_ = (
                    ql[64 * half :].astype(int),
                    qh[32 * half :].astype(int),
                    sc[8 * half :].astype(int),
                )
                for l in range(32):
                    qs = [
                        (l_[l] & 0xF) | ((h_[l] & 3) << 4),
                        (l_[l + 32] & 0xF) | (((h_[l] >> 2) & 3) << 4),
                        (l_[l] >> 4) | (((h_[l] >> 4) & 3) << 4),
                        (l_[l + 32] >> 4) | (((h_[l] >> 6) & 3) << 4),
                    ]
                    for quarter, qv in enumerate(qs):
                        out[128 * half + 32 * quarter + l] = float(d) * s_[l // 16 + 2 * quarter] * (qv - 32)
            w[i, b * 256 : (b + 1) * 256] = out
    return raw, w


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("fmt", ["q8_0", "q4_k", "q6_k"])
def test_qgemv_matches_the_dequantized_product_and_is_batch_invariant(
    cp: Any, kernel: Kernel, dt: str, fmt: str
) -> None:
    rng = np.random.default_rng(2)
    n, k = 40, 512
    raw, w = {"q8_0": q8_0, "q4_k": q4_k, "q6_k": q6_k}[fmt](rng, n, k)
    dw = cp.asarray(np.frombuffer(raw, dtype=np.uint8))
    fn = kernel(f"qgemv_{fmt}_{dt}")

    def run(x: np.ndarray) -> np.ndarray:
        y = dev(cp, np.zeros((x.shape[0], n)), dt)
        args = (dw, dev(cp, x, dt), y, i32(n), i32(k), i32(x.shape[0]), i32(n), i32(0))
        fn((int(np.ceil(n / 4)),), (128,), args)
        return host(y, dt)

    x = rounded(rng.normal(size=(64, k)), dt)
    many = run(x)
    close(many, x @ w.T, dt)
    np.testing.assert_array_equal(run(x[:1]), many[:1])  # row 0 alone == row 0 among 64


@pytest.mark.parametrize("dt", ["f16", "bf16"])
@pytest.mark.parametrize("fmt", ["dense", "q8_0", "q4_k", "q6_k"])
def test_tile_gemm_matches_the_product_and_rows_keep_their_bits_anywhere(
    cp: Any, kernel: Kernel, dt: str, fmt: str
) -> None:
    # The tensor-core tile GEMM (tgemm.cu): weights rounded to the storage type as the kernel
    # stages them; a row alone, first of its tile, gives the bits it gives at any other place
    # of any other tile (70 rows: two row tiles, the second partly filled; 72 columns likewise).
    rng = np.random.default_rng(4)
    n, k = 72, 512
    if fmt == "dense":
        w = rounded(rng.normal(size=(n, k)) * 0.05, dt)
        dw = dev(cp, w, dt)
    else:
        raw, w = {"q8_0": q8_0, "q4_k": q4_k, "q6_k": q6_k}[fmt](rng, n, k)
        dw, w = cp.asarray(np.frombuffer(raw, dtype=np.uint8)), rounded(w, dt)
    fn = kernel(f"tgemm_{fmt}_{dt}")

    def run(x: np.ndarray) -> np.ndarray:
        m = x.shape[0]
        y = dev(cp, np.zeros((m, n)), dt)
        args = (dw, dev(cp, x, dt), y, i32(n), i32(k), i32(m), i32(n), i32(0))
        fn((int(np.ceil(m / 64)), int(np.ceil(n / 64))), (128,), args)
        return host(y, dt)

    x = rounded(rng.normal(size=(70, k)), dt)
    many = run(x)
    close(many, x @ w.T, dt)
    for r in [0, 17, 63, 64, 69]:
        np.testing.assert_array_equal(run(x[r : r + 1]), many[r : r + 1])


def test_sampling_respects_top_k_top_p_and_its_seed(cp: Any, kernel: Kernel) -> None:
    # The kernel equals the host sampler bit for bit (checked on the CPU by kernel_check); here,
    # on the device, the cuts, the seeds and the frequencies.
    rng = np.random.default_rng(3)
    vocab, rows = 32_000, 256
    row = rng.normal(size=vocab).astype(np.float32) * 3
    fn = kernel("sample_f32")

    def draw(
        top_k: int, top_p: float, seeds: np.ndarray, temperature: float = 1.0, min_p: float = 0.0
    ) -> np.ndarray:
        out = cp.zeros(rows, dtype=cp.uint32)
        args = (
            cp.asarray(np.tile(row, (rows, 1))),  # overwritten with the weights
            out,
            cp.full(rows, temperature, dtype=cp.float32),
            cp.full(rows, top_k, dtype=cp.int32),
            cp.full(rows, top_p, dtype=cp.float32),
            cp.full(rows, min_p, dtype=cp.float32),
            cp.asarray(seeds.astype(np.uint64)),
            cp.zeros(rows, dtype=cp.uint64),
            i32(vocab),
        )
        fn((rows,), (1024,), args)
        return np.asarray(out.get())

    seeds = np.arange(rows)
    top5 = set(np.argsort(-row)[:5].tolist())
    assert set(draw(5, 1.0, seeds).tolist()) <= top5
    assert set(draw(0, 1e-6, seeds).tolist()) == {int(row.argmax())}
    assert set(draw(0, 1.0, seeds, min_p=0.999).tolist()) == {int(row.argmax())}
    np.testing.assert_array_equal(draw(50, 0.9, seeds), draw(50, 0.9, seeds))  # same seeds, same tokens
    # Top-2 frequencies follow their probabilities (loose: 256 draws).
    p = np.exp(row - row.max())
    a, b = np.argsort(-row)[:2]
    picks = draw(2, 1.0, seeds)
    share = float(np.mean(picks == a))
    assert abs(share - p[a] / (p[a] + p[b])) < 0.15, share


def test_logit_edits_are_the_hosts_float32_operations(cp: Any, kernel: Kernel) -> None:
    # Row 0: repetition on a positive and a negative logit, everything on one token, a token
    # past the vocabulary; row 1: no edits; row 2: a held-back ending. NumPy's float32 division,
    # multiplication and sums round as the host sampler's do.
    rng = np.random.default_rng(5)
    vocab = 1000
    logits = (rng.normal(size=(3, vocab)) * 4).astype(np.float32)
    logits[0, 1], logits[0, 2] = 2.5, -2.5

    def f(x: float) -> int:
        return int(np.float32(x).view(np.uint32))

    edits = [
        [1, 1, f(1.3), 0, 0],
        [2, 1, f(1.3), 0, 0],
        [9, 1 | 2 | 4, f(0.7), f(0.45), f(-3.25)],
        [5000, 4, 0, 0, f(1.0)],
        [4, 8, 0, 0, 0],
    ]
    starts = np.array([0, 4, 4, 5], dtype=np.uint32)
    dl = cp.asarray(logits)
    args = (dl, cp.asarray(np.array(edits, dtype=np.uint32)), cp.asarray(starts), i32(vocab))
    kernel("logit_edits_f32")((3,), (256,), args)
    want = logits.copy()
    rep, x = np.float32(1.3), want[0, 9]
    want[0, 1], want[0, 2] = want[0, 1] / rep, want[0, 2] * rep
    x = x / np.float32(0.7) if x > 0 else x * np.float32(0.7)
    want[0, 9] = (x - np.float32(0.45)) + np.float32(-3.25)
    want[2, 4] = -np.inf
    np.testing.assert_array_equal(dl.get().view(np.uint32), want.view(np.uint32))
