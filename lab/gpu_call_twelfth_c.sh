#!/usr/bin/env bash
# The twelfth session's packed-rows call (carry .whl), packed into $OUT/twelfth_c.tgz: the A/B of the
# product's packed shapes (rows.WIDE_PACKED, what auto takes now) against the WIDE_ROWS kernels auto took
# before and the probe's builds (lab/packed_rows_ab.py, bf16 then fp16 at 8192-32768), then the row ops' GPU
# tests (the packed ones first, then the row-op files and the special values) until the deadline.
#   OUT=dir bash lab/gpu_call_twelfth_c.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-twelfth-c}; mkdir -p "$OUT/w/f16"; t0=$(date +%s)
source benchmarks/h200_env.sh || exit 2
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/w/gpu.txt"
OUT="$OUT/w" timeout "$(left 110)" $PY lab/packed_rows_ab.py > "$OUT/w/packed.txt" 2>&1
echo "== packed bf16 rc=$? after $(( $(date +%s) - t0 )) s"
OUT="$OUT/w/f16" PR_DTYPES=float16 timeout "$(left 200)" $PY lab/packed_rows_ab.py > "$OUT/w/packed-f16.txt" 2>&1
echo "== packed fp16 rc=$? after $(( $(date +%s) - t0 )) s"
timeout "$(left 300)" $PY -m pytest -q -p no:cacheprovider -rf tests/kernels/test_bf16.py -k "packed or vector_rounds" \
  > "$OUT/w/pytest-packed.txt" 2>&1
echo "== packed tests rc=$? after $(( $(date +%s) - t0 )) s"; tail -2 "$OUT/w/pytest-packed.txt"
timeout "$(left ${T_ALL:-540})" $PY -m pytest -q -p no:cacheprovider -rf -m "not slow" tests/kernels/test_softmax.py \
  tests/kernels/test_rmsnorm.py tests/kernels/test_special_values.py > "$OUT/w/pytest-rows.txt" 2>&1
echo "== row tests rc=$? after $(( $(date +%s) - t0 )) s"; tail -3 "$OUT/w/pytest-rows.txt"
for f in packed.txt packed-f16.txt; do grep -A60 "^op " "$OUT/w/$f" | grep -v "^\[" ; done
tar czf "$OUT/twelfth_c.tgz" -C "$OUT" w && rm -rf "$OUT/w"
