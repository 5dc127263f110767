"""Embeddings (``task="embed"``): parity with transformers on real models, batch invariance, and
``/v1/embeddings`` through the real ``openai`` client with tenants.

The oracle is ``scripts/make_embedding_fixtures.py``: transformers' ``AutoModel`` on the same GGUF
(dequantized to float32), its ``last_hidden_state`` pooled by the last token and by the mean, not
normalized. lmplex multiplies the GGUF blocks directly, so with float32 K/V only the summation order
differs; the default float16 K/V of a quantized checkpoint rounds K and V once stored. The bounds
below sit above what ``scripts/embedding_parity`` measured (docs/bench/embedding-parity-cpu.json),
which ``test_the_documented_figures_are_the_committed_run`` checks against docs/server.md.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from conftest import QWEN_CODER, SMOLLM2, fetched_model
from server_util import Server

import lmplex
from lmplex import InvalidRequest, ModelConfig

FIXTURES = Path(__file__).parent / "fixtures"
REL_TOL = {"float32": 1e-5, "float16": 2e-3}
KEY = "sk-embed-tenant"


def _fixture(alias: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads((FIXTURES / f"embed_{alias}.json").read_text())
    return out


@pytest.mark.parametrize("kv", list(REL_TOL))
@pytest.mark.parametrize("pooling", ["last", "mean"])
@pytest.mark.parametrize("alias", [SMOLLM2, QWEN_CODER])
def test_pooled_states_match_transformers(alias: str, pooling: str, kv: str) -> None:
    fixture = _fixture(alias)
    config = ModelConfig(
        fetched_model(alias), task="embed", pooling=pooling, max_model_len=256, kv_cache_dtype=kv
    )
    engine = lmplex.Engine(config)
    cases = fixture["cases"]
    for case in cases:
        assert engine.tokenize(case["input"]) == case["ids"]
    # One batch of every input: batching must not change a vector.
    got = engine.embed([c["input"] for c in cases], normalize=False)
    for case, vec in zip(cases, got):
        want = np.array(case[pooling], dtype=np.float32)
        assert vec.shape == want.shape == (engine.info.hidden_size,)
        rel = float(np.abs(vec - want).max() / np.abs(want).max())
        assert rel < REL_TOL[kv], f"{case['input']!r}: max diff {rel:.2e} of the largest element"
    # Normalized (the default): the same direction at unit length.
    unit = engine.embed(cases[0]["input"])[0]
    assert abs(float(np.linalg.norm(unit)) - 1.0) < 1e-6
    np.testing.assert_allclose(unit, got[0] / np.linalg.norm(got[0]), rtol=0, atol=1e-6)


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_a_vector_is_the_same_bits_alone_in_a_batch_and_in_chunks(smollm2_path: str, pooling: str) -> None:
    long = " ".join(f"word{i}" for i in range(120))  # past one step of the chunked engine below
    prompts = [long, "Paris is the capital of France.", "hello"]
    whole = lmplex.Engine(ModelConfig(smollm2_path, task="embed", pooling=pooling, max_model_len=512))
    alone = [whole.embed(p)[0] for p in prompts]
    batched = whole.embed(prompts)
    chunked = lmplex.Engine(
        ModelConfig(smollm2_path, task="embed", pooling=pooling, max_model_len=512, max_num_batched_tokens=32)
    ).embed(prompts)
    for a, b, c in zip(alone, batched, chunked):
        assert a.tobytes() == b.tobytes() == c.tobytes()
    # A repeated prompt (a prefix-cache hit for last pooling) gives the same bits.
    assert whole.embed(long)[0].tobytes() == alone[0].tobytes()
    # Token ids are the text's tokens.
    assert whole.embed([whole.tokenize(prompts[1])])[0].tobytes() == alone[1].tobytes()


def test_dimensions_truncate_then_normalize_and_errors_are_typed(smollm2_path: str) -> None:
    engine = lmplex.Engine(ModelConfig(smollm2_path, task="embed", max_model_len=256))
    assert engine.config.task == "embed" and engine.config.pooling is None  # last, resolved at load
    raw = engine.embed("The quick brown fox", normalize=False)[0]
    short = engine.embed("The quick brown fox", dimensions=64)[0]
    np.testing.assert_allclose(short, raw[:64] / np.linalg.norm(raw[:64]), rtol=0, atol=1e-6)
    with pytest.raises(
        InvalidRequest, match="dimensions must be between 1 and the model's embedding size 576"
    ):
        engine.embed("x", dimensions=577)
    with pytest.raises(InvalidRequest, match="is an embedding model"):
        engine.generate("hello")
    with pytest.raises(InvalidRequest, match="pooling applies to embedding models only"):
        ModelConfig(smollm2_path, pooling="mean")
    with pytest.raises(InvalidRequest, match="unknown pooling 'cls'"):
        ModelConfig(smollm2_path, task="embed", pooling="cls")
    with pytest.raises(InvalidRequest, match="embedding models .* run on the CPU"):
        ModelConfig(smollm2_path, task="embed", device="cuda")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smollm2_path: str) -> Iterator[Server]:
    srv = Server(
        tmp_path_factory.mktemp("embeddings"),
        [
            {
                "model_id": smollm2_path,
                "name": "embedder",
                "task": "embed",
                "pooling": "mean",
                "max_model_len": 512,
            },
            {"model_id": smollm2_path, "name": "chat", "max_model_len": 512},
        ],
        tenants=[
            {"name": "open", "api_key": "sk-open"},
            {"name": "metered", "api_key": KEY, "tokens_per_minute": 40, "quota_window_s": 60},
        ],
    )
    srv.wait_ready()
    yield srv
    assert srv.stop() == 0, "".join(srv.log)


def _client(server: Server, key: str = "sk-open") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)


def test_openai_client_embeddings_match_the_engine(server: Server, smollm2_path: str) -> None:
    engine = lmplex.Engine(ModelConfig(smollm2_path, task="embed", pooling="mean", max_model_len=512))
    texts = ["Paris is the capital of France.", "A KV cache keeps keys and values.", "hello"]
    want = engine.embed(texts)
    client = _client(server)
    # The client's default asks for base64 and decodes it with numpy.
    r = client.embeddings.create(model="embedder", input=texts)
    assert r.model == "embedder" and [d.index for d in r.data] == [0, 1, 2]
    for d, w in zip(r.data, want):
        assert np.array(d.embedding, dtype=np.float32).tobytes() == w.tobytes()
    ids = [engine.tokenize(t) for t in texts]
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(len(i) for i in ids)
    # Floats as JSON, token-id inputs and dimensions.
    f = client.embeddings.create(model="embedder", input=ids[0], encoding_format="float", dimensions=32)
    short = engine.embed(texts[0], dimensions=32)[0]
    assert len(f.data) == 1 and np.array(f.data[0].embedding, dtype=np.float32).tobytes() == short.tobytes()
    # The raw body: base64 of little-endian float32.
    body = {"model": "embedder", "input": "hello", "encoding_format": "base64", "normalize": False}
    raw = httpx.post(f"{server.url}/v1/embeddings", json=body, headers={"Authorization": "Bearer sk-open"})
    assert raw.status_code == 200, raw.text
    got = np.frombuffer(base64.b64decode(raw.json()["data"][0]["embedding"]), dtype="<f4")
    assert got.tobytes() == engine.embed("hello", normalize=False)[0].tobytes()
    assert raw.json()["object"] == "list" and raw.json()["data"][0]["object"] == "embedding"


def test_embedding_errors_are_openai_400s(server: Server) -> None:
    client = _client(server)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"model": "chat", "input": "hi"}, "does not serve embeddings"),
        ({"model": "embedder", "input": ""}, "must not be empty"),
        ({"model": "embedder", "input": []}, "must not be an empty list"),
        ({"model": "embedder", "input": "hi", "dimensions": 0}, "dimensions must be at least 1"),
        ({"model": "embedder", "input": "hi", "dimensions": 10_000}, "embedding size 576"),
        ({"model": "embedder", "input": "hi", "encoding_format": "hex"}, "encoding_format"),
        ({"model": "lmplex:auto", "input": "hi"}, "needs a served model's name"),
        ({"model": "embedder", "input": [[999_999]]}, "outside the vocabulary"),
    ]
    for body, message in cases:
        r = httpx.post(f"{server.url}/v1/embeddings", json=body, headers={"Authorization": "Bearer sk-open"})
        assert r.status_code == 400, (body, r.text)
        assert message in r.json()["error"]["message"], (body, r.text)
    with pytest.raises(openai.BadRequestError, match="is an embedding model"):
        client.chat.completions.create(model="embedder", messages=[{"role": "user", "content": "hi"}])
    r = httpx.post(f"{server.url}/v1/embeddings", json={"model": "nope", "input": "hi"})
    assert r.status_code in (401, 404)


def test_embeddings_count_against_a_tenants_token_quota(server: Server) -> None:
    client = _client(server, KEY)
    text = "one two three four five six seven eight nine ten"
    n = client.embeddings.create(model="embedder", input=text).usage.prompt_tokens
    assert 5 <= n < 20
    used = n
    with pytest.raises(openai.RateLimitError):
        while used <= 40:
            used += client.embeddings.create(model="embedder", input=text).usage.prompt_tokens
    usage = httpx.get(f"{server.url}/v1/usage", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert usage["prompt_tokens"] == used and usage["completion_tokens"] == 0


def test_the_documented_figures_are_the_committed_run() -> None:
    root = Path(__file__).parent.parent
    run = json.loads((root / "docs" / "bench" / "embedding-parity-cpu.json").read_text())
    doc = " ".join((root / "docs" / "server.md").read_text().split())
    for kv, bound in REL_TOL.items():
        worst = max(r["max_rel_diff"] for r in run["results"] if r["kv_cache_dtype"] == kv)
        assert worst < bound
        assert f"{worst:.1e}".replace("e-0", "e-") + f" of the vector's largest element with {kv}" in doc or (
            f"{worst:.1e}".replace("e-0", "e-") + f" with the default {kv}" in doc
        )
