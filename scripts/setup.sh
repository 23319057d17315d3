#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build and test nvfp4moe (by package name only).
set -euo pipefail
need=()
for pkg in cmake g++ make nlohmann-json3-dev libcli11-dev libgtest-dev googletest libomp-dev clang libclang-rt-14-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi
# numpy for the independent numpy implementation of the layer (tests/independent) and the Python tests.
python3 -c 'import numpy' 2>/dev/null || python3 -m pip install -q --disable-pip-version-check numpy
# With the CUDA toolkit: cuobjdump and nvdisasm (NVIDIA's PyPI wheels) for the SASS check of the built kernels
# (scripts/sass_arrive_check.py), where the toolkit install lacks them. Optional: the check skips without them.
if command -v nvcc >/dev/null 2>&1 && ! command -v cuobjdump >/dev/null 2>&1; then
  python3 -c 'import sysconfig, os, sys; p = sysconfig.get_paths()["purelib"]; sys.exit(0 if any(os.path.exists(os.path.join(p, "nvidia", c, "bin", "cuobjdump")) for c in ("cu13", "cu12")) else 1)' 2>/dev/null ||
    python3 -m pip install -q --disable-pip-version-check nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm ||
    echo "setup: cuobjdump wheels not installed; the SASS check will be skipped"
fi
