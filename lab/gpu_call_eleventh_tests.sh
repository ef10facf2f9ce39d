#!/usr/bin/env bash
# The eleventh session's second device call (any GPU; carry .whl): the GPU tests of the tenth session's host
# changes that had run only in the simulator or with the driver stubbed: clip's list snapshot and one-read
# key (test_clip_grad_norm, test_replay_gpu), OverlapGuard.over in rope, swiglu and fused_add_rmsnorm; then
# `kernels verify` of gemm, o_proj and linear on the shared epilogue, as time allows.
#   OUT=dir bash lab/gpu_call_eleventh_tests.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-eleventh-tests}; mkdir -p "$OUT"; t0=$(date +%s)
source benchmarks/h200_env.sh || exit 2
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/nvidia-smi.csv"
timeout "$(left ${T_CLIP:-270})" $PY -m pytest -q -p no:cacheprovider -rf tests/kernels/test_clip_grad_norm.py \
  tests/kernels/test_replay_gpu.py > "$OUT/pytest-clip.txt" 2>&1
echo "== clip/replay rc=$? after $(( $(date +%s) - t0 )) s"; tail -3 "$OUT/pytest-clip.txt"
timeout "$(left ${T_ROWS:-500})" $PY -m pytest -q -p no:cacheprovider -rf tests/kernels/test_rope.py \
  tests/kernels/test_swiglu.py tests/kernels/test_fused_add_rmsnorm.py > "$OUT/pytest-llm.txt" 2>&1
echo "== rope/swiglu/fused_add_rmsnorm rc=$? after $(( $(date +%s) - t0 )) s"; tail -3 "$OUT/pytest-llm.txt"
timeout "$(left ${T_VERIFY:-585})" $PY -m kernels verify --json --ops gemm,o_proj,linear --shapes verify > "$OUT/verify.json" 2> "$OUT/verify.err"
echo "== verify rc=$? after $(( $(date +%s) - t0 )) s"
$PY -c "import json,sys; d=json.load(open(sys.argv[1])); print('verify ok:', d.get('ok'))" "$OUT/verify.json" 2>&1 | tail -1
