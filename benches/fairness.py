#!/usr/bin/env python3
"""Tenant fairness on a real model: ``lmplex.bench.fairness`` (its docstring says what is measured).

python benches/fairness.py            # SmolLM2-135M, about 7 minutes on 2 CPU cores
python benches/fairness.py --quick    # smoke test
"""

from lmplex.bench.fairness import main

if __name__ == "__main__":
    main()
