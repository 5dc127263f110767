"""TierSet routing through the real ``openai`` client against ``lmplex serve`` with two models: a tier
by name, ``lmplex:auto`` in each mode, a cost budget that falls to the cheaper model, budgets no model
can meet (400 ``budget_unsatisfiable``), bad routes, a tenant's default route, the ``x-lmplex-*``
headers, the routing metrics, and load adaptation (a flooded deep model loses latency-bound calls to the
fast one, and wins them back once the flood ends)."""

from __future__ import annotations

import pickle
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from server_util import Server

import lmplex

# fast: cheap, quality 40, 8 slots; deep: 10x the price, quality 60, one request at a time.
PRICES = {"fast": (1.0, 2.0), "deep": (10.0, 20.0)}
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smollm2_path: str) -> Iterator[Server]:
    def model(name: str, quality: float, seqs: int) -> dict[str, object]:
        price_in, price_out = PRICES[name]
        return {
            "model_id": smollm2_path,
            "served_model_name": name,
            "max_model_len": 1024,
            "max_model_concurrency": seqs,
            "quality": quality,
            "price_per_million_input_tokens": price_in,
            "price_per_million_output_tokens": price_out,
        }

    tenants: list[dict[str, object]] = [
        {"name": "thrifty", "api_key": "sk-thrifty", "route": {"mode": "deep", "max_cost": 1e-4}},
    ]
    s = Server(
        tmp_path_factory.mktemp("routing"),
        [model("fast", 40, 8), model("deep", 60, 1)],
        tenants=tenants,
        log_args=["--api-key", "sk-plain"],
        tiers={"fast": ["fast"], "deep": ["deep"]},
    )
    s.wait_ready()
    yield s
    assert s.stop() == 0


def _client(server: Server, key: str = "sk-plain") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)


def _chat(
    server: Server, model: str, lmplex: dict[str, Any] | None = None, max_tokens: int = 8, **kw: Any
) -> Any:
    extra = {"lmplex": lmplex} if lmplex is not None else None
    return _client(server, kw.pop("key", "sk-plain")).chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": PROMPT}],
        temperature=0,
        max_tokens=max_tokens,
        extra_body=extra,
        **kw,
    )


def test_routed_names_are_listed(server: Server) -> None:
    ids = [m.id for m in _client(server).models.list()]
    assert ids == ["deep", "fast", "lmplex:auto", "tier:fast", "tier:deep"]


def test_a_tier_by_name_and_each_mode_choose_as_documented(server: Server) -> None:
    raw = _chat(server, "tier:fast")
    assert raw.parse().model == "fast"
    assert raw.headers["x-lmplex-tier"] == "fast"
    assert float(raw.headers["x-lmplex-predicted-latency-ms"]) > 0
    assert raw.parse().choices[0].message.content
    raw = _chat(server, "lmplex:auto", {"mode": "deep"})
    out = raw.parse()
    assert (out.model, raw.headers["x-lmplex-tier"]) == ("deep", "deep")
    # The cost bound: every prompt token at the input price plus 8 output tokens at the output price.
    assert out.usage is not None
    bound = (out.usage.prompt_tokens * 10.0 + 8 * 20.0) / 1e6
    assert float(raw.headers["x-lmplex-max-cost"]) == pytest.approx(bound, rel=1e-6)
    assert _chat(server, "lmplex:auto").parse().model == "fast", "balanced: the cheaper"
    assert _chat(server, "lmplex:auto", {"mode": "max"}).parse().model == "deep"
    assert _chat(server, "tier:deep", {"tier": "deep"}).parse().model == "deep"


def test_a_cost_budget_falls_to_the_cheaper_model_and_an_impossible_one_is_refused(server: Server) -> None:
    # deep costs about (30 x 10 + 8 x 20) / 1e6 = 4.6e-4 here, fast about 4.6e-5.
    raw = _chat(server, "lmplex:auto", {"mode": "deep", "max_cost": 2e-4})
    assert raw.parse().model == "fast"
    assert float(raw.headers["x-lmplex-max-cost"]) <= 2e-4
    with pytest.raises(openai.BadRequestError) as e:
        _chat(server, "lmplex:auto", {"mode": "deep", "max_cost": 1e-6})
    assert e.value.code == "budget_unsatisfiable"
    assert re.search(r"lowest cost bound 0\.0000\d\d", str(e.value)), str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        _chat(server, "lmplex:auto", {"mode": "max", "max_latency_ms": 0.5})
    assert e.value.code == "budget_unsatisfiable" and "best predicted latency" in str(e.value)
    # A named model is held to a budget too.
    with pytest.raises(openai.BadRequestError) as e:
        _chat(server, "deep", {"max_cost": 1e-5})
    assert e.value.code == "budget_unsatisfiable" and "model 'deep'" in str(e.value)
    assert _chat(server, "deep", {"max_cost": 1.0}).parse().model == "deep"


