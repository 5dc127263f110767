"""A process that used the async API exits cleanly.

pyo3-async-runtimes hands each result to asyncio from a tokio thread that may still be finishing
(holding Python objects) when the program reaches ``Py_FinalizeEx``; before lmplex's exit hook
about one such exit in ten aborted or segfaulted (PyO3/pyo3-async-runtimes#40). Each run here ends
right after a batch of concurrent ``agenerate`` calls, the pattern that crashed; every one must
exit with status 0.
"""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import asyncio, sys
import lmplex
from lmplex import ModelConfig, SamplingParams

engine = lmplex.Engine(ModelConfig(sys.argv[1], max_model_len=512))
params = SamplingParams(temperature=0.0, max_tokens=int(sys.argv[2]), ignore_eos=True)

async def main():
    return await asyncio.gather(*[engine.agenerate(["hello"], params) for _ in range(8)])

outs = asyncio.run(main())
assert all(len(o[0].token_ids) == int(sys.argv[2]) for o in outs)
"""


def test_exit_after_async_batches_is_clean(smollm2_path: str) -> None:
    codes = []
    for i in range(12):
        run = subprocess.run(
            [sys.executable, "-c", SCRIPT, smollm2_path, str(16 + 16 * (i % 4))],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        codes.append((run.returncode, run.stderr[-400:]))
    assert all(code == 0 for code, _ in codes), [c for c in codes if c[0] != 0]
