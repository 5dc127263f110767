"""``ModelConfig(dtype=...)`` on the CPU with a Hugging Face folder: what the dense matrices are
stored as, what the KV cache and the report say, and how far each dtype's greedy decode moves
from the float32 run of the same weights (SmolLM2-135M exported as a float32 folder).

``auto`` keeps the folder's element type (and a bf16 folder computes in bf16); ``bfloat16`` and ``float16`` store every dense matrix
in two bytes (rounded once, at load); ``bfloat16`` also rounds prompt rows' activations to
bf16 on a CPU with AMX (torch's bf16 precision), so its log-probs move most.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import lmplex
from lmplex import ModelConfig, SamplingParams

PROMPT = "The capital of France is"
STEPS = 8


def _export(smollm2_path: str, tmp_path_factory: pytest.TempPathFactory, dtype: str) -> str:
    out = tmp_path_factory.mktemp("dense") / f"smollm2-{dtype}"
    done = subprocess.run(
        [sys.executable, "-m", "lmplex", "models", "export", smollm2_path, str(out), "--dtype", dtype],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return str(out)


@pytest.fixture(scope="module")
def f32_folder(smollm2_path: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    return _export(smollm2_path, tmp_path_factory, "float32")


def _greedy(engine: lmplex.Engine) -> tuple[list[int], list[float]]:
    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True, logprobs=1)
    out = engine.generate([PROMPT], params)[0]
    assert out.logprobs is not None
    chosen = [step.logprob for step in out.logprobs]
    return list(out.token_ids), chosen


@pytest.fixture(scope="module")
def reference(f32_folder: str) -> tuple[lmplex.Engine, list[int], list[float]]:
    engine = lmplex.Engine(ModelConfig(f32_folder, max_model_len=256))
    return (engine, *_greedy(engine))


def test_auto_keeps_the_folder_dtype(reference: tuple[lmplex.Engine, list[int], list[float]]) -> None:
    engine, _, _ = reference
    assert engine.info.compute_dtype == "float32" and engine.info.kv_dtype == "float32"


def test_auto_on_a_bf16_folder_computes_in_bfloat16(
    smollm2_path: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # As vLLM's and torch's ``auto``: a bf16 checkpoint computes in bf16, the same bits as
    # asking for ``bfloat16``; ``float32`` widens the matrices and computes in f32.
    folder = _export(smollm2_path, tmp_path_factory, "bfloat16")
    auto = lmplex.Engine(ModelConfig(folder, max_model_len=256))
    assert (auto.info.compute_dtype, auto.info.kv_dtype) == ("bfloat16", "float16")
    asked = lmplex.Engine(ModelConfig(folder, max_model_len=256, dtype="bfloat16"))
    assert _greedy(auto) == _greedy(asked)
    wide = lmplex.Engine(ModelConfig(folder, max_model_len=256, dtype="float32"))
    assert wide.info.compute_dtype == "float32"
    assert wide.memory().weights > 1.9 * auto.memory().weights


@pytest.mark.parametrize(
    ("dtype", "kv_dtype", "tol"),
    # The chosen tokens' log-probs against float32's, measured: float16 weights (11 significant
    # bits) and K/V moved them by at most 0.0023; bfloat16 weights (8 bits) by 0.021, with
    # activations rounded to bf16 on AMX by 0.011. Every token was the same.
    [("float32", "float32", 0.0), ("float16", "float16", 0.01), ("bfloat16", "float16", 0.05)],
)
def test_dtype_stores_weights_and_stays_close(
    f32_folder: str,
    reference: tuple[lmplex.Engine, list[int], list[float]],
    dtype: str,
    kv_dtype: str,
    tol: float,
) -> None:
    ref_engine, ref_ids, ref_lp = reference
    engine = lmplex.Engine(ModelConfig(f32_folder, max_model_len=256, dtype=dtype))
    info = engine.info
    assert info.kv_dtype == kv_dtype
    assert info.compute_dtype == ("bfloat16" if dtype == "bfloat16" else "float32")
    full, mine = ref_engine.memory().weights, engine.memory().weights
    if dtype == "float32":
        assert mine == full
    else:
        # Matrices in two bytes; norms stay float32 (a few KB).
        assert 0.49 * full < mine < 0.51 * full, (mine, full)
    ids, lp = _greedy(engine)
    assert ids == ref_ids
    worst = max(abs(a - b) for a, b in zip(lp, ref_lp))
    assert worst <= tol, f"{dtype}: chosen log-probs moved by {worst:.4f}"


def test_budget_plans_the_dtype(f32_folder: str) -> None:
    # The plan (from the headers, before loading) counts matrices in the dtype asked for: about
    # 270 MB in bfloat16 fits 400 MB, the folder's 540 MB of float32 does not.
    def config(dtype: str) -> ModelConfig:
        return ModelConfig(f32_folder, max_model_len=256, kv_cache_bytes=16 << 20, dtype=dtype)

    host = lmplex.ModelHost([config("bfloat16")], memory_budget_bytes=400 << 20)
    assert host.models
    with pytest.raises(lmplex.CapacityError):
        lmplex.ModelHost([config("float32")], memory_budget_bytes=400 << 20)


def test_bfloat16_prompts_are_batch_invariant(f32_folder: str) -> None:
    # bfloat16 mode runs prompt rows' matmuls and attention on AMX where the CPU has it (over
    # fixed 64-key blocks): a 300-token prompt gives the same bits alone, next to other prompts,
    # and prefilled in 48-token chunks.
    long = " ".join(f"Item {i} is a word." for i in range(60))
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=2)

    def run(prompts: list[str], chunk: int | None = None) -> tuple[list[int], list[float]]:
        config = ModelConfig(f32_folder, max_model_len=512, dtype="bfloat16", max_num_batched_tokens=chunk)
        engine = lmplex.Engine(config)
        out = engine.generate(prompts, greedy)[0]
        assert out.logprobs is not None and out.usage.prompt_tokens > 256
        return list(out.token_ids), [s.logprob for s in out.logprobs]

    alone = run([long])
    assert run([long, "Hello there", long[:200]]) == alone
    assert run([long], chunk=48) == alone
