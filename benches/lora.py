#!/usr/bin/env python3
"""LoRA adapters on one base: ``lmplex.bench.lora`` (its docstring says what is measured).

python benches/lora.py                     # Qwen2.5-Coder-0.5B, rank 16 on every projection
python benches/lora.py --quick --json      # smoke test
"""

from lmplex.bench.lora import main

if __name__ == "__main__":
    main()
