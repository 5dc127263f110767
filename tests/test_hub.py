"""Hugging Face Hub ids through the real ``huggingface_hub`` client against a loopback stand-in Hub.

The repos are made here from the test model: its GGUF file, and the HF folder ``lmplex models export``
writes from it (real config, tokenizer and safetensors). Nothing leaves 127.0.0.1; every test has its
own empty Hub cache (``HF_HUB_CACHE``).
"""

from __future__ import annotations

import filecmp
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import huggingface_hub.constants
import pytest
from hub_util import FakeHub, Repo, Revision
from server_util import Server

from lmplex import Engine, ModelConfig, ModelLoadError, SamplingParams, _core, hub, models

SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOL_GGUF = "bartowski/SmolLM2-135M-Instruct-GGUF"
GATED = "meta-llama/Gated-Smol"
TOKEN = "hf_not_a_real_token_4f2a9c"


@pytest.fixture(scope="module")
def hf_folder(smollm2_path: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "smollm2-hf"
    _core.export_gguf_to_hf(smollm2_path, str(out), "bfloat16", 200_000_000)
    return out


@pytest.fixture(scope="module")
def fake_hub(hf_folder: Path, smollm2_path: str) -> Iterator[FakeHub]:
    gguf = Path(smollm2_path)
    folder: dict[str, bytes | Path] = {p.name: p for p in hf_folder.iterdir()}
    junk = b"not a model" * 2000
    folder |= {
        "pytorch_model.bin": junk,
        "onnx/model.onnx": junk,
        "original/consolidated.safetensors": junk,
        "README.md": b"# SmolLM2\n",
    }
    repos = {
        SMOL: Repo({"main": Revision(folder)}),
        SMOL_GGUF: Repo(
            {
                "main": Revision(
                    {
                        "SmolLM2-135M-Instruct-Q4_1.gguf": gguf,
                        "SmolLM2-135M-Instruct-Q8_0.gguf": junk,
                        "README.md": b"# GGUF\n",
                    }
                ),
                "v1": Revision({"smollm2-q4_1.gguf": gguf, "old-Q2_K.gguf": junk}),
            }
        ),
        GATED: Repo({"main": Revision({"model-Q4_1.gguf": gguf})}, token=TOKEN),
        "acme/only-bin": Repo({"main": Revision({"config.json": b"{}", "pytorch_model.bin": junk})}),
    }
    hub_server = FakeHub(repos)
    yield hub_server
    hub_server.close()


@pytest.fixture
def hub_env(fake_hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    """The stand-in Hub as HF_ENDPOINT, an empty cache, no token and online."""
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME"):
        monkeypatch.delenv(name, raising=False)
    fake_hub.requests.clear()
    fake_hub.auth_headers.clear()
    return fake_hub


def _dead_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _greedy(engine: Engine) -> list[int]:
    out = engine.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=8))
    return list(out[0].token_ids)


# --- choosing files (no network) -------------------------------------------------------------------------


def test_parse_tells_hub_ids_from_paths_and_aliases() -> None:
    assert hub.parse("Qwen/Qwen3-4B") == hub.HubId("Qwen/Qwen3-4B", None)
    assert hub.parse("unsloth/gemma-3-270m-it-GGUF:Q4_K_M") == hub.HubId(
        "unsloth/gemma-3-270m-it-GGUF", "Q4_K_M"
    )
    for not_an_id in (
        "smollm2-135m-instruct",
        "./a/b",
        "/abs/path",
        "a/b/c",
        "a/../b",
        "~/x",
        "a/b:",
        "",
        "a/m.gguf",
    ):
        assert hub.parse(not_an_id) is None, not_an_id


