"""What ``LMLiteBlock(...)(output=...)`` turns into on the wire and back: a JSON schema (a dict) or a
pydantic model class becomes an OpenAI ``response_format`` of type ``json_schema``; the reply, produced
under that constraint by the server (llguidance), comes back as a parsed, validated object.

Invariants: an object is returned only when the reply is complete (``finish_reason == "stop"``) and
parses; a dict schema is checked again with ``jsonschema`` when it is installed, a pydantic model by
``model_validate_json``. Anything else raises :class:`StructuredOutputError`, never a half object.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from lmplex._core import InvalidRequest, LmplexError

__all__ = ["StructuredOutputError", "parse_reply", "response_format"]


class StructuredOutputError(LmplexError):
    """The reply does not hold a complete object of the requested schema (e.g. it ran out of tokens)."""


def _is_model(output: object) -> bool:
    return (
        isinstance(output, type)
        and hasattr(output, "model_json_schema")
        and hasattr(output, "model_validate_json")
    )


def response_format(output: object) -> dict[str, Any] | None:
    """The ``response_format`` body for ``output``: None for ``str``, a json_schema for a schema or model."""
    if output is str:
        return None
    if _is_model(output):
        schema = output.model_json_schema()  # type: ignore[attr-defined]
        name = output.__name__  # type: ignore[attr-defined]
    elif isinstance(output, Mapping):
        schema, name = dict(output), str(output.get("title", "output"))
    else:
        raise InvalidRequest(
            f"output must be str, a JSON schema (dict) or a pydantic model class, got {output!r}"
        )
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def parse_reply(output: object, text: str, finish_reason: str) -> Any:
    """The object in a reply made under ``response_format(output)``."""
    if output is str:
        return text
    if finish_reason != "stop":
        raise StructuredOutputError(
            f"the reply ended by '{finish_reason}' before the object was complete (raise max_tokens): {text!r}"
        )
    if _is_model(output):
        try:
            return output.model_validate_json(text)  # type: ignore[attr-defined]
        except ValueError as err:
            raise StructuredOutputError(f"the reply does not validate: {err}") from None
    try:
        value = json.loads(text)
    except ValueError as err:
        raise StructuredOutputError(f"the reply is not JSON ({err}): {text!r}") from None
    try:
        import jsonschema
    except ImportError:
        return value  # the grammar the server decoded with already enforces the schema
    try:
        jsonschema.validate(value, dict(output))  # type: ignore[call-overload]
    except jsonschema.ValidationError as err:
        raise StructuredOutputError(f"the reply does not validate: {err.message}") from None
    return value
