# One H200 call (thirty-seventh session): x19d's T = 1 stamps (bench/results/x19d-t1-per-scheduler-call.sh: its
# question and predictions; ~60 s), then the protocol with torch (bench/protocol-call.sh) on what is left of the
# 600 s. Carry packed as VARIANT_BUILDS="x19:<x19 tree>/build ..." bash scripts/pack_carry.sh build (the x19 tree:
# HEAD + bench/experiments/x19-t1-first-piece-on-44abfde.patch, its CLI). Run as SHA=<sha> bash <this> (carry
# [".carry"], needs_h200: deepseek-v3's 8-layer stack does not fit an H100). Files back: x19d/{driver.log,x19d.txt,
# logs.tgz}, the protocol's bench-*.json, summary-*.md, roofline-*.png and raw.tgz.
set -u
mkdir -p $OUT/x19d
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  OUT=$OUT/x19d timeout 100 bash bench/results/x19d-t1-per-scheduler-call.sh > $OUT/x19d/driver.log 2>&1
  echo "x19d: exit $? [$SECONDS s]"; rm -rf $OUT/x19d/w
else
  echo "x19d: skipped (not an H200)" | tee $OUT/x19d/driver.log
fi
budget=$(( ${END_S:-545} - SECONDS - 20 ))  # END_S: when the call should end, for a short device budget
echo "protocol budget ${budget}s"
SHA=${SHA:-unknown} BUDGET_S=$budget bash bench/protocol-call.sh
echo "done [$SECONDS s]"