def test_bad_routes_are_400_naming_the_value(server: Server) -> None:
    url = f"{server.url}/v1/chat/completions"
    h = {"authorization": "Bearer sk-plain"}
    msgs = [{"role": "user", "content": "hi"}]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"model": "tier:slow"}, "unknown tier 'slow'"),
        ({"model": "lmplex:auto", "lmplex": {"mode": "cheap"}}, "unknown variant `cheap`"),
        (
            {"model": "lmplex:auto", "lmplex": {"max_latency_ms": -5}},
            "max_latency_ms must be a number >= 0, got -5",
        ),
        ({"model": "lmplex:auto", "lmplex": {"budget": 1}}, "unknown field `budget`"),
        ({"model": "lmplex:auto", "lmplex": {"mode": "fixed"}}, "mode 'fixed' needs a tier"),
        ({"model": "lmplex:auto", "lmplex": {"tier": "max"}}, "tier 'max' has no models"),
        ({"model": "tier:fast", "lmplex": {"tier": "deep"}}, "conflicts with the model 'tier:fast'"),
    ]
    for body, message in cases:
        r = httpx.post(url, headers=h, json={**body, "messages": msgs, "max_tokens": 2})
        assert r.status_code == 400, (body, r.text)
        assert message in r.json()["error"]["message"], (body, r.text)


def test_a_tenants_default_route_applies_unless_the_call_says_otherwise(server: Server) -> None:
    # thrifty's default: mode deep, max_cost 1e-4, so deep (4.6e-4) is out and fast is chosen.
    assert _chat(server, "lmplex:auto", key="sk-thrifty").parse().model == "fast"
    assert _chat(server, "lmplex:auto", {"max_cost": 1.0}, key="sk-thrifty").parse().model == "deep"


def test_a_streamed_routed_call_names_its_model_and_carries_the_headers(server: Server) -> None:
    with _client(server).chat.completions.with_streaming_response.create(
        model="lmplex:auto",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=4,
        temperature=0,
        stream=True,
        extra_body={"lmplex": {"mode": "deep"}},
    ) as raw:
        assert raw.headers["x-lmplex-tier"] == "deep"
        chunks = list(raw.parse())
    assert chunks and {c.model for c in chunks} == {"deep"}


