"""Hugging Face Hub model ids: ``ORG/NAME`` (an HF folder) and ``ORG/NAME:QUANT`` (one GGUF file).

Downloads go through ``huggingface_hub`` into its standard cache, so a model fetched by transformers,
vLLM or ``hf download`` is reused and the other way round.

Invariants:

- The environment is read on every call, not at import: ``HF_HUB_CACHE`` (else ``HF_HOME/hub``),
  ``HF_ENDPOINT``, ``HF_HUB_OFFLINE`` and ``HF_TOKEN`` (read by ``huggingface_hub`` itself; never
  logged or put in a message).
- Only what loading needs is downloaded: for a folder, the root's config, generation config, tokenizer
  and chat template files and its ``*.safetensors`` (never ``.bin``/``.pth``); for a GGUF repository, the
  one ``.gguf`` file the quant tag names.
- A model already in the cache loads without the network: offline, or when the Hub cannot be reached,
  the cached snapshot of the revision is used; the Hub is never asked when ``HF_HUB_OFFLINE`` is set.
- Every failure is a :class:`HubError` (a :class:`~lmplex.ModelLoadError`) that says what to do.
"""

from __future__ import annotations

import functools
import glob
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from lmplex._core import ModelLoadError

__all__ = [
    "GatedRepoError",
    "HubError",
    "HubId",
    "HubOfflineError",
    "NoWeightsError",
    "RepoNotFoundError",
    "RevisionNotFoundError",
    "cache_dir",
    "choose_files",
    "parse",
    "resolve",
]

# What a folder needs besides its weights; all are optional but config.json.
FOLDER_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "model.safetensors.index.json",
)
# The quant a GGUF repository gives without a tag (llama.cpp's and Ollama's default).
DEFAULT_QUANT = "Q4_K_M"

_REPO_ID = re.compile(
    r"(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95})(?::(?P<tag>[A-Za-z0-9._-]+))?"
)
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})$")
_FILE_SUFFIXES = (".gguf", ".json", ".safetensors")


class HubError(ModelLoadError):
    """Resolving a Hugging Face Hub id failed; the message says what to do."""


class RepoNotFoundError(HubError):
    """No such repository on the Hub, or a private one the token cannot read."""


class GatedRepoError(HubError):
    """The repository is gated: its terms must be accepted on the Hub and ``HF_TOKEN`` set."""


class RevisionNotFoundError(HubError):
    """The repository has no such branch, tag or commit."""


class HubOfflineError(HubError):
    """The model is not in the cache and the Hub cannot be asked (``HF_HUB_OFFLINE`` or no network)."""


class NoWeightsError(HubError):
    """The repository has no weights lmplex loads (safetensors or GGUF), or no GGUF for the tag."""


class HubId(NamedTuple):
    """A parsed Hub id: the repository and the GGUF quant tag (``None`` without ``:TAG``)."""

    repo: str
    tag: str | None


def parse(model_id: str) -> HubId | None:
    """``ORG/NAME`` or ``ORG/NAME:TAG`` as a :class:`HubId`; ``None`` for anything else, a name that
    ends like a file (``.gguf``, ``.json``, ``.safetensors``) included."""
    m = _REPO_ID.fullmatch(model_id)
    if m is None or ".." in m["repo"] or m["repo"].endswith((".", "-")):
        return None
    if model_id.lower().endswith(_FILE_SUFFIXES):  # a missing local file, such as models/m.gguf
        return None
    return HubId(m["repo"], m["tag"])


