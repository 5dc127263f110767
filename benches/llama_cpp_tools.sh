#!/usr/bin/env bash
# Builds llama.cpp's `llama-perplexity` and `llama-quantize` from the llama.cpp inside the
# llama-cpp-python sdist (the same version `benches/setup_llama_cpp.sh` pins), for the quality
# table (`benches/quality.py`) and for checking `lmplex quantize` against `llama-quantize`.
# CPU only, tuned for this machine (GGML_NATIVE), no BLAS or network features. Needs a C/C++
# compiler and CMake (`pip install cmake`); about 6 minutes on 2 cores. Not part of CI.
#
#   benches/llama_cpp_tools.sh [DIR]      # default DIR: ~/.cache/lmplex/llama.cpp
#   # then: DIR/bin/llama-perplexity, DIR/bin/llama-quantize
set -euo pipefail
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
dir="${1:-$HOME/.cache/lmplex/llama.cpp}"
mkdir -p "$dir"
cd "$dir"
if [ ! -d "llama_cpp_python-$version" ]; then
    python3 -m pip download --no-deps --no-binary llama-cpp-python "llama-cpp-python==$version" -d .
    tar xzf "llama_cpp_python-$version.tar.gz"
fi
src="llama_cpp_python-$version/vendor/llama.cpp"
cmake -S "$src" -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DGGML_BLAS=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target llama-perplexity llama-quantize -j "$(nproc)"
mkdir -p bin
ln -sf "$PWD/build/bin/llama-perplexity" "$PWD/build/bin/llama-quantize" bin/
echo "llama.cpp tools ready in $dir/bin"
