#!/usr/bin/env bash
# The tenth session's second device call (cc 9.0; carry .whl): the TMA tile's epilogue reading each chunk's
# bias / R words before its stores (WS_EPI_J). gemm, o_proj and linear against cuBLAS (h200_bf16.py), then
# the GPU tests of the TMA tile and of o_proj / linear / gemm.
#   OUT=dir bash lab/gpu_call_tenth_epi.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-tenth-epi}; mkdir -p "$OUT"; t0=$(date +%s)
source benchmarks/h200_env.sh || exit 2
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader | tee "$OUT/nvidia-smi.csv"
timeout "$(left ${T_BENCH:-200})" $PY benchmarks/h200_bf16.py --out "$OUT/gemm" \
  --only "gemm 8192x2560x2560 bfloat16,o_proj bfloat16,o_proj float16,linear bfloat16,linear float16,gemm 4096^3 bfloat16" \
  > "$OUT/gemm.txt" 2>&1
echo "== bench rc=$? after $(( $(date +%s) - t0 )) s"
timeout "$(left ${T_TESTS:-540})" $PY -m pytest -q -p no:cacheprovider -rf tests/kernels/test_wgmma_tma.py \
  tests/kernels/test_o_proj.py tests/kernels/test_linear.py tests/kernels/test_gemm.py > "$OUT/pytest.txt" 2>&1
echo "== pytest rc=$? after $(( $(date +%s) - t0 )) s"
tail -4 "$OUT/pytest.txt"
grep -E "^(gemm|o_proj|linear) " "$OUT/gemm.txt"
$PY -c "
import json, sys
for r in json.load(open(sys.argv[1]))['rows']:
    if 'epilogue_cost' in r: print(r['dtype'], r['shape'], 'plain', r['plain_us'], 'epilogue', r['epilogue_cost'])
" "$OUT/gemm/h200_bf16.json"
