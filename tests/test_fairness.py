"""Tenants in the Python engine: the fair order never changes a request's tokens, tenants never share
cached prefixes unless they opt in, and a quota refusal is a typed :class:`RateLimited`."""

from __future__ import annotations

import concurrent.futures
import time

import pytest

import lmplex
from lmplex import ModelConfig, RateLimited, SamplingParams, Tenant

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "The three primary colours are",
    "import numpy as np\n",
    "Water boils at",
]


def _params(i: int) -> SamplingParams:
    # Greedy and seeded sampling, both must be reproducible alone.
    if i % 2:
        return SamplingParams(temperature=0.8, top_p=0.9, seed=100 + i, max_tokens=24, ignore_eos=True)
    return SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def test_two_tenants_under_fair_get_the_tokens_each_request_gets_alone(smollm2_path: str) -> None:
    tenants = [Tenant("heavy", weight=1), Tenant("light", weight=3)]
    engine = lmplex.Engine(
        ModelConfig(smollm2_path, max_model_len=512, max_model_concurrency=3), tenants=tenants
    )
    assert engine.config.scheduling_policy is None  # resolved to fair: tenants are configured
    alone = [engine.generate(p, _params(i), tenant="light")[0].token_ids for i, p in enumerate(PROMPTS)]

    def call(i: int) -> list[int]:
        tenant = "heavy" if i % 3 else "light"
        return engine.generate(PROMPTS[i], _params(i), tenant=tenant)[0].token_ids

    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(call, range(len(PROMPTS))))
    assert together == alone
    # The heavy tenant's batch also matches, whatever order fair chose.
    batch = engine.generate(PROMPTS, [_params(i) for i in range(len(PROMPTS))], tenant="heavy")
    assert [o.token_ids for o in batch] == alone


def test_tenants_never_reuse_each_others_cached_prefixes(smollm2_path: str) -> None:
    tenants = [Tenant("a"), Tenant("b"), Tenant("c", cache_salt="team"), Tenant("d", cache_salt="team")]
    engine = lmplex.Engine(ModelConfig(smollm2_path, max_model_len=512), tenants=tenants)
    prompt = "A long shared system prompt that spans several KV blocks. " * 8
    greedy = SamplingParams(temperature=0, max_tokens=2)

    def hits_after(tenant: str) -> int:
        before = engine.stats()["prefix_cache_hits"]
        engine.generate(prompt, greedy, tenant=tenant)
        return engine.stats()["prefix_cache_hits"] - before

    hits_after("a")
    assert hits_after("a") > 0, "a tenant reuses its own prefix"
    assert hits_after("b") == 0, "b must not hit a's cached prompt"
    hits_after("c")
    assert hits_after("d") > 0, "c and d share the salt 'team'"


def test_quota_refusal_is_rate_limited_with_a_retry_time(smollm2_path: str) -> None:
    t = Tenant("t", requests_per_minute=1, quota_window_s=0.5, max_cost_per_day=1.0)
    assert "api_key" not in repr(Tenant("k", api_key="sk-secret")).replace("api_key='<redacted>'", "")
    engine = lmplex.Engine(ModelConfig(smollm2_path, max_model_len=256), tenants=[t])
    greedy = SamplingParams(temperature=0, max_tokens=2)
    engine.generate("Hello", greedy, tenant="t")
    with pytest.raises(RateLimited) as e:
        engine.generate("Hello", greedy, tenant="t")
    assert e.value.limit == "requests" and 0 < e.value.retry_after <= 0.5
    assert isinstance(e.value, lmplex.CapacityError)
    time.sleep(e.value.retry_after + 0.05)
    engine.generate("Hello", greedy, tenant="t")
    usage = engine.tenant_usage("t")
    assert usage["requests"] == 2 and usage["completion_tokens"] == 4 and usage["in_flight"] == 0
    with pytest.raises(lmplex.InvalidRequest, match="unknown tenant 'nobody'"):
        engine.generate("Hello", greedy, tenant="nobody")
    with pytest.raises(lmplex.InvalidRequest, match="weight"):
        Tenant("w", weight=0)
    with pytest.raises(TypeError, match="wieght"):
        Tenant("w", wieght=2)  # type: ignore[call-arg]
