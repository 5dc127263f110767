#!/usr/bin/env python3
"""Check LangChain's ``ChatOpenAI`` against a running ``lmplex serve``.

    python tests/peer/langchain_check.py --base-url http://127.0.0.1:8000 --model qwen2.5-coder-0.5b-instruct

Checks ``invoke``, ``stream``, ``bind_tools`` (a required call, streamed and not, and the tool result sent
back) and ``with_structured_output`` with ``method="json_schema"`` and ``method="function_calling"``.
Prints one line per check and exits 1 if any failed; skips (exit 0) without ``langchain-openai``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field


class GetWeather(BaseModel):
    """Get the current weather in a city."""

    city: str = Field(description="The city, e.g. Paris")


class Sum(BaseModel):
    """The sum of two numbers."""

    result: int


def checks(llm: Any) -> dict[str, Callable[[], str]]:
    messages = importlib.import_module("langchain_core.messages")
    ask_weather = "What is the weather in Paris?"

    def invoke() -> str:
        reply = llm.invoke("Say hello in one word.")
        assert isinstance(reply.content, str) and reply.content, reply
        return repr(reply.content)

    def stream() -> str:
        chunks = list(llm.stream("Count from 1 to 5."))
        text = "".join(str(chunk.content) for chunk in chunks)
        assert len(chunks) > 1 and text, chunks
        return f"{len(chunks)} chunks, {text!r}"

    def bind_tools() -> str:
        tooled = llm.bind_tools([GetWeather], tool_choice="required")
        reply = tooled.invoke(ask_weather)
        assert reply.tool_calls and reply.tool_calls[0]["name"] == "GetWeather", reply
        assert "city" in reply.tool_calls[0]["args"], reply.tool_calls
        result = messages.ToolMessage("18 C and sunny", tool_call_id=reply.tool_calls[0]["id"])
        answer = llm.bind_tools([GetWeather]).invoke([messages.HumanMessage(ask_weather), reply, result])
        assert isinstance(answer.content, str), answer
        return f"{reply.tool_calls[0]['args']}, then {answer.content[:60]!r}"

    def bind_tools_stream() -> str:
        tooled = llm.bind_tools([GetWeather], tool_choice="required")
        whole = None
        for chunk in tooled.stream(ask_weather):
            whole = chunk if whole is None else whole + chunk
        assert whole is not None and whole.tool_calls, whole
        assert whole.tool_calls[0]["name"] == "GetWeather" and "city" in whole.tool_calls[0]["args"], whole
        return str(whole.tool_calls[0]["args"])

    def structured(method: str) -> Callable[[], str]:
        def run() -> str:
            out = llm.with_structured_output(Sum, method=method).invoke("What is 2 + 3?")
            assert isinstance(out, Sum), out
            return repr(out)

        return run

    return {
        "invoke": invoke,
        "stream": stream,
        "bind_tools": bind_tools,
        "bind_tools + stream": bind_tools_stream,
        "with_structured_output json_schema": structured("json_schema"),
        "with_structured_output function_calling": structured("function_calling"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-url", default=os.environ.get("LMPLEX_BASE_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    args = parser.parse_args()
    if importlib.util.find_spec("langchain_openai") is None:
        print("skipped: langchain-openai is not installed (pip install langchain-openai)")
        return 0
    chat_openai: Any = importlib.import_module("langchain_openai").ChatOpenAI
    llm = chat_openai(
        base_url=args.base_url.rstrip("/") + "/v1",
        api_key="unused",
        model=args.model,
        temperature=0,
        max_tokens=128,
    )
    failed = 0
    for name, check in checks(llm).items():
        try:
            print(f"ok    {name}: {check()}")
        except Exception as err:  # noqa: BLE001 - report every check, then fail
            failed += 1
            print(f"FAIL  {name}: {type(err).__name__}: {err}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
