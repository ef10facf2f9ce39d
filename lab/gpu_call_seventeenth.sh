#!/usr/bin/env bash
# The narrow widths' packed shapes in their product form (carry .whl), for the sixteenth session's finding
# (benchmarks/PERF.md, "The narrow widths: more warps"): each step on its own deadline, a percentage of TOTAL
# seconds, everything packed into $OUT/seventeenth.tgz after each step:
#   1. (P1=50 %) lab/fused_packed_ab.py (the product's kernel, rmsnorm._make_packed(..., add=True))
#      at COLS (default 5120; the lab copy ran 1.023-1.026x there at 320x16/6) beside the WIDE_ROWS kernel;
#   2. (until TOTAL) lab/packed_rows_ab.py for rmsnorm (the product's _make_packed) at the same shapes, beside
#      auto (WIDE_ROWS there): fused_add_rmsnorm's packed tests pair it bit for bit with rmsnorm's kernel of
#      the same threads x values, so the two ops move together.
#   OUT=dir [TOTAL=100] [P1=50] [COLS=5120] [SHAPES="5120:320x16/6"] bash lab/gpu_call_seventeenth.sh
# The wider form: COLS=1024,2048,5120 SHAPES="1024:64x16/32,2048:128x16/16,5120:320x16/6" TOTAL=300.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-seventeenth}; mkdir -p "$OUT/v"
TOTAL=${TOTAL:-100}; P1=${P1:-50}; COLS=${COLS:-5120}; SHAPES=${SHAPES:-5120:320x16/6}
t0=$(date +%s)
at() { local s=$(( TOTAL * $1 / 100 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }
now() { echo "at $(( $(date +%s) - t0 )) s"; }
pack() { tar czf "$OUT/seventeenth.tgz" -C "$OUT" v; }
source benchmarks/h200_env.sh || exit 2
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$OUT/v/gpu.txt"
FP_SHAPES=$(echo "$SHAPES" | sed 's/\([0-9]\)\(,\|$\)/\1p\2/g')  # packed
OUT="$OUT/v" FP_COLS=$COLS FP_SHAPES=$FP_SHAPES timeout -k 5 "$(at "$P1")" $PY lab/fused_packed_ab.py \
  > "$OUT/v/fused-product.txt" 2>&1
echo "== fused product rc=$? $(now)"; grep -A20 "^dtype " "$OUT/v/fused-product.txt" || tail -10 "$OUT/v/fused-product.txt"
pack
OUT="$OUT/v" PR_OPS=rmsnorm PR_DTYPES=bfloat16,float16 PR_CANDS=$SHAPES timeout -k 5 "$(at 100)" $PY lab/packed_rows_ab.py \
  > "$OUT/v/rmsnorm-packed.txt" 2>&1
echo "== rmsnorm packed rc=$? $(now)"; grep -A20 "^op " "$OUT/v/rmsnorm-packed.txt" || tail -10 "$OUT/v/rmsnorm-packed.txt"
pack && rm -rf "$OUT/v"
