"""What run.py runs: the pinned upstream test files, the names it serves them under, and the selection.

Each ``Suite`` gets its own ``lmplex serve``, serving the stand-in model under each name in ``served``:
llama.cpp's tests mostly omit ``model`` (which lmplex allows only when it serves one model), and vLLM's
responses tests do too, so the suites that need one name have a server of their own. Why a test is
deselected, and why each selected one fails: docs/compat.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Settings = dict[str, object]  # extra ``[[models]]`` keys of the TOML run.py writes (``ModelConfig`` fields)


@dataclass
class Suite:
    title: str
    repo: str
    ref: str  # the pinned upstream commit or tag
    files: list[str]  # upstream paths fetched at ``ref``
    served: list[str]  # served model names, all backed by the stand-in
    tests: list[str]  # pytest arguments, relative to ``cwd``
    include: list[str]  # node-id regexes that run (peer_select.py); all other tests are deselected
    exclude: list[str] = field(default_factory=list)
    cwd: str = "."  # where pytest runs, inside the scratch tree
    shims: dict[str, str] = field(default_factory=dict)  # file here -> path in the scratch tree
    plugins: list[str] = field(default_factory=list)
    settings: Settings = field(default_factory=dict)  # for every served name (e.g. task = "embed")
    per_name: dict[str, Settings] = field(default_factory=dict)  # for one served name


EMBED: Settings = {"task": "embed", "max_model_len": 512}  # the embedding tests' models take 512 tokens
QWEN3: Settings = {"reasoning_parser": "qwen3"}  # vLLM's --reasoning-parser qwen3 for the Qwen3 names

LLAMACPP_REPO = "ggml-org/llama.cpp"
LLAMACPP_REF = "4df29be4f4c3673f428170fda944a5b19f743bb8"
LLAMA_TESTS = "tools/server/tests"
LLAMA_HARNESS = [f"{LLAMA_TESTS}/{name}" for name in ("conftest.py", "pytest.ini", "utils.py")]


def llamacpp(
    title: str,
    units: list[str],
    served: str,
    include: list[str] | None = None,
    exclude: list[str] | None = None,
    settings: Settings | None = None,
) -> Suite:
    """A llama.cpp suite: ``units`` of ``tools/server/tests/unit``, one served name, the plugin."""
    return Suite(
        title=title,
        repo=LLAMACPP_REPO,
        ref=LLAMACPP_REF,
        files=[*LLAMA_HARNESS, *(f"{LLAMA_TESTS}/unit/{unit}" for unit in units)],
        served=[served],
        cwd=LLAMA_TESTS,
        tests=[f"unit/{unit}" for unit in units],
        include=include or [".*"],
        exclude=exclude or [],
        plugins=["llamacpp_plugin"],
        settings=settings or {},
    )


LLAMACPP = llamacpp(
    "llama.cpp chat, tools, tokenize",
    ["test_tool_call.py", "test_chat_completion.py", "test_tokenize.py"],
    # llama.cpp's tests omit "model" (one served model), except the OpenAI-client ones.
    "gpt-3.5-turbo-instruct",
    include=[
        # Real-model rows, once per test, with the model's own template (the stand-in is a Qwen2.5).
        r"test_completion_with_required_tool_real_model\[.*-bartowski/Qwen2\.5-Coder-3B-Instruct-GGUF:Q4_K_M-None-",
        r"test_completion_without_tool_call_fast\[",
        r"test_weather\[bartowski/Qwen2\.5-Coder-3B-Instruct-GGUF:Q4_K_M-None-",
        r"test_calc_result\[None-128-bartowski/Qwen2\.5-Coder-3B-Instruct-GGUF:Q4_K_M-None-",
        r"test_hello_world\[bartowski/Qwen2\.5-7B-Instruct-GGUF:Q4_K_M-None-",
        r"test_thoughts\[1024-deepseek-I need",  # the reasoning model's row without a template override
        # OpenAI-standard checks that do not depend on the stories260K model's text.
        r"test_invalid_chat_completion_req\[",
        r"test_logprobs",
        r"test_completion_with_response_format\[",
        r"test_chat_completions_multiple_choices",
        r"test_tokenize\.py::",
    ],
)
LLAMACPP_ANTHROPIC = llamacpp(
    "llama.cpp Anthropic Messages",
    ["test_compat_anthropic.py"],
    "test",  # the "model" every request sends
    exclude=[
        r"::test_anthropic_vision_base64_with_multimodal_model",  # downloads tinygemma3 and an image
        r"::test_anthropic_thinking_with_reasoning_model",  # downloads DeepSeek-R1-Distill-Qwen-7B
        r"::test_anthropic_thinking_history_in_template",  # llama-server's /apply-template
    ],
)
LLAMACPP_RESPONSES = llamacpp(
    "llama.cpp Responses",
    ["test_compat_oai_responses.py"],
    "gpt-4.1",
    exclude=[r"::test_responses_stream_with_llama_telemetry"],  # timings_per_token, return_progress
)
LLAMACPP_EMBEDDING = llamacpp(
    "llama.cpp embeddings",
    ["test_embedding.py"],
    "text-embedding-3-small",  # the OpenAI-client tests' name; the others omit "model"
    exclude=[
        r"::test_embedding_pooling_none"
    ],  # --pooling none: a vector per token, llama-server's /embeddings
    settings=EMBED,
)

VLLM_REPO = "vllm-project/vllm"
VLLM_REF = "v0.33.0"
VLLM_SHIMS = {
    "vllm_conftest.py": "tests/conftest.py",
    "vllm_utils.py": "tests/utils.py",
}
VLLM_TOOL_USE = Suite(
    title="vLLM tests/tool_use",
    repo=VLLM_REPO,
    ref=VLLM_REF,
    files=[
        "tests/tool_use/utils.py",
        "tests/tool_use/test_tool_calls.py",
        "tests/tool_use/test_chat_completions.py",
        "tests/tool_use/test_parallel_tool_calls.py",
    ],
    served=["NousResearch/Hermes-3-Llama-3.1-8B"],  # CONFIGS["hermes"]: the <tool_call> format
    tests=["tests/tool_use"],
    include=[".*"],
    shims={**VLLM_SHIMS, "vllm_tool_use_conftest.py": "tests/tool_use/conftest.py"},
)
CHAT = "tests/entrypoints/openai/chat_completion"
COMPLETION = "tests/entrypoints/openai/completion"
VLLM_OPENAI = Suite(
    title="vLLM openai chat, completion",
    repo=VLLM_REPO,
    ref=VLLM_REF,
    files=[
        "tests/entrypoints/conftest.py",
        f"{CHAT}/test_chat.py",
        f"{CHAT}/test_chat_completion.py",
        f"{CHAT}/test_chat_logit_bias_validation.py",
        f"{CHAT}/test_completion_with_function_calling.py",
        f"{CHAT}/test_include_reasoning.py",
        f"{COMPLETION}/test_completion.py",
    ],
    served=["HuggingFaceH4/zephyr-7b-beta", "Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen3-0.6B"],
    per_name={"Qwen/Qwen3-0.6B": QWEN3},
    tests=[CHAT, COMPLETION],
    include=[".*"],
    exclude=[
        r"zephyr-lora",  # LoRA adapters downloaded from the Hub
        r"test_function_tool_use\[watermarked-",  # vLLM's --watermark-config
        r"::test_chat_completion_request_|::test_null_top_logprobs|::test_completion_request_",  # vLLM unit tests
        r"::test_invocations",  # SageMaker's /invocations route
        r"::test_kv_transfer_",  # kv_transfer_params (disaggregated prefill)
        r"::test_per_request_metrics",  # --enable-per-request-metrics
        r"::test_completion_truncation_side",  # truncate_prompt_tokens, return_token_ids
        r"::test_logprob_token_ids",  # logprob_token_ids, allowed_token_ids, return_tokens_as_token_ids
    ],
    shims=VLLM_SHIMS,
)
RESPONSES = "tests/entrypoints/openai/responses"
VLLM_RESPONSES = Suite(
    title="vLLM openai/responses",
    repo=VLLM_REPO,
    ref=VLLM_REF,
    files=[
        "tests/entrypoints/conftest.py",
        f"{RESPONSES}/conftest.py",
        f"{RESPONSES}/test_basic.py",
        f"{RESPONSES}/test_stateful.py",
        f"{RESPONSES}/test_structured_output.py",
        f"{RESPONSES}/test_function_call.py",
        f"{RESPONSES}/test_namespace_tool_separator.py",
    ],
    served=["Qwen/Qwen3-1.7B"],  # the conftest's server; test_basic and others omit "model"
    settings=QWEN3,
    tests=[RESPONSES],
    include=[".*"],
    exclude=[r"::test_background", r"::test_cancel_completed"],  # background responses, cancel
    shims=VLLM_SHIMS,
)
VLLM_RESPONSES_SIMPLE = Suite(
    title="vLLM openai/responses/test_simple",
    repo=VLLM_REPO,
    ref=VLLM_REF,
    files=["tests/entrypoints/conftest.py", f"{RESPONSES}/conftest.py", f"{RESPONSES}/test_simple.py"],
    served=["Qwen/Qwen3-8B"],
    settings=QWEN3,
    tests=[f"{RESPONSES}/test_simple.py"],
    include=[".*"],
    exclude=[r"::test_enable_response_messages"],  # vLLM's enable_response_messages (raw prompt tokens)
    shims=VLLM_SHIMS,
)
VLLM_MESSAGES_TOKENIZE = Suite(
    title="vLLM anthropic, serve/tokenize",
    repo=VLLM_REPO,
    ref=VLLM_REF,
    files=[
        "tests/entrypoints/conftest.py",
        "tests/entrypoints/anthropic/test_messages.py",
        "tests/entrypoints/serve/tokenize/test_tokenization.py",
    ],
    # test_messages checks that "Qwen/Qwen3-0.6B" is served, then sends its --served-model-name.
    served=["Qwen/Qwen3-0.6B", "claude-3-7-sonnet-latest", "HuggingFaceTB/SmolLM2-135M-Instruct"],
    tests=["tests/entrypoints/anthropic", "tests/entrypoints/serve/tokenize"],
    include=[".*"],
    exclude=[r"::test_tokenizer_info"],  # vLLM's /tokenizer_info route
    shims=VLLM_SHIMS,
)
EMBED_TESTS = "tests/entrypoints/pooling/embed"
VLLM_EMBED = Suite(
    title="vLLM pooling/embed",
    repo=VLLM_REPO,
    ref=VLLM_REF,
    files=[
        "tests/entrypoints/conftest.py",
        f"{EMBED_TESTS}/test_online.py",
        f"{EMBED_TESTS}/test_online_dimensions.py",
        # imported by those two
        "tests/ci_envs.py",
        "tests/models/utils.py",
        "tests/models/registry.py",
        "tests/models/language/pooling/embed_utils.py",
    ],
    # One name: test_basic wants it listed first. The Snowflake rows of test_online_dimensions are skipped.
    served=["intfloat/multilingual-e5-small"],
    settings={**EMBED, "pooling": "mean"},  # e5's own pooling
    tests=[EMBED_TESTS],
    include=[".*"],
    exclude=[
        r"::test_truncate_prompt_tokens|::test_padding",  # vLLM's truncate_prompt_tokens, padding
        r"::test_chat_request|::test_invocations_",  # embeddings of chat messages; SageMaker's /invocations
        r"_embed_dtype_and_endianness|test_params_not_supported\[(embed_dtype|endianness)",  # embed_dtype, bytes
        r"::test_pooling_",  # vLLM's /pooling route
        r"::test_use_activation",  # vLLM's use_activation; its checks need torch, which the shim stubs
    ],
    shims=VLLM_SHIMS,
)
SUITES = {
    "llamacpp": [LLAMACPP, LLAMACPP_ANTHROPIC, LLAMACPP_RESPONSES, LLAMACPP_EMBEDDING],
    "vllm": [
        VLLM_TOOL_USE,
        VLLM_OPENAI,
        VLLM_RESPONSES,
        VLLM_RESPONSES_SIMPLE,
        VLLM_MESSAGES_TOKENIZE,
        VLLM_EMBED,
    ],
}
