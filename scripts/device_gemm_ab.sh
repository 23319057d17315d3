#!/usr/bin/env bash
# ONE device call step: runs every carried bench/gemm_microbench.cu binary (.carry/mb/gemm_microbench_*,
# e.g. built with different -D variants, see the microbench's header) one after the other on the same GPU, in
# quick mode unless GEMM_MICROBENCH_QUICK= is set empty, writing $OUT/<sha>-mb-<variant>[-r<i>].{jsonl,log}.
#   NVFP4MOE_GIT_SHA=<sha> OUT=out bash scripts/device_gemm_ab.sh
set -u -o pipefail
OUT=${OUT:-out}
CARRY=${CARRY:-.carry}
SHA=${NVFP4MOE_GIT_SHA:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
mkdir -p "$OUT"
# cuBLAS (the microbench's bf16 ceiling) from the toolkit or from the wheel torch depends on.
CUBLAS_WHEEL=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$PWD/$CARRY:/usr/local/cuda/lib64:${CUBLAS_WHEEL:-}:${LD_LIBRARY_PATH:-}
export GEMM_MICROBENCH_QUICK=${GEMM_MICROBENCH_QUICK-1}
[ -z "$GEMM_MICROBENCH_QUICK" ] && unset GEMM_MICROBENCH_QUICK
# MB_DIR (default $CARRY/mb) holds the binaries. REPEAT=n runs the whole set n times, alternating the binaries (run-to-run drift of one point is ~4%, as
# large as the gains measured: compare a variant with the runs next to it).
for r in $(seq 1 "${REPEAT:-1}"); do
  for bin in "${MB_DIR:-$CARRY/mb}"/gemm_microbench_*; do
    v=${bin##*/gemm_microbench_}
    [ "${REPEAT:-1}" -gt 1 ] && v="$v-r$r"
    timeout 240 "$bin" "$OUT/$SHA-mb-$v.jsonl" > "$OUT/$SHA-mb-$v.log" 2>&1
    echo "mb $v: exit $?"
    cat "$OUT/$SHA-mb-$v.log"
  done
done
