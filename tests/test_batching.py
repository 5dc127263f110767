"""The continuous-batching engine from Python: async API, streaming cancellation, the bounded queue,
the KV pool's memory report and batch invariance, on SmolLM2-135M-Instruct."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import lmplex
from lmplex import CapacityError, InvalidRequest, ModelConfig, SamplingParams
from lmplex.engine import Prompt

PROMPTS: list[Prompt] = [
    "The history of the Roman Empire",
    [{"role": "user", "content": "Name three colours."}],
    "def fibonacci(n):",
    [{"role": "user", "content": "Write a haiku about the sea, please, with a title."}],
]


def params(i: int, max_tokens: int = 12) -> SamplingParams:
    if i % 2 == 0:
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=2)
    return SamplingParams(temperature=0.8, seed=100 + i, max_tokens=max_tokens, logprobs=2)


def wait_idle(engine: lmplex.Engine, timeout: float = 10.0) -> lmplex.EngineStats:
    """Polls the engine's counters until every KV block is free and nothing runs."""
    deadline = time.monotonic() + timeout
    while True:
        stats = engine.stats()
        idle = stats["num_running"] == 0 and stats["num_waiting"] == 0 and stats["num_queued"] == 0
        if idle and stats["num_free_kv_blocks"] == stats["num_kv_blocks"]:
            return stats
        assert time.monotonic() < deadline, f"engine not idle: {stats}"
        time.sleep(0.01)


def test_batch_equals_solo_runs_bit_for_bit(engine: lmplex.Engine) -> None:
    each = [params(i) for i in range(len(PROMPTS))]
    together = engine.generate(PROMPTS, each)
    for i, prompt in enumerate(PROMPTS):
        alone = engine.generate([prompt], each[i])[0]
        assert together[i].token_ids == alone.token_ids
        assert together[i].text == alone.text
        got, want = together[i].logprobs, alone.logprobs
        assert got is not None and want is not None
        assert [lp.logprob for lp in got] == [lp.logprob for lp in want]


def test_agenerate_and_astream_match_the_sync_api(engine: lmplex.Engine) -> None:
    each = [params(i) for i in range(len(PROMPTS))]
    sync = engine.generate(PROMPTS, each)

    async def stream_text(i: int) -> tuple[str, list[int], str | None]:
        text, ids, finish = "", [], None
        async for chunk in engine.astream(PROMPTS[i], each[i]):
            text += chunk.text
            ids += chunk.token_ids
            finish = chunk.finish_reason
        return text, ids, finish

    async def main() -> tuple[list[lmplex.RequestOutput], list[tuple[str, list[int], str | None]]]:
        # Two batch calls and four streams at once, on one event loop.
        batches = asyncio.gather(engine.agenerate(PROMPTS, each), engine.agenerate(PROMPTS[:2], each[:2]))
        streams = asyncio.gather(*(stream_text(i) for i in range(len(PROMPTS))))
        (outs, again), texts = await asyncio.gather(batches, streams)
        assert [o.token_ids for o in again] == [o.token_ids for o in outs[:2]]
        return outs, list(texts)

    outs, streams = asyncio.run(main())
    for i, want in enumerate(sync):
        assert outs[i].token_ids == want.token_ids and outs[i].text == want.text
        assert streams[i] == (want.text, want.token_ids, want.finish_reason)
    wait_idle(engine)


def test_async_errors_are_typed(engine: lmplex.Engine) -> None:
    async def main() -> None:
        with pytest.raises(InvalidRequest):
            await engine.agenerate(["fine", "word " * 3000], SamplingParams(max_tokens=4))
        with pytest.raises(InvalidRequest):
            engine.astream([99_999_999], SamplingParams())

    asyncio.run(main())


def test_closing_or_dropping_a_stream_frees_its_blocks(engine: lmplex.Engine) -> None:
    long = SamplingParams(temperature=0.0, max_tokens=500, ignore_eos=True)
    stream = engine.stream(PROMPTS[0], long)
    next(stream)
    assert engine.stats()["num_free_kv_blocks"] < engine.stats()["num_kv_blocks"]
    assert engine.memory().kv_cache_used > 0
    stream.close()
    assert list(stream) == []
    wait_idle(engine)
    # Dropped without close(): the same.
    stream = engine.stream(PROMPTS[0], long)
    next(stream)
    del stream
    wait_idle(engine)

    async def drop_async() -> None:
        it = engine.astream(PROMPTS[0], long)
        await it.__anext__()
        await it.aclose()

    asyncio.run(drop_async())
    wait_idle(engine)


def test_abort_by_request_id_ends_the_stream(engine: lmplex.Engine) -> None:
    stream = engine.stream(PROMPTS[2], SamplingParams(temperature=0.0, max_tokens=500, ignore_eos=True))
    first = next(stream)
    engine.abort(stream.request_id)
    rest = list(stream)
    assert rest and rest[-1].finish_reason == "abort"
    assert len(first.token_ids) + sum(len(c.token_ids) for c in rest) < 500
    wait_idle(engine)