def cache_dir() -> Path:
    """The Hub cache: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``."""
    explicit = os.environ.get("HF_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("HF_HOME")
    if home:
        return Path(home).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "huggingface" / "hub"


ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def choose_files(hub_id: HubId, files: Sequence[str], *, adapter: bool = False) -> list[str]:
    """The files of a repository (paths in it) to download for ``hub_id``.

    With ``adapter``, a PEFT LoRA adapter's :data:`ADAPTER_FILES` (:class:`NoWeightsError` when one
    is missing).

    With a tag, the one ``.gguf`` whose name ends with it (case-insensitive). Without one, a folder's
    config, tokenizer and safetensors when the root has safetensors, else the repository's
    :data:`DEFAULT_QUANT` GGUF, else its only GGUF. :class:`NoWeightsError` otherwise.
    """
    if adapter:
        missing = [f for f in ADAPTER_FILES if f not in files]
        if missing or hub_id.tag is not None:
            raise NoWeightsError(
                f"Hub repo '{hub_id.repo}' is not a PEFT LoRA adapter (it lacks {missing or 'nothing, but a tag'} "
                f"of {list(ADAPTER_FILES)}); it has: {_some(files)}"
            )
        return list(ADAPTER_FILES)
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf") and not _base(f).startswith("mmproj"))
    if hub_id.tag is None:
        weights = sorted(f for f in files if "/" not in f and f.endswith(".safetensors"))
        if weights:
            if "config.json" not in files:
                raise NoWeightsError(f"Hub repo '{hub_id.repo}' has safetensors but no config.json")
            return [f for f in FOLDER_FILES if f in files] + weights
        if not ggufs:
            raise NoWeightsError(
                f"Hub repo '{hub_id.repo}' has no weights lmplex loads (root *.safetensors with "
                f"config.json, or .gguf files); it has: {_some(files)}"
            )
        if len(ggufs) > 1 and not _for_tag(ggufs, DEFAULT_QUANT):
            raise NoWeightsError(
                f"Hub repo '{hub_id.repo}' has several GGUF files and none is {DEFAULT_QUANT}: name one "
                f"with a tag, e.g. '{hub_id.repo}:{_tag_of(ggufs[0])}'; tags: {_tags(ggufs)}"
            )
    chosen = _for_tag(ggufs, hub_id.tag) if hub_id.tag else (_for_tag(ggufs, DEFAULT_QUANT) or ggufs)
    if not chosen:
        raise NoWeightsError(
            f"Hub repo '{hub_id.repo}' has no .gguf file for the tag '{hub_id.tag}'; "
            f"tags: {_tags(ggufs) or 'none (no .gguf files)'}"
        )
    parts = [f for f in chosen if _SPLIT.search(_stem(f))]
    if parts:
        raise NoWeightsError(
            f"'{hub_id.repo}:{hub_id.tag or DEFAULT_QUANT}' is a split GGUF ({len(parts)} parts), which "
            "lmplex does not load: merge it with `llama-gguf-split --merge` and load the file"
        )
    if len(chosen) > 1:
        raise NoWeightsError(
            f"the tag '{hub_id.tag}' of Hub repo '{hub_id.repo}' names several files: {chosen}"
        )
    return chosen


def resolve(
    model_id: str, revision: str | None = None, *, progress: bool = True, adapter: bool = False
) -> str:
    """The local path to load for the Hub id ``model_id``: the snapshot folder, or the ``.gguf`` file
    (with ``adapter``, the snapshot folder of a PEFT LoRA adapter).

    Downloads what is missing from the cache (with a progress bar unless ``progress`` is false); with
    ``HF_HUB_OFFLINE`` set, or when the Hub cannot be reached, uses the cached snapshot of ``revision``.
    """
    hub_id = parse(model_id)
    if hub_id is None:
        raise HubError(f"'{model_id}' is not a Hub id (ORG/NAME or ORG/NAME:QUANT)")
    what = f"'{model_id}'" + (f" at revision '{revision}'" if revision else "")
    from huggingface_hub import constants, errors

    endpoint = os.environ.get("HF_ENDPOINT") or None
    offline = _truthy(os.environ.get("HF_HUB_OFFLINE")) or _truthy(os.environ.get("TRANSFORMERS_OFFLINE"))
    # huggingface_hub reads HF_HUB_OFFLINE once, at its import; the environment now is what counts.
    constants.HF_HUB_OFFLINE = offline
    reason: BaseException | None = None
    try:
        files = None if offline else _remote_files(hub_id.repo, revision, endpoint)
    except errors.GatedRepoError as err:
        raise _gated(what) from err
    except errors.RepositoryNotFoundError as err:
        raise _not_found(hub_id.repo, endpoint) from err
    except errors.RevisionNotFoundError as err:
        raise RevisionNotFoundError(f"Hub repo '{hub_id.repo}' has no revision '{revision}'") from err
    except errors.HfHubHTTPError as err:
        if _status(err) in (401, 403):
            raise HubError(
                f"the Hub refused the credentials for {what} (HTTP {_status(err)}): check HF_TOKEN"
            ) from err
        files, reason = None, err  # the Hub is down: the cache may still have it
    except _transport_errors() as err:
        files, reason = None, err
    if files is None:
        snapshot = _cached_snapshot(hub_id.repo, revision)
        if snapshot is None:
            why = "HF_HUB_OFFLINE is set" if offline else f"the Hub cannot be reached ({_brief(reason)})"
            raise HubOfflineError(
                f"{what} is not in the Hub cache ({cache_dir()}) and {why}: fetch it once with the "
                f"network (`lmplex models fetch {model_id}`), or unset HF_HUB_OFFLINE"
            )
        files = _listing(snapshot)
        chosen = choose_files(hub_id, files, adapter=adapter)
        return _local_result(snapshot, chosen, what)
    chosen = choose_files(hub_id, files, adapter=adapter)
    failed: tuple[type[BaseException], ...] = (errors.HfHubHTTPError, OSError, *_transport_errors())
    try:
        with _progress(progress):
            from huggingface_hub import snapshot_download

            folder = snapshot_download(
                hub_id.repo,
                revision=revision,
                cache_dir=cache_dir(),
                endpoint=endpoint,
                allow_patterns=[glob.escape(f) for f in chosen],
            )
    except errors.GatedRepoError as err:
        raise _gated(what) from err
    except errors.RepositoryNotFoundError as err:
        raise _not_found(hub_id.repo, endpoint) from err
    except failed as err:  # LocalEntryNotFoundError is an OSError
        raise HubError(f"downloading {what} into {cache_dir()} failed: {_brief(err)}") from err
    return _local_result(Path(folder), chosen, what)


# --- internals -------------------------------------------------------------------------------------------


def _remote_files(repo: str, revision: str | None, endpoint: str | None) -> list[str]:
    from huggingface_hub import HfApi

    info = HfApi(endpoint=endpoint).model_info(repo, revision=revision)
    return [s.rfilename for s in info.siblings or []]


def _cached_snapshot(repo: str, revision: str | None) -> Path | None:
    """The cached snapshot folder of ``repo`` at ``revision`` (a ref or a commit), if there is one."""
    root = cache_dir() / ("models--" + repo.replace("/", "--"))
    ref = revision or "main"
    commit = ref if _COMMIT.fullmatch(ref) else None
    if commit is None:
        try:
            commit = (root / "refs" / ref).read_text(encoding="utf-8").strip()
        except OSError:
            return None
    snapshot = root / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def _listing(snapshot: Path) -> list[str]:
    return sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())


