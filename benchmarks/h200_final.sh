#!/usr/bin/env bash
# The final figures on the lent H200, in two parts that each fit one device call:
#   OUT=/some/dir bash benchmarks/h200_final.sh bench    # bench of every op side by side with CuPy/cuBLAS
#                                                         # (-> benchmarks/h200/latest.json, roofline.png), host overhead
#   OUT=/some/dir bash benchmarks/h200_final.sh checks   # verify at verification + benchmark shapes, GPU-marked tests
# Run from the repo root after the numpy 2.4 wheel is installed (see benchmarks/PERF.md). Each step has its own
# time limit so that a slow one cannot cost the others; short tables print last.
set -uo pipefail
PART=${1:-all}
OUT=${OUT:-/tmp/solfleet-final}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/solfleet-cache}
PY=${PY:-python3}
t0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  >"$OUT/nvidia-smi-$PART.csv" 2>&1
if [ "$PART" = bench ] || [ "$PART" = all ]; then
  stamp bench
  timeout 300 $PY -m kernels bench --compare cupy --out "$OUT/latest.json" --plot "$OUT/roofline.png" \
    >"$OUT/bench.txt" 2>&1; echo "bench rc=$?"
  stamp overhead
  timeout 150 $PY -m kernels bench --overhead >"$OUT/overhead.txt" 2>&1; echo "overhead rc=$?"
fi
if [ "$PART" = checks ] || [ "$PART" = all ]; then
  stamp verify
  timeout 150 $PY -m kernels verify --json >"$OUT/verify.json" 2>"$OUT/verify.err"; echo "verify rc=$?"
  stamp pytest-gpu
  # bench-shape tests repeat the check `verify` just ran at those shapes; the rest of the GPU tests run here
  timeout 200 $PY -m pytest -q -p no:cacheprovider -m gpu -k "not bench_shapes" tests/kernels \
    >"$OUT/pytest-gpu.txt" 2>&1
  echo "pytest rc=$?"
fi
stamp done
if [ -f "$OUT/verify.json" ]; then
  echo "---- verify"; $PY -c "
import json; d=json.load(open('$OUT/verify.json'))
print('ok', d['ok'], 'cases', len(d['results']), 'failed', [r['op'] for r in d['results'] if not r['ok']])" \
    || tail -5 "$OUT/verify.err"
fi
[ -f "$OUT/pytest-gpu.txt" ] && { echo "---- pytest"; tail -3 "$OUT/pytest-gpu.txt"; }
[ -f "$OUT/overhead.txt" ] && { echo "---- overhead"; tail -25 "$OUT/overhead.txt"; }
[ -f "$OUT/bench.txt" ] && { echo "---- bench"; grep -v "^  bench " "$OUT/bench.txt" | tail -45; }
exit 0
