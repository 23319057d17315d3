# One call on the final tree (kernels: d663ada's): (1) the protocol with torch (bench/protocol-call.sh), (2) x19's
# T = 1 stamps on the final tree (bench/experiments/x19-t1-first-piece-on-44abfde.patch applied to it, carried as
# .carry/x19/nvfp4moe) at deepseek-v3 and qwen3-235b w4a16: on an H200, whether the piece warps stream the same
# ~6 GB/s a scheduler as on the H100 (docs/gemm.md, "What the T = 1 k-loops' rate per scheduler says about the H200
# target"), (3) the layer tests of the kernels d663ada changed and the decode routing suite.
#   SHA=<sha> bash <this>   (carry [".carry"], packed with VARIANT_BUILDS="x19:<the x19 build>")
SHA=${SHA:-unknown}
SHA=$SHA BUDGET_S=260 bash bench/protocol-call.sh
mkdir -p $OUT/x19
for preset in deepseek-v3 qwen3-235b; do
  timeout 60 env NVFP4MOE_X19_REPLAYS=16 .carry/x19/nvfp4moe bench --preset $preset --tokens 1 --mode w4a16 \
    > $OUT/x19/x19-$preset-t1.log 2>&1
  echo "x19 $preset T=1: exit $? [$SECONDS s]"
done
grep -h "X19" $OUT/x19/x19-*.log > $OUT/x19.txt; rm -rf $OUT/x19
grep -hE "X19 (qwen|deep)|ws_gemm1 +#0 P(1|2|4|5|7|8) " $OUT/x19.txt
left=$(( 530 - SECONDS ))
EXTRA="export NVFP4MOE_TEST_DATA=$PWD/tests/data
timeout 170 .carry/cuda_test_cuda_layer --gtest_color=no --gtest_filter='*T1W4A4QuantizedRows*:*W4A4TokensQuantizedInGemm1*:*T1RouteInGemm*:*TokensRoutedInGemm1*:Modes/ModeTest.LayerMatchesReferenceOverT/w4a4:Modes/ModeTest.AdversarialRouting/w4a4:Modes/ModeTest.PresetDims/w4a4' > \$W/\$SHA-cuda-layer-subset.log 2>&1
echo \"layer exit \$?\"; grep -E '^\[  (PASSED|FAILED) |^\[  FAILED|^\[       OK' \$W/\$SHA-cuda-layer-subset.log
timeout 60 .carry/cuda_test_decode_route_kernels --gtest_color=no > \$W/\$SHA-decode-route.log 2>&1
echo \"decode-route exit \$?\"; grep -E '^\[  (PASSED|FAILED) ' \$W/\$SHA-decode-route.log" \
DEADLINE_S=$left NVFP4MOE_GIT_SHA=$SHA OUT=$OUT bash scripts/device_bundle.sh
ls -la $OUT
