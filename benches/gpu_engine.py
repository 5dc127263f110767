#!/usr/bin/env python3
"""lmplex's CUDA backend against transformers and against the device's memory bandwidth, in one run.

    python benches/gpu_engine.py --out DIR                                 # Llama-3.2-1B and Llama-3-8B
    python benches/gpu_engine.py --out DIR --models llama-3.2-1b --quick   # fewer tokens and repeats

Models are random-weight bfloat16 Llamas of the real shapes (speed does not depend on weight values),
built on the GPU with transformers and saved with a byte-level tokenizer into a temporary folder
(``--work-dir`` keeps them) that both systems load. ``lmplex-w4a16`` is lmplex on the same weights
quantized to Q4_K_M by ``lmplex.quantize`` (timed as ``quantize_s``), kept in their blocks on the
device; its roofline counts the quantized bytes and ``vs_bf16_decode`` is its decode rate over
lmplex's bf16 rate. ``lmplex-tiles`` and ``lmplex-w4a16-tiles`` are the same with
``LMPLEX_CUDA_GEMM=tiles`` (the tensor-core tile GEMM in place of cuBLAS and the GEMV; the W4A16
ratio then against ``lmplex-tiles``); ``lmplex-fused`` is ``lmplex-tiles`` with the fused kernels too
(``LMPLEX_CUDA_FUSED=1``), and ``lmplex-all`` that with attention on the tensor cores too
(``LMPLEX_CUDA_ATTENTION=tensor``). Per model and system:

* ``ready_s``: from loading (lmplex: ``Engine(...)``) to the first token of a first 1-token request;
* ``decode_tok_s``: batch-1 greedy decode of 128 tokens after a 16-token prompt, excluding the first
  token (median of 3), with inter-token latency percentiles for lmplex, and lmplex's rate without
  CUDA graphs (``eager_decode_tok_s``, ``enforce_eager=True``);
* ``roofline_percent``: decode tok/s over bandwidth / (weight bytes + K/V bytes of the mean context),
  with the bandwidth of a device-to-device copy measured first (2 x bytes / time);
* ``throughput``: tokens/s of 64 and 256 concurrent requests (24-40-token prompts, 128 tokens each; for
  transformers one left-padded ``generate`` of 64);
* ``ttft_s``: a 1,000-token prompt to its first token (``max_tokens=1`` / ``max_new_tokens=1``);
* lmplex's ``memory()`` and everything else on the device (``device_used - weights - kv_cache``).

Writes ``DIR/gpu.json`` (with the GPU, driver, versions and git commit) and ``DIR/gpu.png``.

Invariants: every number is measured here, nothing is asserted; each system runs in its own child
process, one after another, so no CUDA context or allocator cache of one counts in another's memory or
timings; a peer that cannot run (not installed, out of memory) is skipped with the reason, never faked;
both systems get the same token ids, decode greedily and ignore EOS, so token counts match.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import inspect
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
SYSTEMS = [
    "lmplex",
    "lmplex-tiles",
    "lmplex-fused",
    "lmplex-all",
    "lmplex-w4a16",
    "lmplex-w4a16-tiles",
    "transformers",
]
TILE_GEMM = {"LMPLEX_CUDA_GEMM": "tiles"}
FUSED = {**TILE_GEMM, "LMPLEX_CUDA_FUSED": "1"}
EVERY_SWITCH = {**FUSED, "LMPLEX_CUDA_ATTENTION": "tensor"}
SWITCHES = {"lmplex-fused": FUSED, "lmplex-all": EVERY_SWITCH}
LLAMA3: dict[str, Any] = {"num_attention_heads": 32, "num_key_value_heads": 8, "rope_theta": 500000.0}


def llama(hidden: int, inter: int, layers: int, tie: bool, max_len: int, scaling: Any) -> dict[str, Any]:
    """A Llama-3 family shape: 32 query heads, 8 KV heads, 128,256 tokens, rope theta 500,000."""
    shape = {"hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers, **LLAMA3}
    shape.update({"vocab_size": 128256, "tie_word_embeddings": tie, "max_position_embeddings": max_len})
    return {**shape, "rope_scaling": scaling}


SHAPES = {
    "llama-3.2-1b": llama(2048, 8192, 16, tie=True, max_len=131072, scaling=LLAMA3_SCALING),
    "llama-3-8b": llama(4096, 14336, 32, tie=False, max_len=8192, scaling=None),
    # 0.37B: a small model of the family's heads and vocabulary (benches/multi_model.py).
    "llama-0.5b": llama(1024, 4096, 16, tie=True, max_len=8192, scaling=None),
}
EOS_ID = 256  # the tokenizer: ids 0-255 are bytes, 256 is <|endoftext|>, the rest fillers
PROMPT_LEN, TTFT_LEN, MAX_MODEL_LEN = 16, 1000, 2048
DEVICE_USED = (
    "cuMemGetInfo total - free: everything on the whole device, every process; during the lmplex run only "
    "lmplex's own process holds device memory (the bench runs each system in its own process), so it "
    "includes lmplex's CUDA context, module images and allocator slack"
)


def optional(name: str) -> Any:
    """An optional peer's module (typed as Any); ImportError when it is not installed."""
    return importlib.import_module(name)


