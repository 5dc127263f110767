"""The CUDA backend end to end, through :class:`lmplex.Engine` with ``device="cuda"``.

What is checked, each against an oracle run in the same test:

* float32 on CUDA against the CPU backend in float32 (weights, activations and KV; tiny random Llama with tied embeddings, tiny random Qwen2 with
  attention biases): the same greedy tokens, top-5 log-probs within ``F32_LOGPROB_TOL``.
* bfloat16 on CUDA against transformers in bfloat16 on the same GPU and folder: the same greedy tokens,
  top-5 log-probs (the first step is the prompt's next-token distribution) within ``BF16_LOGPROB_TOL``.
* SmolLM2-135M GGUF (the fetched alias) on CUDA in bfloat16 against the CPU backend: the same first 8
  greedy tokens of chat prompts.
* A request's tokens and log-probs (greedy, and seeded sampling) are the same alone and among 64, and
  the same with CUDA graphs as with ``enforce_eager`` (no capture may fail), and the same with the
  fused kernels (``LMPLEX_CUDA_FUSED=1``) as with the launches they replace; parity with transformers
  and a request alone against among 64 also hold with every switch on (the tile GEMM, the fused
  kernels, attention on the tensor cores); greedy tokens picked on
  the device (no logprobs asked) are those the host sampler picks from the logits.
* ``info`` names the device and dtypes; ``memory()`` adds up, and what the engine holds on the device
  beyond weights, KV cache and workspace (CUDA context included) stays under 1 GiB (the goal is 0.5 GiB).

Models: random weights (seeded, ``initializer_range`` 0.05 so the logits are not flat, random biases
and norm weights so both are exercised) built with transformers, saved as bfloat16 safetensors with a
byte-level tokenizer written here: ids 0-255 are the bytes, 256 is ``<|endoftext|>``, the rest
fillers up to the model's vocabulary. Storing bfloat16 means every side reads the same weight values.
Prompts are token ids below 256.

Near ties: greedy tokens must be equal; where a step's top-1/top-2 log-prob gap is under the near-tie
threshold on either side (rounding may flip it), a divergence is accepted only if each side's token is
in the other's top-5, and the comparison of that prompt ends there.

Invariants: every test skips with the reason unless PyTorch sees a CUDA device and transformers is
installed (CuPy is not needed here); nothing is downloaded; the SmolLM2 test skips (or fails under
``LMPLEX_REQUIRE_MODELS=1``) when the alias was not fetched.
"""

from __future__ import annotations

import gc
import inspect
import json
import math
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import lmplex
from lmplex import ModelConfig, RequestOutput, SamplingParams

Steps = list[list[tuple[int, float]]]  # per step: the top-n (token id, log-prob), best first

VOCAB = 512
EOS_ID = 256
TOP_N = 5
# float32 on both sides: only the summation order differs, so log-probs agree to ~1e-5; 1e-3 leaves room.
F32_LOGPROB_TOL = 1e-3
F32_NEAR_TIE = 1e-4
# bfloat16 keeps 8 significant bits (relative step 2^-8 = 0.4%); the logits here stay within about +-4,
# so one rounding moves a logit by at most 0.008, and the two implementations round at different points
# in 4 layers. 5e-2 on log-probs allows several such steps; a flip needs a gap under twice that.
BF16_LOGPROB_TOL = 5e-2
BF16_NEAR_TIE = 2 * BF16_LOGPROB_TOL
GiB = 1 << 30


def byte_alphabet() -> list[str]:
    """GPT-2's byte-level alphabet: the character that stands for each byte 0-255."""
    keep = {*range(33, 127), *range(161, 173), *range(174, 256)}
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """A byte-level BPE ``tokenizer.json`` without merges: ids 0-255 are the bytes, EOS_ID is
    ``<|endoftext|>``, ids above it are fillers, so the vocabulary is exactly ``vocab_size``."""
    vocab = {ch: i for i, ch in enumerate(byte_alphabet())}
    vocab["<|endoftext|>"] = EOS_ID
    vocab.update({f"<t{i}>": i for i in range(EOS_ID + 1, vocab_size)})
    flags = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tokenizer: dict[str, Any] = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": EOS_ID, "content": "<|endoftext|>", **flags}],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))


