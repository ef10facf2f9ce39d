#!/usr/bin/env bash
# The H200 check, from the repository root, in one device call of under 10 minutes (step deadlines from the
# start: 210 + 420 + 555 s, after ~30 s of set-up; H200_CHECK_VERIFY=0 skips step 2 when the real-node run has just verified
# every op on this GPU):
#   1. the image's python with the carried numpy 2.4 ahead on PYTHONPATH (numpy 2.5 breaks numba-cuda),
#   2. side by side (correctness only, so they may share the GPU; numba's compiles are CPU work on 16 cores):
#      verify at the GPU verification shapes (and the NaN / inf special cases), and pytest -m gpu tests/kernels
#      then tests/kernels/test_views.py (strided views refused, misaligned ones on the scalar kernels),
#   3. benchmarks/h200_llm.py (H200_CHECK_LLM=0 skips it): the LLM ops beside torch eager and Liger-Kernel,
#   4. the bench with --compare cupy, every figure compared with benchmarks/h200/latest.json (> 2 % slower is
#      flagged). The benches run alone on the GPU. Full outputs under $OUT (or ./h200-check-out); the tables
#      print last.
# Wheels: .whl/numpy-2.4.*-cp312-*manylinux*x86_64.whl, and .whl/bench/liger_kernel-*.whl for step 3.
set -uo pipefail
OUT="${OUT:-$PWD/h200-check-out}"
mkdir -p "$OUT"
# the image's interpreter (torch, numba, numba-cuda, CuPy in its venv); a venv made from it would see the
# system site-packages, not the image's, so the carried numpy goes to a directory ahead on PYTHONPATH
PY=${PY:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=python3
SITE=/tmp/h200-check-site
WHL=$(ls .whl/numpy-2.4*cp312*.whl 2>/dev/null | head -1)
[ -n "$WHL" ] && [ ! -d "$SITE/numpy" ] && mkdir -p "$SITE" && timeout 60 $PY -m zipfile -e "$WHL" "$SITE"
export PYTHONPATH="$SITE:$PWD"
$PY -c "import numpy, numba_cuda; print('numpy', numpy.__version__)" | tee "$OUT/versions.txt"
t0=$(date +%s)
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }  # seconds to the step's deadline
echo "== verify (GPU verification shapes) beside pytest -m gpu tests/kernels"
v=skipped
if [ "${H200_CHECK_VERIFY:-1}" != 0 ]; then
  timeout "$(left 210)" $PY -m kernels verify --shapes verify --json > "$OUT/verify.json" 2>"$OUT/verify.err" &
  VPID=$!
fi
( timeout "$(left 180)" $PY -m pytest -q -m gpu tests/kernels -p no:cacheprovider > "$OUT/pytest-gpu.txt" 2>&1
  echo $? > "$OUT/pytest-gpu.rc"
  timeout "$(left 210)" $PY -m pytest -q tests/kernels/test_views.py -p no:cacheprovider > "$OUT/pytest-views.txt" 2>&1
  echo $? > "$OUT/pytest-views.rc" ) &
TPID=$!
if [ -n "${VPID:-}" ]; then
  wait $VPID; v=$?
  $PY -c "import json,sys; d=json.load(open('$OUT/verify.json')); bad=[r for r in d['results'] if not r['ok']]; \
print('verify', 'PASS' if d['ok'] else 'FAIL', len(d['results']), 'cases'); [print('  ', r['op'], r['dtype'], r['case'], r.get('error')) for r in bad]; \
print('   worst elem_err:', max((r.get('elem_err') or 0) for r in d['results']))"
  tail -n 2 "$OUT/verify.err"
fi
wait $TPID
t=$(cat "$OUT/pytest-gpu.rc" 2>/dev/null || echo none); w=$(cat "$OUT/pytest-views.rc" 2>/dev/null || echo none)
tail -n 3 "$OUT/pytest-gpu.txt"
tail -n 1 "$OUT/pytest-views.txt"
l=skipped
if [ "${H200_CHECK_LLM:-1}" != 0 ]; then
  echo "== benchmarks/h200_llm.py: ours vs torch eager vs Liger-Kernel (after $(( $(date +%s) - t0 )) s)"
  (     for w in .whl/bench/liger_kernel-*.whl; do [ -f "$w" ] && mkdir -p /tmp/h200-llm-site && $PY -m zipfile -e "$w" /tmp/h200-llm-site; done
    [ -d /tmp/h200-llm-site ] && export PYTHONPATH="/tmp/h200-llm-site:$PYTHONPATH"
    timeout "$(left 420)" $PY benchmarks/h200_llm.py --out "$OUT" ${H200_LLM_ARGS:-} > "$OUT/llm.txt" 2>&1 ); l=$?
  grep -E "ERROR|Traceback" "$OUT/llm.txt" | head -5
fi
echo "== bench --compare cupy vs benchmarks/h200/latest.json"
echo "   (after $(( $(date +%s) - t0 )) s)"
timeout "$(left 555)" $PY benchmarks/bench.py --compare cupy --baseline benchmarks/h200/latest.json \
  --out "$OUT/latest.json" --results "$OUT/results.jsonl" > "$OUT/bench-compare.txt" 2>"$OUT/bench-stderr.txt"; b=$?
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv > "$OUT/nvidia-smi.csv" 2>&1
echo "verify rc=$v  pytest rc=$t  views rc=$w  llm rc=$l  bench rc=$b (1: a case wrong or > 2 % slower); $(( $(date +%s) - t0 )) s"
[ -f "$OUT/llm.txt" ] && sed -n '/^op /,$p' "$OUT/llm.txt"
cat "$OUT/bench-compare.txt"
