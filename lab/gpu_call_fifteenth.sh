#!/usr/bin/env bash
# The fifteenth session's first device call (carry .whl), packed into $OUT/fifteenth.tgz after each step;
# ~9 min on any GPU, each step on its own deadline from the start (the call stays under the tool's 600 s):
#   1. lab/fused_packed_ab.py: fused_add_rmsnorm's rows of 8192-32768 columns as packed pairs (rmsnorm's packed
#      kernel with the add in front) at rmsnorm's blocks per SM and fewer, beside the WIDE_ROWS kernel, bf16 and
#      fp16, every output against float64, residual bit for bit;
#   2. the GPU tests of the product form of that kernel and its wiring, which `git revert 53bd05a` restores
#      (test_fused_add_rmsnorm.py's packed and vector-path tests, test_bf16.py's packed tests);
#   3. lab/packed_rows_ab.py for layernorm at fewer blocks per SM: 256x32/6 at 8192 and 512x32/3 at 16384
#      (39-40 registers, no spills, ptxas sm_90), the two- and one-reduction builds;
#   4. lab/rows_liger_ncu.py under Nsight Compute for fused_add_rmsnorm, ours (auto) and Liger's, bf16 at
#      1024, 8192 and 32768 columns (the op is 0.87-0.93x Liger there on the H200).
#   OUT=dir bash lab/gpu_call_fifteenth.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-fifteenth}; mkdir -p "$OUT/f/ln"
t0=$(date +%s)
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }
pack() { tar czf "$OUT/fifteenth.tgz" -C "$OUT" f; }
source benchmarks/h200_env.sh || exit 2
grep -q '"fused_add_rmsnorm": (' kernels/ops/rows.py ||
  echo "NOTE: rows.WIDE_PACKED has no fused_add_rmsnorm shapes: step 2 tests the product without them (git revert 53bd05a first)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$OUT/f/gpu.txt"
OUT="$OUT/f" timeout -k 5 "$(left 230)" $PY lab/fused_packed_ab.py > "$OUT/f/fused-packed.txt" 2>&1
echo "== fused packed rc=$? at $(( $(date +%s) - t0 )) s"; grep -A30 "^dtype " "$OUT/f/fused-packed.txt" || tail -30 "$OUT/f/fused-packed.txt"
pack
timeout -k 5 "$(left 380)" $PY -m pytest -q -p no:cacheprovider tests/kernels/test_fused_add_rmsnorm.py \
  tests/kernels/test_bf16.py -k "packed or vector_path" > "$OUT/f/pytest-gpu.txt" 2>&1
echo "== pytest rc=$? at $(( $(date +%s) - t0 )) s"; tail -5 "$OUT/f/pytest-gpu.txt"
pack
OUT="$OUT/f/ln" PR_OPS=layernorm PR_DTYPES=bfloat16,float16 PR_CANDS=8192:256x32/6,16384:512x32/3 PR_EXTRA=shifted \
  timeout -k 5 "$(left 490)" $PY lab/packed_rows_ab.py > "$OUT/f/ln/packed-layernorm.txt" 2>&1
echo "== layernorm packed rc=$? at $(( $(date +%s) - t0 )) s"; grep -A40 "^op " "$OUT/f/ln/packed-layernorm.txt" || tail -20 "$OUT/f/ln/packed-layernorm.txt"
pack
NCU="ncu --profile-from-start off --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section InstructionStats --csv --page details"
RL_OPS=fused_add_rmsnorm RL_COLS=1024,8192,32768 timeout -k 5 "$(left 570)" $NCU $PY lab/rows_liger_ncu.py > "$OUT/f/ncu-fused.csv" 2>&1
echo "== ncu rc=$? at $(( $(date +%s) - t0 )) s"; grep -E "launch:|rel err" "$OUT/f/ncu-fused.csv" | tail -20
pack && rm -rf "$OUT/f"
