"""The load of the fairness bench (:mod:`lmplex.bench.fairness`): where its requests run (one engine or,
with ``--cross-model``, two models of one host), its prompts, and a tenant's requests kept in flight.

Every prompt starts with its own token, so no request finds another's prompt in the prefix cache.
"""

from __future__ import annotations

import argparse
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import lmplex
from lmplex._core import ModelConfig, SamplingParams, StreamIterator, Tenant

FILLER = " ".join(["rivers", "the moon", "bread", "volcanoes", "owls", "glass", "trains", "salt"] * 60)
FIRST_TOKENS = range(1000, 21000)  # each prompt's own first token: no two share a cached block

Start = Callable[[list[int], SamplingParams, str], StreamIterator]
"""Starts streaming a prompt of a tenant: ``start(ids, params, tenant)``."""


class Prompts:
    """Prompts of a given length: a token no other prompt starts with, then filler text."""

    def __init__(self, filler: list[int]) -> None:
        self.filler, self.numbers = filler, itertools.count()

    def __call__(self, length: int) -> list[int]:
        ids = [FIRST_TOKENS[next(self.numbers) % len(FIRST_TOKENS)], *self.filler[: length - 1]]
        assert len(ids) == length, "filler too short"
        return ids


class Models:
    """Where a run's requests go: one engine, or (``--cross-model``) a host of two models, one per
    tenant in ``places``, the checkpoint loaded once for each."""

    def __init__(
        self, args: argparse.Namespace, places: dict[str, str], tenants: list[Tenant], **kw: Any
    ) -> None:
        def config(name: str | None) -> ModelConfig:
            return ModelConfig(args.model, served_model_name=name, max_model_len=1024, **kw)

        self.host = self.engine = None
        if args.cross_model:
            self.host = lmplex.ModelHost([config(m) for m in dict.fromkeys(places.values())], tenants=tenants)
        else:
            self.engine = lmplex.Engine(config(None), tenants=tenants)
        self.places = places

    def start(self, tenant: str) -> Start:
        if self.host is not None:
            host, model = self.host, self.places[tenant]
            return lambda ids, params, t: host.stream(ids, params, model=model, tenant=t)
        engine = self.engine
        assert engine is not None
        return lambda ids, params, t: engine.stream(ids, params, tenant=t)

    def num_waiting(self) -> int | None:
        return self.engine.stats()["num_waiting"] if self.engine is not None else None


class Load:
    """``inflight`` threads that each keep one request of ``tenant`` in flight until :meth:`stop`,
    recording (arrival time, service) for every chunk with tokens."""

    def __init__(
        self,
        start: Start,
        prompts: Prompts,
        tenant: str,
        inflight: int,
        prompt_len: int,
        max_tokens: tuple[int, int],
    ) -> None:
        self.start, self.prompts, self.tenant = start, prompts, tenant
        self.prompt_len, self.max_tokens = prompt_len, max_tokens
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.active: dict[int, StreamIterator] = {}
        self.events: list[tuple[float, int, int]] = []  # (arrival, service, generated tokens)
        self.errors: list[BaseException] = []
        self.started = self.finished = 0  # requests with a first token, requests read to the end
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(inflight)]
        for t in self.threads:
            t.start()

    def _run(self, index: int) -> None:
        lo, hi = self.max_tokens
        for k in itertools.count(index):
            if self.stopping.is_set():
                return
            ids = self.prompts(self.prompt_len)
            params = SamplingParams(temperature=0.0, max_tokens=lo + k * 37 % (hi - lo + 1), ignore_eos=True)
            stream = self.start(ids, params, self.tenant)
            with self.lock:
                self.active[stream.request_id] = stream
            try:
                first = True
                for chunk in stream:
                    if chunk.token_ids:
                        service = 2 * len(chunk.token_ids) + (len(ids) if first else 0)
                        self.events.append((time.perf_counter(), service, len(chunk.token_ids)))
                        with self.lock:
                            self.started += int(first)
                        first = False
                    if chunk.finish_reason is not None:
                        with self.lock:
                            self.finished += 1
                    if self.stopping.is_set():
                        break
            except lmplex.LmplexError as e:  # an abort from stop() may end a stream with an error
                if not self.stopping.is_set():
                    self.errors.append(e)
                    return
            finally:
                stream.close()
                with self.lock:
                    self.active.pop(stream.request_id, None)

    def wait_for(self, started: int = 0, finished: int = 0) -> None:
        """Blocks until this many requests have started (first token) and finished."""
        deadline = time.perf_counter() + 300
        while self.started < started or self.finished < finished:
            if self.errors:
                raise self.errors[0]
            assert time.perf_counter() < deadline, f"{self.tenant}: the load never got that far"
            time.sleep(0.05)

    def service(self, t0: float, t1: float) -> int:
        return sum(s for t, s, _ in self.events if t0 <= t < t1)

    def tokens_per_s(self, t0: float, t1: float) -> float:
        """Generated tokens a second that arrived between ``t0`` and ``t1``."""
        return sum(n for t, _, n in self.events if t0 <= t < t1) / (t1 - t0)

    def stop(self) -> None:
        """Aborts every request in flight and joins the threads."""
        self.stopping.set()
        with self.lock:
            active = list(self.active.values())
        for stream in active:
            stream.close()  # safe while another thread iterates it
        for t in self.threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in self.threads), f"{self.tenant}: threads did not stop"
        if self.errors:
            raise self.errors[0]
