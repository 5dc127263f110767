"""``LMLiteBlock``: replicas of ``lmplex serve`` behind one callable, on SmolLM2. Calls match the engine,
go round-robin, move off a killed replica, ``ready`` tracks replica health, ``delete`` stops
everything, ``gc`` cleans up after a block whose owner died, and ``output=`` a schema or pydantic model returns
validated objects."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import lora_util
import pydantic
import pytest

import lmplex
from lmplex import GPUS, InvalidRequest, LMLiteBlock, ModelConfig, SamplingParams, StructuredOutputError

SMOLLM2 = "smollm2-135m-instruct"
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LMPLEX_RUNTIME_DIR", str(tmp_path / "blocks"))
    return tmp_path / "blocks"


@pytest.fixture
def block(runtime: Path, smollm2_path: str) -> Iterator[LMLiteBlock]:
    b = LMLiteBlock(models=[ModelConfig(SMOLLM2, max_model_len=512)], gpu=None, replicas=2)
    try:
        b.wait_ready()
        yield b
    finally:
        b.delete()  # also when it never got ready: no replica outlives the test


def _served(url: str) -> float:
    text = urllib.request.urlopen(f"{url}/metrics").read().decode()
    return sum(
        float(v)
        for v in re.findall(
            r'^lmplex_requests_total\{model="[^"]+",tenant="[^"]*",outcome="\w+"\} (\S+)$', text, re.MULTILINE
        )
    )


def test_calls_match_the_engine_and_go_round_robin(block: LMLiteBlock, engine: lmplex.Engine) -> None:
    assert block.ready
    want = engine.chat([{"role": "user", "content": "Name a colour."}], GREEDY).text
    before = [_served(u) for u in block.urls]
    assert [block(model_id=SMOLLM2, input="Name a colour.", params=GREEDY) for _ in range(4)] == [want] * 4
    assert [_served(u) - b for u, b in zip(block.urls, before)] == [2, 2]
    batch = block(model_id=SMOLLM2, input=["Name a colour.", "Name a fruit."], params=GREEDY)
    assert isinstance(batch, list) and batch[0] == want and len(batch) == 2
    messages = [{"role": "user", "content": "Name a colour."}]
    assert block(model_id=SMOLLM2, input=messages, params=GREEDY) == want


def test_a_killed_replica_gets_no_traffic_and_ready_says_so(block: LMLiteBlock) -> None:
    dead, alive = block.replicas[0], block.urls[1]
    os.kill(dead, signal.SIGKILL)
    time.sleep(0.2)
    assert not block.ready
    before = _served(alive)
    for _ in range(3):
        assert block(model_id=SMOLLM2, input="Hi", params=GREEDY)
    assert _served(alive) - before == 3


def _running(url: str) -> float:
    text = urllib.request.urlopen(f"{url}/metrics").read().decode()
    pattern = r"^lmplex_num_requests_running\{[^}]*\} (\S+)$"
    return sum(float(v) for v in re.findall(pattern, text, re.MULTILINE))


def test_calls_in_flight_on_a_killed_replica_finish_on_another(runtime: Path, smollm2_path: str) -> None:
    """SIGKILL a replica while it runs calls: every call returns the reply it gets alone (greedy), the
    killed replica's moving to the other one under their keys; with tenants the replicas share the
    keys through the block's usage store, so the survivor waits out the dead one's claims (seconds)."""
    long = SamplingParams(temperature=0.0, max_tokens=96)
    with LMLiteBlock(
        models=[ModelConfig(SMOLLM2, max_model_len=512)], replicas=2, tenants=[lmplex.Tenant("a")]
    ) as b:
        b.wait_ready()
        expected = b(SMOLLM2, "Tell me about the sea.", params=long, tenant="a")
        replies: list[object] = []
        failures: list[BaseException] = []

        def call() -> None:
            try:
                replies.append(b(SMOLLM2, "Tell me about the sea.", params=long, tenant="a"))
            except BaseException as err:  # noqa: BLE001 - every failure counts
                failures.append(err)

        workers = [threading.Thread(target=call) for _ in range(4)]
        for w in workers:
            w.start()
        victim = 0
        deadline = time.monotonic() + 60
        while _running(b.urls[victim]) < 1:
            assert time.monotonic() < deadline, "no call reached the replica"
            time.sleep(0.02)
        os.kill(b.replicas[victim], signal.SIGKILL)
        for w in workers:
            w.join(120)
        assert not failures, failures[:2]
        assert replies == [expected] * 4
        assert not b.ready, "the killed replica stays down"


def test_delete_stops_replicas_and_removes_files(runtime: Path, smollm2_path: str) -> None:
    b = LMLiteBlock(models=[ModelConfig(SMOLLM2, max_model_len=256)])
    pids = b.replicas
    assert len(list(runtime.iterdir())) == 4  # registry, config, one log, one address file
    b.delete()
    assert not list(runtime.iterdir())
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_gc_removes_what_a_dead_owner_left(runtime: Path, smollm2_path: str) -> None:
    script = textwrap.dedent(f"""
        import os, lmplex
        b = lmplex.LMLiteBlock(models=[lmplex.ModelConfig({SMOLLM2!r}, max_model_len=256)])
        print(b.replicas[0], flush=True)
        os._exit(0)  # dies without delete()
    """)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    orphan = int(out.stdout.split()[0])
    os.kill(orphan, 0)  # still running
    assert LMLiteBlock.gc() == 1
    deadline = time.monotonic() + 10
    while Path(f"/proc/{orphan}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{orphan}").exists()
    assert not list(runtime.iterdir())
    assert LMLiteBlock.gc() == 0


def test_bad_arguments_are_clear_errors(runtime: Path) -> None:
    with pytest.raises(InvalidRequest, match="NVIDIA_L4"):
        LMLiteBlock(models=[ModelConfig(SMOLLM2)], gpu=GPUS.NVIDIA_L4)
    with pytest.raises(InvalidRequest, match="replicas"):
        LMLiteBlock(models=[ModelConfig(SMOLLM2)], replicas=0)
    with pytest.raises(InvalidRequest, match="at least one"):
        LMLiteBlock(models=[])
    assert GPUS.NVIDIA_H100.memory_bytes == 80 << 30


def test_an_adapter_is_a_model_of_the_block(runtime: Path, smollm2_path: str, tmp_path: Path) -> None:
    adapter = lora_util.write_adapter(tmp_path / "qv", lora_util.fixture()["adapters"][0])
    config = ModelConfig(SMOLLM2, max_model_len=512, lora_modules={"qv": adapter})
    chat = [{"role": "user", "content": "Name a colour."}]
    want = lmplex.Engine(config).chat(chat, GREEDY, lora="qv").text
    base = lmplex.Engine(ModelConfig(SMOLLM2, max_model_len=512)).chat(chat, GREEDY).text
    assert want != base  # the adapter changes the reply
    with LMLiteBlock(models=[config], replicas=1) as b:
        b.wait_ready()
        assert b.model_ids == [SMOLLM2, "qv"]
        assert b(model_id="qv", input="Name a colour.", params=GREEDY) == want
        assert b(model_id=SMOLLM2, input="Name a colour.", params=GREEDY) == base
        # The request's metrics carry the adapter's name.
        text = urllib.request.urlopen(f"{b.urls[0]}/metrics").read().decode()
        qv = r'^lmplex_requests_total\{model="qv",tenant="[^"]*",outcome="(?:length|stop)"\} 1$'
        assert re.search(qv, text, re.MULTILINE), text
    with pytest.raises(InvalidRequest, match="unique"):
        LMLiteBlock(models=[config, ModelConfig(SMOLLM2, served_model_name="qv")])


def test_calls_check_model_and_output(block: LMLiteBlock) -> None:
    with pytest.raises(InvalidRequest, match="not in this block"):
        block(model_id="other", input="x")
    with pytest.raises(InvalidRequest, match="output"):
        block(model_id=SMOLLM2, input="x", output=dict)
    bad = {"model": SMOLLM2, "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}
    with pytest.raises(InvalidRequest, match="at least 1"):
        block._post("/v1/chat/completions", bad)


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=30)
    country: str = pydantic.Field(max_length=30)
    population_millions: float = pydantic.Field(ge=0, le=50)


CITY_SCHEMA: dict[str, object] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "rank": {"type": "integer", "minimum": 1}},
    "required": ["city", "rank"],
    "additionalProperties": False,
}


def test_output_schema_or_model_returns_validated_objects(block: LMLiteBlock) -> None:
    params = SamplingParams(temperature=0.8, seed=4, max_tokens=100)
    city = block(model_id=SMOLLM2, input="Describe a big city.", output=City, params=params)
    assert isinstance(city, City) and city.name
    many = block(
        model_id=SMOLLM2, input=["Rank a city.", "Rank another city."], output=CITY_SCHEMA, params=params
    )
    assert isinstance(many, list) and len(many) == 2
    for value in many:
        jsonschema.validate(value, CITY_SCHEMA)
    with pytest.raises(StructuredOutputError, match="length"):
        block(
            model_id=SMOLLM2, input="Describe a big city.", output=City, params=SamplingParams(max_tokens=3)
        )


def test_a_replica_is_found_by_its_address_file_not_its_log(tmp_path: Path) -> None:
    """The block learns a replica's URL from the file ``lmplex serve --address-file`` writes once it
    listens (whole, by rename), never from its log."""
    from lmplex.block import _Replica

    log, address = tmp_path / "replica.log", tmp_path / "replica.url"
    log.write_text("lmplex serve: listening on http://127.0.0.1:6\n")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        r = _Replica(proc, log, address)
        with pytest.raises(lmplex.LmplexError, match="did not start"):
            r.wait_url(0.3)
        address.write_text("http://127.0.0.1:5")
        assert r.wait_url(5.0) == "http://127.0.0.1:5"
    finally:
        proc.kill()
        proc.wait()


def test_replicas_get_every_model_config_field() -> None:
    """The replicas' TOML carries each ``ModelConfig`` whole: every field, set to a non-default value
    here, reads back equal (``dtype`` and ``device`` once never reached a replica)."""
    tomllib = pytest.importorskip("tomllib")
    from lmplex.server_toml import server_toml

    config = ModelConfig(
        "/m/a.gguf",
        revision="v2",
        served_model_name="a",
        max_model_len=512,
        max_model_concurrency=3,
        model_batch_execute_timeout_ms=7,
        dtype="bfloat16",
        device="cpu",
        enforce_eager=True,
        kv_cache_dtype="float32",
        kv_cache_bytes=1 << 20,
        max_num_batched_tokens=64,
        max_queue_len=5,
        enable_prefix_caching=False,
        scheduling_policy="priority",
        kv_swap_bytes=0,
        preemption_mode="swap",
        keep_alive_s=2.5,
        price_per_million_input_tokens=0.5,
        price_per_million_output_tokens=1.5,
        quality=61.5,
        tool_call_parser="mistral",
        reasoning_parser="none",
        lora_modules={"sql": "/m/sql-lora", "my.chat": "ORG/chat"},
        max_loras=3,
        max_lora_rank=16,
        task="embed",
        pooling="mean",
        limit_mm_per_prompt={"image": 2},
        mmproj="/m/mmproj-a.gguf",
    )
    # Speculative decoding is for generation, so it goes on a second model with the same fields.
    fields = {
        k: v for k, v in config.to_dict().items() if k not in ("model_id", "task", "pooling", "speculative")
    }
    spec = ModelConfig("b", **fields, speculative={"method": "ngram", "num_speculative_tokens": 3})
    default = ModelConfig("/m/a.gguf").to_dict()
    unset = [k for k, v in default.items() if v == config.to_dict()[k] == spec.to_dict()[k]]
    assert unset == [], f"fields left at their default: {unset}"
    parsed = tomllib.loads(server_toml([config, spec, ModelConfig("b")], port=0))
    assert parsed["port"] == 0
    assert [ModelConfig.from_dict(m) for m in parsed["models"]] == [config, spec, ModelConfig("b")]


def test_tenants_are_forwarded_and_quotas_hold_for_the_whole_block(runtime: Path, smollm2_path: str) -> None:
    """Two replicas share tenant ``a``'s 3 requests a window through the block's SQLite usage store:
    three calls pass (two on one replica, one on the other), the fourth is RateLimited by both with
    the wait, while ``b`` and calls without a tenant go on; each replica's metrics count its calls under
    the tenant's name; keys never reach the replicas' logs, and the config holding them is the owner's
    alone; ``delete`` removes the store."""
    tenants = [
        lmplex.Tenant("a", requests_per_minute=3, quota_window_s=60.0),
        lmplex.Tenant("b", api_key="sk-b-secret-0123456789"),
    ]
    with LMLiteBlock(models=[ModelConfig(SMOLLM2, max_model_len=512)], replicas=2, tenants=tenants) as b:
        b.wait_ready()
        tiny = SamplingParams(temperature=0.0, max_tokens=2)
        for _ in range(3):
            assert isinstance(b(SMOLLM2, "Hi", params=tiny, tenant="a"), str)
        with pytest.raises(lmplex.RateLimited) as info:
            b(SMOLLM2, "Hi", params=tiny, tenant="a")
        assert info.value.limit == "requests" and 0 < info.value.retry_after <= 60
        assert isinstance(b(SMOLLM2, "Hi", params=tiny, tenant="b"), str)
        assert isinstance(b(SMOLLM2, "Hi", params=tiny), str)
        with pytest.raises(InvalidRequest, match="tenant 'c' is not one of this block's"):
            b(SMOLLM2, "Hi", params=tiny, tenant="c")
        served = []
        for url in b.urls:
            text = urllib.request.urlopen(f"{url}/metrics").read().decode()
            ok = r'^lmplex_requests_total\{model="[^"]+",tenant="a",outcome="(?:length|stop)"\} (\S+)$'
            served.append(sum(float(v) for v in re.findall(ok, text, re.MULTILINE)))
        assert sorted(served) == [1.0, 2.0]
        config = next(runtime.glob("*.toml"))
        assert config.stat().st_mode & 0o077 == 0
        assert config.with_suffix(".usage.sqlite").is_file()
        logs = "".join(p.read_text() for p in runtime.glob("*.log"))
        assert "sk-b-secret" not in logs
    assert not list(runtime.glob("*.usage.sqlite*"))
    with pytest.raises(InvalidRequest, match="only api_key_sha256"):
        LMLiteBlock(models=[ModelConfig(SMOLLM2)], tenants=[lmplex.Tenant("a", api_key_sha256="ab" * 32)])
