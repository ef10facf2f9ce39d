# ruff: noqa: B023, E501  (a check: each lambda is timed within its own loop iteration)
"""Check (not shipped): layernorm's wb_shared shape as the product runs it (rows.WIDE_WB_SHARED, through the
op's own launcher, `layernorm(path="vector")`) against the plain WIDE_ROWS kernel of its width (the kernel
it replaced, rows.plain_shape: `_K.wide_k`), interleaved call by call, every output against float64 and bit
for bit against the plain kernel's.

Why: the twenty-third session moved the twenty-second's `wb_early` probe (lab/layernorm_wb_smem_ab.py:
1.036-1.041x at 16384 on an H100, bit-equal) into kernels/ops/layernorm.py with no GPU lent; this is its
first run on one. Differences from the probe: the kernel keeps the shipped grid-stride loop (its weight and
bias copied once a block, before the first row), and rows of 8193-16383 columns (padding lanes) take it too.

Predictions (written before any run, 2026-12-07, twenty-third session): at 16384 the probe's figure, 1.03-1.04x
the plain kernel (0.90-0.91 of copy on an H100; on an H200 the same ratio or more: each SM moves 1.4x the
bytes, so the write pass's L2 round trips weigh more); at 12288 1.00-1.04x (2 blocks an SM as at 16384, the
same exposed round trips, fewer vectors a thread); at 8200 (the shape's narrowest row, 2 of every 4 vectors
of a thread padding) level (+-2 %). If 12288 or 8200 lose more than 1 %, WIDE_WB_SHARED takes 16384-column
rows only (a `from_cols`, as OnChipRows has).

    source benchmarks/h200_env.sh; OUT=$OUT $PY lab/layernorm_wb_shared_check.py   (WB_COLS, WB_DTYPES)
Under the simulator (NUMBA_ENABLE_CUDASIM=1) it checks correctness at its 512-column shape, no timing.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np
from numba import cuda

from kernels.ops import layernorm as ln
from kernels.ops.rows import WIDE_WB_SHARED, WithShared, for_machine, plain_shape, run_here
from kernels.runtime import arrays, device
from kernels.runtime.arrays import BF16, SIMULATED

ELEMS = 1 << 15 if SIMULATED else 1 << 25
SETS = 1 if SIMULATED else 4


def main() -> int:
    from kernels.harness.bench import time_interleaved

    out_dir = os.environ.get("OUT", ".")
    rng = np.random.default_rng(0)
    copy = 1.0 if SIMULATED else float(device.peaks()["mem_gbs"] or 1.0)
    shape = for_machine(WIDE_WB_SHARED["layernorm"][0])
    plain = plain_shape(shape)
    default = f"{shape.cols},{shape.cols * 3 // 4},{plain.cols // 2 + 8}" if SIMULATED else "16384,12288,8200"
    cols = [int(c) for c in os.environ.get("WB_COLS", default).split(",")]
    dts = [np.dtype(BF16 if d == "bfloat16" else d) for d in os.environ.get("WB_DTYPES", "bfloat16,float16").split(",")]
    report: dict[str, Any] = {"device": device.describe().get("name"), "copy_gbs": copy, "rows": []}
    ok = True
    print(f"copy {copy:.0f} GB/s on {report['device']}")
    for dt in dts:
        if run_here(shape, dt) != shape:
            print(f"{dt.name}: this device cannot hold {shape.label} (wb_shared_fits); nothing to time")
            ok = False
            continue
        for n in cols:
            m = max(ELEMS // n, 1)
            k, threads, grid = ln._K.pick("vector", dt, True, n, m)
            runs_it = isinstance(k, WithShared) and k.kernel is ln._K.wide_k[(dt, shape)] and threads == shape.threads
            if not runs_it and not SIMULATED:  # (the simulator's launcher runs its 512 columns with the op's own kernel)
                print(f"layernorm {dt.name} {m}x{n}: the launcher does not take {shape.label}; FAILED")
                ok = False
                continue
            kp = ln._K.wide_k[(dt, plain)]
            if not SIMULATED:  # the driver's answer: the measured 2 blocks an SM with 64 KB each
                resident = ln._K.wide_k[(dt, shape)].resident_blocks(shape.threads, shape.wb_shared_bytes(dt.itemsize))
                print(f"{dt.name} {shape.label}: {resident} resident blocks an SM (min_blocks {shape.min_blocks})")
                ok &= resident >= shape.min_blocks
            xs_h = [(rng.standard_normal((m, n)) * 2 + 0.5).astype(dt) for _ in range(SETS)]
            w_h = (1 + 0.5 * rng.standard_normal(n)).astype(dt)
            b_h = (0.5 * rng.standard_normal(n)).astype(dt)
            xs = [arrays.to_device(x) for x in xs_h]
            w, b = arrays.to_device(w_h), arrays.to_device(b_h)
            names = ("wb_shared", "plain")
            outs = {p: [arrays.to_device(np.zeros((m, n), dt)) for _ in range(SETS)] for p in names}
            eps = 1e-5

            def call(p: str, s: int) -> None:
                if p == "wb_shared" and not SIMULATED:
                    ln.layernorm(xs[s], w, b, outs[p][s], eps=eps, path="vector")
                    return
                kk = kp if p == "plain" else WithShared(ln._K.wide_k[(dt, shape)], shape.wb_shared_bytes(dt.itemsize))
                named = (("x", xs[s]), ("weight", w), ("bias", b), ("out", outs[p][s]))
                ops = [arrays.operand(nm, a, None) for nm, a in named]
                kk.launch(min(m, 2**31 - 1), shape.threads, (arrays.as_rows(ops[0]), ops[1], ops[2], arrays.as_rows(ops[3]), np.float32(eps)))

            for p in names:
                for s in range(SETS):
                    call(p, s)
            cuda.synchronize()
            if SIMULATED:
                t = [[1.0], [1.0]]
            else:
                t = time_interleaved([(lambda a, p=p: call(p, a["s"]), [{"s": s} for s in range(SETS)], None) for p in names], 30)
            worst, same = 0.0, True
            for s in range(SETS):
                got = arrays.to_host(outs["wb_shared"][s])
                ref = ln.reference(xs_h[s].astype(np.float64), w_h.astype(np.float64), b_h.astype(np.float64), eps)
                worst = max(worst, float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max()))
                same &= bool(np.array_equal(got.view(np.uint16), arrays.to_host(outs["plain"][s]).view(np.uint16)))
            ok &= worst < 8e-3 and same
            us = {p: float(np.median(t[i])) for i, p in enumerate(names)}
            nbytes = 2 * m * n * dt.itemsize
            r = {"op": "layernorm", "dtype": dt.name, "rows": m, "cols": n, "shape": shape.label,
                 "us": {p: round(us[p], 2) for p in names}, "of_copy": {p: round(nbytes / us[p] / 1e3 / copy, 3) for p in names},
                 "x_plain": round(us["plain"] / us["wb_shared"], 3), "max_rel_err": worst, "bits_equal_plain": same}  # fmt: skip
            report["rows"].append(r)
            print(json.dumps(r), flush=True)
    with open(os.path.join(out_dir, "layernorm_wb_shared_check.json"), "w") as fh:
        json.dump(report, fh, indent=1)
    print(f"{'dtype':9} {'rows x cols':13} {'plain us':>9} {'of copy':>7} {'wb us':>8} {'of copy':>7} {'x plain':>7} bits  err")
    for r in report["rows"]:
        print(f"{r['dtype']:9} {r['rows']:>5}x{r['cols']:<7} {r['us']['plain']:9.2f} {r['of_copy']['plain']:7.3f} {r['us']['wb_shared']:8.2f} "
              f"{r['of_copy']['wb_shared']:7.3f} {r['x_plain']:7.3f} {r['bits_equal_plain']!s:5} {r['max_rel_err']:.1e}")  # fmt: skip
    print("all outputs within tolerance and bit-equal to the plain kernel" if ok else "SOME CHECK FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