def test_choose_files_takes_only_what_loading_needs() -> None:
    files = [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "pytorch_model.bin",
        "original/consolidated.safetensors",
        "onnx/model.onnx",
        "README.md",
    ]
    assert hub.choose_files(hub.HubId("o/n", None), files) == [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors.index.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    ggufs = ["m-Q4_K_M.gguf", "m-q8_0.gguf", "m.Q5_K_M.gguf", "mmproj-m-f16.gguf", "m-f16.gguf"]
    assert hub.choose_files(hub.HubId("o/n", None), ggufs) == ["m-Q4_K_M.gguf"]  # llama.cpp's default
    assert hub.choose_files(hub.HubId("o/n", "Q8_0"), ggufs) == ["m-q8_0.gguf"]
    assert hub.choose_files(hub.HubId("o/n", "q5_k_m"), ggufs) == ["m.Q5_K_M.gguf"]
    assert hub.choose_files(hub.HubId("o/n", None), ["only.gguf", "README.md"]) == ["only.gguf"]
    with pytest.raises(hub.NoWeightsError, match=r"tags: F16, Q4_K_M, Q5_K_M, Q8_0"):
        hub.choose_files(hub.HubId("o/n", "Q2_K"), ggufs)
    with pytest.raises(hub.NoWeightsError, match=r"split GGUF \(2 parts\).*llama-gguf-split"):
        hub.choose_files(
            hub.HubId("o/n", "Q8_0"), ["Q8_0/m-Q8_0-00001-of-00002.gguf", "Q8_0/m-Q8_0-00002-of-00002.gguf"]
        )
    with pytest.raises(hub.NoWeightsError, match=r"pytorch_model\.bin"):
        hub.choose_files(hub.HubId("o/n", None), ["config.json", "pytorch_model.bin"])


# --- the download path, against the stand-in -------------------------------------------------------------


def test_hf_folder_downloads_only_needed_files_and_loads(hub_env: FakeHub, hf_folder: Path) -> None:
    path = Path(models.resolve(SMOL, progress=False))
    assert path.is_relative_to(hub.cache_dir()) and path.parent.name == "snapshots"
    got = sorted(p.rsplit("/", 1)[-1] for p in hub_env.downloads())
    want = sorted(p.name for p in hf_folder.iterdir())
    assert got == want  # no .bin, onnx/, original/ or README.md
    assert all(filecmp.cmp(path / name, hf_folder / name, shallow=False) for name in want)
    # ModelConfig takes the Hub id as transformers and vLLM do; it answers like the folder itself.
    assert _greedy(Engine(ModelConfig(SMOL, max_model_len=256))) == _greedy(Engine(str(hf_folder)))


def test_gguf_tag_picks_one_file(
    hub_env: FakeHub, smollm2_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As if huggingface_hub had been imported while HF_HUB_OFFLINE=1: the environment now wins.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    path = models.resolve(f"{SMOL_GGUF}:q4_1", progress=False)
    assert Path(path).name == "SmolLM2-135M-Instruct-Q4_1.gguf"
    assert filecmp.cmp(path, smollm2_path, shallow=False)
    assert [p.rsplit("/", 1)[-1] for p in hub_env.downloads()] == ["SmolLM2-135M-Instruct-Q4_1.gguf"]
    with pytest.raises(hub.NoWeightsError, match=f"{SMOL_GGUF}:Q4_1.*tags: Q4_1, Q8_0"):
        models.resolve(SMOL_GGUF, progress=False)  # no Q4_K_M, two quants: the tag must say which
    with pytest.raises(hub.NoWeightsError, match="no .gguf file for the tag 'Q5_K_M'"):
        models.resolve(f"{SMOL_GGUF}:Q5_K_M", progress=False)


def test_revision_selects_the_commit(hub_env: FakeHub) -> None:
    v1 = models.resolve(f"{SMOL_GGUF}:Q4_1", "v1", progress=False)
    assert Path(v1).name == "smollm2-q4_1.gguf"
    main_sha = json.loads(httpx.get(f"{hub_env.url}/api/models/{SMOL_GGUF}").text)["sha"]
    at_commit = models.resolve(f"{SMOL_GGUF}:Q4_1", main_sha, progress=False)
    assert Path(at_commit).parent.name == main_sha
    with pytest.raises(hub.RevisionNotFoundError, match="no revision 'v9'"):
        models.resolve(f"{SMOL_GGUF}:Q4_1", "v9", progress=False)
    with pytest.raises(ModelLoadError, match="not a Hub id"):
        models.resolve("smollm2-135m-instruct", "v1")


def test_cached_model_loads_without_the_network(hub_env: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    first = models.resolve(f"{SMOL_GGUF}:Q4_1", progress=False)
    monkeypatch.setenv("HF_ENDPOINT", _dead_endpoint())  # the Hub cannot be reached
    assert models.resolve(f"{SMOL_GGUF}:Q4_1", progress=False) == first
    with pytest.raises(hub.HubOfflineError, match="cannot be reached"):
        models.resolve(SMOL, progress=False)
    monkeypatch.setenv("HF_ENDPOINT", hub_env.url)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    before = len(hub_env.requests)
    assert models.resolve(f"{SMOL_GGUF}:Q4_1", progress=False) == first
    with pytest.raises(hub.HubOfflineError, match="HF_HUB_OFFLINE is set"):
        models.resolve(SMOL, progress=False)
    assert len(hub_env.requests) == before  # offline asks nothing


def test_hub_errors_are_typed_and_say_what_to_do(
    hub_env: FakeHub, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(hub.RepoNotFoundError, match="not found on http://127.0.0.1.*HF_TOKEN") as missing:
        models.resolve("acme/does-not-exist", progress=False)
    assert isinstance(missing.value, ModelLoadError)
    with pytest.raises(hub.GatedRepoError, match="gated repo.*set HF_TOKEN"):
        models.resolve(GATED, progress=False)
    with pytest.raises(hub.NoWeightsError, match=r"no weights lmplex loads.*pytorch_model\.bin"):
        models.resolve("acme/only-bin", progress=False)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    with pytest.raises(hub.RepoNotFoundError):  # a 404 with a token, where an anonymous caller got 401
        models.resolve("acme/does-not-exist", progress=False)
    assert Path(models.resolve(GATED, progress=False)).name == "model-Q4_1.gguf"
    assert f"Bearer {TOKEN}" in hub_env.auth_headers
    monkeypatch.setenv("HF_TOKEN", TOKEN + "-wrong")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))  # not served from the cache
    with pytest.raises(hub.GatedRepoError) as gated:
        models.resolve(f"{GATED}:Q4_1", "main", progress=False)
    assert TOKEN not in str(gated.value)


# --- the command line and the server ---------------------------------------------------------------------


def _env(fake_hub: FakeHub, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    return env | {"HF_ENDPOINT": fake_hub.url, "HF_HUB_CACHE": str(cache)}


def test_cli_fetch_and_serve_a_hub_id(fake_hub: FakeHub, tmp_path: Path) -> None:
    env = _env(fake_hub, tmp_path / "hf-cache")
    lmplex = [sys.executable, "-m", "lmplex"]
    done = subprocess.run(
        [*lmplex, "models", "fetch", f"{SMOL_GGUF}:Q4_1"],
        check=False,
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("SmolLM2-135M-Instruct-Q4_1.gguf")
    assert "Fetching 1 files" in done.stderr  # huggingface_hub's progress (bytes too on a terminal)
    missing = subprocess.run(
        [*lmplex, "models", "fetch", "acme/nope"], check=False, capture_output=True, text=True, env=env
    )
    assert missing.returncode == 2 and missing.stderr.startswith("error: Hub repo 'acme/nope' not found")
    assert "Traceback" not in missing.stderr

    served = Server(tmp_path, [{"model_id": f"{SMOL_GGUF}:Q4_1", "revision": "v1"}], env=env)
    try:
        served.wait_ready()
        assert [m["id"] for m in httpx.get(f"{served.url}/v1/models").json()["data"]] == [f"{SMOL_GGUF}:Q4_1"]
        body = {"model": f"{SMOL_GGUF}:Q4_1", "prompt": "The capital of France is", "max_tokens": 4}
        body["temperature"] = 0  # OpenAI's default of 1 samples, and a sampled end-of-text ends early
        reply = httpx.post(f"{served.url}/v1/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 4
        assert reply.json()["choices"][0]["text"].strip().startswith("Paris")
    finally:
        served.stop()
