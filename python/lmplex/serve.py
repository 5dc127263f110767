"""``lmplex serve``: the OpenAI-compatible HTTP server, with one model, several, or a TOML config.

The server itself is Rust (``crates/lmplex-server``, axum); this module only builds its TOML config
from the command line and hands it over with the alias resolver, so the standalone
``lmplex-server`` binary and ``lmplex serve`` read the same config format.

Invariants: an alias must be fetched first (a Hub id downloads into the Hub cache when missing, before
the server listens); the call blocks until SIGTERM or Ctrl-C, after which in-flight requests finish
(drain) and the command exits 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from lmplex import _core, models
from lmplex._core import InvalidRequest, ModelConfig
from lmplex.server_toml import server_toml, with_top_level

__all__ = ["add_parser", "configure_logging", "server_toml"]

_EPILOG = """\
examples:
  lmplex serve smollm2-135m-instruct
  lmplex serve smollm2-135m-instruct qwen2.5-coder-0.5b-instruct --port 8000
  lmplex serve HuggingFaceTB/SmolLM2-135M-Instruct        (a Hub id; ORG/NAME:Q4_K_M for a GGUF repo)
  lmplex serve ./model.gguf --name my-model --max-model-len 4096
  lmplex serve --config models.toml
  lmplex serve smollm2-135m-instruct --lora-modules sql=./sql-lora chat=ORG/chat-lora
  lmplex serve smollm2-135m-instruct --api-key sk-local     (or LMPLEX_API_KEY=sk-local)

config file (TOML):
  host = "127.0.0.1"
  port = 8000
  # usage_store = "redis://127.0.0.1:6379/0"  # or sqlite:PATH; with tenants, default: CONFIG.usage.sqlite
  # usage_store_fail_open = true       # Redis down: serve unmetered instead of 503
  # allowed_media_domains = ["images.example.com"]  # image URLs of these hosts are fetched
  # media_fetch_timeout_s = 5          # max_concurrent_media_fetches = 16 (server-wide)
  [[models]]
  model_id = "smollm2-135m-instruct"   # alias, Hub id (ORG/NAME[:QUANT]), .gguf file or HF folder
  # revision = "main"                  # a Hub id's branch, tag or commit
  served_model_name = "smollm2"        # what clients put in "model" (default: model_id)
  max_model_len = 2048                 # any ModelConfig field, same name
  keep_alive_s = 300                   # unload after 300 s idle; the next request reloads it
  lora_modules = { sql = "./sql-lora" }  # LoRA adapters served as models of their own
  [[models]]
  model_id = "qwen2.5-coder-0.5b-instruct"
  [[tenants]]                          # optional: keys, fair shares and quotas (docs/tenants.md)
  name = "acme"
  api_key_sha256 = "..."               # printf %s KEY | sha256sum (or api_key = "...")
  weight = 2
  requests_per_minute = 600
  tokens_per_minute = 200000
  max_concurrency = 16

