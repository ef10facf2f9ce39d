# ruff: noqa: B023, E501  (a probe: each lambda is timed within its own loop iteration)
"""A/B probe (GPU only, not shipped): the bf16 / fp16 vector row kernels (the op's own BLOCK x PER kernel, or a
kernels.ops.rows.WIDE_ROWS shape past it) against path="scalar" (the register kernel up to BLOCK x PER
columns, streaming past it), interleaved call by call in one process, at the width sweep of
benchmarks/h200_llm.py (2^25 elements per operand) and the 16384 x 4096 bench shape. Also residual_add
bf16 vector vs scalar. Every timed output is checked against the other path's (they must agree to the bf16
tolerance). Prints one line per case and a JSON list to $OUT/wide_rows_ab.json. AB_COLS, AB_DTYPES: the
sweep's widths and dtypes; AB_RESIDUAL=0 leaves residual_add out.

    PYTHONPATH=<numpy 2.4 site>:. python lab/wide_rows_ab.py
"""

from __future__ import annotations

import json
import os
import sys

import ml_dtypes
import numpy as np
from numba import cuda

from kernels.ops.layernorm import layernorm
from kernels.ops.residual_add import residual_add
from kernels.ops.rmsnorm import rmsnorm
from kernels.ops.softmax import softmax
from kernels.runtime import arrays

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
ELEMS = int(os.environ.get("AB_ELEMS", 1 << 25))  # AB_ELEMS=4096 for a simulator smoke run
ITERS, WARMUP, SETS = 30, 5, 3


def timed(calls: list, iters: int = ITERS) -> list[float]:
    ev: list[list] = [[] for _ in calls]
    for i in range(WARMUP + iters):
        for j, c in enumerate(calls):
            a, b = cuda.event(), cuda.event()
            a.record()
            c(i % SETS)
            b.record()
            if i >= WARMUP:
                ev[j].append((a, b))
    cuda.synchronize()
    return [float(np.median([a.elapsed_time(b) * 1e3 for a, b in e])) for e in ev]


def copy_gbs() -> float:
    """The SOL ceiling benchmarks/h200_llm.py uses: kernels.runtime.device.peaks()["mem_gbs"] (a numba copy
    kernel; cudaMemcpy DtoD, which copy_to_device issues, measured ~3.0 TB/s there, ~1.0 here)."""
    from kernels.runtime.device import peaks

    return float(peaks()["mem_gbs"] or 1.0)


def main() -> int:
    out_dir = os.environ.get("OUT", ".")
    rng = np.random.default_rng(0)
    gbs = copy_gbs()
    print(f"copy {gbs:.0f} GB/s")
    rows_out = []
    cols = [int(c) for c in os.environ.get("AB_COLS", "1024,4096,5120,8192,16384,32768").split(",")]
    # AB_DTYPES: the sweep's dtypes (default bf16); past 32768 columns (32768 / 4096 in fp32) "vector" is the
    # 16-byte streaming kernel (kernels.ops.rows.STREAM_ROWS) and "scalar" the scalar streaming one
    sweep = [np.dtype(BF16 if d == "bfloat16" else d) for d in os.environ.get("AB_DTYPES", "bfloat16").split(",")]
    cases = [(F16, 2 * ELEMS // 4096, 4096)] * (4096 in cols) + [(dt, ELEMS // n, n) for dt in sweep for n in cols]
    for op in ("rmsnorm", "layernorm", "softmax"):
        for dt, m, n in cases:
            xs = [arrays.to_device(rng.standard_normal((m, n)).astype(dt)) for _ in range(SETS)]
            w = arrays.to_device((1 + 0.1 * rng.standard_normal(n)).astype(dt))
            b = arrays.to_device((0.1 * rng.standard_normal(n)).astype(dt))
            outs = {p: [cuda.device_array((m, n), dt) for _ in range(SETS)] for p in ("vector", "scalar")}

            def call(p: str, op: str = op):  # type: ignore[no-untyped-def]
                if op == "rmsnorm":
                    return lambda s: rmsnorm(xs[s], w, outs[p][s], path=p)
                if op == "layernorm":
                    return lambda s: layernorm(xs[s], w, b, outs[p][s], path=p)
                return lambda s: softmax(xs[s], outs[p][s], path=p)

            tv, ts = timed([call("vector"), call("scalar")])
            v = arrays.to_host(outs["vector"][0]).astype(np.float64)
            s = arrays.to_host(outs["scalar"][0]).astype(np.float64)
            diff = float(np.abs(v - s).max() / max(np.abs(s).max(), 1e-30))
            nbytes = 2 * m * n * dt.itemsize
            r = {"op": op, "dtype": dt.name, "shape": f"{m}x{n}", "vector_us": round(tv, 2),
                 "scalar_us": round(ts, 2), "vector_sol": round(nbytes / tv / 1e3 / gbs, 3),
                 "scalar_sol": round(nbytes / ts / 1e3 / gbs, 3), "scalar_over_vector": round(ts / tv, 3),
                 "max_rel_diff": diff}  # fmt: skip
            rows_out.append(r)
            print(json.dumps(r), flush=True)
            del xs, outs
    ra = (2 * ELEMS // 4096, 4096)  # 16384 x 4096 at the default ELEMS
    for dt in (F16, BF16) if os.environ.get("AB_RESIDUAL", "1") == "1" else ():
        xs = [arrays.to_device(rng.standard_normal(ra).astype(dt)) for _ in range(SETS)]
        rs = [arrays.to_device(rng.standard_normal(ra).astype(dt)) for _ in range(SETS)]
        outs = {p: [cuda.device_array(ra, dt) for _ in range(SETS)] for p in ("vector", "scalar")}
        tv, ts = timed([lambda s: residual_add(xs[s], rs[s], outs["vector"][s], path="vector"),
                        lambda s: residual_add(xs[s], rs[s], outs["scalar"][s], path="scalar")])  # fmt: skip
        same = bool(np.array_equal(arrays.to_host(outs["vector"][0]).view(np.uint16),
                                   arrays.to_host(outs["scalar"][0]).view(np.uint16)))  # fmt: skip
        nbytes = 3 * ra[0] * ra[1] * dt.itemsize
        r = {"op": "residual_add", "dtype": dt.name, "shape": f"{ra[0]}x{ra[1]}", "vector_us": round(tv, 2),
             "scalar_us": round(ts, 2), "vector_sol": round(nbytes / tv / 1e3 / gbs, 3),
             "scalar_sol": round(nbytes / ts / 1e3 / gbs, 3), "scalar_over_vector": round(ts / tv, 3),
             "bit_identical": same}  # fmt: skip
        rows_out.append(r)
        print(json.dumps(r), flush=True)
    with open(os.path.join(out_dir, "wide_rows_ab.json"), "w") as f:
        json.dump(
            {"copy_gbs": gbs, "device": str(cuda.get_current_device().name), "rows": rows_out},
            f,
            indent=1,
        )
    print(
        f"{'op':10s} {'dtype':9s} {'shape':11s} {'vector':>8s} {'scalar':>8s} {'v sol':>6s} {'s sol':>6s} s/v"
    )
    for r in rows_out:
        print(
            f"{r['op']:10s} {r['dtype']:9s} {r['shape']:11s} {r['vector_us']:8.1f} {r['scalar_us']:8.1f} "
            f"{r['vector_sol']:6.3f} {r['scalar_sol']:6.3f} {r['scalar_over_vector']:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
