#!/usr/bin/env bash
# One device call on the H200 for a change that touched kernels: correctness first, then a probe.
#   OUT=/some/dir bash benchmarks/h200_session.sh
# 1. `python -m kernels verify --shapes verify` of every op (GPU verification shapes, NaN / inf cases) beside
#    `pytest -m gpu` on the test files named by TESTS (correctness only, so they share the GPU)  (CHECK_S, 240 s)
# 2. PROBE (a command line, run alone on the GPU with PROBE_S seconds), e.g. lab/rows_shapes_ab.py, or
#    PROBE='$PY -m kernels bench --overhead --json > $OUT/overhead.json' (host time per call, every op)
# Carry .whl (numpy 2.4; Liger under .whl/bench). Full outputs under $OUT, a summary last.
set -uo pipefail
OUT=${OUT:-/tmp/h200-session}
mkdir -p "$OUT"
source benchmarks/h200_env.sh || exit 2
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
timeout ${CHECK_S:-240} $PY -m kernels verify --shapes verify --json >"$OUT/verify.json" 2>"$OUT/verify.err" &
VPID=$!
TESTS=${TESTS:-tests/kernels/test_concurrency_gpu.py tests/kernels/test_linear.py tests/kernels/test_bf16.py tests/kernels/test_launch.py tests/kernels/test_wgmma.py tests/kernels/test_replay_gpu.py tests/kernels/test_clip_grad_norm.py}
timeout ${CHECK_S:-240} $PY -m pytest -q -m "not slow" -p no:cacheprovider -rf $TESTS >"$OUT/pytest.txt" 2>&1 &
TPID=$!
wait $VPID; echo "== verify rc=$? after $(( $(date +%s) - t0 )) s"
wait $TPID; echo "== pytest rc=$? after $(( $(date +%s) - t0 )) s"
$PY benchmarks/verify_summary.py "$OUT/verify.json"
tail -4 "$OUT/verify.err"
grep -E "passed|failed|error" "$OUT/pytest.txt" | tail -5
if [ -n "${PROBE:-}" ]; then
  timeout "${PROBE_S:-200}" bash -c "$PROBE" >"$OUT/probe.txt" 2>&1
  echo "== probe rc=$? after $(( $(date +%s) - t0 )) s"
  grep -v '^{' "$OUT/probe.txt" | tail -80
fi
exit 0
