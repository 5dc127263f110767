"""Every CUDA kernel against a NumPy reference, on the device, in f32, f16 and bf16.

Tolerances (max absolute error relative to the reference's scale): f32 2e-5, f16 2e-3, bf16 2e-2 for
elementwise kernels and norms; attention and GEMV, whose sums run in f32 over rounded inputs, use the
same per dtype with the scale of the output. Determinism: attention and GEMV rows are bit-identical
alone and in a batch of 64.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

DTYPES = ["f32", "f16", "bf16"]
TOL = {"f32": 2e-5, "f16": 2e-3, "bf16": 2e-2}
Kernel = Callable[[str], Any]


def bf16_round(a: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return u.view(np.float32)


def rounded(a: np.ndarray, dt: str) -> np.ndarray:
    a = np.asarray(a, dtype=np.float32)
    if dt == "f16":
        return a.astype(np.float16).astype(np.float32)
    return bf16_round(a) if dt == "bf16" else a


def dev(cp: Any, a: np.ndarray, dt: str) -> Any:
    a = np.ascontiguousarray(a, dtype=np.float32)
    if dt == "f16":
        return cp.asarray(a.astype(np.float16))
    if dt == "bf16":
        return cp.asarray((bf16_round(a).view(np.uint32) >> 16).astype(np.uint16))
    return cp.asarray(a)


def host(d: Any, dt: str) -> np.ndarray:
    a: np.ndarray = d.get()
    if dt == "bf16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def close(got: np.ndarray, want: np.ndarray, dt: str) -> None:
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(got - want).max()) / scale
    assert err <= TOL[dt], f"{dt}: max error {err:.3g} > {TOL[dt]}"


i32, f32 = np.int32, np.float32
rng = np.random.default_rng(0)


@pytest.mark.parametrize("dt", DTYPES)
def test_embedding(cp: Any, kernel: Kernel, dt: str) -> None:
    table = rounded(rng.normal(size=(50, 96)), dt)
    ids = np.array([3, 0, 49, 7, 50], dtype=np.uint32)  # 50 is outside: a zero row
    out = dev(cp, np.zeros((5, 96)), dt)
    kernel(f"embedding_{dt}")((5,), (128,), (dev(cp, table, dt), cp.asarray(ids), out, i32(96), i32(50)))
    want = np.vstack([table[[3, 0, 49, 7]], np.zeros((1, 96))])
    np.testing.assert_array_equal(host(out, dt), want)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize(("add", "offset"), [(1, 0.0), (0, 0.0), (1, 1.0)])
def test_fused_add_rmsnorm(cp: Any, kernel: Kernel, dt: str, add: int, offset: float) -> None:
    t, h = 7, 1000
    x, r, w = (rounded(rng.normal(size=s), dt) for s in [(t, h), (t, h), (h,)])
    dx, dr, dw, out = dev(cp, x, dt), dev(cp, r, dt), dev(cp, w, dt), dev(cp, np.zeros((t, h)), dt)
    args = (dx, dr, dw, out, i32(h), f32(1e-6), f32(offset), i32(add))
    kernel(f"fused_add_rmsnorm_{dt}")((t,), (256,), args)
    hs = rounded(x + r if add else x, dt)
    want = hs / np.sqrt((hs * hs).mean(axis=1, keepdims=True) + 1e-6) * (w + offset)
    np.testing.assert_array_equal(host(dr, dt), hs)
    close(host(out, dt), want, dt)


def rope_ref(v: np.ndarray, pos: np.ndarray, inv: np.ndarray, rot: int, neox: bool) -> np.ndarray:
    out = v.copy()
    ang = pos[:, None, None] * inv[None, None, :]
    c, s = np.cos(ang), np.sin(ang)
    half = rot // 2
    a = np.arange(half) if neox else 2 * np.arange(half)
    b = a + half if neox else a + 1
    x, y = v[..., a], v[..., b]
    out[..., a], out[..., b] = x * c - y * s, y * c + x * s
    return out


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize(("neox", "rot"), [(1, 64), (0, 64), (1, 32)])
def test_rope_in_a_fused_qkv_buffer(cp: Any, kernel: Kernel, dt: str, neox: int, rot: int) -> None:
    t, hq, hk, d = 5, 8, 2, 64
    qkv = rounded(rng.normal(size=(t, (hq + 2 * hk) * d)), dt)
    pos = np.array([0, 1, 17, 300, 4095], dtype=np.int64)
    inv = (1.0 / 10000 ** (np.arange(0, rot, 2) / rot)).astype(np.float32)
    buf = dev(cp, qkv, dt)
    q, k = buf, buf[:, hq * d :]
    args = (q, k, cp.asarray(pos), cp.asarray(inv), i32(hq), i32(hk), i32(d), i32(rot), i32(qkv.shape[1]))
    kernel(f"rope_{dt}")((t,), (128,), (*args, i32(qkv.shape[1]), i32(neox)))
    got = host(buf, dt)
    heads = qkv[:, : (hq + hk) * d].reshape(t, hq + hk, d)
    want = rope_ref(heads, pos.astype(np.float32), inv, rot, bool(neox)).reshape(t, -1)
    close(got[:, : (hq + hk) * d], want, dt)
    np.testing.assert_array_equal(got[:, (hq + hk) * d :], qkv[:, (hq + hk) * d :])  # v untouched


@pytest.mark.parametrize("dt", DTYPES)
def test_silu_and_mul_on_a_fused_gate_up(cp: Any, kernel: Kernel, dt: str) -> None:
    t, n = 6, 700
    gu = rounded(rng.normal(size=(t, 2 * n)) * 3, dt)
    d = dev(cp, gu, dt)
    out = dev(cp, np.zeros((t, n)), dt)
    kernel(f"silu_and_mul_{dt}")((t,), (256,), (d, d[:, n:], out, i32(n), i32(2 * n)))
    g, u = gu[:, :n], gu[:, n:]
    close(host(out, dt), g / (1 + np.exp(-g)) * u, dt)


@pytest.mark.parametrize("dt", DTYPES)
def test_reshape_and_cache_through_the_slot_mapping(cp: Any, kernel: Kernel, dt: str) -> None:
    t, hk, d, slots = 4, 2, 64, 40
    k, v = (rounded(rng.normal(size=(t, hk * d)), dt) for _ in range(2))
    slot = np.array([5, 16, -1, 39], dtype=np.int64)
    kc, vc = dev(cp, np.zeros((slots, hk * d)), dt), dev(cp, np.zeros((slots, hk * d)), dt)
    args = (
        dev(cp, k, dt),
        dev(cp, v, dt),
        kc,
        vc,
        cp.asarray(slot),
        i32(hk),
        i32(d),
        i32(hk * d),
        i32(hk * d),
    )
    kernel(f"reshape_and_cache_{dt}")((t,), (128,), args)
    want_k, want_v = np.zeros((slots, hk * d)), np.zeros((slots, hk * d))
    for i, s in enumerate(slot):
        if s >= 0:
            want_k[s], want_v[s] = k[i], v[i]
    np.testing.assert_array_equal(host(kc, dt), want_k)
    np.testing.assert_array_equal(host(vc, dt), want_v)


@pytest.mark.parametrize("dt", DTYPES)
def test_add_bias_to_every_row(cp: Any, kernel: Kernel, dt: str) -> None:
    t, w = 5, 896 + 2 * 128
    x, b = rounded(rng.normal(size=(t, w)), dt), rounded(rng.normal(size=w), dt)
    d = dev(cp, x, dt)
    kernel(f"add_bias_{dt}")((t,), (256,), (d, dev(cp, b, dt), i32(w)))
    close(host(d, dt), x + b, dt)


@pytest.mark.parametrize("dt", DTYPES)
def test_rmsnorm_heads_on_the_k_part_of_a_fused_qkv_buffer(cp: Any, kernel: Kernel, dt: str) -> None:
    t, hq, hk, d = 4, 8, 2, 128
    width = (hq + 2 * hk) * d
    qkv, w = rounded(rng.normal(size=(t, width)) * 2, dt), rounded(rng.normal(size=d), dt)
    buf = dev(cp, qkv, dt)
    kernel(f"rmsnorm_heads_{dt}")(
        (t, hk), (128,), (buf, dev(cp, w, dt), i32(width), i32(hq * d), i32(d), f32(1e-6))
    )
    got = host(buf, dt)
    k = qkv[:, hq * d : (hq + hk) * d].reshape(t, hk, d)
    want = (k / np.sqrt((k * k).mean(axis=2, keepdims=True) + 1e-6) * w).reshape(t, -1)
    close(got[:, hq * d : (hq + hk) * d], want, dt)
    np.testing.assert_array_equal(got[:, : hq * d], qkv[:, : hq * d])  # q and v untouched
    np.testing.assert_array_equal(got[:, (hq + hk) * d :], qkv[:, (hq + hk) * d :])


def test_argmax_takes_the_lowest_index_of_a_tie(cp: Any, kernel: Kernel) -> None:
    logits = rng.normal(size=(3, 151_936)).astype(np.float32)
    logits[1, [10, 90_000]] = 50.0
    out = cp.zeros(3, dtype=cp.uint32)
    kernel("argmax_f32")((3,), (1024,), (cp.asarray(logits), out, i32(logits.shape[1])))
    assert out.get().tolist() == [int(logits[0].argmax()), 10, int(logits[2].argmax())]
