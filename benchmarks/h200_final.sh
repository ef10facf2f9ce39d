#!/usr/bin/env bash
# One call on the lent H200 that produces every figure the notes quote: bench of every op side by side with
# CuPy/cuBLAS (-> benchmarks/h200/latest.json), verify at verification + benchmark shapes, host overhead, and
# the GPU-marked tests. Run from the repo root after the numpy 2.4 wheel is installed (see benchmarks/PERF.md):
#   OUT=/some/dir bash benchmarks/h200_final.sh
# Each step has its own time limit so that a slow one cannot cost the others; short tables print last.
set -uo pipefail
OUT=${OUT:-/tmp/solfleet-final}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/solfleet-cache}
PY=${PY:-python3}
t0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  >"$OUT/nvidia-smi.csv" 2>&1
stamp bench
timeout 170 $PY -m kernels bench --compare cupy --out "$OUT/latest.json" --plot "$OUT/roofline.png" \
  >"$OUT/bench.txt" 2>&1; echo "bench rc=$?"
stamp verify
timeout 100 $PY -m kernels verify --json >"$OUT/verify.json" 2>"$OUT/verify.err"; echo "verify rc=$?"
stamp overhead
timeout 30 $PY -m kernels bench --overhead >"$OUT/overhead.txt" 2>&1; echo "overhead rc=$?"
stamp pytest-gpu
# bench-shape tests repeat the check `verify` just ran at those shapes; the rest of the GPU tests run here
timeout 90 $PY -m pytest -q -p no:cacheprovider -m gpu -k "not bench_shapes" tests/kernels >"$OUT/pytest-gpu.txt" 2>&1
echo "pytest rc=$?"
stamp done
echo "---- verify"; $PY -c "
import json; d=json.load(open('$OUT/verify.json'))
print('ok', d['ok'], 'cases', len(d['results']), 'failed', [r['op'] for r in d['results'] if not r['ok']])" \
  || tail -5 "$OUT/verify.err"
echo "---- pytest"; tail -3 "$OUT/pytest-gpu.txt"
echo "---- overhead"; tail -15 "$OUT/overhead.txt"
echo "---- bench"; grep -v "^  bench " "$OUT/bench.txt" | tail -45