def _local_result(snapshot: Path, chosen: list[str], what: str) -> str:
    missing = [f for f in chosen if not (snapshot / f).is_file()]
    if missing:
        raise HubOfflineError(f"the cached snapshot of {what} ({snapshot}) lacks {missing}: fetch it again")
    if len(chosen) == 1 and chosen[0].lower().endswith(".gguf"):
        return str(snapshot / chosen[0])
    return str(snapshot)


def _gated(what: str) -> GatedRepoError:
    return GatedRepoError(
        f"{what} is a gated repo: accept its terms on its Hub page, then set HF_TOKEN to a token of that "
        "account (or run `hf auth login`)"
    )


def _not_found(repo: str, endpoint: str | None) -> RepoNotFoundError:
    return RepoNotFoundError(
        f"Hub repo '{repo}' not found on {endpoint or 'https://huggingface.co'}: check the id (ORG/NAME), "
        "or set HF_TOKEN if it is private"
    )


@functools.cache
def _transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP clients' connection and timeout errors, whichever client this huggingface_hub uses."""
    found: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module in ("httpx2", "httpx", "requests"):
        try:
            mod: Any = __import__(module)
        except ImportError:
            continue
        for name in ("TransportError", "ConnectionError", "Timeout"):
            cls = getattr(mod, name, None)
            if isinstance(cls, type) and issubclass(cls, BaseException):
                found.append(cls)
    return tuple(found)


@contextmanager
def _progress(enabled: bool) -> Iterator[None]:
    from huggingface_hub.utils.tqdm import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    was_disabled = are_progress_bars_disabled()
    if not enabled and not was_disabled:
        disable_progress_bars()
    try:
        yield
    finally:
        if not enabled and not was_disabled:
            enable_progress_bars()


def _status(err: BaseException) -> int | None:
    response = getattr(err, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def _truthy(value: str | None) -> bool:
    return (value or "").strip().upper() in ("1", "ON", "YES", "TRUE")


def _brief(err: BaseException | None) -> str:
    if err is None:
        return "unknown error"
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")


def _base(path: str) -> str:
    return path.rsplit("/", 1)[-1].lower()


def _stem(path: str) -> str:
    return _base(path)[: -len(".gguf")]


def _tag_of(path: str) -> str:
    stem = _SPLIT.sub("", _stem(path))
    return re.split(r"[-.]", stem)[-1].upper()


def _for_tag(ggufs: Sequence[str], tag: str) -> list[str]:
    want = re.compile(rf"(?:^|[-._]){re.escape(tag.lower())}$")
    return [f for f in ggufs if want.search(_SPLIT.sub("", _stem(f)))]


def _tags(ggufs: Sequence[str]) -> str:
    return ", ".join(sorted({_tag_of(f) for f in ggufs}))


def _some(files: Sequence[str]) -> str:
    shown = ", ".join(files[:12]) if files else "no files"
    return shown + (f" (and {len(files) - 12} more)" if len(files) > 12 else "")
