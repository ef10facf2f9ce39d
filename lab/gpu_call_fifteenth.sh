#!/usr/bin/env bash
# The fifteenth session's device call, written for the next session (carry .whl; `git revert 53bd05a` first,
# which restores the product form of the packed fused kernel that step 2 tests). Each step ends at its
# percentage of TOTAL seconds from the start (default 570: ~9.5 min, under the tool's 600 s); the results are
# packed into $OUT/fifteenth.tgz after every step:
#   1. (P1=40 %) lab/fused_packed_ab.py at FP_COLS (default 8192,16384,32768): fused_add_rmsnorm's rows as packed
#      pairs at rmsnorm's blocks per SM and fewer, beside the WIDE_ROWS kernel, bf16 and fp16, every output
#      against float64, the residual bit for bit;
#   2. (P2=67 %) the GPU tests of the packed kernel and its wiring, $TESTS -k "packed or vector_path" (default
#      test_fused_add_rmsnorm.py and test_bf16.py); P2=100 stops after this step;
#   3. with TABLE=1 on the H200, until TOTAL: benchmarks/h200_llm.py for swiglu, rope, cast_fp8 (missing from
#      h200/latest.json), then fused_add_rmsnorm, bf16 and fp16, beside torch and Liger-Kernel (step 4 skipped);
#      otherwise (P3=86 %): lab/packed_rows_ab.py for layernorm at 256x32/6 (8192 columns) and 512x32/3
#      (16384), the builds that do not spill (ptxas sm_90), two- and one-reduction;
#   4. (until TOTAL) lab/rows_liger_ncu.py under Nsight Compute for fused_add_rmsnorm, ours (auto) and Liger's,
#      bf16 at 1024, 8192 and 32768 columns (the op is 0.87-0.93x Liger there on the H200).
#   OUT=dir [TOTAL=570] [P1=40] [P2=67] [P3=86] [TABLE=1] [FP_COLS=...] [TESTS="..."] bash lab/gpu_call_fifteenth.sh
# A short call (little device time left): TOTAL=330 P1=50 P2=100 TESTS=tests/kernels/test_fused_add_rmsnorm.py
set -uo pipefail
OUT=${OUT:-/tmp/gpu-fifteenth}; mkdir -p "$OUT/f/ln"
TOTAL=${TOTAL:-570}; P1=${P1:-40}; P2=${P2:-67}; P3=${P3:-86}
TESTS=${TESTS:-tests/kernels/test_fused_add_rmsnorm.py tests/kernels/test_bf16.py}
t0=$(date +%s)
at() { local s=$(( TOTAL * $1 / 100 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }  # to P % of TOTAL
now() { echo "at $(( $(date +%s) - t0 )) s"; }
pack() { tar czf "$OUT/fifteenth.tgz" -C "$OUT" f; }
source benchmarks/h200_env.sh || exit 2
grep -q '"fused_add_rmsnorm": (' kernels/ops/rows.py ||
  echo "NOTE: rows.WIDE_PACKED has no fused_add_rmsnorm shapes: step 2 tests the product without them (git revert 53bd05a first)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$OUT/f/gpu.txt"

OUT="$OUT/f" FP_COLS=${FP_COLS:-8192,16384,32768} timeout -k 5 "$(at "$P1")" $PY lab/fused_packed_ab.py \
  > "$OUT/f/fused-packed.txt" 2>&1
echo "== fused packed rc=$? $(now)"; grep -A30 "^dtype " "$OUT/f/fused-packed.txt" || tail -30 "$OUT/f/fused-packed.txt"
pack
timeout -k 5 "$(at "$P2")" $PY -m pytest -q -p no:cacheprovider $TESTS -k "packed or vector_path" \
  > "$OUT/f/pytest-gpu.txt" 2>&1
echo "== pytest rc=$? $(now)"; tail -5 "$OUT/f/pytest-gpu.txt"
pack
[ "$P2" -ge 100 ] && { rm -rf "$OUT/f"; exit 0; }

if [ "${TABLE:-0}" = 1 ] && grep -q H200 "$OUT/f/gpu.txt"; then
  timeout -k 5 "$(at 100)" $PY benchmarks/h200_llm.py --out "$OUT/f/llm" --ops swiglu,rope,cast_fp8,fused_add_rmsnorm \
    --dtypes bfloat16,float16 > "$OUT/f/llm.txt" 2>&1
  echo "== llm rc=$? $(now)"; grep -c '"ok": true' "$OUT/f/llm.txt"; grep -E "ERROR|FAIL" "$OUT/f/llm.txt" | head
  pack && rm -rf "$OUT/f"; exit 0
fi
OUT="$OUT/f/ln" PR_OPS=layernorm PR_DTYPES=bfloat16,float16 PR_CANDS=8192:256x32/6,16384:512x32/3 PR_EXTRA=shifted \
  timeout -k 5 "$(at "$P3")" $PY lab/packed_rows_ab.py > "$OUT/f/ln/packed-layernorm.txt" 2>&1
echo "== layernorm packed rc=$? $(now)"; grep -A40 "^op " "$OUT/f/ln/packed-layernorm.txt" || tail -20 "$OUT/f/ln/packed-layernorm.txt"
pack
NCU="ncu --profile-from-start off --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section InstructionStats --csv --page details"
RL_OPS=fused_add_rmsnorm RL_COLS=1024,8192,32768 timeout -k 5 "$(at 100)" $NCU $PY lab/rows_liger_ncu.py \
  > "$OUT/f/ncu-fused.csv" 2>&1
echo "== ncu rc=$? $(now)"; grep -E "launch:|rel err" "$OUT/f/ncu-fused.csv" | tail -20
pack && rm -rf "$OUT/f"
