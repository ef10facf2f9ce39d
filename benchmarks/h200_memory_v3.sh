#!/usr/bin/env bash
# v3 of the memory-bound ops on the H200 (benchmarks/notes-memory.md, "v3"): 16-byte vector loads for fp16
# and the one-launch clip_grad_norm, verified and timed against CuPy, then every old and new path side by
# side on the same buffers. Short tables last. Budget: ~120 s on the H200, numba compiles included.
# Run from the repo root with PYTHONPATH already pointing at the numpy 2.4 wheel (the device notes' line):
#   OUT=/some/dir bash benchmarks/h200_memory_v3.sh
# Writes under $OUT: verify-v3.json, memory-v3.json (+ .txt), variants-v3.json (+ .txt).
set -uo pipefail
OUT=${OUT:-/tmp/solfleet-v3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
OPS=residual_add,rmsnorm,layernorm,softmax,cast,clip_grad_norm
t0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
$PY -c "import numpy, sys; sys.exit(0 if tuple(map(int, numpy.__version__.split('.')[:2])) < (2, 5) else 1)" \
  || { echo "numpy >= 2.5 breaks numba-cuda 0.30.4: install the carried 2.4 wheel first (device notes)"; exit 2; }

stamp verify
timeout 50 $PY -m kernels verify --ops $OPS --json >"$OUT/verify-v3.json"; echo "verify rc=$?"
stamp bench
timeout 50 $PY -m kernels bench --ops $OPS --compare cupy --out "$OUT/memory-v3.json" >"$OUT/memory-v3.txt" 2>&1
echo "bench rc=$?"
stamp variants
# every path of every op at the bench shape, on the same device buffers, one process: v2 ("scalar" /
# "split") against v3 ("vector" / "fused" / "fused_vector"); each result checked against float64
timeout 45 $PY - "$OUT/variants-v3.json" >"$OUT/variants-v3.txt" 2>&1 <<'EOF'
import json, sys
import numpy as np
from numba import cuda
from kernels import bench
from kernels.registry import all_ops
from kernels.ops.clip_grad_norm import _grads, clip_grad_norm
from kernels.ops.layernorm import layernorm
from kernels.ops.residual_add import residual_add
from kernels.ops.rmsnorm import rmsnorm
from kernels.ops.softmax import softmax

ROW = ("scalar", "vector")
CALLS = {
    "residual_add": (ROW, lambda a, p: residual_add(a["x"], a["r"], a["out"], path=p)),
    "rmsnorm": (ROW, lambda a, p: rmsnorm(a["x"], a["weight"], a["out"], eps=a["eps"], path=p)),
    "layernorm": (ROW, lambda a, p: layernorm(a["x"], a["weight"], a["bias"], a["out"], eps=a["eps"], path=p)),
    "softmax": (ROW, lambda a, p: softmax(a["x"], a["out"], path=p)),
    "clip_grad_norm": (("split", "fused", "fused_vector"),
                       lambda a, p: clip_grad_norm(_grads(a), a["max_norm"], norm_out=a["norm"], path=p)),
}
rows, rng = [], np.random.default_rng(7)
for name, (paths, call) in CALLS.items():
    spec = all_ops()[name]
    for case in spec.bench_cases:
        problem = spec.make_problem(case, rng)
        base = bench.stage(problem)
        sets = [base, bench._clone(base)]
        pristine = {n: bench._clone({n: base[n]})[n] for n in problem.inplace}
        def restore(args):
            for n, src in pristine.items():
                args[n].copy_to_device(src)
        for p in paths:
            try:
                us = bench._time_calls(lambda a: call(a, p), sets, restore if pristine else None, 10)
                err = bench._check(problem.reference, sets[(bench.WARMUP + 9) % 2])
                st = bench._stats(us)
                gbs = spec.bytes(case) / (st["median_us"] * 1e-6) / 1e9
                rows.append({"op": name, "dtype": case.dtype, "path": p, **st, "gbs": round(gbs, 1),
                             "rel_err": err, "ok": err is not None and err <= spec.tolerance[case.dtype]})
            except Exception as e:  # report the path, keep timing the others
                rows.append({"op": name, "dtype": case.dtype, "path": p, "ok": False, "error": f"{type(e).__name__}: {e}"})
            print(rows[-1], flush=True)
        del sets, base, pristine
        cuda.current_context().deallocations.clear()
json.dump({"results": rows}, open(sys.argv[1], "w"), indent=1)
EOF
echo "variants rc=$?"
stamp done

echo "---- verify"
$PY -c "
import json; d=json.load(open('$OUT/verify-v3.json'))
print('ok', d['ok'], 'cases', len(d['results']), 'failed', [(r['op'], r['dtype'], r['case'], r.get('error', r['rel_err'])) for r in d['results'] if not r['ok']])" \
  2>&1 | tail -3
echo "---- bench vs CuPy (SOL against the measured copy)"
$PY -c "
import json; d=json.load(open('$OUT/memory-v3.json')); print('copy GB/s', d['peaks'].get('mem_gbs'))
for r in d['results']:
    print(f\"{r['op']:15s} {r['dtype']:8s} {r.get('path', '-'):13s} {r.get('median_us', 0):8.1f} us {r.get('gbs', 0):7.0f} GB/s\"
          f\" SOL {r.get('sol') or 0:.2f} x{r.get('ratio_vs_cupy', 0):.2f} ok={r['ok']} {r.get('error', '')}\")" 2>&1 | tail -14
echo "---- old vs new paths (median us, GB/s)"
$PY -c "
import json; d=json.load(open('$OUT/variants-v3.json'))
for r in d['results']:
    print(f\"{r['op']:15s} {r['dtype']:8s} {r['path']:13s} {r.get('median_us', 0):8.1f} us {r.get('gbs', 0):7.0f} GB/s ok={r['ok']} {r.get('error', '')}\")" \
  2>&1 | tail -24
