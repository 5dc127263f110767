"""``LMLiteBlock``: a set of models served by N replicas, called like a function.

Each replica is one ``lmplex serve`` process hosting every model of the block (one process, one memory
budget, several models). The block talks to its replicas over their OpenAI API on localhost, sends each
call to the next ready replica (round-robin), and skips a replica that fails a call or its ``/ready``
check until it passes again.

What an instance leaves behind, and what :meth:`LMLiteBlock.gc` cleans: a registry file
``<runtime dir>/<block id>.json`` (owner pid, replica pids and URLs), the replicas' TOML config (every
:class:`ModelConfig` whole), logs and address files (each replica writes its URL there once it listens)
beside it, and the replica processes themselves. :meth:`delete` removes all of it; a block whose owner
process died without ``delete`` leaves it all, and ``gc`` terminates those replicas (only processes whose
command line names that block's config) and removes the files. The runtime dir is
``$LMPLEX_RUNTIME_DIR``, else ``<model cache>/../blocks``.

Tenants: with ``tenants=``, every replica serves them (``[[tenants]]`` in its TOML) and a call's
``tenant=`` is sent as that tenant's API key (one the block makes up when the tenant has none); calls
without a tenant use a key of the block's own, which the replicas map to the default tenant. The replicas
keep usage in one SQLite store beside the block's config (``<block id>.usage.sqlite``, removed with the
block), so every quota holds for the block as a whole, exactly, whichever replica answers; a call
refused (429) goes on to the next replica, and only when every replica refuses is it
:class:`RateLimited`, with the shortest ``Retry-After``.

Replica loss: a call whose replica dies or cuts the reply goes to the next replica with the same
``Idempotency-Key`` (one per call). With tenants the replicas share the key's record through their
usage store, so the call is answered once, and a key a dead replica held is free within seconds
(docs/server.md, "Retries"); without tenants each replica keeps its own.

Routing: with ``tiers=`` (a :class:`TierSet` of the block's served names), a call may name
``"lmplex:auto"`` or ``"tier:NAME"`` instead of a model, with ``route=`` a :class:`Route` (mode, tier,
budgets); each replica chooses the model from its own live state (docs/routing.md), and a budget no
model can meet is :class:`BudgetUnsatisfiable`.

Adapters: a model's ``lora_modules`` are served as models of their own, so ``block(model_id=ADAPTER,
...)`` runs the parent under that adapter; an adapter given as a Hub id is downloaded once, here, not
in every replica.

Invariants: ``ready`` is true only when every replica answers ``/ready`` (every model loaded and warmed
up); a call never goes to a replica marked down; nothing here downloads (aliases must be fetched); keys
are never logged or put in an error message.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from lmplex import models
from lmplex._core import (
    BudgetUnsatisfiable,
    CapacityError,
    InvalidRequest,
    LmplexError,
    ModelConfig,
    RateLimited,
    Route,
    SamplingParams,
    Tenant,
    TierSet,
)
from lmplex.gpus import GPUS, present_gpus
from lmplex.models import resolve, with_resolved_adapters
from lmplex.replicas import CLAIM_LAPSE_S, rate_limited, tenant_keys
from lmplex.server_toml import server_toml
from lmplex.structured import parse_reply, response_format

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["GPUS", "LMLiteBlock"]

Input = Union[str, Sequence[Mapping[str, str]], Sequence[str]]


def runtime_dir() -> Path:
    """Where blocks register themselves: ``$LMPLEX_RUNTIME_DIR``, else beside the model cache."""
    explicit = os.environ.get("LMPLEX_RUNTIME_DIR")
    return Path(explicit).expanduser() if explicit else models.cache_dir().parent / "blocks"


def _usage_files(config: Path) -> list[Path]:
    """The SQLite usage store ``lmplex serve --config`` keeps beside ``config`` (with its WAL files)."""
    db = config.with_suffix(".usage.sqlite")
    return [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class _Replica:
    def __init__(self, proc: subprocess.Popen[bytes], log: Path, address_file: Path) -> None:
        self.proc = proc
        self.log = log
        self.address_file = address_file
        self.url = ""
        self.down = False

    def wait_url(self, timeout: float) -> str:
        """The URL the replica wrote to its address file once listening (written whole, by rename)."""
        deadline = time.monotonic() + timeout
        while not self.address_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                text = self.log.read_text(errors="replace") if self.log.exists() else ""
                raise LmplexError(f"replica {self.proc.pid} did not start: {text.strip()[-2000:]}")
            time.sleep(0.05)
        self.url = self.address_file.read_text().strip()
        return self.url

    def check(self) -> bool:
        """``/ready`` answers 200; marks the replica up or down accordingly."""
        if self.proc.poll() is not None:
            self.down = True
            return False
        try:
            with urllib.request.urlopen(f"{self.url}/ready", timeout=5) as r:
                self.down = r.status != 200
        except (urllib.error.URLError, OSError):
            self.down = True
        return not self.down


class LMLiteBlock:
    """``models`` served by ``replicas`` processes; ``block(model_id=..., input=...)`` returns text."""

    def __init__(
        self,
        models: Sequence[ModelConfig],
        gpu: GPUS | None = None,
        replicas: int = 1,
        *,
        tenants: Sequence[Tenant] | None = None,
        tiers: TierSet | None = None,
        start_timeout: float = 300.0,
    ) -> None:
        if not models:
            raise InvalidRequest("an LMLiteBlock needs at least one ModelConfig")
        if replicas < 1:
            raise InvalidRequest(f"replicas must be at least 1, got {replicas}")
        ids = [m.served_model_name or m.model_id for m in models]
        ids += [name for m in models for name in m.lora_modules]
        if len(set(ids)) != len(ids):
            raise InvalidRequest(f"model and adapter names must be unique within a block: {ids}")
        if gpu is not None:
            present = present_gpus()
            if gpu.product_name not in present:
                raise InvalidRequest(
                    f"{gpu.name} ({gpu.product_name}, {gpu.memory_bytes >> 30} GiB) was asked for but this "
                    f"machine has {present or 'no NVIDIA GPU'}; use gpu=None for the CPU"
                )
            raise InvalidRequest(
                f"{gpu.name} is present, but the CUDA backend is not available in this build"
            )
        if tiers is not None:
            unknown = [m for m in tiers.models() if m not in ids]
            if unknown:
                raise InvalidRequest(
                    f"tiers name models that are not in this block: {unknown} (block: {ids})"
                )
        self.model_ids = ids
        self.tiers = tiers
        self.id = f"{os.getpid()}-{secrets.token_hex(4)}"
        self._dir = runtime_dir()
        self._dir.mkdir(parents=True, exist_ok=True)
        self._config = self._dir / f"{self.id}.toml"
        # Fails here, not in every replica; a Hub id (a model's or an adapter's) downloads once.
        models = [with_resolved_adapters(m) for m in models]
        for m in models:
            resolve(m.model_id, m.revision)
        self._keys, tenant_fields = tenant_keys(tenants or [], 1)  # one shared store: no split
        server: dict[str, object] = {"port": 0}
        if tenants:
            server["api_keys"] = [self._keys[None]]
        # Owner-only: with tenants it holds their keys.
        fd = os.open(self._config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(server_toml(models, tenant_fields, tiers, **server))
        self._replicas: list[_Replica] = []
        self._next = 0
        try:
            for i in range(replicas):
                log = self._dir / f"{self.id}.{i}.log"
                address = self._dir / f"{self.id}.{i}.url"
                with open(log, "wb") as err:
                    cmd = [sys.executable, "-m", "lmplex", "serve", "--config", str(self._config)]
                    cmd += ["--address-file", str(address)]
                    proc = subprocess.Popen(
                        cmd, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
                    )
                self._replicas.append(_Replica(proc, log, address))
            for r in self._replicas:
                r.wait_url(start_timeout)
            self._register()
        except BaseException:
            self.delete()
            raise

    def _register(self) -> None:
        record = {
            "owner_pid": os.getpid(),
            "config": str(self._config),
            "replicas": [
                {"pid": r.proc.pid, "url": r.url, "log": str(r.log), "address_file": str(r.address_file)}
                for r in self._replicas
            ],
        }
        (self._dir / f"{self.id}.json").write_text(json.dumps(record))

    @property
    def replicas(self) -> list[int]:
        """The replica processes' pids."""
        return [r.proc.pid for r in self._replicas]

    @property
    def urls(self) -> list[str]:
        """The replicas' base URLs (each an OpenAI-compatible ``lmplex serve``)."""
        return [r.url for r in self._replicas]

    @property
    def ready(self) -> bool:
        """True when every replica has loaded every model and run its warm-up step."""
        states = [r.check() for r in self._replicas]
        return bool(states) and all(states)

    def wait_ready(self, timeout: float = 300.0) -> None:
        """Waits until every replica is ready; :class:`LmplexError` if one exits or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while not self.ready:
            dead = [r for r in self._replicas if r.proc.poll() is not None]
            if dead:
                raise LmplexError(f"replica {dead[0].proc.pid} exited: {dead[0].log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise LmplexError(f"the block was not ready after {timeout} s")
            time.sleep(0.1)

    def _post(self, path: str, body: dict[str, Any], tenant: str | None = None) -> dict[str, Any]:
        """Sends to the next ready replica, moving on from any that fails or whose share of the tenant's
        quota refuses; all down is a CapacityError, all refusing a RateLimited."""
        headers = {"content-type": "application/json"}
        if self._keys:
            if tenant not in self._keys:
                names = sorted(k for k in self._keys if k is not None)
                raise InvalidRequest(f"tenant '{tenant}' is not one of this block's: {names}")
            headers["authorization"] = f"Bearer {self._keys[tenant]}"
        elif tenant is not None:
            raise InvalidRequest(f"tenant '{tenant}' was given but this block has no tenants")
        # One key for every attempt: a replica that sees it again does not run the call twice.
        headers["idempotency-key"] = secrets.token_hex(16)
        limited: list[RateLimited] = []
        n = len(self._replicas)
        # Each replica in turn from this call's own start (other threads' calls move `_next`).
        start, self._next = self._next, self._next + 1
        tries = 0
        settle_by = time.monotonic() + CLAIM_LAPSE_S
        while tries < n:
            r = self._replicas[(start + tries) % n]
            tries += 1
            if r.down and not r.check():
                continue
            req = urllib.request.Request(f"{r.url}{path}", data=json.dumps(body).encode(), headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=600) as resp:
                    out: dict[str, Any] = json.loads(resp.read())
                    return out
            except urllib.error.HTTPError as err:
                try:
                    error = json.loads(err.read() or b"{}").get("error", {})
                except (ValueError, OSError, http.client.HTTPException):
                    error = {}
                message = str(error.get("message", err))
                code = err.headers.get("x-lmplex-error-code") or error.get("code")
                if err.code == 409 and code == "request_in_progress":
                    if time.monotonic() < settle_by:
                        # A replica that died during an earlier attempt still holds the key until its
                        # claim lapses (seconds); then this replica runs the call.
                        time.sleep(1.0)
                        tries -= 1
                        continue
                    raise CapacityError(message) from None
                if err.code == 400 and error.get("code") == "budget_unsatisfiable":
                    raise BudgetUnsatisfiable(message) from None
                if err.code in (400, 404):
                    raise InvalidRequest(message) from None
                if err.code == 429 and error.get("code") in ("rate_limit_exceeded", "insufficient_quota"):
                    limited.append(rate_limited(message, error, err.headers.get("retry-after")))
                    continue
                if err.code != 503:
                    raise CapacityError(message) from None
                r.down = True
                settle_by = time.monotonic() + CLAIM_LAPSE_S
            except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError):
                # The replica died or cut its reply: the call moves on under the same key, and may
                # wait out the dead replica's claim on it.
                r.down = True
                settle_by = time.monotonic() + CLAIM_LAPSE_S
        if limited:
            raise min(limited, key=lambda e: float(e.retry_after))
        raise CapacityError(f"no replica of block {self.id} is ready")

    def __call__(
        self,
        model_id: str,
        input: Input,
        output: type | Mapping[str, Any] = str,
        params: SamplingParams | None = None,
        *,
        tenant: str | None = None,
        route: Route | None = None,
    ) -> Any:
        """Runs ``input`` on ``model_id``: a string is one user message, a list of message dicts is a
        conversation, a list of strings is a batch (one reply each). ``output=str`` returns the reply
        text; a JSON schema (dict) returns the parsed JSON value and a pydantic model class an instance,
        both decoded under the schema's constraint (:class:`StructuredOutputError` if the reply is cut
        short). ``tenant`` names one of the block's tenants (its quotas, share and cache apply);
        :class:`RateLimited` when its quota refuses the call on every replica. With the block's ``tiers``,
        ``model_id`` may be ``"lmplex:auto"`` or ``"tier:NAME"`` and ``route`` sets the mode and budgets
        (:class:`BudgetUnsatisfiable` when no model meets them); a named model is held to ``route``'s
        budgets too."""
        routed = model_id == "lmplex:auto" or model_id.startswith("tier:")
        if routed and self.tiers is None:
            raise InvalidRequest(f"'{model_id}' needs a block made with tiers=lmplex.TierSet(...)")
        if not routed and model_id not in self.model_ids:
            raise InvalidRequest(f"model '{model_id}' is not in this block: {self.model_ids}")
        p = params or SamplingParams()
        sampling: dict[str, Any] = {
            "max_tokens": p.max_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "seed": p.seed,
            "stop": list(p.stop),
        }
        fmt = response_format(output)
        if fmt is not None:
            sampling["response_format"] = fmt
        if route is not None:
            sampling["lmplex"] = route.to_dict()
        if isinstance(input, str):
            return self._chat(model_id, [{"role": "user", "content": input}], sampling, output, tenant)
        items = list(input)
        if items and all(isinstance(x, str) for x in items):
            return [
                self._chat(model_id, [{"role": "user", "content": str(x)}], sampling, output, tenant)
                for x in items
            ]
        if items and all(isinstance(x, Mapping) for x in items):
            messages = [dict(m) for m in items if isinstance(m, Mapping)]
            return self._chat(model_id, messages, sampling, output, tenant)
        raise InvalidRequest("input must be a string, a list of strings or a list of message dicts")

    def _chat(
        self,
        model_id: str,
        messages: list[dict[str, str]],
        sampling: dict[str, Any],
        output: object,
        tenant: str | None,
    ) -> Any:
        body = {"model": model_id, "messages": messages, **sampling}
        out = self._post("/v1/chat/completions", body, tenant)
        choice = out["choices"][0]
        return parse_reply(output, str(choice["message"]["content"]), str(choice["finish_reason"]))

    def delete(self) -> None:
        """Stops every replica and removes the block's files."""
        for r in self._replicas:
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGTERM)
        for r in self._replicas:
            try:
                r.proc.wait(30)
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait()
        files = [f for r in self._replicas for f in (r.log, r.address_file)]
        for f in [self._config, self._dir / f"{self.id}.json", *files, *_usage_files(self._config)]:
            f.unlink(missing_ok=True)
        self._replicas = []

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.delete()

    @staticmethod
    def gc() -> int:
        """Removes what blocks whose owner process died left behind; returns how many blocks."""
        removed = 0
        folder = runtime_dir()
        for record_path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                record = json.loads(record_path.read_text())
            except (OSError, ValueError):
                continue
            if _pid_alive(int(record.get("owner_pid", 0))):
                continue
            config = str(record.get("config", ""))
            for rep in record.get("replicas", []):
                pid = int(rep.get("pid", 0))
                if pid > 0 and config and config in _cmdline(pid):
                    os.kill(pid, signal.SIGKILL)
                for key in ("log", "address_file"):
                    if rep.get(key):
                        Path(str(rep[key])).unlink(missing_ok=True)
            if config:
                for f in [Path(config), *_usage_files(Path(config))]:
                    f.unlink(missing_ok=True)
            record_path.unlink(missing_ok=True)
            removed += 1
        return removed
