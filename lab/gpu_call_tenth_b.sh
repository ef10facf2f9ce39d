#!/usr/bin/env bash
# The tenth session's third device call (cc 9.0; carry .whl): the TMA tile's GPU tests after the epilogue
# change (and the NVRTC warning it had on keys without bias or R), a second bench of gemm / o_proj / linear,
# then host time of the calls (`bench --overhead`, registry rows of clip_grad_norm only).
#   OUT=dir bash lab/gpu_call_tenth_b.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-tenth-b}; mkdir -p "$OUT"; t0=$(date +%s)
source benchmarks/h200_env.sh || exit 2
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader | tee "$OUT/nvidia-smi.csv"
timeout "$(left ${T_TESTS:-250})" $PY -m pytest -q -p no:cacheprovider -rf tests/kernels/test_wgmma_tma.py \
  tests/kernels/test_o_proj.py tests/kernels/test_linear.py tests/kernels/test_gemm.py > "$OUT/pytest.txt" 2>&1
echo "== pytest rc=$? after $(( $(date +%s) - t0 )) s"
timeout "$(left ${T_BENCH:-300})" $PY benchmarks/h200_bf16.py --out "$OUT/gemm" \
  --only "gemm 8192x2560x2560 bfloat16,o_proj bfloat16,o_proj float16,linear bfloat16,linear float16,gemm 8192x2560x2560 float16" \
  > "$OUT/gemm.txt" 2>&1
echo "== bench rc=$? after $(( $(date +%s) - t0 )) s"
timeout "$(left ${T_OVERHEAD:-500})" $PY -m kernels bench --overhead --ops clip_grad_norm --json > "$OUT/overhead.json" 2> "$OUT/overhead.err"
echo "== overhead rc=$? after $(( $(date +%s) - t0 )) s"
tail -4 "$OUT/pytest.txt"
grep -a -E "^(gemm|o_proj|linear) " "$OUT/gemm.txt"
$PY -c "
import json, sys
for r in json.load(open(sys.argv[1]))['overhead']:
    print(f\"{r['call']:70s} {r['median_us']:6.2f} us (p10 {r['p10_us']}, p90 {r['p90_us']})\")
" "$OUT/overhead.json"
