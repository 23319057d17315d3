# One device call (thirty-ninth session): the token-major routed gather (GatherArgs::token_major) tested and measured
# against the expert-major one, then the SS kernel's profile (bench/experiments/ss-short-call.sh's steps) as time
# allows. In the order of what decides most:
#   1. the layer tests of the gather (bitwise token-major = expert-major, the reference over T, calibration);
#   2. the whole layer A/B (scripts/device_variant_ab.sh), em = expert-major at every T, tm = token-major from 1024;
#   3. the SS bitwise test and the GEMM microbenchmark (bt128 / bt144 / both SS configs at deepseek-v3 T = 4096),
#      also its experiment-1 build (the conversion left out, in bt144's consumers and SS's dequantizer);
#   4. per kernel (Nsight Compute, one eager forward, scripts/device_prefill_diag.sh) at deepseek-v3 T = 16384 w4a16,
#      expert-major and token-major: the gather's time and DRAM bytes;
#   5. Nsight Compute, full set, on the SS GEMM1; the layer with SS against the CPU reference; the GEMM suite;
#      Nsight Compute on bt144's GEMM1.
# Carry: cmake --build build --target gemm_microbench; the experiment-1 microbench by hand into build-x1/ (the
# command in bench/gemm_microbench.cu's header plus -DNVFP4MOE_SM90_DEQUANT_EXPERIMENT=1 -o build-x1/gemm_microbench);
# VARIANT_BUILDS="x1:build-x1" bash scripts/pack_carry.sh build. Run as SHA=<sha> END_S=540 bash <this>
# (carry [".carry"]). A short budget: GATHER_TESTS='*TokenMajorGather*' AB_POINTS=deepseek-v3:16384:w4a16,w4a4.
set -u
for b in .carry/*.tar.xz; do tar xJf $b -C .carry; done
export LD_LIBRARY_PATH=$PWD/.carry
W=$OUT/w; mkdir -p $W
END=${END_S:-540}
SHA=${SHA:-unknown}
EM="NVFP4MOE_GATHER_TOKEN_MAJOR_MIN_TOKENS=2147483647"  # expert-major at every T: the default
TM="NVFP4MOE_GATHER_TOKEN_MAJOR_MIN_TOKENS=1024"
left() { echo $(( END - SECONDS )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
timeout $(( END > 450 ? 150 : 90 )) .carry/cuda_test_cuda_layer \
  --gtest_filter="${GATHER_TESTS:-*TokenMajorGather*:*LayerMatchesReferenceOverT*:*Calibration*}" \
  > $W/layer-gather.log 2>&1
echo "layer gather tests: exit $? [$SECONDS s]"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure" $W/layer-gather.log | head -8
VARIANTS="em:.carry/nvfp4moe:$EM tm:.carry/nvfp4moe:$TM" POINTS="${AB_POINTS:-deepseek-v3:1024,4096,16384:w4a16,w4a4}" \
  REPEAT=${AB_REPEAT:-2} NVFP4MOE_GIT_SHA=$SHA OUT=$W/ab timeout $(( $(left) > 400 ? 200 : $(left) / 2 )) \
  bash scripts/device_variant_ab.sh | tee $W/ab.txt
echo "ab: [$SECONDS s]"
timeout 40 .carry/cuda_test_sm90_grouped_gemm --gtest_filter='*SsBitIdentical*' > $W/gemm-ss.log 2>&1
echo "gemm SS test: exit $? [$SECONDS s]"; grep -E "^\[  (PASSED|FAILED) |Failure|differ" $W/gemm-ss.log | head -6
GEMM_MICROBENCH_ONLY=prefill GEMM_MICROBENCH_QUICK=1 timeout 60 .carry/gemm_microbench $W/mb.jsonl > $W/mb.log 2>&1
echo "microbench: exit $? [$SECONDS s]"; cat $W/mb.log
# Experiment 1 (gemm_microbench built by hand with -DNVFP4MOE_SM90_DEQUANT_EXPERIMENT=1, carried as .carry/x1/):
# bt144 and SS with the conversion left out (wrong results, timing only): whether SS's dequantizer bounds it. Only
# SS's number is clean: in that build ptxas serializes the register-A tiles' wgmmas (C7511 for bt64 / bt128 / bt144),
# the SS kernels not.
[ -x .carry/x1/gemm_microbench ] && { GEMM_MICROBENCH_ONLY=prefill GEMM_MICROBENCH_QUICK=1 timeout 60 \
  .carry/x1/gemm_microbench $W/mb-x1.jsonl > $W/mb-x1.log 2>&1; echo "microbench x1: exit $? [$SECONDS s]"; \
  grep -E "prefill" $W/mb-x1.log | head -12; }
[ $(left) -gt 80 ] && { DIAG_CASES="deepseek-v3:16384:w4a16:uniform::$EM deepseek-v3:16384:w4a16:uniform::$TM" \
  OUT=$W/diag timeout $(( $(left) > 250 ? 150 : $(left) / 2 )) bash scripts/device_prefill_diag.sh; \
  echo "diag: exit $? [$SECONDS s]"; grep -E "ncu |gather|combine|total" $W/diag/diag-summary.txt | head -20; \
  pkill -9 -f 'ncu|\.carry/nvfp4moe' 2>/dev/null; sleep 2; }
# (timeout stops the diag script, not the profiled process it started: on 7888a8a's run that process kept the
# GPU's memory and every later step ran out of it; hence the pkill)
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
ncu_one() {  # name, kernel regex
  GEMM_MICROBENCH_ONLY=prefill GEMM_MICROBENCH_QUICK=1 timeout $(( $(left) > 15 ? $(left) : 15 )) \
    $NCU --clock-control none --kernel-name-base demangled --kernel-name "regex:$2" --launch-skip 2 --launch-count 1 \
    --set full --import-source no -f -o $W/ncu-$1 .carry/gemm_microbench $W/mb-ncu.jsonl > $W/ncu-$1.run.log 2>&1
  echo "ncu $1: exit $? [$SECONDS s]"
  $NCU -i $W/ncu-$1.ncu-rep --page details > $W/ncu-$1-details.txt 2>&1
  $NCU -i $W/ncu-$1.ncu-rep --page raw --csv > $W/ncu-$1-raw.csv 2>&1
  # Per SASS instruction stall samples: whether the consumers sit at the dequantized slot's full barrier (the
  # dequantizer's k-tile chain, docs/gemm.md "The SS kernel's dequantizer in SASS") or at their wgmma waits.
  $NCU -i $W/ncu-$1.ncu-rep --page source --print-source sass --csv > $W/ncu-$1-source.csv 2>&1
  python3 bench/ncu_stall_summary.py $W/ncu-$1-source.csv 2>&1 | head -30
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Shared|Issue Slots Busy|Executed Ipc A|No Eligible" \
    $W/ncu-$1-details.txt | head -20
}
[ $(left) -gt 40 ] && ncu_one ss "ss_grouped_gemm_kernel<4, 2, .*Epilogue.1>"
[ $(left) -gt 20 ] && { timeout $(left) env NVFP4MOE_SM90_CONFIG=gemm1=bt288_s4_ss,gemm2=bt288_s4_ss \
  .carry/cuda_test_cuda_layer --gtest_filter='*LayerMatchesReferenceOverT*' > $W/layer-ss.log 2>&1; \
  echo "layer with SS: exit $? [$SECONDS s]"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $W/layer-ss.log | head -6; }
[ $(left) -gt 40 ] && ncu_one bt144 "kernel<144, 2, 8, .*Epilogue.1, 1, false, false>"
[ $(left) -gt 30 ] && { timeout $(left) .carry/cuda_test_sm90_grouped_gemm --gtest_filter='-*SsBitIdentical*' \
  > $W/gemm-all.log 2>&1; echo "gemm suite: exit $? [$SECONDS s]"; \
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]|UNSTABLE" $W/gemm-all.log | head -12; }
echo "done [$SECONDS s]"
rm -f $W/*.ncu-rep
tar czf $OUT/logs.tgz -C $W . && cp $W/mb.log $W/gpu.txt $W/ab.txt $W/diag/diag-summary.txt $OUT/ 2>/dev/null
