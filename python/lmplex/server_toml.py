"""The server's TOML config as text: written from :class:`ModelConfig` objects, tenants and tiers
(``server_toml``), and a config file's top-level keys overridden by command-line flags
(``with_top_level``).

Invariants: a value that is ``None`` is left out (the server's default applies); an overridden key's
own definition is commented out, never deleted, so the file's other lines (and its comments) stay
as written.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from lmplex._core import ModelConfig, TierSet


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, Mapping):
        return (
            "{"
            + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items() if x is not None)
            + "}"
        )
    return json.dumps(v)


def key_lines(fields: Mapping[str, Any]) -> list[str]:
    return [f"{k} = {_toml_value(v)}" for k, v in fields.items() if v is not None]


def server_toml(
    configs: Sequence[ModelConfig],
    tenants: Sequence[Mapping[str, Any]] = (),
    tiers: TierSet | None = None,
    **server: object,
) -> str:
    """The server TOML for ``configs``: each :class:`ModelConfig` whole, as a ``[[models]]`` entry
    (``to_dict()``, unset fields left out), after the top-level ``server`` keys (``host``, ``port``);
    then one ``[[tenants]]`` entry per dict of a :class:`Tenant`'s fields in ``tenants``, then
    ``[tiers]`` if ``tiers`` is given."""
    lines = key_lines(server)
    for table, entries in (("models", [c.to_dict() for c in configs]), ("tenants", tenants)):
        for fields in entries:
            lines += [f"[[{table}]]", *key_lines(fields)]
    if tiers is not None:
        lines += ["[tiers]", *key_lines(tiers.to_dict())]
    return "\n".join(lines) + "\n"


# A top-level key at the start of a line: bare, or quoted.
_TOP_KEY = re.compile(r"""\s*(?:"([^"\\]*)"|'([^']*)'|([A-Za-z0-9_-]+))\s*=""")


def _open_brackets(text: str) -> int:
    """How many ``[`` and ``{`` ``text`` leaves open (closed ones subtracted), outside strings and comments."""
    depth, quote = 0, ""
    escaped = False
    for ch in text:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\" and quote == '"':
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            break
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
    return depth


def with_top_level(text: str, values: Mapping[str, object]) -> str:
    """The TOML document ``text`` with the top-level keys of ``values`` set to them (``None``: left as
    they are): each key's own definition, before the first table header, is commented out line by line
    (its value may span lines), every other line is kept, and the values come first."""
    values = {k: v for k, v in values.items() if v is not None}
    if not values:
        return text
    out: list[str] = []
    lines = text.splitlines()
    depth, overridden = 0, False
    for i, line in enumerate(lines):
        if depth <= 0:
            if line.lstrip().startswith("["):
                out += lines[i:]
                break
            m = _TOP_KEY.match(line)
            overridden = m is not None and next(g for g in m.groups() if g is not None) in values
        out.append(f"# {line}" if overridden else line)
        depth += _open_brackets(line)
    return "\n".join([*key_lines(values), *out]) + "\n"
