#!/usr/bin/env bash
# Installs the peers `lmplex bench` compares against into the current Python. Not part of CI.
#   - llama.cpp: llama-cpp-python built from source (benches/setup_llama_cpp.sh; several minutes
#     on 2 cores);
#   - mistral.rs: the `mistralrs` wheel (its CPU build, 26 MB);
#   - with --transformers: Hugging Face transformers on torch. PyPI's Linux torch is a CUDA build
#     with several GB of NVIDIA wheels; it runs on CPU as well. transformers reads the GGUF itself
#     (with the `gguf` and `accelerate` packages) and dequantizes it to f32.
#
#   benches/setup_peers.sh                 # llama.cpp and mistral.rs
#   benches/setup_peers.sh --transformers  # and transformers
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
"$here/setup_llama_cpp.sh"
python3 -m pip install --disable-pip-version-check "mistralrs==${MISTRALRS_VERSION:-0.9.5}"
if [[ "${1:-}" == "--transformers" ]]; then
    python3 -m pip install --disable-pip-version-check torch "transformers>=4.56" accelerate "gguf>=0.10"
fi
python3 -c "import mistralrs; print('mistralrs ready')"
