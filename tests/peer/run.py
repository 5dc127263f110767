#!/usr/bin/env python3
"""Run llama.cpp's and vLLM's OpenAI-server test suites against ``lmplex serve`` (see README.md here).

For each suite: fetch the pinned upstream test files into a scratch folder, add the shims from this
folder, start ``lmplex serve`` on a free loopback port with the local stand-in model under the names the
tests use, run the selected tests, and print passed/failed/skipped/deselected per suite.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
STAND_IN = "qwen2.5-coder-0.5b-instruct"  # the lmplex alias every served name below maps to
REQUIREMENTS = {  # module -> pip requirement; the ones already importable are not installed
    "pytest": "pytest>=8",
    "pytest_asyncio": "pytest-asyncio>=0.23",
    "openai": "openai>=1.92",
    "httpx": "httpx",
    "requests": "requests",
    "jsonschema": "jsonschema",
    "regex": "regex",
    "wget": "wget",
    "filelock": "filelock",
}


@dataclass
class Suite:
    title: str
    repo: str
    ref: str  # the pinned upstream commit or tag
    files: list[str]  # upstream paths fetched at ``ref``
    served: list[str]  # served model names, all backed by STAND_IN; the first is listed first
    tests: list[str]  # pytest arguments, relative to ``cwd``
    include: list[str]  # node-id regexes that run (peer_select.py); all other tests are deselected
    exclude: list[str] = field(default_factory=list)
    cwd: str = "."  # where pytest runs, inside the scratch tree
    shims: dict[str, str] = field(default_factory=dict)  # file here -> path in the scratch tree
    plugins: list[str] = field(default_factory=list)


LLAMA_TESTS = "tools/server/tests"
LLAMACPP = Suite(
    title="llama.cpp tools/server/tests",
    repo="ggml-org/llama.cpp",
    ref="4df29be4f4c3673f428170fda944a5b19f743bb8",
    files=[
        f"{LLAMA_TESTS}/{name}"
        for name in (
            "conftest.py",
            "pytest.ini",
            "utils.py",
            "unit/test_tool_call.py",
            "unit/test_chat_completion.py",
        )
    ],
    # llama.cpp's tests omit "model" (one served model), except the OpenAI-client ones.
    served=["gpt-3.5-turbo-instruct"],
    cwd=LLAMA_TESTS,
    tests=["unit/test_tool_call.py", "unit/test_chat_completion.py"],
    include=[
        # Real-model rows, once per test, with the model's own template (the stand-in is a Qwen2.5).
        r"test_completion_with_required_tool_real_model\[.*-bartowski/Qwen2\.5-Coder-3B-Instruct-GGUF:Q4_K_M-None-",
        r"test_completion_without_tool_call_fast\[",
        r"test_weather\[bartowski/Qwen2\.5-Coder-3B-Instruct-GGUF:Q4_K_M-None-",
        r"test_calc_result\[None-128-bartowski/Qwen2\.5-Coder-3B-Instruct-GGUF:Q4_K_M-None-",
        r"test_hello_world\[bartowski/Qwen2\.5-7B-Instruct-GGUF:Q4_K_M-None-",
        # OpenAI-standard checks that do not depend on the stories260K model's text.
        r"test_invalid_chat_completion_req\[",
        r"test_logprobs",
        r"test_completion_with_response_format\[",
        r"test_chat_completions_multiple_choices",
    ],
    plugins=["llamacpp_plugin"],
)

VLLM_REF = "v0.33.0"
VLLM_SHIMS = {
    "vllm_conftest.py": "conftest.py",
    "vllm_utils.py": "tests/utils.py",
}
VLLM_TOOL_USE = Suite(
    title="vLLM tests/tool_use",
    repo="vllm-project/vllm",
    ref=VLLM_REF,
    files=[
        "tests/tool_use/utils.py",
        "tests/tool_use/test_tool_calls.py",
        "tests/tool_use/test_chat_completions.py",
        "tests/tool_use/test_parallel_tool_calls.py",
    ],
    served=["NousResearch/Hermes-3-Llama-3.1-8B"],  # CONFIGS["hermes"]: the <tool_call> format
    tests=["tests/tool_use"],
    include=[".*"],
    shims={**VLLM_SHIMS, "vllm_tool_use_conftest.py": "tests/tool_use/conftest.py"},
)
CHAT = "tests/entrypoints/openai/chat_completion"
COMPLETION = "tests/entrypoints/openai/completion"
VLLM_OPENAI = Suite(
    title="vLLM tests/entrypoints/openai",
    repo="vllm-project/vllm",
    ref=VLLM_REF,
    files=[
        "tests/entrypoints/conftest.py",
        f"{CHAT}/test_chat.py",
        f"{CHAT}/test_chat_completion.py",
        f"{CHAT}/test_chat_logit_bias_validation.py",
        f"{CHAT}/test_completion_with_function_calling.py",
        f"{COMPLETION}/test_completion.py",
    ],
    served=["HuggingFaceH4/zephyr-7b-beta", "Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen3-0.6B"],
    tests=[CHAT, COMPLETION],
    include=[".*"],
    exclude=[
        r"zephyr-lora",  # LoRA adapters
        r"test_function_tool_use\[watermarked-",  # vLLM's --watermark-config
        r"test_function_tool_use\[plain-True-",  # enable_thinking=True: reasoning output
        r"::test_chat_completion_request_|::test_null_top_logprobs|::test_completion_request_",  # vLLM unit tests
        r"::test_invocations",  # SageMaker's /invocations route
        r"::test_kv_transfer_",  # kv_transfer_params (disaggregated prefill)
        r"::test_per_request_metrics",  # --enable-per-request-metrics
        r"::test_completion_truncation_side",  # truncate_prompt_tokens, return_token_ids
        r"::test_logprob_token_ids",  # logprob_token_ids, allowed_token_ids, return_tokens_as_token_ids
    ],
    shims=VLLM_SHIMS,
)
SUITES = {"llamacpp": [LLAMACPP], "vllm": [VLLM_TOOL_USE, VLLM_OPENAI]}


def fetch(suite: Suite, cache: Path, sources: dict[str, Path]) -> Path:
    """The pinned upstream files, copied from a local checkout in ``sources`` or downloaded from GitHub."""
    root = cache / f"{suite.repo.replace('/', '+')}@{suite.ref}"
    for path in suite.files:
        target = root / path
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if suite.repo in sources:
            shutil.copyfile(sources[suite.repo] / path, target)
        else:
            url = f"https://raw.githubusercontent.com/{suite.repo}/{suite.ref}/{path}"
            with urllib.request.urlopen(url, timeout=60) as response:
                target.write_bytes(response.read())
    return root


def build_tree(suite: Suite, upstream: Path, tree: Path) -> None:
    """The scratch tree pytest runs in: upstream files, shims, and empty ``__init__.py`` for vLLM's packages."""
    shutil.rmtree(tree, ignore_errors=True)
    for path in suite.files:
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(upstream / path, tree / path)
    for shim, dest in suite.shims.items():
        (tree / dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(HERE / shim, tree / dest)
    if suite.repo == "vllm-project/vllm":
        for folder in {p.parent.relative_to(tree) for p in (tree / "tests").rglob("*.py")}:
            for package in (folder, *folder.parents):
                if package != Path("."):
                    (tree / package / "__init__.py").touch()
        (tree / "pytest.ini").write_text("[pytest]\nasyncio_default_fixture_loop_scope = function\n")


def ensure_venv(work: Path) -> Path:
    """A venv that sees the system's packages, plus the test requirements that are missing."""
    venv = work / "venv"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    check = "import importlib.util as u, sys; print(' '.join(m for m in sys.argv[1:] if not u.find_spec(m)))"
    missing = subprocess.run(
        [str(python), "-c", check, *REQUIREMENTS], capture_output=True, text=True, check=True
    ).stdout.split()
    if missing:
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, *(REQUIREMENTS[m] for m in missing)], check=True)
    return python