endpoints: /v1/models, /v1/completions, /v1/chat/completions (SSE with "stream": true),
/v1/usage (the caller's usage and quotas), /v1/load_lora_adapter and /v1/unload_lora_adapter,
/health, /ready (503 until every model is loaded), /metrics (Prometheus).
"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds the ``serve`` subcommand to the CLI's subparsers."""
    serve = sub.add_parser(
        "serve",
        help="serve models over an OpenAI-compatible HTTP API",
        description="Load MODEL... (or the models of --config) into one process and serve them over "
        "an OpenAI-compatible HTTP API until SIGTERM or Ctrl-C.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument(
        "model",
        nargs="*",
        metavar="MODEL",
        help="a known alias, a Hub id (ORG/NAME or ORG/NAME:QUANT), a .gguf file or an HF folder",
    )
    serve.add_argument("--revision", metavar="REV", help="the Hub branch, tag or commit of each MODEL")
    serve.add_argument("--config", metavar="FILE", help="a TOML file with [[models]] (instead of MODEL)")
    serve.add_argument("--name", metavar="NAME", help="the served name of the one MODEL (default: MODEL)")
    serve.add_argument("--host", metavar="HOST", help="address to listen on (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, metavar="PORT", help="port (default: 8000; 0 picks a free one)")
    serve.add_argument("--max-model-len", type=int, metavar="N", help="context length of each MODEL")
    serve.add_argument(
        "--max-model-concurrency", type=int, metavar="N", help="sequences per step, each MODEL"
    )
    serve.add_argument(
        "--device", metavar="DEVICE", help="auto, cpu, cuda or cuda:N for each MODEL (default: auto)"
    )
    serve.add_argument(
        "--dtype",
        choices=["auto", "float32", "float16", "bfloat16"],
        help="each MODEL's activation and dense-weight dtype (default: auto)",
    )
    serve.add_argument(
        "--enforce-eager",
        action="store_true",
        default=None,
        help="on CUDA, run every step kernel by kernel instead of replaying CUDA graphs",
    )
    serve.add_argument(
        "--gpu-memory-utilization",
        type=float,
        metavar="SHARE",
        help="share (0, 1] of each CUDA device its models may reserve (default: 0.9)",
    )
    serve.add_argument(
        "--kv-cache-dtype",
        choices=["auto", "float16", "float32", "int8"],
        help="what each MODEL's KV cache stores (int8: bytes with scales per 32 values; CPU only)",
    )
    serve.add_argument(
        "--lora-modules",
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME=ADAPTER",
        help="serve the PEFT LoRA adapter ADAPTER (a folder or a Hub id) as the model NAME on the one MODEL",
    )
    serve.add_argument(
        "--max-loras", type=int, metavar="N", help="most adapters in a step and held idle (default: 8)"
    )
    serve.add_argument("--max-lora-rank", type=int, metavar="R", help="highest adapter rank (default: 64)")
    serve.add_argument(
        "--tool-call-parser",
        choices=["hermes", "llama3_json", "mistral"],
        help="how each MODEL writes tool calls (default: read from its chat template)",
    )
    serve.add_argument(
        "--reasoning-parser",
        choices=["think", "qwen3", "deepseek_r1", "none"],
        help="how each MODEL's chat replies carry reasoning, sent as reasoning_content "
        "(default: think when its chat template writes <think>)",
    )
    serve.add_argument(
        "--task",
        choices=["generate", "embed"],
        help="what each MODEL serves: generation, or /v1/embeddings (default: generate)",
    )
    serve.add_argument(
        "--pooling",
        choices=["last", "mean"],
        help="how an embedding MODEL pools its final hidden states (default: its sentence-transformers "
        "config, else last)",
    )
    serve.add_argument(
        "--speculative-config",
        metavar="JSON",
        help='decode each MODEL speculatively, e.g. \'{"method": "ngram", "num_speculative_tokens": 4}\' '
        "(vLLM's flag; tokens never change, docs/speculative.md)",
    )
    serve.add_argument(
        "--limit-mm-per-prompt",
        metavar="JSON",
        help="most images one prompt may hold, e.g. '{\"image\": 4}' (vLLM's flag; default 8; 0 loads no "
        "vision tower)",
    )
    serve.add_argument(
        "--mmproj",
        metavar="PATH",
        help="a llama.cpp multimodal projector file: MODEL's vision tower and image settings "
        "(llama-server's flag; docs/vision.md)",
    )
    serve.add_argument(
        "--keep-alive",
        type=float,
        metavar="SECONDS",
        help="unload each MODEL after this long without requests; its next request reloads it",
    )
    serve.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY",
        help="require this bearer key (repeatable; also $LMPLEX_API_KEY); tenants come from --config",
    )
    serve.add_argument(
        "--allowed-origins",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let browser pages from ORIGIN call the server (CORS; repeatable; * for any); off by default",
    )
    serve.add_argument(
        "--allowed-media-domains",
        action="extend",
        type=_host_list,
        default=[],
        metavar="HOST[,HOST...]",
        help="fetch image URLs (http/https) of these hosts, exact names (vLLM's flag; one value per use, "
        "repeatable; replaces a --config file's list); default: none, images come as data: URLs or base64",
    )
    serve.add_argument(
        "--media-fetch-timeout-s",
        type=float,
        metavar="SECONDS",
        help="longest one image URL's fetch may take, waiting for a turn included (default: 5)",
    )
    serve.add_argument(
        "--max-concurrent-media-fetches",
        type=int,
        metavar="N",
        help="most image URL fetches in flight at once, across all requests (default: 16)",
    )
    serve.add_argument(
        "--scheduling-policy",
        choices=["fcfs", "priority", "fair"],
        help="admission order for models that set none (default: fair with tenants, else fcfs)",
    )
    serve.add_argument(
        "--usage-store",
        metavar="STORE",
        help="where tenants' usage is kept: memory, sqlite:PATH (kept across restarts, shared by every "
        "server on the file) or redis://HOST:PORT/DB (shared by servers on any machine); default with "
        "tenants: sqlite beside the --config file",
    )
    serve.add_argument(
        "--usage-store-fail-open",
        action="store_true",
        help="while the usage store cannot be reached, let calls through unmetered (logged, counted) "
        "instead of answering 503 (the default: fail closed)",
    )
    serve.add_argument(
        "--address-file",
        metavar="FILE",
        help="write the server's URL (http://HOST:PORT) to FILE once it listens (for --port 0)",
    )
    serve.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="log lines as text or as JSON objects (level: $LMPLEX_LOG, default info)",
    )
    serve.set_defaults(func=_cmd_serve)


class _JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(
            {
                "time": self.formatTime(record),
                "level": record.levelname,
                "logger": record.name,
                "message": record.getMessage(),
            }
        )


