#!/usr/bin/env python3
"""TierSet routing on two real models: ``lmplex.bench.routing`` (its docstring says what is measured).

python benches/routing.py            # SmolLM2-135M (fast) and Qwen2.5-Coder-0.5B (deep), about 4 minutes
python benches/routing.py --quick    # smoke test
"""

from lmplex.bench.routing import main

if __name__ == "__main__":
    main()
