"""llama.cpp's own HF -> GGUF converter, pinned, for fixture scripts that need llama.cpp as the oracle
of the file format (``make_mmproj_fixtures.py``).

It gets ``convert_hf_to_gguf.py`` (with its ``conversion/`` modules and ``gguf-py/``) from the sdist of
``llama-cpp-python==0.3.36``, which vendors llama.cpp, runs it, and reads what it wrote back:

- ``llama_cpp_dir``: the ``vendor/llama.cpp`` to use: the one ``--llama-cpp`` names (an extracted
  sdist), or the sdist downloaded from PyPI into a cache folder and extracted there once
  (``fetch_llama_cpp``);
- ``provenance``: what converted the files: the sdist, llama.cpp's commit as the sdist's CHANGELOG
  names it, gguf-py's version and the sha256 of the converter files used;
- ``convert``: ``convert_hf_to_gguf.py <folder> <args> --outfile <out>`` in a subprocess of this
  Python;
- ``read_gguf``: a GGUF's metadata and tensors as that ``gguf-py``'s ``GGUFReader`` reads them.

Invariants:

- the download's sha256 is checked against ``SDIST_SHA256`` before anything is extracted from it (a
  mismatch deletes the download and stops), and only the converter files, ``CHANGELOG.md`` and
  ``PKG-INFO`` are extracted, never a member with ``..`` or an absolute path;
- the converter always runs with its own ``gguf-py`` (the writer it was written against) first on
  ``PYTHONPATH``, ``NO_LOCAL_GGUF`` unset, and GGUFs are read back with that same ``gguf-py``:
  ``gguf_py`` asserts the imported ``gguf`` is the one under the ``vendor/llama.cpp`` in use, never an
  installed ``gguf`` package.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tarfile
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SDIST_VERSION = "0.3.36"
SDIST_URL = (
    "https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/"
    f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
)
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
# What the converter needs from the sdist's vendor/llama.cpp.
VENDORED = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_llama_cpp(cache: Path) -> Path:
    """``vendor/llama.cpp`` of the llama-cpp-python sdist (its converter files and CHANGELOG.md),
    downloaded into ``cache`` and checked against ``SDIST_SHA256``, extracted once."""
    top = f"llama_cpp_python-{SDIST_VERSION}"
    dest = cache / top
    vendor = dest / "vendor" / "llama.cpp"
    if (vendor / "convert_hf_to_gguf.py").is_file() and (dest / ".complete").is_file():
        return vendor
    cache.mkdir(parents=True, exist_ok=True)
    tgz = cache / f"{top}.tar.gz"
    if not tgz.is_file() or sha256_of(tgz) != SDIST_SHA256:
        print(f"downloading {SDIST_URL}", file=sys.stderr)
        part = tgz.with_suffix(".part")
        with urllib.request.urlopen(SDIST_URL) as r, part.open("wb") as f:
            while block := r.read(1 << 20):
                f.write(block)
        got = sha256_of(part)
        if got != SDIST_SHA256:
            part.unlink()
            raise SystemExit(f"{SDIST_URL}: sha256 {got}, expected {SDIST_SHA256}")
        part.replace(tgz)
    wanted = [f"{top}/vendor/llama.cpp/{p}" for p in VENDORED] + [f"{top}/CHANGELOG.md", f"{top}/PKG-INFO"]
    with tarfile.open(tgz, "r:gz") as tf:
        for m in tf.getmembers():
            name = m.name
            if not m.isfile() or ".." in Path(name).parts or Path(name).is_absolute():
                continue
            if not any(name == w or (w.endswith("/") and name.startswith(w)) for w in wanted):
                continue
            target = cache / name
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tf.extractfile(m)
            assert src is not None
            target.write_bytes(src.read())
    (dest / ".complete").write_text(SDIST_SHA256 + "\n")
    return vendor


def gguf_py(llama_cpp: Path) -> Any:
    """The ``gguf`` module of ``llama_cpp``'s ``gguf-py`` (put first on ``sys.path``), checked to be
    that one."""
    path = str(llama_cpp / "gguf-py")
    if path not in sys.path:
        sys.path.insert(0, path)
    import gguf

    assert Path(gguf.__file__).resolve().is_relative_to(llama_cpp), gguf.__file__
    return gguf


def llama_cpp_dir(given: Path | None, cache: Path) -> Path:
    """The ``vendor/llama.cpp`` to use: ``given`` (``--llama-cpp``), else the sdist's, fetched into
    ``cache``; its ``gguf-py`` imported (``gguf_py``)."""
    llama_cpp = (given or fetch_llama_cpp(cache)).resolve()
    if not (llama_cpp / "convert_hf_to_gguf.py").is_file():
        raise SystemExit(f"{llama_cpp}: no convert_hf_to_gguf.py")
    gguf_py(llama_cpp)
    return llama_cpp


def provenance(llama_cpp: Path, conversion_modules: Sequence[str]) -> dict[str, Any]:
    """What converted the files: the sdist, llama.cpp's commit as its CHANGELOG names it, gguf-py's
    version, and the sha256 of ``convert_hf_to_gguf.py`` and the ``conversion/<m>.py`` used (so a
    copy from ``--llama-cpp`` is checkable)."""
    sdist = llama_cpp.parent.parent
    commit = None
    changelog = sdist / "CHANGELOG.md"
    if changelog.is_file():
        text = changelog.read_text()
        section = text.split(f"## [{SDIST_VERSION}]", 1)[-1].split("\n## [", 1)[0]
        if m := re.search(r"ggml-org/llama\.cpp@([0-9a-f]{7,40})", section):
            commit = m.group(1)
    pkg = (sdist / "PKG-INFO").read_text() if (sdist / "PKG-INFO").is_file() else ""
    if pkg and f"\nVersion: {SDIST_VERSION}\n" not in pkg:
        raise SystemExit(f"{sdist}/PKG-INFO is not llama-cpp-python {SDIST_VERSION}")
    pyproject = (llama_cpp / "gguf-py" / "pyproject.toml").read_text()
    gguf_version = re.search(r'^version = "([^"]+)"', pyproject, re.MULTILINE)
    modules = ["convert_hf_to_gguf.py"] + [f"conversion/{m}.py" for m in conversion_modules]
    return {
        "sdist": f"llama-cpp-python=={SDIST_VERSION}",
        "url": SDIST_URL,
        "sha256": SDIST_SHA256,
        "llama_cpp_commit": commit,
        "llama_cpp_commit_source": "the sdist's CHANGELOG.md",
        "gguf_py": gguf_version.group(1) if gguf_version else None,
        "converter_files_sha256": {m: sha256_of(llama_cpp / m) for m in modules},
    }


def convert(llama_cpp: Path, folder: Path, out: Path, args: Sequence[str], cwd: Path, label: str) -> None:
    """Run ``convert_hf_to_gguf.py <folder> <args> --outfile <out>`` in ``cwd``, in a subprocess of this
    Python with llama.cpp's ``gguf-py`` first on ``PYTHONPATH``; on failure print its output and stop."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(llama_cpp / "gguf-py"), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("NO_LOCAL_GGUF", None)
    cmd = [sys.executable, str(llama_cpp / "convert_hf_to_gguf.py"), str(folder), *args]
    cmd += ["--outfile", str(out)]
    run = subprocess.run(cmd, check=False, env=env, cwd=cwd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.stderr.write(run.stdout + run.stderr)
        raise SystemExit(f"{label}: convert_hf_to_gguf.py failed ({run.returncode})")


@dataclass
class Tensor:
    """A GGUF tensor as gguf-py reads it: ``type`` the GGML type's name, ``ne`` its dimensions
    innermost first, ``data`` its values (a numpy array, gguf-py's shape)."""

    name: str
    type: str
    ne: list[int]
    data: Any


def read_gguf(llama_cpp: Path, path: Path) -> tuple[list[dict[str, Any]], list[Tensor]]:
    """The metadata (key, type, value; not the ``GGUF.*`` header fields) and tensors of a GGUF, as
    ``llama_cpp``'s gguf-py reads them."""
    reader = gguf_py(llama_cpp).GGUFReader(path)
    metadata = []
    for field in reader.fields.values():
        if field.name.startswith("GGUF."):
            continue
        types = [t.name for t in field.types]
        metadata.append(
            {
                "key": field.name,
                "type": types[0] if len(types) == 1 else f"{types[0]}[{types[-1]}]",
                "value": field.contents(),
            }
        )
    tensors = [Tensor(t.name, t.tensor_type.name, [int(n) for n in t.shape], t.data) for t in reader.tensors]
    return metadata, tensors
