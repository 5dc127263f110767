#!/usr/bin/env bash
# Builds llama.cpp's Python bindings (llama-cpp-python) from source into the current Python, for
# `lmplex bench` to compare against. CPU only, tuned for this machine's SIMD (GGML_NATIVE), no BLAS,
# no network features. Needs a C/C++ compiler; pip fetches CMake and the build backend. Takes several
# minutes on 2 cores. Not part of CI.
#
#   benches/setup_llama_cpp.sh            # the pinned version below
#   LLAMA_CPP_PYTHON_VERSION=0.3.36 benches/setup_llama_cpp.sh
set -euo pipefail
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
export CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_BLAS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
python3 -m pip install --no-binary llama-cpp-python --no-cache-dir "llama-cpp-python==${version}"
python3 -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, 'ready')"
