#!/usr/bin/env bash
# The tenth session's device call (any sm_90 GPU; carry .whl): the host time of every op call after the lean
# clip's key became one read of the ids (`python -m kernels bench --overhead`), the GPU tests of clip and of
# graph replay (which reads that key), and the linear epilogues with the bias timed on its own.
#   OUT=dir bash lab/gpu_call_tenth.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-tenth}; mkdir -p "$OUT"; t0=$(date +%s)
source benchmarks/h200_env.sh || exit 2
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader | tee "$OUT/nvidia-smi.csv"
timeout "$(left ${T_OVERHEAD:-150})" $PY -m kernels bench --overhead --json > "$OUT/overhead.json" 2> "$OUT/overhead.err"
echo "== overhead rc=$? after $(( $(date +%s) - t0 )) s"
timeout "$(left ${T_TESTS:-330})" $PY -m pytest -q -p no:cacheprovider -rf tests/kernels/test_clip_grad_norm.py \
  tests/kernels/test_replay_gpu.py > "$OUT/pytest.txt" 2>&1
echo "== pytest rc=$? after $(( $(date +%s) - t0 )) s"
timeout "$(left ${T_LINEAR:-560})" $PY benchmarks/h200_bf16.py --out "$OUT/linear" --only "linear bfloat16,linear float16" \
  > "$OUT/linear.txt" 2>&1
echo "== linear rc=$? after $(( $(date +%s) - t0 )) s"
tail -3 "$OUT/pytest.txt"
$PY -c "
import json, sys
for r in json.load(open(sys.argv[1]))['overhead']:
    if 'clip' in r['call']: print(f\"{r['call']:70s} {r['median_us']:6.2f} us (p10 {r['p10_us']}, p90 {r['p90_us']})\")
" "$OUT/overhead.json"
tail -12 "$OUT/linear.txt"
