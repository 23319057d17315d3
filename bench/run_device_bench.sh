#!/usr/bin/env bash
# The whole benchmark of ../shared/docs/benchmarks.md in ONE device call, building nothing (the binary is
# carried): ceilings + torch bf16 baseline (bench/torch_baseline.py), then `nvfp4moe bench` over the presets
# and T in {1 .. 16384}, both modes, uniform routing (+ skewed for deepseek-v3 and qwen3-30b; torch skewed:
# qwen3-30b), each preset with its own time budget so that everything fits in ~9 minutes (points that would overrun are dropped and
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
  # torch_baseline.py writes its JSON only when it finishes: deepseek-v3 (the slow one) gets its own call, so a
  # timeout there cannot lose the other presets' rows or the ceilings.
  small=$(echo $PRESETS | tr ' ' '\n' | grep -v '^deepseek-v3$' | paste -sd, -)
  t=$(min "${TORCH_TIMEOUT:-80}" "$(( $(left) - 330 ))")
  if [ -n "$small" ] && [ "$t" -ge 20 ]; then
    log "torch baseline + ceilings: $small (timeout ${t}s)"
    timeout "$t" python3 bench/torch_baseline.py --out "$OUT/torch.json" --tokens "$TOKENS" --presets "$small" \
      2>&1 | tee "$OUT/torch.log"
  fi
  t=$(min "${TORCH_DS_TIMEOUT:-70}" "$(( $(left) - 300 ))")
  if echo " $PRESETS " | grep -q ' deepseek-v3 ' && [ "$t" -ge 20 ]; then
    log "torch baseline + ceilings: deepseek-v3 (timeout ${t}s)"
    timeout "$t" python3 bench/torch_baseline.py --out "$OUT/torch_deepseek.json" --tokens "$TOKENS" \
      --presets deepseek-v3 2>&1 | tee "$OUT/torch_deepseek.log"
  fi
  if [ ! -s "$OUT/torch.json" ] && [ ! -s "$OUT/torch_deepseek.json" ]; then
    log "no torch baseline finished: ceilings only"
    timeout 60 python3 bench/torch_baseline.py --ceilings-only --out "$OUT/torch_ceilings.json" 2>&1 | tee -a "$OUT/torch.log"
  fi
  t=$(min "${TORCH_SKEW_TIMEOUT:-35}" "$(( $(left) - 280 ))")
  if [ "$t" -ge 20 ]; then
    log "torch baseline, skewed subset: qwen3-30b (timeout ${t}s)"
    timeout "$t" python3 bench/torch_baseline.py --out "$OUT/torch_skewed.json" --presets qwen3-30b \
      --tokens 1,16,256,4096 --skewed 2>&1 | tee "$OUT/torch_skewed.log"
  fi
fi

# ---- 2. our layer, one driver invocation per preset (its own budget; a crash loses one preset only)
budget_of() {
  case $1 in
    deepseek-v3) echo 110 ;; qwen3-235b) echo 70 ;; qwen3-30b) echo 50 ;; gpt-oss-120b) echo 55 ;; *) echo 45 ;;
  esac
}
want_left=0
for p in $PRESETS; do want_left=$(( want_left + $(budget_of "$p") )); done
for p in $PRESETS; do
  routing=uniform
  case $p in deepseek-v3|qwen3-30b) routing=uniform,skewed ;; esac
  want=$(budget_of "$p")
  share=$(( want * ($(left) - 15) / want_left ))   # short of time: every preset still to come gets its share
  b=$(min "$want" "$share")
  want_left=$(( want_left - want ))
  if [ "$b" -lt 15 ]; then log "$p: skipped (no time left)"; echo "{\"preset\":\"$p\",\"skipped\":\"no time left\"}" > "$OUT/ours-$p.skipped.json"; continue; fi
  log "nvfp4moe bench --preset $p (budget ${b}s, routing $routing)"
  timeout $(( b + 60 )) "$BIN" bench --preset "$p" --tokens "$TOKENS" --mode w4a16,w4a4 --routing "$routing" \
    --layers 8 --iters "$ITERS" --time-budget "$b" --git-sha "$SHA" --json "$OUT/ours-$p.json" 2>&1 | tee "$OUT/ours-$p.log"
  log "$p: exit ${PIPESTATUS[0]}"
done

{ echo "== after"; nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv 2>&1; } >> "$OUT/gpu-info.txt"

# ---- 3. one JSON + summary table (+ plot if matplotlib is installed on this machine)
torch_args=()
for f in torch.json torch_deepseek.json torch_ceilings.json torch_skewed.json; do
  [ -s "$OUT/$f" ] && torch_args+=(--torch "$OUT/$f")
done
python3 bench/merge_results.py --ours "$OUT"/ours-*.json "${torch_args[@]}" --gpu-info "$OUT/gpu-info.txt" \
  --out "$OUT/bench-$SHA.json" --markdown "$OUT/summary-$SHA.md" 2>&1 | tee "$OUT/summary.txt"
python3 bench/plot_roofline.py "$OUT/bench-$SHA.json" --out "$OUT/roofline-$SHA.png" 2>&1 | tail -2 || true
log "done"
