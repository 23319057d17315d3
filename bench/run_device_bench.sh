#!/usr/bin/env bash
# The whole benchmark of ../shared/docs/benchmarks.md in ONE device call, building nothing (the binary is
# carried): ceilings + torch bf16 baseline (bench/torch_baseline.py), then `nvfp4moe bench` over the presets
# and T in {1 .. 16384}, both modes, uniform routing (+ skewed for deepseek-v3 and qwen3-30b), each preset
# with its own time budget so that everything fits in ~9 minutes (points that would overrun are dropped and
# recorded in the JSON), then bench/merge_results.py writes ONE JSON (ours + ceilings + baseline, ratios,
# efficiencies) and a summary table, and bench/plot_roofline.py the PNG when matplotlib is there.
#
#   NVFP4MOE_GIT_SHA=<sha> OUT=out bash bench/run_device_bench.sh
# Env: BIN (default build-bench/nvfp4moe; libgomp.so.1 next to it or in .carry/), TOTAL_BUDGET_S (540),
#      PRESETS (all five), TOKENS, SKIP_TORCH=1 (ours only), ITERS (50).
set -u -o pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
BIN=${BIN:-build-bench/nvfp4moe}
BINDIR=$(cd "$(dirname "$BIN")" && pwd)
export LD_LIBRARY_PATH=$BINDIR:$PWD/.carry:${LD_LIBRARY_PATH:-}
SHA=${NVFP4MOE_GIT_SHA:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export NVFP4MOE_GIT_SHA=$SHA
TOTAL=${TOTAL_BUDGET_S:-540}
TOKENS=${TOKENS:-1,4,16,64,256,1024,4096,16384}
ITERS=${ITERS:-50}
PRESETS=${PRESETS:-deepseek-v3 qwen3-235b qwen3-30b gpt-oss-120b nemotron-nano}
T0=$SECONDS
left() { echo $(( TOTAL - (SECONDS - T0) )); }
min() { [ "$1" -lt "$2" ] && echo "$1" || echo "$2"; }
log() { echo "[$(( SECONDS - T0 ))s] $*" | tee -a "$OUT/run.log"; }

log "git $SHA, binary $BIN, budget ${TOTAL}s"
{
  echo "== before"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.draw,temperature.gpu \
    --format=csv 2>&1
  nvidia-smi -q -d CLOCK 2>&1 | head -40
} > "$OUT/gpu-info.txt"
"$BIN" --version >> "$OUT/run.log" 2>&1 || { log "FATAL: $BIN does not run"; exit 1; }

# ---- 1. ceilings + torch bf16 baseline (same shapes; uniform routing for all presets, skewed for a subset)
if [ "${SKIP_TORCH:-0}" != 1 ]; then
  t=$(min "${TORCH_TIMEOUT:-130}" "$(( $(left) - 300 ))")
  log "torch baseline + ceilings (timeout ${t}s)"
  timeout "$t" python3 bench/torch_baseline.py --out "$OUT/torch.json" --tokens "$TOKENS" \
    --presets "$(echo $PRESETS | tr ' ' ',')" 2>&1 | tee "$OUT/torch.log"
  if [ ! -s "$OUT/torch.json" ]; then
    log "torch baseline did not finish: ceilings only"
    timeout 60 python3 bench/torch_baseline.py --ceilings-only --out "$OUT/torch.json" 2>&1 | tee -a "$OUT/torch.log"
  fi
  t=$(min "${TORCH_SKEW_TIMEOUT:-40}" "$(( $(left) - 280 ))")
  if [ "$t" -gt 10 ]; then
    log "torch baseline, skewed subset (timeout ${t}s)"
    timeout "$t" python3 bench/torch_baseline.py --out "$OUT/torch_skewed.json" --presets qwen3-30b,deepseek-v3 \
      --tokens 1,16,256,4096 --skewed 2>&1 | tee "$OUT/torch_skewed.log"
  fi
fi

# ---- 2. our layer, one driver invocation per preset (its own budget; a crash loses one preset only)
budget_of() {
  case $1 in
    deepseek-v3) echo 110 ;; qwen3-235b) echo 70 ;; qwen3-30b) echo 50 ;; gpt-oss-120b) echo 55 ;; *) echo 45 ;;
  esac
}
n_left=$(echo $PRESETS | wc -w)
for p in $PRESETS; do
  routing=uniform
  case $p in deepseek-v3|qwen3-30b) routing=uniform,skewed ;; esac
  want=$(budget_of "$p")
  share=$(( ($(left) - 15) / n_left ))   # never starve the presets still to come
  b=$(min "$want" "$share")
  n_left=$(( n_left - 1 ))
  if [ "$b" -lt 15 ]; then log "$p: skipped (no time left)"; echo "{\"preset\":\"$p\",\"skipped\":\"no time left\"}" > "$OUT/ours-$p.skipped.json"; continue; fi
  log "nvfp4moe bench --preset $p (budget ${b}s, routing $routing)"
  timeout $(( b + 60 )) "$BIN" bench --preset "$p" --tokens "$TOKENS" --mode w4a16,w4a4 --routing "$routing" \
    --layers 8 --iters "$ITERS" --time-budget "$b" --git-sha "$SHA" --json "$OUT/ours-$p.json" 2>&1 | tee "$OUT/ours-$p.log"
  log "$p: exit ${PIPESTATUS[0]}"
done

{ echo "== after"; nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv 2>&1; } >> "$OUT/gpu-info.txt"

# ---- 3. one JSON + summary table (+ plot if matplotlib is installed on this machine)
torch_args=()
[ -s "$OUT/torch.json" ] && torch_args+=(--torch "$OUT/torch.json")
[ -s "$OUT/torch_skewed.json" ] && torch_args+=(--torch "$OUT/torch_skewed.json")
python3 bench/merge_results.py --ours "$OUT"/ours-*.json "${torch_args[@]}" --gpu-info "$OUT/gpu-info.txt" \
  --out "$OUT/bench-$SHA.json" --markdown "$OUT/summary-$SHA.md" 2>&1 | tee "$OUT/summary.txt"
python3 bench/plot_roofline.py "$OUT/bench-$SHA.json" --out "$OUT/roofline-$SHA.png" 2>&1 | tail -2 || true
log "done"
