#!/usr/bin/env python3
"""Run llama.cpp's and vLLM's server test suites against ``lmplex serve`` (see README.md here).

For each suite of suites.py: fetch the pinned upstream test files into a scratch folder, add the shims from this
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
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from suites import SUITES, Settings, Suite

STAND_IN = "qwen2.5-coder-0.5b-instruct"  # the lmplex alias every served name of suites.py maps to
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
    "anthropic": "anthropic",
    "numpy": "numpy",
    "pybase64": "pybase64",
    "jinja2": "jinja2",  # the vLLM shim renders chat templates as transformers does
    "gguf": "gguf",  # ... read from the stand-in's GGUF
    "pydantic": "pydantic",
}


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


def toml_value(value: object) -> str:
    """A TOML value for a str, bool or number (JSON writes those as TOML does)."""
    return json.dumps(value)


class LmplexServer:
    """``lmplex serve`` on a free loopback port, serving STAND_IN under each name of ``suite.served``,
    with the suite's ``settings`` and ``per_name`` keys (``max_model_len`` defaults to ``max_model_len``);
    ``bare`` keeps ``max_model_len`` alone."""

    def __init__(
        self, python: str, suite: Suite, folder: Path, max_model_len: int, bare: bool = False
    ) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        lines = ['host = "127.0.0.1"', "port = 0"]
        for name in suite.served:
            keys: Settings = {
                "max_model_len": max_model_len,
                **suite.settings,
                **suite.per_name.get(name, {}),
            }
            if bare:  # an lmplex from before task, pooling and reasoning_parser
                keys = {"max_model_len": keys["max_model_len"]}
            lines += ["[[models]]", f'model_id = "{STAND_IN}"', f"name = {toml_value(name)}"]
            lines += [f"{key} = {toml_value(value)}" for key, value in keys.items()]
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
    server = LmplexServer(
        args.server_python, suite, work / f"{key}.server", args.max_model_len, args.bare_models
    )
    try:
        try:
            url = server.wait_ready()
        except RuntimeError as error:
            print(f"\n=== {suite.title}: {error}", flush=True)
            return {"title": suite.title, "counts": {}, "failed": [str(error)]}
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
    keys = {f"{name}-{i}": (name, i) for name, suites in SUITES.items() for i in range(len(suites))}
    parser.add_argument(
        "suites",
        nargs="*",
        metavar="SUITE",
        help=f"{' or '.join(SUITES)} (default: both), or one of their servers: {', '.join(keys)}",
    )
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "lmplex-peer")
    parser.add_argument("--llamacpp-src", type=Path, help="a llama.cpp checkout at the pinned commit")
    parser.add_argument("--vllm-src", type=Path, help="a vLLM checkout (or sdist) at the pinned tag")
    parser.add_argument("--server-python", default=sys.executable, help="the Python whose lmplex serves")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument(
        "--bare-models",
        action="store_true",
        help="serve each name with max_model_len alone (for an lmplex without task, pooling, reasoning_parser)",
    )
    parser.add_argument("--tb", default="short", help="pytest --tb style")
    parser.epilog = "Arguments after -- go to every pytest run (e.g. -- -k weather -x)."
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.pytest_args = argv[split + 1 :]
    unknown = set(args.suites) - set(SUITES) - set(keys)
    if unknown:
        parser.error(f"unknown suites {sorted(unknown)}; choose from {list(SUITES)} or {list(keys)}")
    chosen = [key for key, (name, _) in keys.items() if {name, key} & set(args.suites or SUITES)]
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    sources = {
        repo: path.resolve()
        for repo, path in (("ggml-org/llama.cpp", args.llamacpp_src), ("vllm-project/vllm", args.vllm_src))
        if path
    }
    python = ensure_venv(work)
    outcomes = [
        run_suite(SUITES[keys[key][0]][keys[key][1]], key, args, python, work, sources) for key in chosen
    ]
    (work / "summary.json").write_text(json.dumps(outcomes, indent=1))
    print(f"\n{'suite':36} {'passed':>7} {'failed':>7} {'errors':>7} {'skipped':>8} {'deselected':>11}")
    for outcome in outcomes:
        counts = outcome["counts"]
        assert isinstance(counts, dict)
        cells = [counts.get(k, 0) for k in ("passed", "failed", "error", "skipped", "deselected")]
        print(f"{outcome['title']:36} {cells[0]:>7} {cells[1]:>7} {cells[2]:>7} {cells[3]:>8} {cells[4]:>11}")
    for outcome in outcomes:
        failed = outcome["failed"]
        assert isinstance(failed, list)
        for nodeid in failed:
            print(f"FAILED {outcome['title']}: {nodeid}")
    print(f"(details: {work}/summary.json; server logs: {work}/*.server/serve.log)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
