# Sourced by the one-off device call scripts (bench/experiments/*-call.sh) on the device: unpacks the carry
# (scripts/pack_carry.sh's .carry/*.tar.xz), puts its libgomp on LD_LIBRARY_PATH, makes the work folder W=$OUT/r
# (the script packs it into $OUT/r.tgz at its end), and defines left(): the seconds left before END_S (default 570,
# under the call's 600 s limit). Records the GPU's name and clock in $W/gpu.txt.
for b in .carry/*.tar.xz; do [ -f "$b" ] && tar xJf "$b" -C .carry; done
export LD_LIBRARY_PATH=$PWD/.carry:${LD_LIBRARY_PATH:-}
W=$OUT/r
mkdir -p "$W"
END=${END_S:-570}
left() { echo $(( END - SECONDS )); }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$W/gpu.txt"