def niced(cmd: list[str]) -> list[str]:
    """``cmd`` under ``nice -n 19`` (``LMPLEX_PEER_NICE``), so builds running beside it keep priority."""
    nice = shutil.which("nice")
    return [nice, "-n", os.environ.get("LMPLEX_PEER_NICE", "19"), *cmd] if nice else cmd


class LmplexServer:
    """``lmplex serve`` on a free loopback port, serving STAND_IN under each of ``names``."""

    def __init__(self, python: str, names: list[str], folder: Path, max_model_len: int) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        lines = ['host = "127.0.0.1"', "port = 0"]
        for name in names:
            lines += ["[[models]]", f'model_id = "{STAND_IN}"', f"name = {json.dumps(name)}"]
            lines += [f"max_model_len = {max_model_len}"]
        config = folder / "serve.toml"
        config.write_text("\n".join(lines) + "\n")
        self.address = folder / "serve.url"
        self.address.unlink(missing_ok=True)
        self.log_path = folder / "serve.log"
        cmd = [python, "-m", "lmplex", "serve", "--config", str(config), "--address-file", str(self.address)]
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(niced(cmd), stdout=log, stderr=subprocess.STDOUT)
        self.url = ""

    def wait_ready(self, timeout: float = 600) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lmplex serve exited; see {self.log_path}")
            if self.address.exists() and self.address.read_text().strip():
                self.url = self.address.read_text().strip()
                try:
                    if httpx.get(f"{self.url}/ready", timeout=5).status_code == 200:
                        return self.url
                except httpx.HTTPError:
                    pass
            time.sleep(0.5)
        raise RuntimeError(f"lmplex serve not ready after {timeout} s; see {self.log_path}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def run_suite(
    suite: Suite, key: str, args: argparse.Namespace, python: Path, work: Path, sources: dict[str, Path]
) -> dict[str, object]:
    upstream = fetch(suite, work / "upstream", sources)
    tree = work / key
    build_tree(suite, upstream, tree)
    selection = work / f"{key}.select.json"
    selection.write_text(json.dumps({"include": suite.include, "exclude": suite.exclude}))
    result = work / f"{key}.result.json"
    result.unlink(missing_ok=True)
    server = LmplexServer(args.server_python, suite.served, work / f"{key}.server", args.max_model_len)
    try:
        url = server.wait_ready()
        host, port = url.removeprefix("http://").rsplit(":", 1)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
            "LMPLEX_PEER_SELECT": str(selection),
            "LMPLEX_PEER_RESULT": str(result),
            "LMPLEX_BASE_URL": url,  # vLLM shim
            "LMPLEX_PEER_TOKENIZER": STAND_IN,  # vLLM shim's get_tokenizer
            "LMPLEX_HOST": host,  # llama.cpp plugin
            "PORT": port,
            "DEBUG_EXTERNAL": "1",
        }
        plugins = [arg for p in ["peer_select", *suite.plugins] for arg in ("-p", p)]
        cmd = [str(python), "-m", "pytest", *plugins, "-p", "no:cacheprovider", *suite.tests]
        cmd += ["-q", "-rfEs", f"--tb={args.tb}", *args.pytest_args]
        print(f"\n=== {suite.title} ({suite.repo}@{suite.ref}) against {url}", flush=True)
        subprocess.run(niced(cmd), cwd=tree / suite.cwd, env=env, check=False)
    finally:
        server.stop()
    if not result.exists():
        return {"title": suite.title, "counts": {}, "failed": ["pytest did not finish"]}
    outcome: dict[str, object] = json.loads(result.read_text())
    outcome["title"] = suite.title
    return outcome


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("suites", nargs="*", metavar="SUITE", help=f"{' or '.join(SUITES)} (default: both)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "lmplex-peer")
    parser.add_argument("--llamacpp-src", type=Path, help="a llama.cpp checkout at the pinned commit")
    parser.add_argument("--vllm-src", type=Path, help="a vLLM checkout (or sdist) at the pinned tag")
    parser.add_argument("--server-python", default=sys.executable, help="the Python whose lmplex serves")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--tb", default="short", help="pytest --tb style")
    parser.epilog = "Arguments after -- go to every pytest run (e.g. -- -k weather -x)."
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.pytest_args = argv[split + 1 :]
    unknown = set(args.suites) - set(SUITES)
    if unknown:
        parser.error(f"unknown suites {sorted(unknown)}; choose from {list(SUITES)}")
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    sources = {
        repo: path.resolve()
        for repo, path in (("ggml-org/llama.cpp", args.llamacpp_src), ("vllm-project/vllm", args.vllm_src))
        if path
    }
    python = ensure_venv(work)
    outcomes = [
        run_suite(suite, f"{name}-{i}", args, python, work, sources)
        for name in (args.suites or SUITES)
        for i, suite in enumerate(SUITES[name])
    ]
    (work / "summary.json").write_text(json.dumps(outcomes, indent=1))
    print(f"\n{'suite':32} {'passed':>7} {'failed':>7} {'errors':>7} {'skipped':>8} {'deselected':>11}")
    for outcome in outcomes:
        counts = outcome["counts"]
        assert isinstance(counts, dict)
        cells = [counts.get(k, 0) for k in ("passed", "failed", "error", "skipped", "deselected")]
        print(f"{outcome['title']:32} {cells[0]:>7} {cells[1]:>7} {cells[2]:>7} {cells[3]:>8} {cells[4]:>11}")
    for outcome in outcomes:
        failed = outcome["failed"]
        assert isinstance(failed, list)
        for nodeid in failed:
            print(f"FAILED {outcome['title']}: {nodeid}")
    print(f"(details: {work}/summary.json; server logs: {work}/*.server/serve.log)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