def test_memory_report_accounts_for_the_pool(engine: lmplex.Engine) -> None:
    mem = engine.memory()
    assert mem.kv_cache_used + mem.kv_cache_cached + mem.kv_cache_free == mem.kv_cache
    assert mem.total == mem.weights + mem.kv_cache + mem.kv_swap + mem.other
    # The warm tier defaults to the pool's size (at most 4 GiB) and is empty when idle.
    assert mem.kv_swap == mem.kv_cache and mem.kv_swap_used == 0
    info = engine.info
    # SmolLM2's head is its embedding table, so a decode step reads every weight.
    assert info.decode_weight_bytes == mem.weights
    # 30 layers x 3 KV heads x 64 dims x (K and V) x 2 bytes per token, 16 tokens per block:
    # float16, the default for a quantized checkpoint.
    assert info.kv_dtype == "float16"
    assert mem.kv_cache == info.kv_num_blocks * 16 * 30 * 3 * 64 * 2 * 2
    # Sized for max_model_concurrency (8) sequences of max_model_len (2048) tokens.
    assert info.kv_num_blocks == 8 * 2048 // 16


def _agrees_with_float16(other: lmplex.Engine, half: lmplex.Engine, tol: float) -> None:
    """``other``'s greedy tokens do not change with the batch, equal the float16 cache's, and their
    log-probs stay within ``tol`` of it."""
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=1)
    alone = other.generate(PROMPTS[0], greedy)[0]
    assert other.generate(PROMPTS, greedy)[0].token_ids == alone.token_ids
    base = half.generate(PROMPTS[0], greedy)[0]
    assert base.token_ids == alone.token_ids
    assert alone.logprobs is not None and base.logprobs is not None
    assert max(abs(a.logprob - b.logprob) for a, b in zip(alone.logprobs, base.logprobs)) < tol


def test_kv_cache_dtype_sets_what_the_pool_stores(engine: lmplex.Engine, smollm2_path: str) -> None:
    """float32 K/V (vLLM's ``kv_cache_dtype``) takes twice the float16 default's bytes per block;
    each is batch-invariant, and their greedy tokens and log-probs agree closely (the HF fixture
    tests bound both against transformers)."""
    with pytest.raises(InvalidRequest, match="kv_cache_dtype"):
        ModelConfig(smollm2_path, kv_cache_dtype="int4")
    f32 = lmplex.Engine(ModelConfig(smollm2_path, max_model_len=2048, kv_cache_dtype="float32"))
    assert (f32.info.kv_dtype, engine.info.kv_dtype) == ("float32", "float16")
    assert f32.info.kv_num_blocks == engine.info.kv_num_blocks
    assert f32.memory().kv_cache == 2 * engine.memory().kv_cache
    _agrees_with_float16(f32, engine, 1e-2)


def test_int8_kv_cache_stores_bytes_and_scales(engine: lmplex.Engine, smollm2_path: str) -> None:
    """int8 K/V: one byte per value plus a float32 scale per token, KV head and 32 dimensions, so
    (64 + 8) / 128 of float16's bytes for SmolLM2's head_dim 64; batch-invariant, and its log-probs
    stay near float16's."""
    i8 = lmplex.Engine(ModelConfig(smollm2_path, max_model_len=2048, kv_cache_dtype="int8"))
    assert i8.info.kv_dtype == "int8" and i8.config.kv_cache_dtype == "int8"
    assert i8.info.kv_num_blocks == engine.info.kv_num_blocks
    assert i8.memory().kv_cache == engine.memory().kv_cache * (64 + 8) // 128
    _agrees_with_float16(i8, engine, 5e-2)


def test_full_queue_raises_capacity_error(smollm2_path: str) -> None:
    engine = lmplex.Engine(
        ModelConfig(smollm2_path, max_model_len=256, max_queue_len=1, model_batch_execute_timeout_ms=60_000)
    )
    held = engine.stream("Hello", SamplingParams(max_tokens=4))  # waits in the batch window
    with pytest.raises(CapacityError, match="max_queue_len=1"):
        engine.stream("Hello again", SamplingParams(max_tokens=4))
    held.close()
    wait_idle(engine)
    # A batch larger than the queue is fed in as room appears (here the window is 60 s, so only
    # a full batch of max_model_concurrency would start at once: use single mode instead).
    engine = lmplex.Engine(ModelConfig(smollm2_path, max_model_len=256, max_queue_len=2))
    outs = engine.generate(["a", "b", "c", "d", "e"], SamplingParams(temperature=0.0, max_tokens=3))
    assert len(outs) == 5


