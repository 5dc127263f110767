"""LoRA adapters on SmolLM2-135M against transformers + PEFT, through the fixture
``scripts/make_lora_model_fixture.py`` writes: three PEFT adapters (ranks 8, 16 with rsLoRA, 64 with a
rank pattern; attention, MLP or both), rebuilt here bit for bit from their names (``hashed.py``).

transformers dequantized the GGUF to float32 and decoded greedily; lmplex decodes the same prompt ids
with float32 K/V under each adapter. The rule is ``test_hf_fixtures.py``'s: tokens equal (a near tie may
flip only between two top-5 tokens, and the case ends there), and each agreeing step's log-prob within
2e-3. Then: the base and the three adapters decoding at once give each the tokens and log-probs it gets
alone, bit for bit, and an adapter's prompt never reuses K/V the base cached for the same prompt; bad
adapters are refused by name and change nothing; adapters load and unload at run time. Served by
``lmplex serve`` (the real ``openai`` client): adapters are models with a ``parent``, answer as the
Python engine does, obey a tenant's ``models``, and only the administrators' key loads or unloads one.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import lora_util
import openai
import pytest
from hub_util import FakeHub, Repo, Revision
from server_util import Server

import lmplex
from lmplex import CapacityError, InvalidRequest, ModelConfig, ModelLoadError, SamplingParams, hub

NEAR_TIE = 1e-3
LOGPROB_TOL = 2e-3


@pytest.fixture(scope="module")
def fixture() -> dict[str, Any]:
    return lora_util.fixture()


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return lora_util.write_adapters(tmp_path_factory.mktemp("adapters"))


@pytest.fixture(scope="module")
def engine(smollm2_path: str, adapters: dict[str, str]) -> lmplex.Engine:
    config = ModelConfig(smollm2_path, kv_cache_dtype="float32", lora_modules=adapters, max_lora_rank=64)
    return lmplex.Engine(config)


def _greedy(steps: int) -> SamplingParams:
    return SamplingParams(max_tokens=steps, temperature=0.0, logprobs=5, ignore_eos=True)


def _run(engine: lmplex.Engine, ids: list[int], steps: int, lora: str | None) -> Any:
    return engine.generate([ids], _greedy(steps), lora=lora)[0]


def _check(name: str, ours: Any, theirs: list[dict[str, Any]]) -> None:
    for i, (tok, lp, want) in enumerate(zip(ours.token_ids, ours.logprobs, theirs)):
        mine = sorted(((x.token_id, x.logprob) for x in lp.top), key=lambda kv: -kv[1])
        if tok != want["token_id"]:
            my_gap = mine[0][1] - mine[1][1]
            their_gap = want["top_logprobs"][0] - want["top_logprobs"][1]
            tie = min(my_gap, their_gap) < NEAR_TIE
            crossed = tok in want["top_ids"] and want["token_id"] in dict(mine)
            assert tie and crossed, f"{name} step {i}: lmplex {tok}, PEFT {want['token_id']} with no near tie"
            return
        assert abs(lp.logprob - want["top_logprobs"][0]) < LOGPROB_TOL, (
            f"{name} step {i}: {lp.logprob} vs {want}"
        )


def _parity(engine: lmplex.Engine, fixture: dict[str, Any]) -> None:
    assert engine.lora_adapters() == sorted(a["name"] for a in fixture["adapters"])
    for name, cases in fixture["runs"].items():
        for ids, steps in zip(fixture["prompt_ids"], cases):
            ours = _run(engine, ids, len(steps), name or None)
            _check(f"{fixture['model']}/{name or 'base'}", ours, steps)


def test_each_adapter_decodes_as_peft(engine: lmplex.Engine, fixture: dict[str, Any]) -> None:
    _parity(engine, fixture)
    held = sum(lora_util.prod(t["shape"]) * 4 for a in fixture["adapters"] for t in a["tensors"])
    assert engine.memory().lora_adapters == held
    # The adapters change the output: they are applied, not ignored.
    replies = {name: tuple(s["token_id"] for s in cases[0]) for name, cases in fixture["runs"].items()}
    assert len(set(replies.values())) == len(replies)


def test_qwen_adapters_decode_as_peft(qwen_coder_path: str, tmp_path: Path) -> None:
    """Qwen2.5-Coder-0.5B (q/k/v biases, a Q4_K_M base, rows in Hugging Face's order)."""
    fixture: dict[str, Any] = json.loads(
        (lora_util.FIXTURE.parent / "lora_qwen2.5-coder-0.5b-instruct.json").read_text()
    )
    folders = {a["name"]: lora_util.write_adapter(tmp_path / a["name"], a) for a in fixture["adapters"]}
    config = ModelConfig(qwen_coder_path, kv_cache_dtype="float32", lora_modules=folders, max_model_len=512)
    _parity(lmplex.Engine(config), fixture)
    # Each adapter moves PEFT's log-probs far more than the tolerance: the check tells them apart.
    base = [s["top_logprobs"][0] for s in fixture["runs"][""][0]]
    for a in fixture["adapters"]:
        theirs = [s["top_logprobs"][0] for s in fixture["runs"][a["name"]][0]]
        assert max(abs(x - y) for x, y in zip(base, theirs)) > 50 * LOGPROB_TOL, a["name"]


def test_adapters_mixed_in_one_batch_match_alone(engine: lmplex.Engine, fixture: dict[str, Any]) -> None:
    ids = fixture["prompt_ids"][0]
    names: list[str | None] = [None, *(a["name"] for a in fixture["adapters"])]
    alone = {n: _run(engine, ids, 12, n) for n in names}
    streams = [engine.stream(ids, _greedy(12), lora=n) for n in names]
    outs: dict[str | None, tuple[list[int], list[float]]] = {}

    def drain(n: str | None, s: Any) -> None:
        chunks = list(s)
        tokens = [t for c in chunks for t in c.token_ids]
        outs[n] = (tokens, [lp.logprob for c in chunks for lp in c.logprobs or []])

    threads = [threading.Thread(target=drain, args=(n, s)) for n, s in zip(names, streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n in names:
        assert outs[n] == (list(alone[n].token_ids), [lp.logprob for lp in alone[n].logprobs]), n


def test_loading_and_unloading_under_load_changes_no_running_request(
    engine: lmplex.Engine, adapters: dict[str, str], fixture: dict[str, Any], tmp_path: Path
) -> None:
    ids = fixture["prompt_ids"][1]
    alone = _run(engine, ids, 24, "qv-r8")
    engine.load_lora_adapter("busy", adapters["qv-r8"])
    streams = [engine.stream(ids, _greedy(24), lora=n) for n in ("qv-r8", "busy", "qv-r8")]
    firsts = [next(s) for s in streams]
    # While they run: another adapter comes and goes, and the one two of them run under is unloaded.
    engine.load_lora_adapter("passing", lora_util.write_adapter(tmp_path / "passing", fixture["adapters"][2]))
    engine.unload_lora_adapter("passing")
    engine.unload_lora_adapter("busy")
    for first, s in zip(firsts, streams):
        tokens = list(first.token_ids) + [t for c in s for t in c.token_ids]
        assert tokens == list(alone.token_ids)
    with pytest.raises(InvalidRequest, match="unknown LoRA adapter"):
        _run(engine, ids, 2, "busy")


def test_max_loras_bounds_the_adapters_held_and_run(
    smollm2_path: str, adapters: dict[str, str], fixture: dict[str, Any]
) -> None:
    small = {n: adapters[n] for n in ("qv-r8", "all-r16-rslora")}
    e = lmplex.Engine(ModelConfig(smollm2_path, kv_cache_dtype="float32", lora_modules=small, max_loras=1))
    size = {a["name"]: sum(lora_util.prod(t["shape"]) * 4 for t in a["tensors"]) for a in fixture["adapters"]}
    ids = fixture["prompt_ids"][0]
    first = _run(e, ids, 8, "qv-r8")
    assert e.memory().lora_adapters == size["qv-r8"]
    _run(e, ids, 8, "all-r16-rslora")
    assert e.memory().lora_adapters == size["all-r16-rslora"]
    # Let go, then read again from its folder: the same tokens.
    assert _run(e, ids, 8, "qv-r8").token_ids == first.token_ids
    # While a request runs under the one adapter a step may run (max_loras=1), a request under
    # another waits in the queue, a request of the base goes ahead, and the waiting one then runs.
    busy = e.stream(ids, _greedy(48), lora="qv-r8")
    busy_tokens = list(next(busy).token_ids)
    waiting = e.stream(ids, _greedy(8), lora="all-r16-rslora")
    for _ in range(200):
        if e.stats()["num_waiting"] == 1:
            break
        time.sleep(0.01)
    assert e.stats()["num_waiting"] == 1
    assert _run(e, ids, 4, None).token_ids  # the base is not held up
    assert e.stats()["num_waiting"] == 1
    busy_tokens += [t for c in busy for t in c.token_ids]
    assert len(busy_tokens) == 48
    assert [t for c in waiting for t in c.token_ids] == list(_run(e, ids, 8, "all-r16-rslora").token_ids)
    assert e.memory().lora_adapters == size["all-r16-rslora"]


def test_bad_adapters_are_refused_by_name(
    engine: lmplex.Engine, smollm2_path: str, fixture: dict[str, Any], tmp_path: Path
) -> None:
    big = fixture["adapters"][2]  # rank 64
    config = ModelConfig(
        smollm2_path, lora_modules={"big": lora_util.write_adapter(tmp_path / "big", big)}, max_lora_rank=16
    )
    with pytest.raises(ModelLoadError, match="above max_lora_rank 16"):
        lmplex.Engine(config)
    bad = json.loads(json.dumps(fixture["adapters"][0]))
    bad["adapter_config"]["target_modules"] = ["c_attn"]
    with pytest.raises(ModelLoadError, match="c_attn"):
        engine.load_lora_adapter("bad", lora_util.write_adapter(tmp_path / "bad", bad))
    dora = json.loads(json.dumps(fixture["adapters"][0]))
    dora["adapter_config"]["use_dora"] = True
    with pytest.raises(ModelLoadError, match="use_dora"):
        engine.load_lora_adapter("dora", lora_util.write_adapter(tmp_path / "dora", dora))
    cut = (
        Path(lora_util.write_adapter(tmp_path / "cut", fixture["adapters"][0])) / "adapter_model.safetensors"
    )
    cut.write_bytes(cut.read_bytes()[:1000])
    with pytest.raises(ModelLoadError, match="corrupt or truncated"):
        engine.load_lora_adapter("cut", str(cut.parent))
    with pytest.raises(ModelLoadError, match="adapter_config.json"):
        engine.load_lora_adapter("none", str(tmp_path))
    assert engine.lora_adapters() == sorted(a["name"] for a in fixture["adapters"])
    with pytest.raises(InvalidRequest, match="unknown LoRA adapter"):
        engine.generate("Hi", SamplingParams(max_tokens=2), lora="bad")


def test_adapters_load_and_unload_at_run_time(
    engine: lmplex.Engine, fixture: dict[str, Any], tmp_path: Path
) -> None:
    a = fixture["adapters"][0]
    ids, steps = fixture["prompt_ids"][1], fixture["runs"][a["name"]][1]
    engine.load_lora_adapter("again", lora_util.write_adapter(tmp_path / "again", a))
    assert "again" in engine.lora_adapters()
    _check("again", _run(engine, ids, len(steps), "again"), steps)
    engine.unload_lora_adapter("again")
    assert "again" not in engine.lora_adapters()
    with pytest.raises(InvalidRequest, match="unknown LoRA adapter"):
        _run(engine, ids, 2, "again")
    with pytest.raises(InvalidRequest, match="no LoRA adapter named"):
        engine.unload_lora_adapter("again")


ADMIN, TEAM = "sk-lora-admin", "sk-lora-team"


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: str, adapters: dict[str, str]
) -> Iterator[Server]:
    model = {
        "model_id": smollm2_path,
        "served_model_name": "smol",
        "kv_cache_dtype": "float32",
        "lora_modules": adapters,
        "max_lora_rank": 64,
    }
    team: dict[str, object] = {"name": "team", "api_key": TEAM, "models": ["smol", "qv-r8"]}
    tiers = {"fast": ["qv-r8"], "balanced": ["smol"]}
    s = Server(tmp_path_factory.mktemp("lora-server"), [model], tenants=[team], api_keys=[ADMIN], tiers=tiers)
    s.wait_ready()
    yield s
    assert s.stop() == 0


def _client(server: Server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)


def _completion(client: openai.OpenAI, model: str, ids: list[int]) -> str:
    r = client.completions.create(model=model, prompt=ids, max_tokens=12, temperature=0)
    return r.choices[0].text


def test_the_server_serves_adapters_as_models(
    server: Server, engine: lmplex.Engine, fixture: dict[str, Any]
) -> None:
    admin, team = _client(server, ADMIN), _client(server, TEAM)
    routed_names = {"lmplex:auto", "tier:fast", "tier:balanced"}
    listed = {
        m.id: (m.model_extra or {}).get("parent") for m in admin.models.list() if m.id not in routed_names
    }
    assert listed == {"smol": None, **{a["name"]: "smol" for a in fixture["adapters"]}}
    assert (admin.models.retrieve("mlp-r64").model_extra or {})["parent"] == "smol"
    assert sorted(m.id for m in team.models.list() if m.id not in routed_names) == ["qv-r8", "smol"]
    ids = fixture["prompt_ids"][0]
    for name in ["smol", "qv-r8", "all-r16-rslora"]:
        want = engine.generate(
            [ids], SamplingParams(max_tokens=12, temperature=0.0), lora=None if name == "smol" else name
        )
        assert _completion(admin, name, ids) == want[0].text, name
    assert _completion(team, "qv-r8", ids) == _completion(admin, "qv-r8", ids)
    with pytest.raises(openai.NotFoundError):
        _completion(team, "all-r16-rslora", ids)
    chat = team.chat.completions.create(
        model="qv-r8",
        messages=[{"role": "user", "content": "Name three colors."}],
        max_tokens=8,
        temperature=0,
    )
    assert chat.model == "qv-r8" and chat.choices[0].message.content
    # A tier may name an adapter: a call routed to it runs on its parent under the adapter.
    routed = admin.completions.create(model="tier:fast", prompt=ids, max_tokens=12, temperature=0)
    assert routed.model == "qv-r8" and routed.choices[0].text == _completion(admin, "qv-r8", ids)
    # The Responses API takes an adapter's name as well, and answers as chat does.
    r = team.responses.create(model="qv-r8", input="Name three colors.", max_output_tokens=8, temperature=0)
    assert r.model == "qv-r8" and r.output_text == chat.choices[0].message.content


def test_the_server_loads_and_unloads_adapters(
    server: Server, adapters: dict[str, str], fixture: dict[str, Any]
) -> None:
    load, unload = f"{server.url}/v1/load_lora_adapter", f"{server.url}/v1/unload_lora_adapter"
    admin_h, team_h = {"Authorization": f"Bearer {ADMIN}"}, {"Authorization": f"Bearer {TEAM}"}
    body = {"lora_name": "extra", "lora_path": adapters["qv-r8"]}
    refused = httpx.post(load, json=body, headers=team_h)
    assert refused.status_code == 403 and "api_keys" in refused.json()["error"]["message"]
    ok = httpx.post(load, json=body, headers=admin_h)
    assert ok.status_code == 200 and "Success" in ok.text, ok.text
    admin = _client(server, ADMIN)
    assert "extra" in {m.id for m in admin.models.list()}
    ids = fixture["prompt_ids"][1]
    assert _completion(admin, "extra", ids) == _completion(admin, "qv-r8", ids)
    bad = httpx.post(
        load, json={"lora_name": "x", "lora_path": str(Path(adapters["qv-r8"]).parent)}, headers=admin_h
    )
    assert bad.status_code == 400 and "adapter_config.json" in bad.json()["error"]["message"], bad.text
    clash = httpx.post(load, json={"lora_name": "smol", "lora_path": adapters["qv-r8"]}, headers=admin_h)
    assert clash.status_code == 400, clash.text
    unknown = httpx.post(
        load, json={"lora_name": "y", "lora_path": adapters["qv-r8"], "extra": 1}, headers=admin_h
    )
    assert unknown.status_code == 400, unknown.text
    gone = httpx.post(unload, json={"lora_name": "extra"}, headers=admin_h)
    assert gone.status_code == 200, gone.text
    with pytest.raises(openai.NotFoundError):
        _completion(admin, "extra", ids)
    again = httpx.post(unload, json={"lora_name": "extra"}, headers=admin_h)
    assert again.status_code == 400 and "no LoRA adapter named" in again.text


def test_serve_flags_name_adapters(smollm2_path: str) -> None:
    import argparse

    from lmplex import serve

    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers())
    flags = [
        "serve",
        smollm2_path,
        "--lora-modules",
        "sql=/a/sql",
        "my.chat=ORG/chat",
        "--max-lora-rank",
        "32",
    ]
    lines = serve.config_toml(parser.parse_args(flags)).splitlines()
    assert (
        'lora_modules = {"my.chat" = "ORG/chat", "sql" = "/a/sql"}' in lines and "max_lora_rank = 32" in lines
    )
    with pytest.raises(InvalidRequest, match="NAME=ADAPTER"):
        serve.config_toml(parser.parse_args(["serve", smollm2_path, "--lora-modules", "sql"]))
    with pytest.raises(InvalidRequest, match="one MODEL"):
        serve.config_toml(parser.parse_args(["serve", smollm2_path, smollm2_path, "--lora-modules", "a=b"]))


def test_an_adapter_comes_from_the_hub(
    engine: lmplex.Engine,
    adapters: dict[str, str],
    fixture: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder = Path(adapters["qv-r8"])
    files: dict[str, bytes | Path] = {p.name: p for p in folder.iterdir()} | {"README.md": b"# adapter\n"}
    repos = {
        "acme/qv-lora": Repo({"main": Revision(files)}),
        "acme/model": Repo({"main": Revision({"config.json": b"{}"})}),
    }
    fake = FakeHub(repos)
    try:
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        for name in (
            "HF_TOKEN",
            "HUGGING_FACE_HUB_TOKEN",
            "HF_HUB_OFFLINE",
            "TRANSFORMERS_OFFLINE",
            "HF_HOME",
        ):
            monkeypatch.delenv(name, raising=False)
        engine.load_lora_adapter("from-hub", "acme/qv-lora")
        got = sorted(p.rsplit("/", 1)[-1] for p in fake.downloads())
        assert got == ["adapter_config.json", "adapter_model.safetensors"]  # not the README
        ids, steps = fixture["prompt_ids"][0], fixture["runs"]["qv-r8"][0]
        _check("from-hub", _run(engine, ids, len(steps), "from-hub"), steps)
        engine.unload_lora_adapter("from-hub")
        with pytest.raises(hub.NoWeightsError, match="not a PEFT LoRA adapter"):
            engine.load_lora_adapter("not-one", "acme/model")
    finally:
        fake.close()


def test_adapters_count_in_the_hosts_budget(
    smollm2_path: str, adapters: dict[str, str], fixture: dict[str, Any]
) -> None:
    config = ModelConfig(smollm2_path, served_model_name="smol", max_model_len=256)
    host = lmplex.ModelHost([config])
    base = host.memory().reserved
    size = sum(lora_util.prod(t["shape"]) * 4 for t in fixture["adapters"][0]["tensors"])
    host.load_lora_adapter("qv", adapters["qv-r8"])
    assert host.memory().reserved == base + size and host.lora_adapters() == {"qv": "smol"}
    fields = {**config.to_dict(), "lora_modules": {"qv": adapters["qv-r8"]}}
    assert lmplex.ModelHost([ModelConfig.from_dict(fields)]).memory().reserved == base + size
    tight = lmplex.ModelHost([config], memory_budget_bytes=base + size // 2)
    with pytest.raises(CapacityError, match="more for LoRA adapter 'qv'"):
        tight.load_lora_adapter("qv", adapters["qv-r8"])
    assert tight.lora_adapters() == {} and tight.memory().reserved == base
