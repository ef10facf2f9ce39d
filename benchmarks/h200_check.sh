#!/usr/bin/env bash
# The H200 check after the kernels-tree refactor, from the repository root, in under 10 minutes (the step
# timeouts: 30 + 200 + 140 + 30 + 200 = 600 s; H200_CHECK_VERIFY=0 skips step 2 when the real-node run has
# just verified every op on this GPU):
#   1. a venv over the image's packages with the carried numpy 2.4 (numpy 2.5 breaks numba-cuda: FACTS.md),
#   2. verify at the GPU verification shapes (and the NaN / inf special cases), 3. pytest -m gpu tests/kernels,
#   then tests/kernels/test_views.py (strided views refused, misaligned ones on the scalar kernels),
#   4. the bench with --compare cupy, every figure compared with benchmarks/h200/latest.json (> 2 % slower is
#      flagged). Full outputs under $OUT (or ./h200-check-out); the comparison table prints last.
# Wheels: .whl/numpy-2.4.*-cp312-*manylinux*x86_64.whl (the lead installs it; this script uses it if there).
set -uo pipefail
OUT="${OUT:-$PWD/h200-check-out}"
mkdir -p "$OUT"
PY=python3
if [ ! -x .venv-h200/bin/python ]; then
  timeout 10 $PY -m venv --system-site-packages .venv-h200
  ls .whl/numpy-2.4*.whl >/dev/null 2>&1 && timeout 20 .venv-h200/bin/pip install -q --no-deps .whl/numpy-2.4*.whl
fi
PY="$PWD/.venv-h200/bin/python"
export PYTHONPATH="$PWD"
$PY -c "import numpy, numba_cuda; print('numpy', numpy.__version__)" | tee "$OUT/versions.txt"
echo "== verify (GPU verification shapes)"
v=skipped
if [ "${H200_CHECK_VERIFY:-1}" != 0 ]; then
timeout 200 $PY -m kernels verify --shapes verify --json > "$OUT/verify.json"; v=$?
$PY -c "import json,sys; d=json.load(open('$OUT/verify.json')); bad=[r for r in d['results'] if not r['ok']]; \
print('verify', 'PASS' if d['ok'] else 'FAIL', len(d['results']), 'cases'); [print('  ', r['op'], r['dtype'], r['case'], r.get('error')) for r in bad]; \
print('   worst elem_err:', max((r.get('elem_err') or 0) for r in d['results']))"
fi
echo "== pytest -m gpu tests/kernels"
timeout 140 $PY -m pytest -q -m gpu tests/kernels -p no:cacheprovider > "$OUT/pytest-gpu.txt" 2>&1; t=$?
tail -n 3 "$OUT/pytest-gpu.txt"
timeout 30 $PY -m pytest -q tests/kernels/test_views.py -p no:cacheprovider > "$OUT/pytest-views.txt" 2>&1; w=$?
tail -n 1 "$OUT/pytest-views.txt"
echo "== bench --compare cupy vs benchmarks/h200/latest.json"
timeout 200 $PY benchmarks/bench.py --compare cupy --baseline benchmarks/h200/latest.json \
  --out "$OUT/latest.json" --results "$OUT/results.jsonl" > "$OUT/bench-compare.txt" 2>"$OUT/bench-stderr.txt"; b=$?
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv > "$OUT/nvidia-smi.csv" 2>&1
echo "verify rc=$v  pytest rc=$t  views rc=$w  bench rc=$b (1: a case wrong or > 2 % slower)"
cat "$OUT/bench-compare.txt"
