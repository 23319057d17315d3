#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (CPU suites run; GPU suites are skipped without a device),
# then the safetensors fuzzer for a bounded time. The README's second command.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"
# The Python package: `pip install .` (reusing build/) and its pytest suite (CPU backend without a GPU).
bash scripts/test_python.sh
if [ -f fuzz/CMakeLists.txt ]; then
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -DNVFP4MOE_FUZZ=ON -DNVFP4MOE_TESTS=OFF -DNVFP4MOE_CUDA=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build build-fuzz -j"$jobs" --target fuzz_safetensors
  bash fuzz/run.sh build-fuzz/fuzz/fuzz_safetensors "${NVFP4MOE_FUZZ_SECONDS:-60}"
fi
