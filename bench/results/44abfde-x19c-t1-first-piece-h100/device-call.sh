# Pending call (written in the thirty-fourth session, not yet run): experiment 19 with P12 / P13 before the first
# piece (bench/experiments/x19-t1-first-piece-on-44abfde.patch, the CLI built from it carried as .carry/x19/nvfp4moe)
# at T = 1, w4a16 and w4a4, beside the engine's unstamped CLI. Questions: (a) where in routing done (P8) -> range
# (P12) -> scales' loads issued (P13) -> first piece begun (P2) w4a4's piece warps lose the 0.55-0.65 us against
# w4a16 (bench/results/44abfde-x19-w4a4-t1-timeline-h100); (b) w4a4's P10 -> P11 undistorted (the idle warps'
# quantization against the piece warps' arrival at the barrier); (c) GEMM2's P1 (after its wait) -> P2 / P3 (first
# piece, its copies) -> P4 (first k-tile): what its first k-tile waits for 1.2-2 us. Build here (~4 min):
#   git worktree add /tmp/x19c <sha> && cd /tmp/x19c && git apply /work/main/bench/experiments/x19-t1-first-piece-on-44abfde.patch
#   cmake -S . -B build -DNVFP4MOE_TESTS=OFF -DNVFP4MOE_PYTHON=OFF -DCMAKE_BUILD_TYPE=Release
#   cmake --build build --target nvfp4moe_cli -j2
#   cd /work/main && cmake --build build && VARIANT_BUILDS="x19:/tmp/x19c/build" bash scripts/pack_carry.sh build
# then SHA=<sha> bash <this> (carry [".carry"], ~100 s).
for b in .carry/*.tar.xz; do tar xJf $b -C .carry; done
export LD_LIBRARY_PATH=$PWD/.carry
W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
for preset in qwen3-235b deepseek-v3 qwen3-30b; do
  timeout 100 env NVFP4MOE_X19_REPLAYS=16 .carry/x19/nvfp4moe bench --preset $preset --tokens 1 \
    --mode w4a16,w4a4 > $W/x19c-$preset-t1.log 2>&1
  echo "x19c $preset T=1: exit $? [$SECONDS s]"
  timeout 60 .carry/nvfp4moe bench --preset $preset --tokens 1 --mode w4a16,w4a4 > $W/base-$preset-t1.log 2>&1
  grep -E "us/layer" $W/base-$preset-t1.log
done
grep -h "X19" $W/x19c-*.log > $OUT/x19c.txt
grep -hE "X19 (qwen|deep)|ws_gemm1 +#0 P(2|3|4|5|7|8|10|11|12|13) |ws_gemm2 +#0 P(1|2|3|4|5|7) |combine +#0 P(1|7) " \
  $W/x19c-*.log
tar czf $OUT/logs.tgz -C $W .
