#!/usr/bin/env bash
# The calls after lab/gpu_call_eighteenth.sh (carry .whl), on whichever GPU comes: both start from a tree
# without the full-row loads (main) and apply lab/full_row_loads.patch on the device's copy first.
#   STEP=narrow: lab/gpu_call_seventeenth.sh's wider form (the 320x16/6, 128x16/16 and 64x16/32 packed
#                shapes at 5120, 2048 and 1024 columns, against WIDE_ROWS with the full-row loads), TOTAL s;
#   STEP=tests:  the GPU tests of the three changed ops' files and test_bf16 (the eighteenth call ran only
#                the changed branches' 58), until TOTAL s.
#   OUT=dir STEP=narrow|tests [TOTAL=300] bash lab/gpu_call_nineteenth.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-nineteenth}; STEP=${STEP:-narrow}; TOTAL=${TOTAL:-300}
if ! grep -q WRITE_GROUP kernels/ops/layernorm.py; then
  { git apply lab/full_row_loads.patch 2>/dev/null || patch -p1 < lab/full_row_loads.patch; } || exit 3
  grep -q WRITE_GROUP kernels/ops/layernorm.py || { echo "lab/full_row_loads.patch did not apply"; exit 3; }
fi
case $STEP in
  narrow)
    OUT=$OUT TOTAL=$TOTAL COLS=1024,2048,5120 SHAPES="1024:64x16/32,2048:128x16/16,5120:320x16/6" \
      bash lab/gpu_call_seventeenth.sh ;;
  tests)
    source benchmarks/h200_env.sh || exit 2
    mkdir -p "$OUT"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"
    # the changed branches' on-chip tests first (the eighteenth call's time ran out inside them)
    timeout -k 5 "$TOTAL" $PY -m pytest -q -p no:cacheprovider tests/kernels/test_bf16.py -k onchip_rows \
      > "$OUT/pytest-onchip.txt" 2>&1
    echo "== pytest on-chip rc=$?"; tail -3 "$OUT/pytest-onchip.txt"
    timeout -k 5 "$TOTAL" $PY -m pytest -q -p no:cacheprovider tests/kernels/test_rmsnorm.py \
      tests/kernels/test_fused_add_rmsnorm.py tests/kernels/test_layernorm.py \
      > "$OUT/pytest.txt" 2>&1
    echo "== pytest rc=$?"; tail -8 "$OUT/pytest.txt" ;;
  *) echo "STEP must be narrow or tests, not '$STEP'"; exit 2 ;;
esac
