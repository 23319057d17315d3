# The SS kernel's call cut to a short device budget (~220 s; thirty-eighth session): what ss-first-call.sh does,
# in the order of what decides most: the SS bitwise test, the GEMM microbenchmark (bt128 / bt144 / both SS configs),
# Nsight Compute on the SS GEMM1 (its stalls, tensor pipe and shared-memory throughput), the GEMM suite, the layer
# with SS on both GEMMs against the CPU reference, then Nsight Compute on bt144's GEMM1 if time is left.
# Run as SHA=<sha> bash <this> (carry [".carry"] packed with gemm_microbench).
set -u
for b in .carry/*.tar.xz; do tar xJf $b -C .carry; done
export LD_LIBRARY_PATH=$PWD/.carry
W=$OUT/w; mkdir -p $W
END=${END_S:-200}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
timeout 40 .carry/cuda_test_sm90_grouped_gemm --gtest_filter='*SsBitIdentical*' > $W/gemm-ss.log 2>&1
echo "gemm SS test: exit $? [$SECONDS s]"; grep -E "^\[  (PASSED|FAILED) |Failure|differ" $W/gemm-ss.log | head -6
GEMM_MICROBENCH_ONLY=prefill GEMM_MICROBENCH_QUICK=1 timeout 60 .carry/gemm_microbench $W/mb.jsonl > $W/mb.log 2>&1
echo "microbench: exit $? [$SECONDS s]"; cat $W/mb.log
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
ncu_one() {  # name, kernel regex
  GEMM_MICROBENCH_ONLY=prefill GEMM_MICROBENCH_QUICK=1 timeout $(( END - SECONDS > 15 ? END - SECONDS : 15 )) \
    $NCU --clock-control none --kernel-name-base demangled --kernel-name "regex:$2" --launch-skip 2 --launch-count 1 \
    --set full --import-source no -f -o $W/ncu-$1 .carry/gemm_microbench $W/mb-ncu.jsonl > $W/ncu-$1.run.log 2>&1
  echo "ncu $1: exit $? [$SECONDS s]"
  $NCU -i $W/ncu-$1.ncu-rep --page details > $W/ncu-$1-details.txt 2>&1
  $NCU -i $W/ncu-$1.ncu-rep --page raw --csv > $W/ncu-$1-raw.csv 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Shared|Issue Slots Busy|Executed Ipc A|No Eligible" \
    $W/ncu-$1-details.txt | head -20
}
ncu_one ss "ss_grouped_gemm_kernel<4, 2, .*Epilogue.1>"
[ $(( END - SECONDS )) -gt 30 ] && { timeout $(( END - SECONDS )) .carry/cuda_test_sm90_grouped_gemm \
  --gtest_filter='-*SsBitIdentical*' > $W/gemm-all.log 2>&1; echo "gemm suite: exit $? [$SECONDS s]"; \
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]|UNSTABLE" $W/gemm-all.log | head -12; }
[ $(( END - SECONDS )) -gt 20 ] && { timeout $(( END - SECONDS )) env \
  NVFP4MOE_SM90_CONFIG=gemm1=bt288_s4_ss,gemm2=bt288_s4_ss .carry/cuda_test_cuda_layer \
  --gtest_filter='*LayerMatchesReferenceOverT*' > $W/layer-ss.log 2>&1; echo "layer with SS: exit $? [$SECONDS s]"; \
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $W/layer-ss.log | head -6; }
[ $(( END - SECONDS )) -gt 25 ] && ncu_one bt144 "kernel<144, 2, 8, .*Epilogue.1, 1, false, false>"
echo "done [$SECONDS s]"
rm -f $W/*.ncu-rep
tar czf $OUT/logs.tgz -C $W . && cp $W/mb.log $W/gpu.txt $OUT/ 2>/dev/null
