#!/usr/bin/env bash
# Device script for the memory-bound ops (benchmarks/notes-memory.md): one call that checks, times and
# collects everything, short tables last. Run on the lent GPU from the repo root, after the numpy 2.4 wheel is
# installed (see the device notes):
#   OUT=/some/dir bash benchmarks/bench_kernels.sh [quick]
# Writes under $OUT: nvidia-smi.csv, info.json, verify.json, bench.json (+ .txt), roofline.png, overhead.txt,
# pytest.txt, memvariants.txt/json (not with "quick", which also leaves out the bench-shape GPU tests that
# repeat what verify does at those shapes).
set -uo pipefail
OUT=${OUT:-/tmp/solfleet-bench}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/solfleet-cache}
PY=${PY:-python3}
OPS=residual_add,rmsnorm,layernorm,softmax,cast,clip_grad_norm
MINE="tests/kernels/test_residual_add.py tests/kernels/test_rmsnorm.py tests/kernels/test_layernorm.py
 tests/kernels/test_softmax.py tests/kernels/test_cast.py tests/kernels/test_clip_grad_norm.py
 tests/kernels/test_launch.py tests/kernels/test_bench.py tests/kernels/test_node_commands.py
 tests/kernels/test_verify.py"
t0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv >"$OUT/nvidia-smi.csv" 2>&1
stamp info;    $PY -m kernels info --json >"$OUT/info.json"; echo "info rc=$?"
stamp verify;  $PY -m kernels verify --ops $OPS --json >"$OUT/verify.json"; echo "verify rc=$?"
stamp bench;   $PY -m kernels bench --ops $OPS --compare cupy --out "$OUT/bench.json" --plot "$OUT/roofline.png" \
  >"$OUT/bench.txt" 2>&1; echo "bench rc=$?"
stamp overhead; $PY -m kernels bench --overhead >"$OUT/overhead.txt" 2>&1; echo "overhead rc=$?"
# quick: the bench-shape GPU tests repeat exactly what `verify` (same check_case) just did at those shapes
K=""; [ "${1:-}" = quick ] && K="not bench_shapes"
stamp pytest;  $PY -m pytest -q -p no:cacheprovider -rs -k "$K" $MINE >"$OUT/pytest.txt" 2>&1; echo "pytest rc=$?"
if [ "${1:-}" != quick ]; then
  stamp variants; $PY benchmarks/memvariants.py >"$OUT/memvariants.txt" 2>&1; echo "variants rc=$?"
fi
stamp done
echo "---- nvidia-smi";  cat "$OUT/nvidia-smi.csv"
echo "---- info";        $PY -c "import json,sys; d=json.load(open('$OUT/info.json')); print(d['device']['name'], d['peaks'])"
echo "---- verify";      $PY -c "
import json; d=json.load(open('$OUT/verify.json'))
print('ok', d['ok'], 'failed', d.get('failed_ops'), 'cases', len(d['results']), d.get('error', ''))
[print(' ', r['op'], r['dtype'], r['case'], r['rel_err'], r.get('error', '')) for r in d['results'] if not r['ok']]"
echo "---- pytest";      tail -4 "$OUT/pytest.txt"
echo "---- overhead";    cat "$OUT/overhead.txt"
[ -f "$OUT/memvariants.txt" ] && { echo "---- variants"; cat "$OUT/memvariants.txt"; }
echo "---- bench";       grep -v "^  bench " "$OUT/bench.txt"
