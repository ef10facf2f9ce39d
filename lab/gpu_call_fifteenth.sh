#!/usr/bin/env bash
# Written at the end of the fourteenth session for the next one (carry .whl), packed into $OUT/fifteenth.tgz;
# ~4 min on any GPU:
#   1. lab/fused_packed_ab.py, fused_add_rmsnorm's rows of 8192-32768 columns as packed pairs (the shapes of
#      rmsnorm's WIDE_PACKED, and fewer blocks per SM at 8192-16384) beside auto's WIDE_ROWS kernel, bf16 and
#      fp16, every output checked against float64 and the residual bit for bit;
#   2. lab/rows_liger_ncu.py under Nsight Compute for fused_add_rmsnorm, ours (auto) and Liger's, bf16 at
#      1024, 8192 and 32768 columns (the op is 0.87-0.93x Liger there on the H200).
#   OUT=dir bash lab/gpu_call_fifteenth.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-fifteenth}; mkdir -p "$OUT/f"
source benchmarks/h200_env.sh || exit 2
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$OUT/f/gpu.txt"
OUT="$OUT/f" timeout 540 $PY lab/fused_packed_ab.py > "$OUT/f/fused-packed.txt" 2>&1
echo "== fused packed rc=$?"; grep -A30 "^dtype " "$OUT/f/fused-packed.txt" || tail -30 "$OUT/f/fused-packed.txt"
NCU="ncu --profile-from-start off --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section InstructionStats --csv --page details"
RL_OPS=fused_add_rmsnorm RL_COLS=1024,8192,32768 timeout 240 $NCU $PY lab/rows_liger_ncu.py > "$OUT/f/ncu-fused.csv" 2>&1
echo "== ncu rc=$?"; grep -E "launch:|rel err" "$OUT/f/ncu-fused.csv" | tail -20
tar czf "$OUT/fifteenth.tgz" -C "$OUT" f && rm -rf "$OUT/f"