def build_model(torch: Any, transformers: Any, folder: Path, model_type: str, tie: bool) -> Path:
    """A random tiny ``model_type`` (hidden 256, 4 layers, 4 heads of 64, 2 KV heads) saved in bfloat16."""
    config_class = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[model_type]
    config = config_class(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        initializer_range=0.05,
        tie_word_embeddings=tie,
        bos_token_id=EOS_ID,
        eos_token_id=EOS_ID,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):  # Qwen2's q/k/v biases start at zero: make them count
                param.normal_(0.0, 0.5)
            elif name.endswith("norm.weight"):
                param.uniform_(0.8, 1.2)
    model.to(torch.bfloat16)
    save = model.save_pretrained
    save(
        folder,
        **(
            {"safe_serialization": True} if "safe_serialization" in inspect.signature(save).parameters else {}
        ),
    )
    write_tokenizer(folder, VOCAB)
    return folder


@pytest.fixture(scope="session")
def llama_dir(torch: Any, transformers: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(torch, transformers, tmp_path_factory.mktemp("tiny-llama"), "llama", tie=True)


@pytest.fixture(scope="session")
def qwen2_dir(torch: Any, transformers: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(torch, transformers, tmp_path_factory.mktemp("tiny-qwen2"), "qwen2", tie=False)


def cuda_engine(path: Path | str, dtype: str, **kwargs: Any) -> lmplex.Engine:
    kwargs = {"max_model_len": 1024, "max_model_concurrency": 8, **kwargs}
    return lmplex.Engine(ModelConfig(str(path), device="cuda", dtype=dtype, **kwargs))


def prompts(lengths: list[int], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(EOS_ID) for _ in range(n)] for n in lengths]


def greedy(steps: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=steps, logprobs=TOP_N, ignore_eos=True)


def lmplex_steps(out: RequestOutput) -> Steps:
    assert out.logprobs is not None
    return [[(t.token_id, t.logprob) for t in step.top] for step in out.logprobs]


def compare_greedy(mine: Steps, ref: Steps, logprob_tol: float | None, near_tie: float) -> int:
    """How many steps agreed before a divergence at a near tie (any other divergence fails). On steps
    that agree, every token in both top-n lists has log-probs within ``logprob_tol``."""
    for i, (a, b) in enumerate(zip(mine, ref)):
        if a[0][0] != b[0][0]:
            gap = min(a[0][1] - a[1][1], b[0][1] - b[1][1])
            assert gap < near_tie, f"step {i}: lmplex {a[0]} vs reference {b[0]}, no near tie ({gap:.2e})"
            assert a[0][0] in dict(b) and b[0][0] in dict(a), (i, a, b)
            return i
        if logprob_tol is not None:
            theirs = dict(b)
            for token, logprob in a:
                if token in theirs:
                    assert abs(logprob - theirs[token]) <= logprob_tol, (i, token, logprob, theirs[token])
    return min(len(mine), len(ref))


@pytest.mark.parametrize("model_dir", ["llama_dir", "qwen2_dir"])
def test_float32_on_cuda_matches_the_cpu_backend(
    torch: Any, model_dir: str, request: pytest.FixtureRequest
) -> None:
    folder: Path = request.getfixturevalue(model_dir)
    batch = prompts([1, 7, 33, 130, 600], seed=1)  # 600 spans several KV blocks and attention partitions
    # float32 weights, activations and KV on the CPU too: its `auto` on a bf16 folder multiplies bf16
    # activations, which moves log-probs by ~3e-3 and would hide a real float32 difference.
    cpu_config = ModelConfig(
        str(folder),
        device="cpu",
        dtype="float32",
        kv_cache_dtype="float32",
        max_model_len=1024,
        max_model_concurrency=8,
    )
    cpu = lmplex.Engine(cpu_config)
    assert (cpu.info.compute_dtype, cpu.info.kv_dtype) == ("float32", "float32")
    gpu = cuda_engine(folder, "float32")
    assert (gpu.info.device, gpu.info.compute_dtype, gpu.info.kv_dtype) == (
        "cuda",
        "float32",
        "float32",
    )
    steps = 24
    theirs, mine = cpu.generate(batch, greedy(steps)), gpu.generate(batch, greedy(steps))
    compared = sum(
        compare_greedy(lmplex_steps(m), lmplex_steps(t), F32_LOGPROB_TOL, F32_NEAR_TIE)
        for m, t in zip(mine, theirs)
    )
    assert compared >= 0.75 * steps * len(batch)  # one near tie at step 0 of one prompt costs 20%


def hf_greedy(torch: Any, model: Any, prompt: list[int], steps: int) -> Steps:
    """transformers' greedy decode, recomputing the whole sequence each step (no cache to get wrong)."""
    ids, out = list(prompt), []
    with torch.inference_mode():
        for _ in range(steps):
            logits = model(torch.tensor([ids], device="cuda")).logits[0, -1].float()
            values, indices = torch.log_softmax(logits, -1).topk(TOP_N)
            step = [(int(i), float(v)) for i, v in zip(indices.tolist(), values.tolist())]
            out.append(step)
            ids.append(step[0][0])
    return out


def load_hf(torch: Any, transformers: Any, folder: Path) -> Any:
    dtype_kw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, **{dtype_kw: torch.bfloat16})
    return model.to("cuda").eval()


