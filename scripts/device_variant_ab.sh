#!/usr/bin/env bash
# ONE device call step: the whole-layer benchmark (`nvfp4moe bench`, the protocol: graph replay over 8 layers,
# median of 50) on several carried CLI builds of the same tree (A/B variants), alternating the builds point set
# by point set so that drift over the call hits every variant alike. Writes
# $OUT/<sha>-ab-<variant>-<preset>-t<tokens>-<modes>-r<i>.{json,log} and prints one line per point.
#   VARIANTS="base:.carry/nvfp4moe x6:.carry/x6/nvfp4moe" POINTS="qwen3-30b:1,4,64:w4a16,w4a4 deepseek-v3:1,64:w4a16" \
#   REPEAT=2 NVFP4MOE_GIT_SHA=<sha> OUT=out bash scripts/device_variant_ab.sh
# A variant may add environment settings after a second colon (several separated by ';'), e.g. one binary
# three times:
#   VARIANTS="wgmma:.carry/nvfp4moe sync:.carry/nvfp4moe:NVFP4MOE_SM90_CONFIG=mma=sync both:.carry/nvfp4moe:A=1;B=2"
# BENCH_ARGS: more `nvfp4moe bench` flags for every point (e.g. --shared-max-input-scale).
# Compare: python3 bench/merge_results.py --compare A.json B.json.
set -u -o pipefail
OUT=${OUT:-out}
SHA=${NVFP4MOE_GIT_SHA:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
: "${VARIANTS:?VARIANTS=\"name:path/to/nvfp4moe ...\"}"
: "${POINTS:?POINTS=\"preset:T,T,...:mode,mode ...\"}"
mkdir -p "$OUT"
for r in $(seq 1 "${REPEAT:-1}"); do
  for point in $POINTS; do
    IFS=: read -r preset tokens modes <<< "$point"
    for v in $VARIANTS; do
      IFS=: read -r name bin venv <<< "$v"
      # (the token list in the name: two points of one preset and modes, e.g. qwen3-235b:1 and qwen3-235b:4, wrote
      # the same files until the twenty-third session)
      base="$OUT/$SHA-ab-$name-$preset-t${tokens//,/_}-${modes//,/_}-r$r"
      IFS=';' read -r -a venvs <<< "$venv"
      # shellcheck disable=SC2086  # BENCH_ARGS: more bench flags, split on spaces (e.g. --shared-max-input-scale)
      timeout "${POINT_TIMEOUT_S:-120}" env "${venvs[@]}" "$bin" bench --preset "$preset" --tokens "$tokens" --mode "$modes" \
        ${BENCH_ARGS:-} --json "$base.json" > "$base.log" 2>&1
      echo "ab $name $preset r$r: exit $?"
      grep -E "us/layer" "$base.log" | sed "s/^/  $name /"
    done
  done
done
