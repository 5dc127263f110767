"""Images in, text out: a vision-language model (Idefics3 / SmolVLM) from Python and through the
server with the real ``openai`` client.

The model is the tiny Idefics3 of ``tests/fixtures/vision/idefics3.json``
(``scripts/make_vlm_fixtures.py``): its weights rebuilt from ``hashed_values``, its chat template,
tokenizer and processor settings from the fixture. The oracle is transformers' whole pipeline on the
same image (chat template, Idefics3 processor, greedy ``generate``): the reply's tokens must equal
its tokens, whether the image comes as a PIL image, bytes, a path or a data URL, from Python or over
HTTP (chat completions, Responses and Anthropic's Messages, through the real clients). Bad images are typed errors (``InvalidRequest``, a 400 naming the part).
"""

from __future__ import annotations

import base64
import http.server
import json
import math
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from hashed import hashed_values
from server_util import Server

import lmplex
from lmplex import InvalidRequest, SamplingParams

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).parent.parent
FIXTURE: dict[str, Any] = json.loads((FIXTURES / "vision" / "idefics3.json").read_text())
CHAT = FIXTURE["chat"]
IMAGE = ROOT / CHAT["image"]


def write_folder(folder: Path) -> Path:
    """The fixture's model as a Hugging Face folder."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(FIXTURE["config_json"]))
    (folder / "tokenizer.json").write_text(json.dumps(CHAT["tokenizer_json"]))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHAT["chat_template"]}))
    for f in ("preprocessor_config.json", "processor_config.json"):
        shutil.copy(ROOT / CHAT["processor"] / f, folder / f)
    tensors = {
        t["name"]: hashed_values(t["name"], math.prod(t["shape"]), t["std"], t["mean"]).reshape(t["shape"])
        for t in FIXTURE["tensors"]
    }
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_folder(tmp_path_factory.mktemp("vlm") / "tiny-idefics3")


def turn(image: object) -> list[dict[str, Any]]:
    content = [{"type": "image", "image": image}, {"type": "text", "text": CHAT["messages_text"]}]
    return [{"role": "user", "content": content}]


def greedy() -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=len(CHAT["generated"]), ignore_eos=True)


def data_url(raw: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(raw).decode()


def test_every_image_form_gives_transformers_tokens(vlm: Path) -> None:
    from PIL import Image

    engine = lmplex.Engine(lmplex.ModelConfig(str(vlm), device="cpu"))
    raw = IMAGE.read_bytes()
    forms: list[object] = [Image.open(IMAGE), raw, bytearray(raw), str(IMAGE), IMAGE, data_url(raw)]
    outs = engine.generate([turn(f) for f in forms], greedy())
    for form, out in zip(forms, outs):
        assert out.token_ids == CHAT["generated"], type(form).__name__
        assert out.usage.prompt_tokens == len(CHAT["prompt_ids"])
    assert engine.tokenize(outs[0].prompt, add_special_tokens=False) == CHAT["prompt_ids"]
    # OpenAI's part shape works from Python too.
    openai_part = [
        {"type": "image_url", "image_url": {"url": data_url(raw)}},
        {"type": "text", "text": "t5 t6 t7"},
    ]
    (out,) = engine.generate([[{"role": "user", "content": openai_part}]], greedy())
    assert out.token_ids == CHAT["generated"]


def test_bad_images_are_invalid_requests(vlm: Path, tmp_path: Path) -> None:
    engine = lmplex.Engine(lmplex.ModelConfig(str(vlm), device="cpu"))
    raw = IMAGE.read_bytes()
    cases: list[tuple[object, str]] = [
        (raw[: len(raw) // 2], "image 0"),
        (b"not an image at all", "image 0"),
        (str(tmp_path / "missing.png"), "cannot read the image file"),
        ("https://example.com/cat.png", "not fetched"),
        (12, "not int"),
    ]
    for image, want in cases:
        with pytest.raises(InvalidRequest, match=want):
            engine.generate([turn(image)], greedy())
    # A placeholder typed in the text as well as the image part's: two placeholders, one image.
    typed = [{"type": "image", "image": raw}, {"type": "text", "text": "<image>"}]
    with pytest.raises(InvalidRequest, match="2 image placeholders"):
        engine.generate([[{"role": "user", "content": typed}]], greedy())


def test_openai_and_anthropic_clients_send_images(vlm: Path, tmp_path: Path) -> None:
    server = Server(tmp_path, [{"model_id": str(vlm), "served_model_name": "tiny-vlm", "device": "cpu"}])
    server.wait_ready()
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    url = data_url(IMAGE.read_bytes())
    content: Any = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "t5 t6 t7"}]
    reply = client.chat.completions.create(
        model="tiny-vlm",
        messages=[{"role": "user", "content": content}],
        max_tokens=len(CHAT["generated"]),
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    engine = lmplex.Engine(lmplex.ModelConfig(str(vlm), device="cpu"))
    assert reply.choices[0].message.content == engine.detokenize(CHAT["generated"])
    assert reply.usage is not None and reply.usage.prompt_tokens == len(CHAT["prompt_ids"])
    bad = [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "tiny-vlm", "messages": [{"role": "user", "content": bad}]},
    )
    assert r.status_code == 400 and "only data: URLs" in r.json()["error"]["message"], r.text
    raw = IMAGE.read_bytes()
    broken = [{"type": "image_url", "image_url": {"url": data_url(raw[: len(raw) // 2])}}]
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "tiny-vlm", "messages": [{"role": "user", "content": broken}]},
    )
    assert r.status_code == 400 and "image 0" in r.json()["error"]["message"], r.text
    garbled = [{"type": "image_url", "image_url": {"url": url[: len(url) // 2 + 1]}}]
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "tiny-vlm", "messages": [{"role": "user", "content": garbled}]},
    )
    assert r.status_code == 400 and "base64 is invalid" in r.json()["error"]["message"], r.text

    # The Responses API's input_image, and Anthropic's base64 image block: the same tokens.
    want = engine.detokenize(CHAT["generated"])
    parts: Any = [{"type": "input_image", "image_url": url}, {"type": "input_text", "text": "t5 t6 t7"}]
    response: Any = client.responses.create(
        model="tiny-vlm",
        input=[{"role": "user", "content": parts}],
        max_output_tokens=len(CHAT["generated"]),
        temperature=0,
    )
    assert response.output_text == want
    claude = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    b64 = base64.b64encode(IMAGE.read_bytes()).decode()
    block: Any = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}
    # The reply never reaches EOS (id 2) in these tokens, so no ignore_eos is needed here.
    assert 2 not in CHAT["generated"]
    message = claude.messages.create(
        model="tiny-vlm",
        max_tokens=len(CHAT["generated"]),
        messages=[{"role": "user", "content": [block, {"type": "text", "text": "t5 t6 t7"}]}],
        extra_body={"temperature": 0},
    )
    assert message.content[0].type == "text" and message.content[0].text == want
    with pytest.raises(anthropic.BadRequestError, match="not fetched"):
        url_block: Any = {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}
        claude.messages.create(
            model="tiny-vlm", max_tokens=4, messages=[{"role": "user", "content": [url_block]}]
        )
    assert server.stop() == 0, "".join(server.log)


# Image URLs fetched by the server (allowed_media_domains), from a loopback host serving the test PNG.
MAX_IMAGE_BYTES = 32 << 20  # lmplex_image::ImageLimits::default().max_bytes


class _ImageHost(http.server.BaseHTTPRequestHandler):
    """``/cat.png``: the test image; ``/counted.png``: the same, its requests counted in ``hits``;
    ``/missing.png``: 404; ``/big.png``: one byte past the cap, with no length (streamed until the client
    hangs up); ``/slow.png``: the image after 3 s; ``/hop``: a redirect to ``/cat.png``; ``/away``: a
    redirect to ``localhost``, a host not listed."""

    hits = 0
    lock = threading.Lock()

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path == "/counted.png":
            with _ImageHost.lock:
                _ImageHost.hits += 1
        port = self.headers.get("Host", "").rsplit(":", 1)[-1]
        if path in ("/hop", "/away"):
            host = "127.0.0.1" if path == "/hop" else "localhost"
            self.send_response(302)
            self.send_header("Location", f"http://{host}:{port}/cat.png?token=sekrit")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path in ("/cat.png", "/slow.png", "/counted.png"):
            if path == "/slow.png":
                time.sleep(3)
            raw = IMAGE.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
        elif path == "/big.png":
            self.send_response(200)
            self.end_headers()
            chunk = b"\0" * (1 << 20)
            try:
                for _ in range(MAX_IMAGE_BYTES // len(chunk)):
                    self.wfile.write(chunk)
                self.wfile.write(b"\0")
            except OSError:
                pass  # the server stopped reading past the cap and hung up
        else:
            self.send_error(404)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def image_host() -> Iterator[str]:
    host = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ImageHost)
    host.daemon_threads = True
    threading.Thread(target=host.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{host.server_address[1]}"
    host.shutdown()
    host.server_close()


def test_image_urls_of_listed_hosts_are_fetched(vlm: Path, tmp_path: Path, image_host: str) -> None:
    model: dict[str, object] = {"model_id": str(vlm), "served_model_name": "tiny-vlm", "device": "cpu"}
    server = Server(tmp_path, [model], allowed_media_domains=["127.0.0.1"], media_fetch_timeout_s=1.0)
    server.wait_ready()
    want = lmplex.Engine(lmplex.ModelConfig(str(vlm), device="cpu")).detokenize(CHAT["generated"])
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    url = f"{image_host}/cat.png?token=sekrit"

    def chat(image_url: str) -> Any:
        content: Any = [
            {"type": "image_url", "image_url": {"url": image_url}},
            {"type": "text", "text": "t5 t6 t7"},
        ]
        return client.chat.completions.create(
            model="tiny-vlm",
            messages=[{"role": "user", "content": content}],
            max_tokens=len(CHAT["generated"]),
            temperature=0,
        )

    # The same tokens as the data: URL's, through chat, a redirect on the listed host, Responses and Anthropic.
    for reply in (chat(data_url(IMAGE.read_bytes())), chat(url), chat(f"{image_host}/hop")):
        assert reply.choices[0].message.content == want
        assert reply.usage is not None and reply.usage.prompt_tokens == len(CHAT["prompt_ids"])
    parts: Any = [{"type": "input_image", "image_url": url}, {"type": "input_text", "text": "t5 t6 t7"}]
    response: Any = client.responses.create(
        model="tiny-vlm",
        input=[{"role": "user", "content": parts}],
        max_output_tokens=len(CHAT["generated"]),
        temperature=0,
    )
    assert response.output_text == want
    claude = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    block: Any = {"type": "image", "source": {"type": "url", "url": url}}
    message = claude.messages.create(
        model="tiny-vlm",
        max_tokens=len(CHAT["generated"]),
        messages=[{"role": "user", "content": [block, {"type": "text", "text": "t5 t6 t7"}]}],
        extra_body={"temperature": 0},
    )
    assert message.content[0].type == "text" and message.content[0].text == want

    # Each refusal is a 400 naming the host and the reason, in time.
    port = image_host.rsplit(":", 1)[1]
    for image_url, reason in [
        (f"http://localhost:{port}/cat.png?token=sekrit", "'localhost' is not in allowed_media_domains"),
        (f"{image_host}/missing.png?token=sekrit", "HTTP 404 Not Found"),
        (f"{image_host}/big.png?token=sekrit", f"larger than {MAX_IMAGE_BYTES} bytes"),
        (f"{image_host}/slow.png?token=sekrit", "longer than 1 s (media_fetch_timeout_s)"),
        (
            f"{image_host}/away?token=sekrit",
            "redirects to 'localhost', which is not in allowed_media_domains",
        ),
    ]:
        start = time.monotonic()
        with pytest.raises(openai.BadRequestError) as err:
            chat(image_url)
        assert reason in err.value.message and "sekrit" not in err.value.message, err.value.message
        assert time.monotonic() - start < 2.5, f"{reason}: {time.monotonic() - start:.1f} s"
    with pytest.raises(anthropic.BadRequestError, match="not in allowed_media_domains"):
        unlisted: Any = {
            "type": "image",
            "source": {"type": "url", "url": f"http://localhost:{port}/cat.png"},
        }
        claude.messages.create(
            model="tiny-vlm", max_tokens=4, messages=[{"role": "user", "content": [unlisted]}]
        )
    r = httpx.post(
        f"{server.url}/v1/responses",
        json={
            "model": "tiny-vlm",
            "input": [{"role": "user", "content": [{**parts[0], "image_url": f"{image_host}/nope"}]}],
        },
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "input" and "404" in r.text, r.text
    assert server.stop() == 0, "".join(server.log)
    assert "sekrit" not in "".join(server.log), "the logs show a URL's query"


def test_image_urls_are_fetched_only_for_an_authorized_call(
    vlm: Path, tmp_path: Path, image_host: str
) -> None:
    model: dict[str, object] = {
        "model_id": str(vlm),
        "served_model_name": "tiny-vlm",
        "device": "cpu",
        "limit_mm_per_prompt": {"image": 1},
    }
    once = {"name": "once", "api_key": "sk-once", "requests_per_minute": 1}
    server = Server(
        tmp_path, [model], tenants=[once], api_keys=["sk-admin"], allowed_media_domains=["127.0.0.1"]
    )
    server.wait_ready()
    start = _ImageHost.hits
    image: Any = {"type": "image_url", "image_url": {"url": f"{image_host}/counted.png?token=sekrit"}}
    inline: Any = {"type": "image_url", "image_url": {"url": data_url(IMAGE.read_bytes())}}
    text = {"type": "text", "text": "t5 t6 t7"}

    def post(path: str, key: str | None, content: list[Any], **body: object) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        messages = [{"role": "user", "content": content}]
        json_body = {"model": "tiny-vlm", "messages": messages, **body}
        return httpx.post(f"{server.url}{path}", headers=headers, json=json_body, timeout=60)

    # Refused callers, more URLs than limit_mm_per_prompt.image, and counting fetch nothing.
    assert post("/v1/chat/completions", None, [image, text], max_tokens=1).status_code == 401
    assert post("/v1/chat/completions", "sk-wrong", [image, text], max_tokens=1).status_code == 401
    r = post("/v1/chat/completions", "sk-admin", [image, image, text], max_tokens=1)
    assert (
        r.status_code == 400
        and "more than 1, the limit_mm_per_prompt.image of the model 'tiny-vlm'" in r.text
    )
    counted = post("/tokenize", "sk-admin", [image, text])
    assert counted.status_code == 200, counted.text
    assert counted.json()["tokens"] == post("/tokenize", "sk-admin", [inline, text]).json()["tokens"]
    assert _ImageHost.hits == start
    # An authorized call fetches its image once; the next, past the tenant's quota, does not.
    r = post("/v1/chat/completions", "sk-once", [image, text], max_tokens=1)
    assert r.status_code == 200 and _ImageHost.hits == start + 1, r.text
    r = post("/v1/chat/completions", "sk-once", [image, text], max_tokens=1)
    assert r.status_code == 429 and _ImageHost.hits == start + 1, r.text
    assert server.stop() == 0, "".join(server.log)
    assert "sekrit" not in "".join(server.log), "the logs show a URL's query"


def test_serve_flag_lists_the_media_hosts(vlm: Path, tmp_path: Path) -> None:
    import argparse

    from lmplex import serve

    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers())
    # One value per use (a host or a comma-separated list): MODEL after the flag stays a model.
    flags = ["serve", "--allowed-media-domains", "images.example.com", str(vlm)]
    args = parser.parse_args([*flags, "--allowed-media-domains", "127.0.0.1, localhost"])
    assert args.model == [str(vlm)]
    lines = serve.config_toml(args).splitlines()
    assert lines[0] == 'allowed_media_domains = ["images.example.com", "127.0.0.1", "localhost"]', lines
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", str(vlm), "--allowed-media-domains", ","])
    # With --config the media flags replace the file's keys; the rest of the file is kept.
    config = tmp_path / "serve.toml"
    text = 'port = 0\nallowed_media_domains = [\n  "old.example",\n]\nmedia_fetch_timeout_s = 9\n'
    config.write_text(text + "[[models]]\nmodel_id = 'x'\n")
    assert serve.config_toml(parser.parse_args(["serve", "--config", str(config)])) == config.read_text()
    media = ["--allowed-media-domains", "a.example", "--max-concurrent-media-fetches", "4"]
    merged = serve.config_toml(parser.parse_args(["serve", "--config", str(config), *media])).splitlines()
    assert merged == [
        'allowed_media_domains = ["a.example"]',
        "max_concurrent_media_fetches = 4",
        "port = 0",
        "# allowed_media_domains = [",
        '#   "old.example",',
        "# ]",
        "media_fetch_timeout_s = 9",
        "[[models]]",
        "model_id = 'x'",
    ], merged


def test_limit_mm_per_prompt_bounds_a_prompts_images(vlm: Path) -> None:
    config = lmplex.ModelConfig(str(vlm), device="cpu", limit_mm_per_prompt={"image": 1})
    assert config.limit_mm_per_prompt == {"image": 1}
    assert lmplex.ModelConfig(str(vlm)).limit_mm_per_prompt == {"image": 8}
    with pytest.raises(TypeError, match="video"):  # an unknown modality, as an unknown field
        lmplex.ModelConfig(str(vlm), limit_mm_per_prompt={"video": 1})
    engine = lmplex.Engine(config)
    two = [{"type": "image", "image": IMAGE.read_bytes()}] * 2
    with pytest.raises(InvalidRequest, match=r"at most 1 images \(limit_mm_per_prompt\), got 2"):
        engine.generate([[{"role": "user", "content": two}]], greedy())
    (out,) = engine.generate([turn(IMAGE)], greedy())
    assert out.token_ids == CHAT["generated"]
    # The serve flag writes the field.
    import argparse

    from lmplex import serve

    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers())
    import tomllib

    toml = serve.config_toml(parser.parse_args(["serve", str(vlm), "--limit-mm-per-prompt", '{"image": 2}']))
    assert tomllib.loads(toml)["models"][0]["limit_mm_per_prompt"] == {"image": 2}, toml
