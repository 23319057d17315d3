#!/usr/bin/env bash
# Packs the binaries one device call needs into .carry/ (ignored by git), xz-compressed: the GPU test binaries
# and the CLI of build dir B (default build), optionally a second CLI as .carry/base/nvfp4moe (BASE_CLI=path),
# optionally whole A/B trees (VARIANT_BUILDS="x17:build-x17 ...": each one's CLI and, where built, its GEMM and
# layer test binaries as .carry/<name>/, for CARRY=.carry/<name> STEPS="gemm layer" scripts/device_gpu_suite.sh
# and an A/B variant name:.carry/<name>/nvfp4moe), and libgomp. scripts/device_bundle.sh unpacks it on the device.
# A gemm_microbench built in B (`cmake --build B --target gemm_microbench`) or in a variant tree is packed beside
# its CLI when present (.carry/gemm_microbench, .carry/<name>/gemm_microbench): GEMM-only A/Bs in the same call.
#   BASE_CLI=/tmp/old/nvfp4moe VARIANT_BUILDS="x17:build-x17" bash scripts/pack_carry.sh [build]
set -euo pipefail
B=${1:-build}
# A binary older than the library it links was not rebuilt (e.g. `--target nvfp4moe` builds the library, the CLI is
# nvfp4moe_cli): its A/B would measure the old code (the thirty-second session's first d814566 A/B did).
for bin in "$B/nvfp4moe" "$B"/tests/cuda_test_*; do
  if [ -f "$bin" ] && [ "$B/libnvfp4moe.a" -nt "$bin" ]; then
    echo "pack_carry: $bin is older than $B/libnvfp4moe.a: rebuild it (cmake --build $B)" >&2; exit 1
  fi
done
rm -rf .carry/stage && mkdir -p .carry/stage/base
cp "$B/nvfp4moe" .carry/stage/
[ -f "$B/gemm_microbench" ] && cp "$B/gemm_microbench" .carry/stage/
for t in cuda_test_cuda_layer cuda_test_sm90_grouped_gemm cuda_test_decode_route_kernels cuda_test_cuda_stress \
         ${EXTRA_TESTS:-}; do
  cp "$B/tests/$t" .carry/stage/
done
[ -n "${BASE_CLI:-}" ] && cp "$BASE_CLI" .carry/stage/base/nvfp4moe
for v in ${VARIANT_BUILDS:-}; do
  name=${v%%:*} dir=${v#*:}
  mkdir -p ".carry/stage/$name"
  # (a GEMM-only measurement build, e.g. gemm_microbench with an experiment hook built by hand, has no CLI)
  if [ -f "$dir/nvfp4moe" ]; then cp "$dir/nvfp4moe" ".carry/stage/$name/"; fi
  [ -f "$dir/gemm_microbench" ] && cp "$dir/gemm_microbench" ".carry/stage/$name/"
  # (a measurement tree built with -DNVFP4MOE_TESTS=OFF, e.g. bench/experiments' patches, has no test binaries)
  for t in cuda_test_cuda_layer cuda_test_sm90_grouped_gemm; do
    if [ -f "$dir/tests/$t" ]; then cp "$dir/tests/$t" ".carry/stage/$name/"; fi
  done
done
cp /lib/x86_64-linux-gnu/libgomp.so.1 .carry/stage/ 2>/dev/null || cp "$(g++ -print-file-name=libgomp.so.1)" .carry/stage/
# One xz stream with a 64 MiB dictionary (-9, one thread): the CLIs and test binaries share most of their bytes
# (the same kernels in each), so the window deduplicates them: 8 binaries pack to 14 MB instead of 40 MB at -6,
# which keeps the tracked tree (~41 MB) plus .carry under the device call's 64 MiB.
rm -f .carry/bins.tar.xz
tar cf - -C .carry/stage . | xz -T1 -9 > .carry/bins.tar.xz
rm -rf .carry/stage
ls -la .carry/bins.tar.xz
