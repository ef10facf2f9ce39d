#!/usr/bin/env bash
# v3 of the memory-bound ops on the H200 (benchmarks/notes-memory.md, "v3"): 16-byte vector loads for fp16
# and the one-launch clip_grad_norm, verified and timed against CuPy, then every old and new path
# side by side on the same buffers. Short tables last. Expected ~130 s on the H200 (numba compiles in each
# of the three processes; host-side float64 references for bench and verify), at most 185 s (the timeouts).
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

# the bench first: it is the measurement, and it checks every timed output against float64 too
stamp bench
timeout 75 $PY -m kernels bench --ops $OPS --compare cupy --out "$OUT/memory-v3.json" >"$OUT/memory-v3.txt" 2>&1
echo "bench rc=$?"
stamp verify
timeout 70 $PY -m kernels verify --ops $OPS --json >"$OUT/verify-v3.json"; echo "verify rc=$?"
stamp variants
# every path of every op at the bench shape, on the same device buffers, one process: v2 ("scalar" /
# "split") against v3 ("vector" / "fused" / "fused_vector"). Inputs are made on the device by CuPy (host
# generation of 67 M-element arrays and float64 references would cost ~2 s a case; verify and bench above
# check every auto path against float64); each path's result is compared with the first path's.
timeout 40 $PY - "$OUT/variants-v3.json" >"$OUT/variants-v3.txt" 2>&1 <<'EOF'
import json, sys, time
import cupy as cp
from kernels.registry import all_ops
from kernels.ops.clip_grad_norm import clip_grad_norm
from kernels.ops.layernorm import layernorm
from kernels.ops.residual_add import residual_add
from kernels.ops.rmsnorm import rmsnorm
from kernels.ops.softmax import softmax

ROW = ("scalar", "vector")
CALLS = {  # op -> (paths, call(args, path), names of the results to compare across paths)
    "residual_add": (ROW, lambda a, p: residual_add(a["x"], a["r"], a["out"], path=p), ("out",)),
    "rmsnorm": (ROW, lambda a, p: rmsnorm(a["x"], a["w"], a["out"], path=p), ("out",)),
    "layernorm": (ROW, lambda a, p: layernorm(a["x"], a["w"], a["b"], a["out"], path=p), ("out",)),
    "softmax": (ROW, lambda a, p: softmax(a["x"], a["out"], path=p), ("out",)),
    "clip_grad_norm": (("split", "fused", "fused_vector"),
                       lambda a, p: clip_grad_norm(a["g"], a["max_norm"], norm_out=a["norm"], path=p), ("g", "norm")),
}


def inputs(name, case):  # device-side random inputs: no host generation, no float64 reference (verify did that)
    dt, P = case.dtype, case.params
    rnd = lambda *s: cp.random.standard_normal(s, dtype=cp.float32).astype(dt)
    if name == "clip_grad_norm":
        g = [(rnd(P["elems"] + 7 * k) * 0.1).astype(dt) for k in range(P["count"])]
        tot = float(cp.sqrt(sum(cp.sum(x.astype(cp.float32) ** 2) for x in g)))
        return {"g": g, "max_norm": tot / 2, "norm": cp.zeros(1, cp.float32)}, ("g",)
    m, n = P["rows"], P["cols"]
    return {"x": rnd(m, n), "r": rnd(m, n), "w": rnd(n), "b": rnd(n), "out": cp.empty((m, n), dt)}, ()


def flat(a, names):
    parts = [a[k] if not isinstance(a[k], list) else cp.concatenate(a[k]) for k in names]
    return cp.concatenate([p.ravel().astype(cp.float64) for p in parts])


rows = []
for name, (paths, call, results) in CALLS.items():
    spec = all_ops()[name]
    for case in spec.bench_cases:
        a, inplace = inputs(name, case)
        pristine = {k: [x.copy() for x in a[k]] for k in inplace}
        def restore():
            for k, xs in pristine.items():
                for dst, src in zip(a[k], xs):
                    dst[...] = src
        first = None
        for p in paths:
            row = {"op": name, "dtype": case.dtype, "case": case.label, "path": p}
            try:
                us = []
                for i in range(13):
                    restore()
                    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                    e0.record(); call(a, p); e1.record(); e1.synchronize()
                    if i >= 3:
                        us.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
                restore(); call(a, p); cp.cuda.Device().synchronize()
                got = flat(a, results)
                first = got if first is None else first
                us.sort()
                med = us[len(us) // 2]
                row.update(median_us=round(med, 1), p10_us=round(us[1], 1), p90_us=round(us[-2], 1),
                           gbs=round(spec.bytes(case) / (med * 1e-6) / 1e9, 1),
                           rel_diff_vs_first_path=float(cp.linalg.norm(got - first) / cp.linalg.norm(first)),
                           ok=True)
            except Exception as e:  # report the path, keep timing the others
                row.update(ok=False, error=f"{type(e).__name__}: {e}")
            rows.append(row)
            print(row, flush=True)
            json.dump({"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "results": rows},
                      open(sys.argv[1], "w"), indent=1)
        del a, pristine, first
        cp.get_default_memory_pool().free_all_blocks()
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
    print(f\"{r['op']:15s} {r['dtype']:8s} {r['path']:13s} {r.get('median_us', 0):8.1f} us {r.get('gbs', 0):7.0f} GB/s\"
          f\" diff {r.get('rel_diff_vs_first_path', -1):.1e} ok={r['ok']} {r.get('error', '')}\")" 2>&1 | tail -24
