#!/usr/bin/env bash
# On the H200 (device machine): build the Python extension with its CUDA backend against the image's own
# python3 (3.12, with torch), then run the GPU half of the pytest suite (python/tests -m gpu: torch CUDA
# tensors, the caller's stream, torch.cuda.graph, torch.compile, the T=1 call overhead) and the CPU half too.
# Logs and python.json under $OUT. Usage: OUT=out NVFP4MOE_GIT_SHA=<sha> bash scripts/device_python_gpu.sh
set -u -o pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
SHA=${NVFP4MOE_GIT_SHA:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
export NCCL_NVLS_ENABLE=0
t0=$SECONDS
python3 -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, torch.cuda.get_device_name())' \
  > "$OUT/python-env.log" 2>&1
# --target: the image's venv may be read-only; --no-build-isolation: nothing can be fetched there (the image
# has scikit-build-core and nanobind).
{ echo "build environment:"; env | grep -E '^(LDFLAGS|CFLAGS|CXXFLAGS|CPPFLAGS|CMAKE_[A-Z_]*|CC|CXX|CUDAHOSTCXX)=' || true
  python3 -m pip config list 2>/dev/null || true; } >> "$OUT/python-env.log"
# The image's compiler flags are not this project's (a -static-libstdc++ there gave an extension whose private
# libstdc++ copy clashed with the one numpy loads, and Checkpoint() crashed): build with the project's own.
unset LDFLAGS CFLAGS CXXFLAGS CPPFLAGS
rm -rf /tmp/nvfp4moe-site /tmp/nvfp4moe-pybuild
if ! python3 -m pip install -v --no-build-isolation --no-deps --disable-pip-version-check \
     -C build-dir=/tmp/nvfp4moe-pybuild --target /tmp/nvfp4moe-site . > "$OUT/pip-install.log" 2>&1; then
  tail -n 60 "$OUT/pip-install.log"; echo "device_python_gpu.sh: pip install failed"; exit 1
fi
ldd /tmp/nvfp4moe-site/nvfp4moe/_core*.so >> "$OUT/python-env.log" 2>&1
echo "pip install took $(( SECONDS - t0 )) s; $(grep -m1 -o 'CUDA backend [A-Z]*' "$OUT/pip-install.log")" | tee -a "$OUT/python-env.log"
export PYTHONPATH=/tmp/nvfp4moe-site
export NVFP4MOE_GPU_RESULTS="$OUT/$SHA-python-gpu.json"
# The CLI for the parity tests: carried in .carry/ (scripts/device_gpu_suite.sh) or build-bench/.
for d in .carry build-bench; do
  if [ -x "$d/nvfp4moe" ]; then export NVFP4MOE_CLI=$PWD/$d/nvfp4moe LD_LIBRARY_PATH=$PWD/$d:${LD_LIBRARY_PATH:-}; break; fi
done
cd /tmp && python3 -m pytest -p no:cacheprovider -ra -v --rootdir "$OLDPWD" "$OLDPWD/python/tests" \
  2>&1 | tee "$OUT/$SHA-python-pytest.log" | tail -n 40
exit "${PIPESTATUS[0]}"
