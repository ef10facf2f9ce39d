#!/usr/bin/env bash
# One device call on a GPU that is not an H200 (PERF.md "The next GPU session", step 1): the row ops' GPU
# tests, the on-chip A/B below the mid shape's from_cols (36864, 34816), rmsnorm's on-chip kernels with
# the next row's loads in the write pass (lab/onchip_prefetch.py), verify of the row ops, and the
# host-time rows of every op x dtype. Each step on its own deadline from the start (s).
#   OUT=dir bash lab/h100_rows_call.sh      (carry .whl)
set -uo pipefail
OUT=${OUT:-/tmp/h100-rows}; mkdir -p "$OUT"; t0=$(date +%s)
source benchmarks/h200_env.sh || exit 2
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader > "$OUT/nvidia-smi.csv"
timeout "$(left ${T_TESTS:-200})" $PY -m pytest -q -m "not slow" -p no:cacheprovider -rf \
  tests/kernels/test_softmax.py tests/kernels/test_layernorm.py tests/kernels/test_rmsnorm.py > "$OUT/pytest.txt" 2>&1
echo "== pytest rc=$? after $(( $(date +%s) - t0 )) s"
OUT=$OUT OA_SHAPES=${OA_SHAPES:-1024x34816,1024x36864} timeout "$(left ${T_AB:-320})" \
  $PY lab/onchip_ab.py > "$OUT/onchip.txt" 2>&1
echo "== onchip rc=$? after $(( $(date +%s) - t0 )) s"
OUT=$OUT timeout "$(left ${T_PREFETCH:-440})" $PY lab/onchip_prefetch.py > "$OUT/prefetch.txt" 2>&1
echo "== prefetch rc=$? after $(( $(date +%s) - t0 )) s"
timeout "$(left ${T_VERIFY:-500})" $PY -m kernels verify --json --ops rmsnorm,layernorm,softmax --shapes verify \
  > "$OUT/verify.json" 2> "$OUT/verify.err"
echo "== verify rc=$? after $(( $(date +%s) - t0 )) s"
timeout "$(left ${T_OVERHEAD:-570})" $PY -m kernels bench --overhead --json > "$OUT/overhead.json" 2> "$OUT/overhead.err"
echo "== overhead rc=$? after $(( $(date +%s) - t0 )) s"
tail -3 "$OUT/pytest.txt"; grep -v "^chip" "$OUT/onchip.txt" | tail -14; grep -v "registers" "$OUT/prefetch.txt" | tail -10
