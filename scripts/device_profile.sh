#!/usr/bin/env bash
# ONE device call: where one forward's time goes, per kernel (bench/profile_layer_kernels.py: CUPTI kernel
# times next to the CUDA-graph replay of one layer). Builds the Python package there (as
# scripts/device_python_gpu.sh does), generates a qwen3-30b layer and a deepseek-v3-shaped layer with 32
# experts (a full 256-expert layer takes minutes of CPU quantization in `gen`), profiles both modes.
#   NVFP4MOE_GIT_SHA=<sha> OUT=out bash scripts/device_profile.sh
# NVFP4MOE_PDL defaults to 0 here: with programmatic dependent launch a kernel starts while its predecessor
# drains, and CUPTI's kernel durations then include that wait and overlap (bench/results/0f13eff-profile-*).
# With PDL off the graph replay it also reports is the unoverlapped chain (a few us slower than the default at
# T = 1): compare the kernels with each other, and the benchmark (PDL on) for the layer's time.
# Output: $OUT/<sha>-profile-{q30,ds32}-{w4a16,w4a4}.{log,json}, packed with the build log into one archive.
set -u -o pipefail
OUT=${OUT:-out}
mkdir -p "$OUT/p"
SHA=${NVFP4MOE_GIT_SHA:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
CARRY=${CARRY:-.carry}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
export LD_LIBRARY_PATH=$PWD/$CARRY:${LD_LIBRARY_PATH:-}
unset LDFLAGS CFLAGS CXXFLAGS CPPFLAGS  # the image's flags are not the project's (see device_python_gpu.sh)
rm -rf /tmp/nvfp4moe-site /tmp/nvfp4moe-pybuild
if ! python3 -m pip install --no-build-isolation --no-deps --disable-pip-version-check \
     -C build-dir=/tmp/nvfp4moe-pybuild --target /tmp/nvfp4moe-site . > "$OUT/p/pip-install.log" 2>&1; then
  tail -n 40 "$OUT/p/pip-install.log"; echo "device_profile.sh: pip install failed"; exit 1
fi
export PYTHONPATH=/tmp/nvfp4moe-site
export NVFP4MOE_PDL=${NVFP4MOE_PDL:-0}
echo "NVFP4MOE_PDL=$NVFP4MOE_PDL"
"$CARRY/nvfp4moe" gen --preset qwen3-30b --layers 1 --out /tmp/prof-q30 > "$OUT/p/gen.log" 2>&1
"$CARRY/nvfp4moe" gen --preset deepseek-v3 --experts 32 --layers 1 --out /tmp/prof-ds32 >> "$OUT/p/gen.log" 2>&1
for mode in w4a16 w4a4; do
  for c in q30 ds32; do
    timeout 120 python3 bench/profile_layer_kernels.py --checkpoint /tmp/prof-$c --mode $mode --tokens 1,4,64 \
      --json "$OUT/p/$SHA-profile-$c-$mode.json" > "$OUT/p/$SHA-profile-$c-$mode.log" 2>&1
    echo "$c $mode: exit $?; $(head -1 "$OUT/p/$SHA-profile-$c-$mode.log")"
  done
done
( cd "$OUT" && tar czf "$SHA-profile.tgz" p --remove-files ) || true
