#!/usr/bin/env bash
# The eleventh session's last device call (carry .whl): cast_fp8 with fp32 on the vector kernels under "auto"
# (AUTO_CAST), timed against torch by h200_llm.py (every dtype, so fp16 / bf16 are the control), then the
# session's new GPU tests (auto's cast_fp8 kernels; o_proj in place on the cp.async tile) and as much of
# test_cast_fp8.py as the deadline allows.
#   OUT=dir bash lab/gpu_call_eleventh_fp8.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-eleventh-fp8}; mkdir -p "$OUT"; t0=$(date +%s)
source benchmarks/h200_env.sh || exit 2
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }
timeout "$(left ${T_BENCH:-80})" $PY benchmarks/h200_llm.py --out "$OUT/llm" --ops cast_fp8 \
  --dtypes float32,float16,bfloat16 > "$OUT/llm.txt" 2>&1
echo "== bench rc=$? after $(( $(date +%s) - t0 )) s"
timeout "$(left ${T_NEW:-150})" $PY -m pytest -q -p no:cacheprovider -rf tests/kernels/test_cast_fp8.py \
  tests/kernels/test_vector.py tests/kernels/test_wgmma_tma.py -k "auto or choose or in_place_on_each_hopper_tile" \
  > "$OUT/pytest-new.txt" 2>&1
echo "== new tests rc=$? after $(( $(date +%s) - t0 )) s"; tail -2 "$OUT/pytest-new.txt"
timeout "$(left ${T_ALL:-255})" $PY -m pytest -q -p no:cacheprovider -rf tests/kernels/test_cast_fp8.py \
  > "$OUT/pytest-all.txt" 2>&1
echo "== test_cast_fp8 rc=$? after $(( $(date +%s) - t0 )) s"; tail -3 "$OUT/pytest-all.txt"
grep -E "^cast_fp8 " "$OUT/llm.txt"