def workload(quick: bool) -> dict[str, int]:
    """Tokens generated per request (batch-1 decode and throughput alike), and repeats of each timing."""
    return {"tokens": 32 if quick else 128, "repeats": 1 if quick else 3}


def concurrency(quick: bool) -> list[int]:
    return [64] if quick else [64, 256]


def prompts(lengths: list[int], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(EOS_ID) for _ in range(n)] for n in lengths]


def batch(n: int) -> list[list[int]]:
    return prompts([24 + i % 17 for i in range(n)], seed=n)


def percentiles(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    return {f"p{p}": s[min(len(s) - 1, int(p / 100 * len(s)))] for p in (50, 90, 99)} if s else {}


def kv_bytes_per_token(shape: dict[str, Any]) -> int:
    layers, kv_heads = int(shape["num_hidden_layers"]), int(shape["num_key_value_heads"])
    head_dim = int(shape["hidden_size"]) // int(shape["num_attention_heads"])
    return 2 * layers * kv_heads * head_dim * 2  # K and V, bf16


def dtype_kw(transformers: Any) -> str:
    return "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """Byte-level BPE without merges (as in tests/gpu/test_engine_gpu.py), exactly ``vocab_size`` ids."""
    keep = {*range(33, 127), *range(161, 173), *range(174, 256)}
    extra = iter(range(256, 512))
    vocab = {(chr(b) if b in keep else chr(next(extra))): b for b in range(256)}
    vocab["<|endoftext|>"] = EOS_ID
    vocab.update({f"<t{i}>": i for i in range(EOS_ID + 1, vocab_size)})
    flags = dict.fromkeys(("single_word", "lstrip", "rstrip", "normalized"), False)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    nulls = dict.fromkeys(("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"))
    bpe = {"type": "BPE", **nulls, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False}
    tokenizer: dict[str, Any] = {
        "version": "1.0",
        **dict.fromkeys(("truncation", "padding", "normalizer", "post_processor")),
        "added_tokens": [{"id": EOS_ID, "content": "<|endoftext|>", **flags, "special": True}],
        "pre_tokenizer": byte_level,
        "decoder": byte_level,
        "model": {**bpe, "vocab": vocab, "merges": []},
    }
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))


# ---- workers: each runs in its own process and returns one JSON object ----


def probe() -> dict[str, Any]:
    """The GPU and its device-to-device copy bandwidth (read + write bytes over time, best of 10)."""
    torch = optional("torch")

    n = 1 << 30
    src = torch.ones(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = 0.0
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        best = max(best, 2 * n / (start.elapsed_time(end) / 1e3))
    versions = {"torch": torch.__version__, "torch_cuda": torch.version.cuda}
    for name in ("transformers", "cupy"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            versions[name] = None
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": torch.cuda.get_device_name(0),
        "gpu_memory_bytes": props.total_memory,
        "compute_capability": f"{props.major}.{props.minor}",
        "copy_buffer_bytes": n,
        "device_copy_gb_s": round(best / 1e9, 1),
        "versions": versions,
    }


def build(name: str, folder: Path) -> dict[str, Any]:
    """A random bf16 model of ``name``'s shape, initialised on the GPU, saved as safetensors; one built
    before into ``folder`` (its ``build.json`` written last) is reused."""
    saved = folder / "build.json"
    if saved.exists():
        return {**json.loads(saved.read_text()), "reused": True}
    torch, transformers = optional("torch"), optional("transformers")

    kwargs = dict(SHAPES[name])
    theta, scaling = kwargs.pop("rope_theta"), kwargs.pop("rope_scaling")
    if "rope_parameters" in inspect.signature(transformers.LlamaConfig.__init__).parameters:  # >= 5
        kwargs["rope_parameters"] = {"rope_type": "default", "rope_theta": theta, **(scaling or {})}
    else:
        kwargs.update(rope_theta=theta, rope_scaling=scaling)
    config = transformers.LlamaConfig(**kwargs, rms_norm_eps=1e-5, bos_token_id=EOS_ID, eos_token_id=EOS_ID)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(
            config, **{dtype_kw(transformers): torch.bfloat16}
        )
    save = model.save_pretrained
    safe = {"safe_serialization": True} if "safe_serialization" in inspect.signature(save).parameters else {}
    save(folder, **safe)
    write_tokenizer(folder, config.vocab_size)
    embedding = model.get_input_embeddings().weight
    built = {
        "build_s": round(time.perf_counter() - t0, 1),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "embedding_bytes": embedding.numel() * embedding.element_size(),
    }
    saved.write_text(json.dumps(built))
    return built


def quantized_path(folder: Path) -> Path:
    return folder.parent / f"{folder.name}-q4_k_m.gguf"


def quantize(folder: Path) -> dict[str, Any]:
    """``folder`` as a Q4_K_M GGUF beside it (``lmplex.quantize``, on the CPU)."""
    import lmplex

    out = quantized_path(folder)
    t0 = time.perf_counter()
    result = lmplex.quantize(str(folder), str(out), "q4_k_m")
    return {
        "quantize_s": round(time.perf_counter() - t0, 1),
        "gguf_bytes": out.stat().st_size,
        "types": result.type_counts(),
    }


def run_lmplex(name: str, folder: Path, quick: bool) -> dict[str, Any]:
    import lmplex
    from lmplex import ModelConfig, SamplingParams

    w, conc = workload(quick), max(concurrency(quick))
    kv_tokens = conc * (40 + w["tokens"] + 16) + TTFT_LEN + 16  # all requests at once, and the long prompt
    config = ModelConfig(
        str(folder),
        device="cuda",
        dtype="bfloat16",
        max_model_len=MAX_MODEL_LEN,
        max_model_concurrency=conc,
        kv_cache_bytes=kv_tokens * kv_bytes_per_token(SHAPES[name]),
        enable_prefix_caching=False,  # transformers reuses nothing across requests either
    )

    def greedy(n: int) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)

    t0 = time.perf_counter()
    engine = lmplex.Engine(config)
    engine_s = time.perf_counter() - t0
    engine.generate([[1, 2, 3]], greedy(1))
    ready_s = time.perf_counter() - t0
    prompt = prompts([PROMPT_LEN], seed=0)[0]

    def decode(engine: Any) -> tuple[list[float], list[float]]:
        """Batch-1 decode rates (one per repeat) and inter-token gaps, after a warm-up."""
        engine.generate([prompt], greedy(8))
        rates, gaps = [], []
        for _ in range(w["repeats"]):
            stamps = []
            for chunk in engine.stream(prompt, greedy(w["tokens"])):
                stamps += [time.perf_counter()] * len(chunk.token_ids)
            rates.append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
            gaps += [b - a for a, b in zip(stamps, stamps[1:])]
        return rates, gaps

    rates, gaps = decode(engine)
    throughput = []
    for n in concurrency(quick):
        t = time.perf_counter()
        tokens = sum(len(o.token_ids) for o in engine.generate(batch(n), greedy(w["tokens"])))
        seconds = time.perf_counter() - t
        throughput.append({"requests": n, "generated_tokens": tokens, "tok_s": tokens / seconds})
    ttfts = []
    for r in range(w["repeats"]):
        long_prompt = prompts([TTFT_LEN], seed=100 + r)[0]
        t = time.perf_counter()
        engine.generate([long_prompt], greedy(1))
        ttfts.append(time.perf_counter() - t)
    mem = engine.memory()
    everything_else = (mem.device_used or 0) - mem.weights - mem.kv_cache
    info = engine.info.to_dict()
    del engine
    gc.collect()
    # The same decode without CUDA graphs: what the graphs are worth.
    eager_rates, _ = decode(lmplex.Engine(ModelConfig.from_dict({**config.to_dict(), "enforce_eager": True})))
    return {
        "engine_s": engine_s,
        "ready_s": ready_s,
        "decode_tok_s": statistics.median(rates),
        "eager_decode_tok_s": statistics.median(eager_rates),
        "itl_s": percentiles(gaps),
        "throughput": throughput,
        "ttft_s": statistics.median(ttfts),
        "info": info,
        "memory": mem.to_dict(),
        "everything_else_bytes": everything_else,
        "everything_else_minus_workspace_bytes": everything_else - mem.workspace,
    }


def run_transformers(folder: Path, quick: bool) -> dict[str, Any]:
    torch, transformers = optional("torch"), optional("transformers")

    w, greedy = workload(quick), {"do_sample": False, "use_cache": True, "pad_token_id": EOS_ID}
    t0 = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, **{dtype_kw(transformers): torch.bfloat16}
    )
    model = model.to("cuda").eval()
    torch.cuda.synchronize()
    ready_s = time.perf_counter() - t0

    def generate(batch_ids: list[list[int]], n: int) -> tuple[float, int]:
        width = max(len(p) for p in batch_ids)  # left padding, as batched decoder-only generate needs
        ids = torch.tensor([[EOS_ID] * (width - len(p)) + p for p in batch_ids], device="cuda")
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch_ids], device="cuda")
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, **greedy)
        torch.cuda.synchronize()
        return time.perf_counter() - t, (out.shape[1] - width) * len(batch_ids)

    with torch.inference_mode():
        prompt = prompts([PROMPT_LEN], seed=0)[0]
        generate([prompt], 8)  # warm-up
        rates = []
        for _ in range(w["repeats"]):
            first, _ = generate([prompt], 1)
            total, tokens = generate([prompt], w["tokens"])
            rates.append((tokens - 1) / (total - first))
        throughput: list[dict[str, Any]] = []
        for n in concurrency(quick):
            if n > 64:
                throughput.append({"requests": n, "skipped": "transformers runs 64 concurrent requests only"})
                continue
            try:
                seconds, tokens = generate(batch(n), w["tokens"])
                throughput.append({"requests": n, "generated_tokens": tokens, "tok_s": tokens / seconds})
            except torch.cuda.OutOfMemoryError as err:
                throughput.append({"requests": n, "skipped": f"out of memory: {str(err)[:200]}"})
                torch.cuda.empty_cache()
        ttfts = [generate([prompts([TTFT_LEN], seed=100 + r)[0]], 1)[0] for r in range(w["repeats"])]
    free, total_bytes = torch.cuda.mem_get_info()
    return {
        "ready_s": ready_s,
        "decode_tok_s": statistics.median(rates),
        "throughput": throughput,
        "ttft_s": statistics.median(ttfts),
        "memory": {
            "max_allocated": torch.cuda.max_memory_allocated(),
            "reserved": torch.cuda.memory_reserved(),
            "device_used": total_bytes - free,
        },
    }


def worker(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(args.folder) if args.folder else Path()
    try:
        if args.worker == "probe":
            return probe()
        if args.worker == "build":
            return build(args.model, folder)
        if args.worker == "quantize":
            return quantize(folder)
        if args.worker == "lmplex":
            return run_lmplex(args.model, folder, args.quick)
        return run_transformers(folder, args.quick)
    except ImportError as err:
        return {"skipped": f"{err.name or err} is not installed"}


# ---- the parent: no CUDA here, only children ----


def child(kind: str, *extra: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    print(f"[gpu bench] {kind} {' '.join(extra)} {env or ''}", file=sys.stderr, flush=True)
    cmd = [sys.executable, __file__, "--worker", kind, *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env={**os.environ, **(env or {})})
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"skipped": f"{kind} failed (exit {done.returncode}): {done.stderr.strip()[-1500:]}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def nvidia_smi(query: str) -> str | None:
    cmd = ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return None


def roofline(
    shape: dict[str, Any], built: dict[str, Any], decode: int, bandwidth_gb_s: float
) -> dict[str, Any]:
    """Bytes one decoded token reads: every weight once (an untied embedding table only one row) plus K
    and V of the mean context during the decode, all bf16; the limit is bandwidth over that."""
    weights = built["weight_bytes"]
    if not shape["tie_word_embeddings"]:
        weights -= built["embedding_bytes"] - 2 * shape["hidden_size"]
    kv = kv_bytes_per_token(shape) * (PROMPT_LEN + decode / 2)
    per_token = weights + kv
    return {
        "bytes_per_token": int(per_token),
        "kv_bytes_read_per_token": int(kv),
        "roofline_tok_s": bandwidth_gb_s * 1e9 / per_token,
    }


def w4a16_figures(
    result: dict[str, Any], entry: dict[str, Any], bandwidth_gb_s: float, bf16_system: str = "lmplex"
) -> float:
    """Adds the quantized model's own roofline (its decode weight bytes, as lmplex reports them, plus
    the same K/V reads) and its decode rate over ``bf16_system``'s rate to ``result``; returns the
    roofline."""
    per_token = int(result["info"]["decode_weight_bytes"]) + int(entry["roofline"]["kv_bytes_read_per_token"])
    roof = bandwidth_gb_s * 1e9 / per_token
    result["roofline_tok_s"] = roof
    bf16 = entry["systems"].get(bf16_system, {}).get("decode_tok_s")
    if bf16 and "decode_tok_s" in result:
        result["vs_bf16_decode"] = result["decode_tok_s"] / bf16
    return roof


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(report["models"])
    width = 0.8 / len(SYSTEMS)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for j, system in enumerate(SYSTEMS):
        rows = [report["models"][m]["systems"].get(system, {}) for m in models]
        xs = [i + width * j for i in range(len(models))]
        axes[0].bar(xs, [r.get("decode_tok_s", 0.0) for r in rows], width, label=system)
        axes[1].bar(xs, [r.get("roofline_percent", 0.0) for r in rows], width, label=system)
    for i, m in enumerate(models):
        roof = report["models"][m].get("roofline", {}).get("roofline_tok_s")
        if roof:
            label = "roofline" if i == 0 else "_nolegend_"
            axes[0].hlines(roof, i - 0.2, i + 0.8, colors="black", linestyles="dashed", label=label)
    for ax, ylabel in ((axes[0], "batch-1 decode tokens/s"), (axes[1], "% of decode roofline")):
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(models))], models)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
    m = report["machine"]
    fig.suptitle(f"{m.get('gpu')}, {m.get('device_copy_gb_s')} GB/s device copy measured", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="folder for gpu.json and gpu.png")
    ap.add_argument("--models", nargs="+", choices=sorted(SHAPES), default=["llama-3.2-1b", "llama-3-8b"])
    ap.add_argument(
        "--quick", action="store_true", help="32 tokens instead of 128, one repeat, 64 requests only"
    )
    ap.add_argument("--systems", nargs="+", choices=SYSTEMS, default=SYSTEMS)
    ap.add_argument("--work-dir", help="where the random models are written (default: a temporary folder)")
    ap.add_argument(
        "--worker", choices=["probe", "build", "quantize", "lmplex", "transformers"], help=argparse.SUPPRESS
    )
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    if not args.out:
        ap.error("--out is required")
    import lmplex
    from lmplex.bench.hardware import machine

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    quick = ["--quick"] if args.quick else []
    gpu = child("probe")
    if "skipped" in gpu:
        sys.exit(f"no usable GPU: {gpu['skipped']}")
    report: dict[str, Any] = {
        "machine": {
            **machine(os.cpu_count() or 1),
            **{k: v for k, v in gpu.items() if k != "versions"},
            "driver": nvidia_smi("driver_version"),
        },
        "versions": {"lmplex": lmplex.__version__, "python": sys.version.split()[0], **gpu["versions"]},
        "settings": {"prompt_tokens": PROMPT_LEN, "ttft_prompt_tokens": TTFT_LEN, **workload(args.quick)},
        "device_used_includes": DEVICE_USED,
        "models": {},
    }
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="lmplex-gpu-bench-"))
    for name in args.models:
        folder = work / name
        folder.mkdir(parents=True, exist_ok=True)
        built = child("build", "--model", name, "--folder", str(folder))
        entry: dict[str, Any] = {"shape": SHAPES[name], "build": built, "systems": {}}
        report["models"][name] = entry
        if "skipped" in built:
            continue
        entry["roofline"] = roofline(
            SHAPES[name], built, workload(args.quick)["tokens"], gpu["device_copy_gb_s"]
        )
        for system in args.systems:
            used_before = nvidia_smi("memory.used")
            path, roof = folder, entry["roofline"]["roofline_tok_s"]
            w4a16, tiles = system.startswith("lmplex-w4a16"), system.endswith("-tiles")
            if w4a16:
                if "quantize" not in entry:
                    entry["quantize"] = child("quantize", "--folder", str(folder))
                path = quantized_path(folder)
            kind = "transformers" if system == "transformers" else "lmplex"
            if "skipped" in entry.get("quantize", {}) and w4a16:
                result = dict(entry["quantize"])
            else:
                env = SWITCHES.get(system, TILE_GEMM if tiles else None)
                result = child(kind, "--model", name, "--folder", str(path), *quick, env=env)
            result["device_used_before_mib"] = used_before  # nvidia-smi, before the child started
            if w4a16 and "info" in result:
                bf16_system = "lmplex-tiles" if tiles else "lmplex"
                roof = w4a16_figures(result, entry, gpu["device_copy_gb_s"], bf16_system)
            for key in ("decode_tok_s", "eager_decode_tok_s"):
                if key in result:
                    result[key.replace("decode_tok_s", "roofline_percent")] = 100 * result[key] / roof
            print(f"[gpu bench] {system}: {json.dumps(result, default=str)}", file=sys.stderr, flush=True)
            entry["systems"][system] = result
        print(json.dumps({name: entry["systems"]}, indent=2, default=str), flush=True)
        # Written after each model too, so a later model's failure or timeout keeps this one's figures.
        (out / "gpu.json").write_text(json.dumps(report, indent=2, default=str))
        if not args.work_dir:
            shutil.rmtree(folder, ignore_errors=True)
            quantized_path(folder).unlink(missing_ok=True)
    (out / "gpu.json").write_text(json.dumps(report, indent=2, default=str))
    plot(report, out / "gpu.png")
    print(f"wrote {out / 'gpu.json'} and {out / 'gpu.png'}")


if __name__ == "__main__":
    main()
