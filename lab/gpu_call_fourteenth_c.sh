#!/usr/bin/env bash
# The fourteenth session's third device call (carry .whl), packed into $OUT/c.tgz; ~8 min on an H100:
#   1. the GPU tests of the change: fused_add_rmsnorm on chip (rmsnorm.make_onchip's `add`), rmsnorm's
#      on-chip rows (the same kernel text, refactored), the row selection rules, the bench harness;
#   2. benchmarks/h200_llm.py for rmsnorm, softmax and fused_add_rmsnorm in bf16 (the width sweep, beside
#      torch and Liger), on the harness's new method (each timed call after an untimed one of its own
#      provider);
#   3. time left: lab/rows_ncu.py under ncu, layernorm beside rmsnorm (bf16, 2048 x 16384 and 1024 x 32768).
#   OUT=dir bash lab/gpu_call_fourteenth_c.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-fourteenth-c}; mkdir -p "$OUT/c"; t0=$(date +%s)
source benchmarks/h200_env.sh || exit 2
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$OUT/c/gpu.txt"
timeout "$(left 250)" $PY -m pytest -q -p no:cacheprovider tests/kernels/test_fused_add_rmsnorm.py \
  tests/kernels/test_bench.py "tests/kernels/test_bf16.py::test_onchip_rows_round_the_float64_result" \
  "tests/kernels/test_bf16.py::test_onchip_rows_end_where_shared_memory_does" \
  "tests/kernels/test_bf16.py::test_auto_takes_the_stream_vector_kernel_only_where_it_is_listed" \
  -k "not softmax and not layernorm" > "$OUT/c/pytest-gpu.txt" 2>&1
echo "== tests rc=$? after $(( $(date +%s) - t0 )) s"; tail -8 "$OUT/c/pytest-gpu.txt"
timeout "$(left 480)" $PY benchmarks/h200_llm.py --out "$OUT/c/llm" --ops rmsnorm,softmax,fused_add_rmsnorm \
  --dtypes bfloat16 > "$OUT/c/llm.txt" 2>&1
echo "== llm rc=$? after $(( $(date +%s) - t0 )) s"; grep -E "^op |^[a-z_]+ +bfloat16" "$OUT/c/llm.txt" | tail -60
# 3. where layernorm's time goes beside rmsnorm's (bf16 at 2048 x 16384 and 1024 x 32768), if time is left
NCU="ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section InstructionStats --csv --page details"
for shape in 2048x16384 1024x32768; do
  [ "$(left 570)" -gt 40 ] || break
  RN_OPS=rmsnorm,layernorm RN_ROWS=${shape%x*} RN_COLS=${shape#*x} timeout "$(left 570)" $NCU $PY lab/rows_ncu.py \
    > "$OUT/c/ncu-ln-$shape.csv" 2>&1
  echo "== ncu $shape rc=$? after $(( $(date +%s) - t0 )) s"
done
tar czf "$OUT/c.tgz" -C "$OUT" c && rm -rf "$OUT/c"