def _metric(server: Server, name: str, **labels: str) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    total = 0.0
    for line in text.splitlines():
        m = re.fullmatch(rf"{re.escape(name)}\{{(.*)\}} (\S+)", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            total += float(m.group(2))
    assert want is not None
    return total


def test_decisions_refusals_and_prediction_error_are_metrics(server: Server) -> None:
    before = _metric(server, "lmplex_route_decisions_total", mode="deep", tier="deep", model="deep")
    refused = _metric(server, "lmplex_route_refusals_total", mode="deep", reason="budget_unsatisfiable")
    ratios = _metric(server, "lmplex_route_latency_ratio_count", model="deep")
    _chat(server, "lmplex:auto", {"mode": "deep"})
    with pytest.raises(openai.BadRequestError):
        _chat(server, "lmplex:auto", {"mode": "deep", "max_cost": 1e-9})
    assert (
        _metric(server, "lmplex_route_decisions_total", mode="deep", tier="deep", model="deep") == before + 1
    )
    assert (
        _metric(server, "lmplex_route_refusals_total", mode="deep", reason="budget_unsatisfiable")
        == refused + 1
    )
    assert _metric(server, "lmplex_route_latency_ratio_count", model="deep") == ratios + 1


def test_a_flooded_deep_model_loses_latency_bound_calls_until_the_flood_ends(server: Server) -> None:
    idle = _chat(server, "lmplex:auto", {"mode": "deep"}, max_tokens=16)
    assert idle.parse().model == "deep"
    fast = _chat(server, "tier:fast", max_tokens=16)
    # Room for fast to run twice as slow while deep is busy on the same cores (its slowdown).
    budget = 4 * max(float(r.headers["x-lmplex-predicted-latency-ms"]) for r in (idle, fast))
    bound = {"mode": "deep", "max_latency_ms": budget}
    _until_deep_serves(server, bound)
    stop = threading.Event()
    client = _client(server)

    def flood() -> None:
        # deep runs one request at a time: these queue behind each other until `stop`.
        with client.completions.with_streaming_response.create(
            model="deep",
            prompt=PROMPT,
            max_tokens=400,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        ) as r:
            for _ in r.iter_lines():
                if stop.is_set():
                    return

    threads = [threading.Thread(target=flood) for _ in range(8)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                raw = _chat(server, "lmplex:auto", bound, max_tokens=16)
                if raw.parse().model == "fast":
                    break
            except openai.BadRequestError as err:
                # A busy CPU raises fast's prediction too for a moment: refused, never overrun.
                assert "no model meets the budget" in str(err), err
            assert time.monotonic() < deadline, "the flood never shows in deep's prediction"
            time.sleep(0.2)
        assert float(raw.headers["x-lmplex-predicted-latency-ms"]) <= budget
    finally:
        stop.set()
        for t in threads:
            t.join()
    _until_deep_serves(server, bound)


def _until_deep_serves(server: Server, bound: dict[str, Any]) -> None:
    """Waits (90 s at most) until an idle ``deep`` meets ``bound``. The predictions are live: a step
    slowed by a busy CPU raises them for a moment, and then a bounded call may be refused; a call
    that ran far over its prediction raises the calibration, which relaxes 30 s after the last such
    call ends (docs/routing.md)."""
    deadline = time.monotonic() + 90
    while True:
        try:
            if _chat(server, "lmplex:auto", bound, max_tokens=16).parse().model == "deep":
                return
        except openai.BadRequestError as err:
            assert "no model meets the budget" in str(err), err
        assert time.monotonic() < deadline, "deep never serves the latency-bound call"
        time.sleep(0.2)


def test_route_and_tierset_are_the_core_types() -> None:
    r = lmplex.Route(mode="deep", max_cost=0.001)
    assert (r.mode, r.tier, r.max_latency_ms, r.max_cost) == ("deep", None, None, 0.001)
    assert r.to_dict() == {"mode": "deep", "max_cost": 0.001}
    assert repr(r) == "Route(mode='deep', max_cost=0.001)"
    assert pickle.loads(pickle.dumps(r)) == r == lmplex.Route.from_dict({"mode": "deep", "max_cost": 0.001})
    with pytest.raises(lmplex.InvalidRequest, match="max_latency_ms must be a number >= 0, got -1"):
        lmplex.Route(max_latency_ms=-1)
    with pytest.raises(lmplex.InvalidRequest, match="mode 'fixed' needs a tier"):
        lmplex.Route(mode="fixed")
    with pytest.raises(lmplex.InvalidRequest, match="unknown variant `cheap`"):
        lmplex.Route(mode="cheap")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="budget"):
        lmplex.Route(budget=1)  # type: ignore[call-arg]
    t = lmplex.TierSet(fast=["a"], deep=["b", "a"])
    assert (t.fast, t.balanced, t.deep, t.max, t.models()) == (["a"], [], ["b", "a"], [], ["a", "b"])
    assert t.to_dict() == {"fast": ["a"], "balanced": [], "deep": ["b", "a"], "max": []}
    assert pickle.loads(pickle.dumps(t)) == t
    with pytest.raises(lmplex.InvalidRequest, match="tiers.fast: 'a' is listed twice"):
        lmplex.TierSet(fast=["a", "a"])
    # A tenant's default route, as a Route or a dict.
    assert lmplex.Tenant("x", route=lmplex.Route(mode="deep")).route == lmplex.Route(mode="deep")
    assert lmplex.Tenant("x", route={"max_cost": 0.5}).route == lmplex.Route(max_cost=0.5)
    with pytest.raises(lmplex.InvalidRequest, match="route: max_cost must be a number >= 0"):
        lmplex.Tenant("x", route={"max_cost": -1.0})


def test_a_block_with_tiers_routes_calls(smollm2_path: str) -> None:
    configs = [
        lmplex.ModelConfig(
            smollm2_path,
            served_model_name=name,
            max_model_len=512,
            quality=q,
            price_per_million_input_tokens=p,
            price_per_million_output_tokens=p,
        )
        for name, q, p in (("fast", 40.0, 1.0), ("deep", 60.0, 10.0))
    ]
    tiers = lmplex.TierSet(fast=["fast"], deep=["deep"])
    with pytest.raises(lmplex.InvalidRequest, match="not in this block"):
        lmplex.LMLiteBlock(configs, tiers=lmplex.TierSet(max=["huge"]))
    params = lmplex.SamplingParams(max_tokens=4, temperature=0)
    with lmplex.LMLiteBlock(configs, tiers=tiers) as block:
        block.wait_ready()
        reply = block(
            "lmplex:auto", "The capital of France is", params=params, route=lmplex.Route(mode="deep")
        )
        assert reply == block("fast", "The capital of France is", params=params), "the same weights"
        with pytest.raises(lmplex.BudgetUnsatisfiable, match="lowest cost bound"):
            block("lmplex:auto", "Hi", params=params, route=lmplex.Route(mode="deep", max_cost=1e-9))
        block("tier:fast", "Hi", params=params)
        text = httpx.get(f"{block.urls[0]}/metrics").text
        assert 'lmplex_route_decisions_total{mode="deep",tier="deep",model="deep"} 1' in text
        assert 'lmplex_route_decisions_total{mode="fixed",tier="fast",model="fast"} 1' in text


def test_a_model_host_generates_on_a_named_model_or_routed(
    smollm2_path: str, qwen_coder_path: str, engine: lmplex.Engine
) -> None:
    def config(path: str, name: str, quality: float, price: float) -> lmplex.ModelConfig:
        return lmplex.ModelConfig(
            path,
            served_model_name=name,
            max_model_len=512,
            quality=quality,
            price_per_million_input_tokens=price,
            price_per_million_output_tokens=price,
        )

    tiers = lmplex.TierSet(fast=["fast"], deep=["deep"])
    host = lmplex.ModelHost(
        [config(smollm2_path, "fast", 40, 1.0), config(qwen_coder_path, "deep", 60, 10.0)], tiers=tiers
    )
    assert (host.models, host.tiers) == (["deep", "fast"], tiers)
    # Each model's time from being asked for to ready, its warm-up included.
    ready = [host.ready_seconds(name) for name in host.models]
    assert all(r is not None and 0.0 < r < 120.0 for r in ready), ready
    assert host.ready_seconds("nope") is None
    params = lmplex.SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    (deep,) = host.generate(PROMPT, params, route=lmplex.Route(mode="deep"))
    assert deep.model == "deep" and deep.usage.completion_tokens == 4
    # deep costs (prompt + 4) x 10 per million, about 1e-4; fast a tenth of that.
    (cheap,) = host.generate(PROMPT, params, route=lmplex.Route(mode="deep", max_cost=5e-5))
    assert cheap.model == "fast"
    with pytest.raises(lmplex.BudgetUnsatisfiable, match="lowest cost bound"):
        host.generate(PROMPT, params, route=lmplex.Route(mode="deep", max_cost=1e-9))
    with pytest.raises(lmplex.BudgetUnsatisfiable, match="model 'deep'"):
        host.generate(PROMPT, params, model="deep", route=lmplex.Route(max_cost=1e-6))
    # A named model runs what an Engine on the same weights runs, token for token.
    (named,) = host.generate(PROMPT, params, model="fast")
    assert named.model == "fast" and named.token_ids == engine.generate(PROMPT, params)[0].token_ids
    assert named.token_ids == cheap.token_ids
    with pytest.raises(lmplex.InvalidRequest, match="no model named 'nope'"):
        host.generate(PROMPT, params, model="nope")
    # Streamed, named or routed: the same tokens, and the stream names the model that runs it.
    stream = host.stream(PROMPT, params, model="fast")
    assert stream.model == "fast" and [t for c in stream for t in c.token_ids] == named.token_ids
    routed = host.stream(PROMPT, params, route=lmplex.Route(mode="deep"))
    assert routed.model == "deep" and [t for c in routed for t in c.token_ids] == deep.token_ids
    assert engine.stream(PROMPT, params).model == engine.generate(PROMPT, params)[0].model
    plain = lmplex.ModelHost([config(smollm2_path, "only", 0, 0)])
    with pytest.raises(lmplex.InvalidRequest, match="no tiers are configured"):
        plain.generate(PROMPT, params)
