"""``lmplex usage``: every tenant's usage as a server's usage store holds it (docs/tenants.md).

Reads the store without writing, so it answers while servers run: the store ``--store sqlite:PATH``
or ``--store redis://HOST:PORT/DB`` names, else the one ``lmplex serve --config FILE`` uses (the
config's ``usage_store``, or the default beside it). Prints one row per tenant, or with ``--json`` a list of objects.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from lmplex import _core

COLUMNS = [
    ("tenant", "tenant"),
    ("requests", "requests"),
    ("prompt_tokens", "prompt tokens"),
    ("completion_tokens", "completion tokens"),
    ("cost", "cost"),
    ("cost_today", "cost today"),
    ("in_flight", "in flight"),
]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "usage",
        help="every tenant's usage from a server's usage store",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", metavar="FILE", help="the server config whose store to read")
    where.add_argument(
        "--store", metavar="STORE", help="the store itself: sqlite:PATH or redis://HOST:PORT/DB"
    )
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.set_defaults(func=_cmd_usage)


def rows(store: str | None = None, config: str | None = None) -> list[dict[str, Any]]:
    """Every tenant's usage in the store (``store``, else ``config``'s), by tenant name."""
    if store and store.startswith("sqlite:"):
        store = "sqlite:" + os.path.abspath(store.removeprefix("sqlite:"))
    return _core.usage_report(store, config)


def _cell(v: object) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _cmd_usage(args: argparse.Namespace) -> int:
    out = rows(args.store, args.config)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    table = [[title for _, title in COLUMNS]] + [[_cell(r[k]) for k, _ in COLUMNS] for r in out]
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
    for row in table:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    return 0
