"""``lmplex models``: list the aliases and the cache, fetch one, describe a model (its info and memory
once loaded), export a GGUF as a Hugging Face folder. Each is a subcommand function of
:mod:`lmplex.cli` (``(args) -> exit status``, errors raised for ``main`` to map).

Invariant: only ``models fetch`` downloads; ``info`` loads the model to report what it holds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from lmplex import _core, models
from lmplex._core import InvalidRequest, ModelConfig
from lmplex.engine import Engine

__all__ = ["models_export", "models_fetch", "models_info", "models_list"]


def models_list(args: argparse.Namespace) -> int:
    rows = models.list_models()
    name_width = max(len("NAME"), *(len(row["name"]) for row in rows))
    print(f"{'NAME':<{name_width}}  {'SIZE MB':>8}  {'FETCHED':<7}  PATH")
    for row in rows:
        fetched = "yes" if row["fetched"] else "no"
        path = row["path"] if row["path"] is not None else "-"
        print(f"{row['name']:<{name_width}}  {row['size'] / 1e6:>8.1f}  {fetched:<7}  {path}")
    print(f"\ncache: {models.cache_dir()}", file=sys.stderr)
    return 0


def models_fetch(args: argparse.Namespace) -> int:
    path = models.fetch(args.name, revision=args.revision, progress=not args.quiet)
    print(path)
    return 0


def models_info(args: argparse.Namespace) -> int:
    path = models.resolve(args.model)
    print(f"path:    {path}")
    spec = models.MODELS.get(args.model)
    if spec is not None:
        print(f"alias:   {spec.name} ({spec.description})")
        print(f"size:    {spec.size} bytes")
        print(f"sha256:  {spec.sha256} (verified when fetched)")
    else:
        file = Path(path)
        if file.is_file():
            print(f"size:    {file.stat().st_size} bytes")
            print(f"sha256:  {models.file_sha256(file)}")
        else:
            total = sum(p.stat().st_size for p in file.rglob("*") if p.is_file())
            print(f"size:    {total} bytes (folder)")
    sys.stdout.flush()
    engine = Engine(ModelConfig(args.model, max_model_len=args.max_model_len, device=args.device))
    print("info:")
    _print_mapping(engine.info.to_dict())
    print(f"  max_model_len: {engine.max_model_len}")
    print("memory (bytes):")
    _print_mapping(engine.memory().to_dict())
    return 0


def models_export(args: argparse.Namespace) -> int:
    path = models.resolve(args.model)
    if not Path(path).is_file():
        raise InvalidRequest(f"{path} is not a GGUF file: only GGUF checkpoints can be exported")
    for written in _core.export_gguf_to_hf(path, args.out, args.dtype, args.max_shard_mb * 1_000_000):
        print(written)
    return 0


def _print_mapping(values: dict[str, Any]) -> None:
    for key in sorted(values):
        print(f"  {key}: {values[key]}")
