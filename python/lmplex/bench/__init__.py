"""``lmplex bench``: lmplex and its peers on the same GGUF, prompts and token counts, in one run.

Modules: :mod:`.systems` (lmplex; peers llama.cpp, mistral.rs and transformers, each optional and
skipped with a reason), :mod:`.workloads` (batch-1 decode, prefill, offline throughput, online load),
:mod:`.hardware` (machine facts, measured memory bandwidth, decode roofline), :mod:`.plot` (PNGs),
:mod:`.cli` (the command). Results are JSON; nothing here asserts a speed.
"""