# Each switch that stays off until a device run confirms it, all on (`EVERY_SWITCH`).
EVERY_SWITCH = {"LMPLEX_CUDA_GEMM": "tiles", "LMPLEX_CUDA_FUSED": "1", "LMPLEX_CUDA_ATTENTION": "tensor"}


@pytest.mark.parametrize("switches", ["default", "every switch"])
@pytest.mark.parametrize("model_dir", ["llama_dir", "qwen2_dir"])
def test_bfloat16_on_cuda_matches_transformers(
    torch: Any,
    transformers: Any,
    model_dir: str,
    switches: str,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in (EVERY_SWITCH if switches == "every switch" else {}).items():
        monkeypatch.setenv(name, value)
    folder: Path = request.getfixturevalue(model_dir)
    batch, steps = prompts([3, 40, 300], seed=2), 8
    gpu = cuda_engine(folder, "auto")
    assert (gpu.info.device, gpu.info.compute_dtype, gpu.info.kv_dtype) == (
        "cuda",
        "bfloat16",
        "bfloat16",
    )
    mine = gpu.generate(batch, greedy(steps))
    model = load_hf(torch, transformers, folder)
    theirs = [hf_greedy(torch, model, p, steps) for p in batch]
    del model
    torch.cuda.empty_cache()
    compared = sum(
        compare_greedy(lmplex_steps(m), t, BF16_LOGPROB_TOL, BF16_NEAR_TIE) for m, t in zip(mine, theirs)
    )
    assert compared >= steps * len(batch) // 2


def test_smollm2_gguf_on_cuda_matches_the_cpu_backend(
    torch: Any, smollm2_path: str, engine: lmplex.Engine
) -> None:
    chats = [
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "user", "content": "Name three colors."}],
    ]
    gpu = cuda_engine(smollm2_path, "auto", max_model_len=2048)
    assert gpu.info.device == "cuda"
    mine, theirs = gpu.generate(chats, greedy(8)), engine.generate(chats, greedy(8))
    for m, t in zip(mine, theirs):
        # Q4_1 weights: the CPU multiplies the blocks in float32, CUDA in bfloat16; tokens only.
        compare_greedy(lmplex_steps(m), lmplex_steps(t), None, BF16_NEAR_TIE)


