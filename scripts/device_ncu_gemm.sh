#!/usr/bin/env bash
# ONE device call: Nsight Compute on the sm90 grouped GEMMs of whole layers (the carried CLI's `bench`), to see
# where the consumer warps stall and which pipes are busy. For each case it profiles GEMM1 and GEMM2 of one
# forward (kernel replay, clocks left alone) and writes the details page and the per-SASS-instruction source
# page (stall samples per instruction) as text next to the .ncu-rep.
#   NVFP4MOE_GIT_SHA=<sha> OUT=out bash scripts/device_ncu_gemm.sh
# Env: CARRY (.carry), NCU_CASES: "layer:<preset>:<T>[:<mode>]" (the CLI bench; mode w4a16 unless given) or
# "mb:<microbench case prefix>"
# (default "layer:deepseek-v3:1 mb:decode_T1_k8 mb:decode_rpe1"), NCU_MB (the microbench binary), NCU_SKIP
# (microbench launches to skip, default 8: the first config's warm-up; each config of a case runs 64 GEMM1
# launches then 64 GEMM2), NCU_LAYERS (the layer cases' --layers, default 8; the profile is one eager forward of
# layer 0, so 1 (which the bench accepts with --profile-eager since b152009) builds less where the stack
# would not fit or take long to build).
# Output: $OUT/<sha>-ncu.tgz (reports + text pages) and $OUT/<sha>-ncu-summary.txt.
set -u -o pipefail
OUT=${OUT:-out}
CARRY=${CARRY:-.carry}
SHA=${NVFP4MOE_GIT_SHA:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
CASES=${NCU_CASES:-layer:deepseek-v3:1 mb:decode_T1_k8 mb:decode_rpe1}
export LD_LIBRARY_PATH=$PWD/$CARRY:${LD_LIBRARY_PATH:-}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
D="$OUT/ncu"
mkdir -p "$D"
: > "$OUT/$SHA-ncu-summary.txt"
CUBLAS_WHEEL=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/usr/local/cuda/lib64:${CUBLAS_WHEEL:-}
for c in $CASES; do
  kind=${c%%:*} rest=${c#*:}
  if [ "$kind" = layer ]; then
    # One eager forward before the graph (bench --profile-eager: the layers' creation-time warm-up launches of
    # every config stay outside the profiled range): its GEMM1 + GEMM2 pair, caches as the forward left them.
    IFS=: read -r preset tokens mode <<< "$rest"
    mode=${mode:-w4a16}
    name="layer-$preset-t$tokens-$mode" skip=0 count=2
    range=(--profile-from-start off --cache-control none)
    cmd=("$CARRY/nvfp4moe" bench --preset "$preset" --tokens "$tokens" --mode "$mode" --iters 1 --warmup 1 --layers "${NCU_LAYERS:-8}"
         --profile-eager)
  else
    # bench/gemm_microbench.cu, one case (GEMM_MICROBENCH_ONLY), after its 8 warm-up launches.
    name="mb-$rest${NCU_SKIP:+-skip$NCU_SKIP}" skip=${NCU_SKIP:-8} count=1
    range=()
    cmd=(env GEMM_MICROBENCH_ONLY="$rest" GEMM_MICROBENCH_QUICK=1 "$CARRY/mb/${NCU_MB:-gemm_microbench_x0}" /dev/null)
  fi
  timeout 150 "$NCU" --clock-control none "${range[@]}" --kernel-name regex:sm90_nvfp4_grouped_gemm_kernel --launch-skip $skip \
    --launch-count $count --set full --import-source no -f -o "$D/$name" "${cmd[@]}" > "$D/$name.run.log" 2>&1
  echo "$name: ncu exit $?" >> "$OUT/$SHA-ncu-summary.txt"
  if [ -f "$D/$name.ncu-rep" ]; then
    "$NCU" --import "$D/$name.ncu-rep" --page details --print-units base > "$D/$name.details.txt" 2>&1
    "$NCU" --import "$D/$name.ncu-rep" --page source --print-source sass --csv > "$D/$name.source.csv" 2>&1
    grep -E "sm90_nvfp4|Duration|DRAM Throughput|Issue Slots Busy|Executed Ipc Active|No Eligible|Warp Cycles Per Issued|L2 Hit|Achieved Occupancy|Memory Throughput" \
      "$D/$name.details.txt" >> "$OUT/$SHA-ncu-summary.txt"
    # The raw counters behind the L2 -> SM traffic and the DRAM bytes (the SS-wgmma sketch's open question).
    "$NCU" --import "$D/$name.ncu-rep" --page raw --csv --print-units base > "$D/$name.raw.csv" 2>&1
    python3 - "$D/$name.raw.csv" >> "$OUT/$SHA-ncu-summary.txt" <<'PY' || true
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = next((r for r in rows if "Kernel Name" in r), None)
want = ["gpu__time_duration.sum", "lts__t_sectors_srcunit_tex_op_read.sum", "lts__t_bytes.sum",
        "l1tex__m_xbar2l1tex_read_bytes.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "smsp__inst_executed.sum",
        "sm__throughput.avg.pct_of_peak_sustained_elapsed", "lts__throughput.avg.pct_of_peak_sustained_elapsed"]
if hdr:
    idx = {m: hdr.index(m) for m in want if m in hdr}
    for r in rows[rows.index(hdr) + 1:]:
        if len(r) != len(hdr) or "sm90_nvfp4" not in r[hdr.index("Kernel Name")]:
            continue
        print("  raw", r[hdr.index("Kernel Name")][:60], " ".join(f"{m}={r[i]}" for m, i in idx.items()))
PY
  else
    tail -n 20 "$D/$name.run.log" >> "$OUT/$SHA-ncu-summary.txt"
  fi
done
( cd "$OUT" && tar czf "$SHA-ncu.tgz" ncu --remove-files ) || true