def test_close_from_another_thread_ends_a_waiting_iteration(smollm2_path: str) -> None:
    """A reader blocked in ``next()`` on a request that produces nothing yet (it waits in a 60 s
    batch window) is released by ``close()`` from another thread; ``close()`` does not wait for
    the reader's next chunk (before, it did so holding the GIL, stalling every thread)."""
    engine = lmplex.Engine(
        ModelConfig(smollm2_path, max_model_len=256, model_batch_execute_timeout_ms=60_000)
    )
    stream = engine.stream("Hello", SamplingParams(max_tokens=4))
    chunks: list[lmplex.StreamChunk] = []
    reader = threading.Thread(target=lambda: chunks.extend(stream), daemon=True)
    reader.start()
    time.sleep(0.3)  # the reader is now waiting inside next()
    assert reader.is_alive()
    t0 = time.monotonic()
    stream.close()
    reader.join(timeout=10)
    assert not reader.is_alive() and time.monotonic() - t0 < 10
    assert [c.finish_reason for c in chunks if c.finish_reason] in ([], ["abort"])
    assert all(not c.token_ids for c in chunks)
    wait_idle(engine)


def test_kv_budget_is_checked(smollm2_path: str) -> None:
    with pytest.raises(InvalidRequest, match="kv_cache_bytes"):
        ModelConfig(smollm2_path, kv_cache_bytes=0)
    with pytest.raises(InvalidRequest, match="smaller than one KV block"):
        lmplex.Engine(ModelConfig(smollm2_path, kv_cache_bytes=1000))
    small = lmplex.Engine(
        ModelConfig(smollm2_path, max_model_len=2048, kv_cache_bytes=4 * 16 * 30 * 3 * 64 * 2 * 2)
    )
    assert small.info.kv_num_blocks == 4
    with pytest.raises(InvalidRequest, match="KV pool holds 4 blocks"):
        small.generate("hello", SamplingParams(max_tokens=100))
    assert small.generate("hello", SamplingParams(max_tokens=8))[0].token_ids


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preempted_requests_match_an_unconstrained_engine(
    engine: lmplex.Engine, smollm2_path: str, mode: str
) -> None:
    """A 6-block pool cannot hold 4 requests of ~40 tokens at once: some are preempted, swapped
    to the warm tier or recomputed, and every output still equals the roomy engine's."""
    block = 16 * 30 * 3 * 64 * 2 * 2
    small = lmplex.Engine(
        ModelConfig(smollm2_path, max_model_len=256, kv_cache_bytes=6 * block, preemption_mode=mode)
    )
    assert small.config.preemption_mode == mode
    each = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True) for _ in PROMPTS]
    got = small.generate(PROMPTS, each)
    want = engine.generate(PROMPTS, each)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    stats = wait_idle(small)
    assert stats["num_preemptions"] > 0
    assert (stats["num_swaps"] > 0) == (mode == "swap")
    assert stats["num_free_swap_blocks"] == stats["num_swap_blocks"] == 6
    assert small.memory().kv_swap_used == 0
    with pytest.raises(InvalidRequest, match="preemption_mode"):
        ModelConfig(smollm2_path, preemption_mode="lottery")


def test_priority_and_cache_salt_are_accepted_and_checked(smollm2_path: str) -> None:
    with pytest.raises(InvalidRequest, match="scheduling_policy"):
        ModelConfig(smollm2_path, scheduling_policy="lottery")
    engine = lmplex.Engine(ModelConfig(smollm2_path, max_model_len=512, scheduling_policy="priority"))
    assert engine.config.scheduling_policy == "priority"
    greedy = SamplingParams(temperature=0.0, max_tokens=4)
    prefix = "Once upon a time, " * 20  # well over two 16-token blocks
    first = engine.generate(prefix + "a", greedy, priority=3, cache_salt="tenant-a")[0]
    hits = engine.stats()["prefix_cache_hits"]
    other = engine.generate(prefix + "a", greedy, cache_salt="tenant-b")[0]
    assert engine.stats()["prefix_cache_hits"] == hits  # another tenant's prefix is not found
    assert other.token_ids == first.token_ids
    engine.generate([prefix + "b", prefix + "c"], greedy, priority=[1, 2], cache_salt="tenant-a")
    assert engine.stats()["prefix_cache_hits"] > hits
    with pytest.raises(InvalidRequest, match="priorities"):
        engine.generate(["x", "y"], greedy, priority=[1])
    assert [c.token_ids for c in engine.stream("hi", greedy, priority=-1, cache_salt="t")]


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_an_unused_kv_pool_costs_no_resident_memory(smollm2_path: str) -> None:
    """A 512 MiB pool and a 512 MiB warm tier (8.5 MiB per layer buffer) are mapped, not committed:
    resident memory grows by about the weights only."""
    before = _rss()
    big = lmplex.Engine(
        ModelConfig(smollm2_path, max_model_len=512, kv_cache_bytes=512 << 20, kv_swap_bytes=512 << 20)
    )
    mem = big.memory()
    block = 16 * 30 * 3 * 64 * 2 * 2
    assert mem.kv_cache > (512 << 20) - block and mem.kv_swap == mem.kv_cache
    grown = _rss() - before
    assert grown < mem.weights + (150 << 20), f"{grown} bytes resident for a pool nobody used"
