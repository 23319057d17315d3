#!/usr/bin/env bash
# Builds and installs the nvfp4moe Python package with `pip install .` into a virtual environment, then runs
# its pytest suite (python/tests). Exits with pytest's code; "no tests collected" (5) is a failure.
#
# When the main CMake build folder exists (build/, as scripts/test.sh configures it; NVFP4MOE_BUILD_DIR to
# change), the package is built in it, with its generator and options, so the library is compiled once for
# the C++ tests and the extension (only the _core target and what it links are built). Otherwise it builds in
# build-python/ (pyproject.toml's default). Environment: PYTHON (default python3), NVFP4MOE_VENV (default
# <build>/pyenv), PYTEST_ARGS (extra pytest arguments).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BUILD=${NVFP4MOE_BUILD_DIR:-build}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}

pip_args=(--no-build-isolation --disable-pip-version-check)
if [ -f "$BUILD/CMakeCache.txt" ]; then
  cached() { sed -n "s/^$1:[A-Z]*=//p" "$BUILD/CMakeCache.txt" | head -1; }
  export CMAKE_GENERATOR="$(cached CMAKE_GENERATOR)"
  pip_args+=(-C "build-dir=$BUILD")
  # Keep the folder's own settings, so scripts/test.sh's next configure sees what it set.
  for opt in NVFP4MOE_TESTS NVFP4MOE_CUDA; do
    v="$(cached $opt)"
    [ -n "$v" ] && pip_args+=(-C "cmake.define.$opt=$v")
  done
  VENV=${NVFP4MOE_VENV:-$BUILD/pyenv}
  [ -z "${NVFP4MOE_CLI:-}" ] && [ -x "$BUILD/nvfp4moe" ] && export NVFP4MOE_CLI="$PWD/$BUILD/nvfp4moe"
else
  VENV=${NVFP4MOE_VENV:-build-python/pyenv}
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# The pinned build requirements come from pyproject.toml ([build-system] requires), plus the test tools.
build_reqs=$("$VENV/bin/python" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')
mapfile -t reqs <<<"$build_reqs"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "${reqs[@]}" "pytest==8.3.5" "numpy==2.2.6"

start=$(date +%s)
log="$VENV/pip-install.log"
if ! "$VENV/bin/python" -m pip install -v "${pip_args[@]}" . >"$log" 2>&1; then
  tail -n 80 "$log"
  echo "test_python.sh: pip install . failed (full log: $log)" >&2
  exit 1
fi
echo "test_python.sh: pip install . took $(( $(date +%s) - start )) s ($(grep -m1 -o 'CUDA backend [A-Z]*' "$log" || echo 'CUDA backend ?'))"

rc=0
# Run outside the source tree's package folder so the installed package (with its extension) is imported.
"$VENV/bin/python" -m pytest -p no:cacheprovider -ra ${PYTEST_ARGS:-} python/tests || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test_python.sh: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
