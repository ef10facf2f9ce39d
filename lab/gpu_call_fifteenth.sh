#!/usr/bin/env bash
# Written at the end of the fourteenth session for the next one (carry .whl), packed into $OUT/fifteenth.tgz;
# ~3 min on any GPU: lab/fused_packed_ab.py, fused_add_rmsnorm's rows of 8192-32768 columns as packed pairs
# (the shapes of rmsnorm's WIDE_PACKED, and fewer blocks per SM at 8192-16384) beside auto's WIDE_ROWS kernel,
# bf16 and fp16, every output checked against float64 and the residual bit for bit.
#   OUT=dir bash lab/gpu_call_fifteenth.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-fifteenth}; mkdir -p "$OUT/f"
source benchmarks/h200_env.sh || exit 2
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$OUT/f/gpu.txt"
OUT="$OUT/f" timeout 540 $PY lab/fused_packed_ab.py > "$OUT/f/fused-packed.txt" 2>&1
echo "== fused packed rc=$?"; grep -A30 "^dtype " "$OUT/f/fused-packed.txt" || tail -30 "$OUT/f/fused-packed.txt"
tar czf "$OUT/fifteenth.tgz" -C "$OUT" f && rm -rf "$OUT/f"
