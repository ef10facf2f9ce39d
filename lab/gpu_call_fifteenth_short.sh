#!/usr/bin/env bash
# The fifteenth session's call when the device time left fits one call (refusals took most of it): the packed
# fused_add_rmsnorm A/B, its GPU tests, then the H200 table's missing LLM rows, packed into
# $OUT/fifteenth.tgz after each step. Each step on its own deadline from the start, the last at TOTAL
# (default 560 s):
#   1. lab/fused_packed_ab.py at 8192 and 16384 columns (the shapes rows.WIDE_PACKED lists for the op)
#   2. the GPU tests of the packed kernel and its wiring
#   3. on the H200, benchmarks/h200_llm.py for swiglu, rope, cast_fp8 (missing from h200/latest.json), then
#      fused_add_rmsnorm (its rows on the new shapes), bf16 and fp16, beside torch and Liger-Kernel; on
#      another GPU lab/packed_rows_ab.py for layernorm at 6 / 3 blocks per SM (gpu_call_fifteenth.sh's step 3)
#   OUT=dir [TOTAL=560] [P1=30] [P2=48] [TESTS="..."] bash lab/gpu_call_fifteenth_short.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-fifteenth}; mkdir -p "$OUT/f"
TOTAL=${TOTAL:-560}
P1=${P1:-30}; P2=${P2:-48}  # steps 1 and 2 end at these percentages of TOTAL (P2=100: no step 3)
TESTS=${TESTS:-tests/kernels/test_fused_add_rmsnorm.py tests/kernels/test_bf16.py}
t0=$(date +%s)
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }
pack() { tar czf "$OUT/fifteenth.tgz" -C "$OUT" f; }
source benchmarks/h200_env.sh || exit 2
grep -q '"fused_add_rmsnorm": (' kernels/ops/rows.py ||
  echo "NOTE: rows.WIDE_PACKED has no fused_add_rmsnorm shapes: step 2 tests the product without them (git revert 53bd05a first)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$OUT/f/gpu.txt"
OUT="$OUT/f" FP_COLS=8192,16384 timeout -k 5 "$(left $(( TOTAL * P1 / 100 )))" $PY lab/fused_packed_ab.py \
  > "$OUT/f/fused-packed.txt" 2>&1
echo "== fused packed rc=$? at $(( $(date +%s) - t0 )) s"; grep -A30 "^dtype " "$OUT/f/fused-packed.txt" || tail -30 "$OUT/f/fused-packed.txt"
pack
timeout -k 5 "$(left $(( TOTAL * P2 / 100 )))" $PY -m pytest -q -p no:cacheprovider $TESTS \
  -k "packed or vector_path" > "$OUT/f/pytest-gpu.txt" 2>&1
echo "== pytest rc=$? at $(( $(date +%s) - t0 )) s"; tail -5 "$OUT/f/pytest-gpu.txt"
pack
if [ "$P2" -ge 100 ]; then
  :
elif grep -q H200 "$OUT/f/gpu.txt"; then
  timeout -k 5 "$(left "$TOTAL")" $PY benchmarks/h200_llm.py --out "$OUT/f/llm" --ops swiglu,rope,cast_fp8,fused_add_rmsnorm \
    --dtypes bfloat16,float16 > "$OUT/f/llm.txt" 2>&1
  echo "== llm rc=$? at $(( $(date +%s) - t0 )) s"; grep -c '"ok": true' "$OUT/f/llm.txt"; grep -E "ERROR|FAIL" "$OUT/f/llm.txt" | head
else  # not the H200: the table's rows would not belong in h200/latest.json; layernorm's packed probe instead
  mkdir -p "$OUT/f/ln"
  OUT="$OUT/f/ln" PR_OPS=layernorm PR_DTYPES=bfloat16,float16 PR_CANDS=8192:256x32/6,16384:512x32/3 PR_EXTRA=shifted \
    timeout -k 5 "$(left "$TOTAL")" $PY lab/packed_rows_ab.py > "$OUT/f/ln/packed-layernorm.txt" 2>&1
  echo "== layernorm packed rc=$? at $(( $(date +%s) - t0 )) s"; grep -A40 "^op " "$OUT/f/ln/packed-layernorm.txt" || tail -20 "$OUT/f/ln/packed-layernorm.txt"
fi
pack && rm -rf "$OUT/f"
