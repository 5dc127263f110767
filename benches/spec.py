#!/usr/bin/env python3
"""Speculative decoding against plain decoding: ``lmplex.bench.spec`` (its docstring says what is measured).

python benches/spec.py                      # Qwen2.5-Coder-0.5B, code editing and chat, batch 1 and 8
python benches/spec.py --quick --json       # smoke test
"""

from lmplex.bench.spec import main

if __name__ == "__main__":
    main()