@pytest.mark.parametrize("switches", ["default", "every switch"])
def test_a_request_is_the_same_alone_and_among_64(
    torch: Any, llama_dir: Path, switches: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in (EVERY_SWITCH if switches == "every switch" else {}).items():
        monkeypatch.setenv(name, value)
    # No prefix caching: the alone runs would otherwise reuse the batch's KV blocks.
    gpu = cuda_engine(llama_dir, "bfloat16", max_model_concurrency=64, enable_prefix_caching=False)
    batch = prompts([1 + (37 * i) % 300 for i in range(64)], seed=3)
    plain = greedy(32)
    seeded = SamplingParams(
        temperature=0.8, top_p=0.95, seed=1234, max_tokens=32, logprobs=3, ignore_eos=True
    )
    others = [
        SamplingParams(temperature=float(i % 2), seed=i, max_tokens=8 + i % 40, ignore_eos=True)
        for i in range(2, 64)
    ]
    together = gpu.generate(batch, [plain, seeded, *others])  # the others finish at different steps
    for i, params in ((0, plain), (1, seeded)):
        alone = [gpu.generate([batch[i]], params)[0] for _ in range(2)]
        assert alone[0].token_ids == alone[1].token_ids, "run to run"
        assert together[i].token_ids == alone[0].token_ids, f"request {i}: batch of 64 != alone"
        assert lmplex_steps(together[i]) == lmplex_steps(alone[0]), f"request {i}: log-probs differ"


def test_cuda_graphs_change_no_token_or_log_prob(
    torch: Any, llama_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Decode steps replay captured graphs (batches of 1 and of 3 sequences, contexts of several block
    # strides); enforce_eager launches every kernel. Both must give the same bits.
    batch = prompts([5, 60, 200], seed=4)
    params = [greedy(40), SamplingParams(temperature=0.7, seed=9, max_tokens=24, logprobs=3, ignore_eos=True)]
    runs = []
    for eager in (False, True):
        gpu = cuda_engine(llama_dir, "bfloat16", enforce_eager=eager, enable_prefix_caching=False)
        assert gpu.config.enforce_eager is eager
        runs.append([gpu.generate(batch, p) for p in params] + [gpu.generate(batch[:1], params[0])])
        del gpu
        gc.collect()
    for graphed, eager_out in zip(*runs):
        assert [o.token_ids for o in graphed] == [o.token_ids for o in eager_out]
        assert [lmplex_steps(o) for o in graphed] == [lmplex_steps(o) for o in eager_out]
    assert not [r for r in caplog.records if "graph capture failed" in r.getMessage()]


@pytest.mark.parametrize("gemm", ["vendor", "tiles"])
def test_the_fused_kernels_change_no_token_or_log_prob(
    torch: Any, llama_dir: Path, monkeypatch: pytest.MonkeyPatch, gemm: str
) -> None:
    # RoPE with the KV write, one-pass attention (contexts within one partition), and with the tile
    # GEMM the norms and SwiGLU inside the GEMMs: each fused kernel gives the bits of the launches
    # it replaces, so the switch changes no token or log-prob, eager or graphed.
    batch = prompts([5, 60, 200], seed=5)
    params = [greedy(40), SamplingParams(temperature=0.7, seed=9, max_tokens=24, logprobs=3, ignore_eos=True)]
    monkeypatch.setenv("LMPLEX_CUDA_GEMM", gemm)
    runs = []
    for fused in ("0", "1"):
        monkeypatch.setenv("LMPLEX_CUDA_FUSED", fused)
        for eager in (False, True):
            gpu = cuda_engine(llama_dir, "bfloat16", enforce_eager=eager, enable_prefix_caching=False)
            runs.append([gpu.generate(batch, p) for p in params])
            del gpu
            gc.collect()
    for other in runs[1:]:
        for want, got in zip(runs[0], other):
            assert [o.token_ids for o in got] == [o.token_ids for o in want]
            assert [lmplex_steps(o) for o in got] == [lmplex_steps(o) for o in want]


def test_device_argmax_picks_the_samplers_tokens(torch: Any, qwen2_dir: Path) -> None:
    # Greedy without logprobs: the argmax is taken on the device and only ids are copied back. With
    # logprobs the logits rows cross to the host sampler. Both must pick the same tokens.
    gpu = cuda_engine(qwen2_dir, "bfloat16", max_model_concurrency=16, enable_prefix_caching=False)
    batch = prompts([3, 50, 120, 7, 300], seed=6)
    plain = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    on_device = [o.token_ids for o in gpu.generate(batch, plain)]
    on_host = [o.token_ids for o in gpu.generate(batch, greedy(24))]
    assert on_device == on_host
    alone = [gpu.generate([p], plain)[0].token_ids for p in batch[:2]]
    assert alone == on_device[:2]


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [("auto", "bfloat16"), ("bfloat16", "bfloat16"), ("float16", "float16"), ("float32", "float32")],
)
def test_info_names_the_device_and_dtypes(torch: Any, llama_dir: Path, dtype: str, expected: str) -> None:
    gpu = cuda_engine(llama_dir, dtype)
    assert gpu.info.device == "cuda"
    assert (gpu.info.compute_dtype, gpu.info.kv_dtype) == (expected, expected)
    out = gpu.generate([[1, 2, 3]], greedy(4))[0]
    assert len(out.token_ids) == 4
    assert all(math.isfinite(lp) for step in lmplex_steps(out) for _, lp in step)


# Run in a child process: the CUDA context this process holds (PyTorch, CuPy) is not the engine's.
MEMORY_PROBE = """
import json, sys
import lmplex
engine = lmplex.Engine(lmplex.ModelConfig(sys.argv[1], device="cuda", max_model_len=1024))
engine.generate([[1, 2, 3]], lmplex.SamplingParams(temperature=0.0, max_tokens=4))
print(json.dumps({"memory": engine.memory().to_dict(), "info": engine.info.to_dict()}))
"""


def _probe(script: str, model_dir: Path) -> Any:
    """The JSON that ``script`` prints last, run in a child process on ``model_dir``."""
    done = subprocess.run(
        [sys.executable, "-c", script, str(model_dir)],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_memory_adds_up_and_overhead_is_small(torch: Any, llama_dir: Path) -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    before = total - free  # the whole device, as cuMemGetInfo counts it, before the engine exists
    report = _probe(MEMORY_PROBE, llama_dir)
    mem = lmplex.MemoryReport.from_core(report["memory"])
    assert report["info"]["device"] == "cuda"
    assert mem.device_used is not None and mem.device_total is not None, mem
    assert min(mem.weights, mem.kv_cache, mem.workspace) > 0, mem
    assert mem.other >= 0, mem
    parts = ("weights", "kv_cache", "workspace", "graphs", "other", "kv_swap")
    assert mem.total == sum(getattr(mem, k) for k in parts), mem
    assert 0 <= mem.graphs <= 256 << 20, mem  # one decode shape captured, by the driver's count
    assert mem.device_total == total
    assert 0 < mem.device_used <= mem.device_total
    engine_used = mem.device_used - before
    assert engine_used >= mem.weights, (engine_used, mem)
    everything_else = engine_used - mem.weights - mem.kv_cache - mem.workspace - mem.graphs
    print(
        f"\ndevice memory beyond weights + KV + workspace + graphs: {everything_else / GiB:.3f} GiB ({mem})"
    )
    assert everything_else <= GiB, f"{everything_else / GiB:.2f} GiB beyond weights, KV and workspace"


HOST_PROBE = """
import json, sys
import lmplex
host = lmplex.ModelHost([lmplex.ModelConfig(sys.argv[1], device="cuda", max_model_len=1024)])
print(json.dumps(host.memory().to_dict()))
"""


def test_the_devices_context_is_measured_by_the_driver(torch: Any, llama_dir: Path) -> None:
    mem = _probe(HOST_PROBE, llama_dir)
    context = mem["cuda"]["cuda:0"]["context"]
    print(f"\nCUDA context and kernels, by NVML: {context / GiB if context else context} GiB")
    # NVML comes with the driver; the context and the loaded kernels take some hundreds of MiB.
    assert context is not None and 32 << 20 <= context <= 2 * GiB, mem
