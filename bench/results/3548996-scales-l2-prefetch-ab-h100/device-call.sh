# One call (thirty-third session): the quantizing GEMM1 prefetches its experts' activation scales into L2 at its
# start (experiment 19 saw the piece warps wait ~1-2.5 us for them after their row was in:
# bench/results/b654b86-x19-w4a4-t1-timeline-h100). Through scripts/device_bundle.sh: the A/B base (the CLI of
# 222e0ef, .carry/base/nvfp4moe) against new (this build), 2 repeats, then (EXTRA) the quantizing GEMM1's bitwise
# layer tests and w4a4's adversarial routing against the CPU reference, and the SASS of every quantizing
# warp-streaming kernel (WsRows 3 and 6) of both CLIs.
# Run as SHA=<sha> bash <this>; logs: $OUT/<sha>-logs.tgz, $OUT/<sha>-points.txt.
L=.carry/cuda_test_cuda_layer
EXTRA="export NVFP4MOE_TEST_DATA=$PWD/tests/data
timeout 100 $L --gtest_color=no --gtest_filter='*T1W4A4QuantizedRows*:*W4A4TokensQuantizedInGemm1*:Modes/ModeTest.AdversarialRouting/w4a4' > \$W/\$SHA-cuda-layer-w4a4.log 2>&1; echo \"layer exit \$?\"
grep -E '^\[ +(OK|FAILED|PASSED) ' \$W/\$SHA-cuda-layer-w4a4.log | tail -12
for v in base:.carry/base/nvfp4moe new:.carry/nvfp4moe; do
  cuobjdump -sass \${v#*:} | awk '/Function :/{keep = (\$0 ~ /WsRowsE3|WsRowsE6/)} keep' > \$W/sass-\${v%%:*}.txt
  echo \"sass \${v%%:*}: \$(grep -c 'Function :' \$W/sass-\${v%%:*}.txt) kernels\"
done" \
AB1_VARIANTS="base:.carry/base/nvfp4moe new:.carry/nvfp4moe" \
AB1_POINTS="qwen3-235b:1,4:w4a4 deepseek-v3:1:w4a4 qwen3-30b:1:w4a16,w4a4" AB1_REPEAT=2 POINT_TIMEOUT_S=60 \
DEADLINE_S=190 NVFP4MOE_GIT_SHA=${SHA:-unknown} OUT=$OUT bash scripts/device_bundle.sh