def configure_logging(log_format: str = "text") -> None:
    """Sends log records (the Rust core's included) to stderr at ``$LMPLEX_LOG``'s level (a level
    name such as ``debug``; default ``info``), as text or JSON lines."""
    name = os.environ.get("LMPLEX_LOG", "info").strip().upper() or "INFO"
    level = logging.getLevelName(name)
    if not isinstance(level, int):
        raise InvalidRequest(f"LMPLEX_LOG={name.lower()!r} is not a log level (debug, info, warning, error)")
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)


def _host_list(value: str) -> list[str]:
    """``--allowed-media-domains``' one value: a host, or hosts separated by commas."""
    hosts = [h.strip() for h in value.split(",") if h.strip()]
    if not hosts:
        raise argparse.ArgumentTypeError(f"needs a host (or a comma-separated list), got {value!r}")
    return hosts


def config_toml(args: argparse.Namespace) -> str:
    """The server config the command line describes, as TOML text. With ``--config``, the media flags
    override the file's keys of the same names, as ``--host`` or ``--allowed-origins`` do."""
    media = {
        "allowed_media_domains": args.allowed_media_domains or None,
        "media_fetch_timeout_s": args.media_fetch_timeout_s,
        "max_concurrent_media_fetches": args.max_concurrent_media_fetches,
    }
    if args.config:
        if args.model or args.name:
            raise InvalidRequest("give either --config or MODEL arguments, not both")
        try:
            with open(args.config, encoding="utf-8") as f:
                return with_top_level(f.read(), media)
        except OSError as err:
            raise InvalidRequest(f"cannot read the config {args.config}: {err}") from err
    if not args.model:
        raise InvalidRequest("give a MODEL to serve (e.g. smollm2-135m-instruct) or --config FILE")
    if args.name and len(args.model) > 1:
        raise InvalidRequest("--name names one MODEL; use --config to name several")
    if args.lora_modules and len(args.model) > 1:
        raise InvalidRequest("--lora-modules adapts one MODEL; use --config for adapters of several")
    if args.mmproj and len(args.model) > 1:
        raise InvalidRequest("--mmproj is one MODEL's vision tower; use --config to give several")
    lora: dict[str, str] = {}
    for item in args.lora_modules:
        name, sep, adapter = item.partition("=")
        if not (sep and name and adapter):
            raise InvalidRequest(f"--lora-modules takes NAME=ADAPTER items, got {item!r}")
        lora[name] = adapter
    speculative = None
    if args.speculative_config is not None:
        try:
            speculative = json.loads(args.speculative_config)
        except ValueError as err:
            raise InvalidRequest(f"--speculative-config takes a JSON object: {err}") from err
    limit_mm = None
    if args.limit_mm_per_prompt is not None:
        try:
            limit_mm = json.loads(args.limit_mm_per_prompt)
        except ValueError as err:
            raise InvalidRequest(f"--limit-mm-per-prompt takes a JSON object: {err}") from err
    fields = {
        "served_model_name": args.name,
        "revision": args.revision,
        "max_model_len": args.max_model_len,
        "max_model_concurrency": args.max_model_concurrency,
        "device": args.device,
        "dtype": args.dtype,
        "enforce_eager": args.enforce_eager,
        "kv_cache_dtype": args.kv_cache_dtype,
        "keep_alive_s": None if args.keep_alive is None else float(args.keep_alive),
        "tool_call_parser": args.tool_call_parser,
        "reasoning_parser": args.reasoning_parser,
        "task": args.task,
        "pooling": args.pooling,
        "lora_modules": lora or None,
        "max_loras": args.max_loras,
        "max_lora_rank": args.max_lora_rank,
        "speculative": speculative,
        "limit_mm_per_prompt": limit_mm,
        "mmproj": os.path.abspath(args.mmproj) if args.mmproj else None,
    }
    given = {k: v for k, v in fields.items() if v is not None}
    configs = [ModelConfig(model, **given) for model in args.model]
    return server_toml(configs, gpu_memory_utilization=args.gpu_memory_utilization, **media)


def _cmd_serve(args: argparse.Namespace) -> int:
    port = args.port
    if port is not None and not 0 <= port <= 65535:
        raise InvalidRequest(f"--port must be between 0 and 65535, got {port}")
    configure_logging(args.log_format)
    keys = list(args.api_key)
    env_key = os.environ.get("LMPLEX_API_KEY", "")
    if env_key:
        keys.append(env_key)
    store = args.usage_store
    if store and store.startswith("sqlite:"):
        store = "sqlite:" + os.path.abspath(
            store.removeprefix("sqlite:")
        )  # from here, not the config's folder
    _core.serve(
        config_toml(args),
        models.resolve,
        args.host,
        port,
        args.address_file,
        keys,
        args.scheduling_policy,
        args.allowed_origins,
        store,
        args.config,
        args.usage_store_fail_open,
    )
    return 0
