# Pending call (written in the thirty-fifth session, not yet run): x19's T = 1 stamps on an H200, to confirm or refute
# that the T = 1 piece warps stream ~6 GB/s per SM scheduler whatever the card's HBM (docs/gemm.md, "What the T = 1
# k-loops' rate per scheduler says about the H200 target"). On an H100 (19c and bench/results/0b9e747-h100-raw/
# x19-t1-final-tree.txt) a piece's first k-tile -> k-loop end took 46.75 us at deepseek-v3 (129 KB a warp, 2.2
# warps a scheduler) and 18.8 us at qwen3-235b (36.9 KB, 2.9 a scheduler). Predicted on an H200 if the bound is
# the schedulers: the same spans within ~5%; if it is the HBM: ~25-30% shorter (4.0-4.3 TB/s against 3.1).
# Only worth running on an H200 (an H100 repeats the files above). Build here (~3 min):
#   git worktree add /tmp/x19n <sha> && cd /tmp/x19n && git apply /work/main/bench/experiments/x19-t1-first-piece-on-44abfde.patch
#   cmake -S . -B build -DNVFP4MOE_TESTS=OFF -DNVFP4MOE_PYTHON=OFF -DCMAKE_BUILD_TYPE=Release
#   cmake --build build --target nvfp4moe_cli -j2
#   cd /work/main && cmake --build build && VARIANT_BUILDS="x19:/tmp/x19n/build" bash scripts/pack_carry.sh build
# then SHA=<sha> bash <this> (carry [".carry"], ~60 s).
for b in .carry/*.tar.xz; do tar xJf $b -C .carry; done
export LD_LIBRARY_PATH=$PWD/.carry
W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
for preset in deepseek-v3 qwen3-235b qwen3-30b; do
  timeout 60 env NVFP4MOE_X19_REPLAYS=16 .carry/x19/nvfp4moe bench --preset $preset --tokens 1 --mode w4a16 \
    > $W/x19-$preset-t1.log 2>&1
  echo "x19 $preset T=1: exit $? [$SECONDS s]"
  timeout 60 .carry/nvfp4moe bench --preset $preset --tokens 1 --mode w4a16 > $W/base-$preset-t1.log 2>&1
  grep -E "us/layer" $W/base-$preset-t1.log
done
grep -h "X19" $W/x19-*.log > $OUT/x19d.txt
grep -hE "X19 (qwen|deep)|ws_gemm1 +#0 P(1|2|4|5|7|8) |ws_gemm2 +#0 P(1|4|5|7) " $OUT/x19d.txt
tar czf $OUT/logs.tgz -C $W .
