# One call (fortieth session): x19f, every piece warp's T = 1 stamps (x19 plus a per-warp dump with the block's SM:
# bench/experiments/x19f-per-warp-dump-on-d0d7287.patch, x19-t1-first-piece-on-44abfde.patch and the dump in one),
# then the protocol with torch (bench/protocol-call.sh) on what is left of END_S. The question x19f answers
# (docs/gemm.md, "Where this plan stands after the thirty-ninth session"): which warps end deepseek-v3 T = 1's GEMM1
# last, 11.6 us past its median warp on the H200; predicted: the third warps of a scheduler (96 SMs run 9 pieces).
# Carry: VARIANT_BUILDS="x19:<x19f tree>/build" bash scripts/pack_carry.sh build. Run as SHA=<sha> END_S=560 bash
# <this> (carry [".carry"]; needs_h200: deepseek-v3's 8-layer stack does not fit an H100).
set -u
for b in .carry/*.tar.xz; do tar xJf $b -C .carry; done
export LD_LIBRARY_PATH=$PWD/.carry
W=$OUT/x19f; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
for preset in deepseek-v3 qwen3-235b qwen3-30b; do
  timeout 60 env NVFP4MOE_X19_REPLAYS=16 NVFP4MOE_X19_DUMP=$W/x19f-warps.txt .carry/x19/nvfp4moe bench \
    --preset $preset --tokens 1 --mode w4a16 > $W/x19-$preset-t1.log 2>&1
  echo "x19f $preset T=1: exit $? [$SECONDS s]"
done
grep -h "X19" $W/x19-*.log > $W/x19f.txt
grep -hE "X19 (qwen|deep)|ws_gemm1 +#0 P(1|4|5|7|8|14|15|16|17) " $W/x19f.txt
python3 bench/x19f_warp_tail.py $W/x19f-warps.txt > $W/x19f-tail.txt 2>&1; cat $W/x19f-tail.txt | head -60
xz -9 $W/x19f-warps.txt
tar czf $OUT/x19f.tgz -C $W . && rm -rf $W
[ "${PROTOCOL:-1}" = 0 ] && { echo "done (x19f only) [$SECONDS s]"; exit 0; }  # (PROTOCOL=0: x19f only)
budget=$(( ${END_S:-560} - SECONDS - 20 ))
echo "protocol budget ${budget}s"
SHA=${SHA:-unknown} BUDGET_S=$budget bash bench/protocol-call.sh
echo "done [$SECONDS s]"
