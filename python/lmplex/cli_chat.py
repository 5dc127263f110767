"""``lmplex chat`` and the reply streaming ``lmplex generate`` shares with it.

Invariant: replies go to stdout, flushed per chunk and ended with a newline (also when a stream fails
part-way); prompts and notices go to stderr, and ``>>> `` is shown only on a TTY.
"""

from __future__ import annotations

import sys

from lmplex._core import InvalidRequest, SamplingParams
from lmplex.engine import Engine, Prompt

__all__ = ["chat", "stream_reply", "system_messages"]


def chat(model: str, system: str | None, engine: Engine, params: SamplingParams) -> int:
    """Turns from stdin, each reply streamed to stdout, until end of input or ``/exit``; ``/reset``
    starts over. A turn the model refuses is dropped with the error and the chat goes on."""
    interactive = sys.stdin.isatty()
    if interactive:
        try:
            import readline  # noqa: F401  (line editing for input())
        except ImportError:
            pass
        print(f"lmplex chat with {model}: /reset clears the conversation, /exit quits.", file=sys.stderr)
    history: list[dict[str, str]] = system_messages(system)
    while True:
        line = _read_turn(interactive)
        if line is None:
            break
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            break
        if text == "/reset":
            history = system_messages(system)
            print("(conversation cleared)", file=sys.stderr)
            continue
        history.append({"role": "user", "content": text})
        try:
            reply = stream_reply(engine, history, params)
        except InvalidRequest as err:
            history.pop()
            print(f"error: {err} (try /reset)", file=sys.stderr)
            continue
        history.append({"role": "assistant", "content": reply})
    return 0


def system_messages(text: str | None) -> list[dict[str, str]]:
    """The conversation's opening: a system message with ``text``, or nothing."""
    return [{"role": "system", "content": text}] if text is not None else []


def stream_reply(engine: Engine, prompt: Prompt, params: SamplingParams) -> str:
    """Stream the reply to stdout, flushing each chunk, and end it with a newline; return its text."""
    pieces: list[str] = []
    try:
        for chunk in engine.stream(prompt, params):
            if chunk.text:
                pieces.append(chunk.text)
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
    except BaseException:
        if pieces:  # end the partial line before the error is printed
            sys.stdout.write("\n")
            sys.stdout.flush()
        raise
    sys.stdout.write("\n")
    sys.stdout.flush()
    return "".join(pieces)


def _read_turn(interactive: bool) -> str | None:
    """The next line from stdin, or None at end of input. Shows ``>>> `` only on a TTY."""
    if interactive:
        try:
            return input(">>> ")
        except EOFError:
            print()
            return None
    line = sys.stdin.readline()
    return line if line else None
