#!/usr/bin/env bash
# The first device call after the twenty-third session (carry .whl), on whichever GPU comes. The twenty-third
# session had no device: it moved layernorm's weight-and-bias-in-shared-memory kernel (rows.WIDE_WB_SHARED)
# into the product, tested in the simulator only. This call, in this order, until TOTAL s:
#   1. lab/layernorm_wb_shared_check.py: the product's launcher at 16384 / 12288 / 8200 columns against the
#      plain WIDE_ROWS kernel, interleaved, bit for bit and against float64 (~60 s);
#   2. its GPU tests: tests/kernels/test_layernorm.py and test_bf16.py's layernorm cases (~200 s);
#   3. on an H200 only, with what is left: the row ops' bf16 width sweep beside Liger (h200_llm.py).
#   OUT=dir [TOTAL=560] bash lab/gpu_call_twentythird.sh
# If step 1 or 2 fails on an H100 / H200 (sm_90 holds the shape; on sm_86 / sm_89 step 1 says it cannot), the
# kernel is wrong on a GPU: set WIDE_WB_SHARED to {} (the WIDE_ROWS kernel runs again) before anything else.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-twentythird}; TOTAL=${TOTAL:-560}
t0=$(date +%s)
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }
mkdir -p "$OUT"
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "== device: $name"
source benchmarks/h200_env.sh || exit 2
OUT=$OUT timeout -k 5 "$(left 150)" $PY lab/layernorm_wb_shared_check.py > "$OUT/wb-check.txt" 2>&1
echo "== wb_shared check rc=$? after $(( $(date +%s) - t0 )) s"; tail -8 "$OUT/wb-check.txt"
timeout -k 5 "$(left 420)" $PY -m pytest -q -p no:cacheprovider tests/kernels/test_layernorm.py \
  "tests/kernels/test_bf16.py" -k "layernorm or wb_shared" > "$OUT/gpu-tests.txt" 2>&1
echo "== gpu tests rc=$? after $(( $(date +%s) - t0 )) s"; tail -4 "$OUT/gpu-tests.txt"
if [[ $name == *H200* ]]; then
  timeout -k 5 "$(left "$TOTAL")" $PY benchmarks/h200_llm.py --out "$OUT/llm" --ops layernorm,rmsnorm,softmax \
    --dtypes bfloat16 > "$OUT/llm.txt" 2>&1
  echo "== llm rc=$? after $(( $(date +%s) - t0 )) s"; tail -30 "$OUT/llm.txt"
fi
