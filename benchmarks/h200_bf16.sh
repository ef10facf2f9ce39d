#!/usr/bin/env bash
# One device call on the H200 for issue 13's first slice: `verify` of gemm, o_proj (wgmma on cc 9.0, fp16 and
# bf16), residual_add and cast_bf16 at their GPU verify shapes, then benchmarks/h200_bf16.py: ours vs cuBLAS
# (torch) for gemm / o_proj and torch eager for the bf16 memory-bound ops, one process, a short table last.
# Run from the repo root:   OUT=/some/dir bash benchmarks/h200_bf16.sh
# Needs in .whl/: numpy-2.4*cp312*manylinux*x86_64.whl (the image's numpy 2.5 breaks numba-cuda 0.30.4) and
# ml_dtypes-*cp312*.whl. Expected ~2-3 min (numba + NVRTC + LTO compiles dominate); hard limits 230 s total.
set -uo pipefail
OUT=${OUT:-/tmp/h200-bf16}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/h200-bf16-cache} PYTHONPATH=$PWD
PY=${PY:-python3}
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  >"$OUT/nvidia-smi.csv" 2>&1
SITE=/tmp/h200-bf16-site
if $PY -c "import sys, numpy; sys.exit(0 if tuple(map(int, numpy.__version__.split('.')[:2])) >= (2, 5) else 1)"; then
  WHL=$(ls .whl/numpy-2.4*cp312*manylinux*x86_64*.whl 2>/dev/null | head -1)
  if [ -z "$WHL" ]; then echo "the image's numpy breaks numba-cuda 0.30.4 and no .whl/numpy-2.4*cp312*.whl was carried"; exit 2; fi
  mkdir -p "$SITE" && $PY -m zipfile -e "$WHL" "$SITE" || exit 2
fi
for w in .whl/ml_dtypes-*cp312*.whl; do [ -f "$w" ] && mkdir -p "$SITE" && $PY -m zipfile -e "$w" "$SITE"; done
[ -d "$SITE" ] && export PYTHONPATH="$SITE:$PYTHONPATH"
$PY -c "import numpy, numba, ml_dtypes, torch; print('numpy', numpy.__version__, 'numba', numba.__version__, 'ml_dtypes', ml_dtypes.__version__, 'torch', torch.__version__)" 2>&1 | tail -2
timeout 130 $PY -m kernels verify --ops gemm,o_proj,residual_add,cast,cast_bf16 --shapes verify --json \
  >"$OUT/verify.json" 2>"$OUT/verify.err"
echo "== verify rc=$? after $(( $(date +%s) - t0 )) s"
$PY - "$OUT/verify.json" <<'PYEOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("verify: no JSON:", e); sys.exit(0)
res = d.get("results", [])
print(f"verify ok={d.get('ok')} {sum(r['ok'] for r in res)}/{len(res)} cases; error={d.get('error')}")
for r in res:
    if not r["ok"] or r["dtype"] == "bfloat16" or r.get("path") == "wgmma":
        print(f"  {r['op']:13} {r['dtype']:9} {r['case']:15} {str(r.get('path')):9} ok={r['ok']} "
              f"rel={r['rel_err']} elem={r.get('elem_err')} {r.get('error') or ''}")
PYEOF
tail -3 "$OUT/verify.err"
timeout $(( 225 - ($(date +%s) - t0) )) $PY benchmarks/h200_bf16.py --out "$OUT" >"$OUT/bench.txt" 2>&1
echo "== bench rc=$? after $(( $(date +%s) - t0 )) s"
grep -E "ERROR|Traceback" "$OUT/bench.txt" | head -10
echo "---- nvidia-smi"; cat "$OUT/nvidia-smi.csv"
echo "---- table"; sed -n '/^op /,$p' "$OUT/bench.txt"
[ -n "$(sed -n '/^op /p' "$OUT/bench.txt")" ] || tail -30 "$OUT/bench.txt"
exit 0
