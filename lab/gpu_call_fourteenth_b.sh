#!/usr/bin/env bash
# The fourteenth session's second device call (carry .whl): lab/bench_order_ab.py (softmax and rmsnorm bf16,
# ours / torch / Liger in four call orders), ~2-3 min; $OUT/order.tgz.
#   OUT=dir bash lab/gpu_call_fourteenth_b.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-fourteenth-b}; mkdir -p "$OUT/o"
source benchmarks/h200_env.sh || exit 2
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$OUT/o/gpu.txt"
OUT="$OUT/o" timeout 540 $PY lab/bench_order_ab.py > "$OUT/o/order.txt" 2>&1
echo "== order rc=$?"; grep -A40 "^op " "$OUT/o/order.txt" || tail -30 "$OUT/o/order.txt"
tar czf "$OUT/order.tgz" -C "$OUT" o && rm -rf "$OUT/o"
