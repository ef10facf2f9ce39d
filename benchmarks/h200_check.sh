#!/usr/bin/env bash
# The GPU check, from the repository root. Measured on an H100 (2026-12-02): verify of every op ~200 s,
# pytest -m gpu tests/kernels ~360 s, the LLM bench ~390 s, the CuPy bench ~200 s: more than one 10-minute
# device call, so it runs in two (each step on its own timeout):
#   call 1 (correctness):  OUT=... bash benchmarks/h200_check.sh                 (H200_CHECK_BENCH=0 default)
#     verify at the GPU verification shapes (NaN / inf cases included) beside pytest -m gpu tests/kernels and
#     tests/kernels/test_views.py: correctness only, so they share the GPU (numba's compiles are CPU work on
#     16 cores); H200_CHECK_VERIFY=0 skips verify (after a real-node run verified every op on this GPU);
#   call 2 (speed):        H200_CHECK_TESTS=0 H200_CHECK_VERIFY=0 H200_CHECK_BENCH=1 OUT=... bash benchmarks/h200_check.sh
#     benchmarks/h200_llm.sh (the LLM ops beside torch eager and Liger-Kernel; H200_CHECK_LLM=0 skips it), then
#     the bench with --compare cupy, every figure compared with benchmarks/h200/bench-2026-11-30.json (the
#     last registry bench report of the H200; > 2 % slower is flagged). The benches run alone on the GPU.
# The image's python (torch, numba, numba-cuda, CuPy in its venv) with the carried numpy 2.4 ahead on
# PYTHONPATH (numpy 2.5 breaks numba-cuda; a venv made from the image's venv would see the system
# site-packages, not the image's). Wheels: .whl/numpy-2.4.*-cp312-*manylinux*x86_64.whl, and
# .whl/bench/liger_kernel-*.whl for the LLM bench. Full outputs under $OUT (or ./h200-check-out).
set -uo pipefail
OUT="${OUT:-$PWD/h200-check-out}"
mkdir -p "$OUT"
PY=${PY:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=python3
SITE=/tmp/h200-check-site
WHL=$(ls .whl/numpy-2.4*cp312*.whl 2>/dev/null | head -1)
[ -n "$WHL" ] && [ ! -d "$SITE/numpy" ] && mkdir -p "$SITE" && timeout 60 $PY -m zipfile -e "$WHL" "$SITE"
export PYTHONPATH="$SITE:$PWD"
$PY -c "import numpy, numba_cuda; print('numpy', numpy.__version__)" | tee "$OUT/versions.txt"
t0=$(date +%s)
v=skipped t=skipped w=skipped l=skipped b=skipped
if [ "${H200_CHECK_VERIFY:-1}" != 0 ]; then
  echo "== verify (GPU verification shapes)"
  timeout 300 $PY -m kernels verify --shapes verify --json > "$OUT/verify.json" 2>"$OUT/verify.err" &
  VPID=$!
fi
if [ "${H200_CHECK_TESTS:-1}" != 0 ]; then
  echo "== pytest -m gpu tests/kernels, then tests/kernels/test_views.py"
  ( timeout 450 $PY -m pytest -q -m gpu tests/kernels -p no:cacheprovider -rf > "$OUT/pytest-gpu.txt" 2>&1
    echo $? > "$OUT/pytest-gpu.rc"
    timeout 60 $PY -m pytest -q tests/kernels/test_views.py -p no:cacheprovider > "$OUT/pytest-views.txt" 2>&1
    echo $? > "$OUT/pytest-views.rc" ) &
  TPID=$!
fi
if [ -n "${VPID:-}" ]; then
  wait $VPID; v=$?
  $PY -c "import json,sys; d=json.load(open('$OUT/verify.json')); bad=[r for r in d['results'] if not r['ok']]; \
print('verify', 'PASS' if d['ok'] else 'FAIL', len(d['results']), 'cases'); [print('  ', r['op'], r['dtype'], r['case'], r.get('error')) for r in bad]; \
print('   worst elem_err:', max((r.get('elem_err') or 0) for r in d['results']))"
  tail -n 2 "$OUT/verify.err"
fi
if [ -n "${TPID:-}" ]; then
  wait $TPID
  t=$(cat "$OUT/pytest-gpu.rc" 2>/dev/null || echo none); w=$(cat "$OUT/pytest-views.rc" 2>/dev/null || echo none)
  tail -n 12 "$OUT/pytest-gpu.txt"
  tail -n 1 "$OUT/pytest-views.txt"
fi
if [ "${H200_CHECK_BENCH:-0}" = 1 ]; then
  if [ "${H200_CHECK_LLM:-1}" != 0 ]; then
    echo "== benchmarks/h200_llm.sh: ours vs torch eager vs Liger-Kernel"
    VERIFY=0 BENCH_DEADLINE=420 PY=$PY OUT="$OUT" bash benchmarks/h200_llm.sh > "$OUT/llm.txt" 2>&1; l=$?
  fi
  echo "== bench --compare cupy vs benchmarks/h200/bench-2026-11-30.json"
  timeout 240 $PY benchmarks/bench.py --compare cupy --baseline benchmarks/h200/bench-2026-11-30.json \
    --out "$OUT/latest.json" --results "$OUT/results.jsonl" > "$OUT/bench-compare.txt" 2>"$OUT/bench-stderr.txt"; b=$?
  nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv > "$OUT/nvidia-smi.csv" 2>&1
fi
echo "verify rc=$v  pytest rc=$t  views rc=$w  llm rc=$l  bench rc=$b (1: a case wrong or > 2 % slower); $(( $(date +%s) - t0 )) s"
[ -f "$OUT/llm.txt" ] && sed -n '/^---- table/,$p' "$OUT/llm.txt"
[ -f "$OUT/bench-compare.txt" ] && cat "$OUT/bench-compare.txt"
exit 0
