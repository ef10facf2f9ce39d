#!/usr/bin/env bash
# One device call on the H200 for issue 13's LLM-op slice: `verify` of the LLM ops at their GPU verify shapes
# (fp32, fp16 and bf16, NaN/inf cases included; VERIFY=0 skips it), then benchmarks/h200_llm.py: ours vs torch
# eager vs Liger-Kernel at the bench shapes and a bf16 width sweep of the row ops, calls interleaved with the
# shared harness, one process, a short table last.
# Run from the repo root:   OUT=/some/dir bash benchmarks/h200_llm.sh
#   PY=/opt/torch/.venv/bin/python3 by default (the H200 image's torch and Triton); DRY_RUN=1: the same steps
#   under the CUDA simulator at the tiny sim shapes, untimed and without torch (the plumbing, on a CPU machine).
# Needs in .whl/: numpy-2.4*cp312*manylinux*x86_64.whl (the image's numpy 2.5 breaks numba-cuda 0.30.4), and
# in .whl/bench/: liger_kernel-*.whl (pure Python over the image's Triton). Deadlines from the start: verify
# 150 s, bench BENCH_DEADLINE (480 s; 387 s on an H100, 2026-12-02); BENCH_ARGS go to h200_llm.py;
# VERIFY_OPS: the ops to verify (default: all eight).
set -uo pipefail
OUT=${OUT:-/tmp/h200-llm}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/h200-llm-cache} PYTHONPATH=$PWD
t0=$(date +%s)
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }  # seconds to the step's deadline
if [ "${DRY_RUN:-0}" = 1 ]; then
  export NUMBA_ENABLE_CUDASIM=1
  PY=${PY:-python3}
  echo "dry run: CUDA simulator, sim shapes, no timing, no torch" >"$OUT/nvidia-smi.csv"
else
  PY=${PY:-/opt/torch/.venv/bin/python3}
  timeout 15 nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
    --format=csv >"$OUT/nvidia-smi.csv" 2>&1
  SITE=/tmp/h200-llm-site
  if timeout 30 $PY -c "import sys, numpy; sys.exit(0 if tuple(map(int, numpy.__version__.split('.')[:2])) >= (2, 5) else 1)"; then
    WHL=$(ls .whl/numpy-2.4*cp312*manylinux*x86_64*.whl 2>/dev/null | head -1)
    if [ -z "$WHL" ]; then echo "the image's numpy breaks numba-cuda 0.30.4 and no .whl/numpy-2.4*cp312*.whl was carried"; exit 2; fi
    mkdir -p "$SITE" && timeout 60 $PY -m zipfile -e "$WHL" "$SITE" || exit 2
  fi
  for w in .whl/bench/liger_kernel-*.whl; do [ -f "$w" ] && mkdir -p "$SITE" && timeout 30 $PY -m zipfile -e "$w" "$SITE"; done
  [ -d "$SITE" ] && export PYTHONPATH="$SITE:$PYTHONPATH"
  timeout 30 $PY -c "import numpy, numba, ml_dtypes, torch, liger_kernel; print('numpy', numpy.__version__, 'numba', numba.__version__, 'ml_dtypes', ml_dtypes.__version__, 'torch', torch.__version__)" 2>&1 | tail -2
fi
OPS=${VERIFY_OPS:-rmsnorm,layernorm,softmax,fused_add_rmsnorm,swiglu,rope,cast_fp8,residual_add}
if [ "${VERIFY:-1}" != 0 ]; then
timeout "$(left 150)" $PY -m kernels verify --ops $OPS --shapes verify --json \
  >"$OUT/verify.json" 2>"$OUT/verify.err"
echo "== verify rc=$? after $(( $(date +%s) - t0 )) s"
timeout 20 $PY - "$OUT/verify.json" <<'PYEOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("verify: no JSON:", e); sys.exit(0)
res = d.get("results", [])
print(f"verify ok={d.get('ok')} simulated={d.get('simulated')} {sum(r['ok'] for r in res)}/{len(res)} cases; "
      f"error={d.get('error')}")
worst = {}
for r in res:
    if r["dtype"] == "bfloat16" and r.get("rel_err") is not None:
        w = worst.setdefault(r["op"], [0.0, 0.0])
        w[0], w[1] = max(w[0], r["rel_err"]), max(w[1], r.get("elem_err") or 0.0)
    if not r["ok"]:
        print(f"  {r['op']:10} {r['dtype']:9} {r['case']:14} {str(r.get('path')):9} ok={r['ok']} "
              f"rel={r['rel_err']} elem={r.get('elem_err')} {r.get('error') or ''}")
for op, (rel, elem) in sorted(worst.items()):
    print(f"  worst bf16 {op:17} rel {rel:.3e} elem {elem:.3e}")
PYEOF
tail -3 "$OUT/verify.err"
fi
timeout "$(left ${BENCH_DEADLINE:-480})" $PY benchmarks/h200_llm.py --out "$OUT" ${BENCH_ARGS:-} >"$OUT/bench.txt" 2>&1
echo "== bench rc=$? after $(( $(date +%s) - t0 )) s"
grep -E "ERROR|Traceback" "$OUT/bench.txt" | head -10
[ "${DRY_RUN:-0}" = 1 ] || timeout 15 nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
  --format=csv,noheader >>"$OUT/nvidia-smi.csv" 2>&1
echo "---- nvidia-smi (before, after)"; cat "$OUT/nvidia-smi.csv"
echo "---- table"; sed -n '/^op /,$p' "$OUT/bench.txt"
[ -n "$(sed -n '/^op /p' "$OUT/bench.txt")" ] || tail -30 "$OUT/bench.txt"
exit 0
