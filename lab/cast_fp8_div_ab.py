# ruff: noqa: B023, E501  (a probe: each lambda is timed within its own loop iteration)
"""A/B probe (GPU only, not shipped): cast_fp8's vector kernels, each timed call the op's two launches (amax,
then cast), interleaved call by call:

  before        the kernels as they were: a per-element IEEE division x / scale in the cast (div.rn.f32: 36
                in the PTX of one thread's tile, ~8 SASS instructions each plus a slow-path check; 55
                registers), no launch bounds (bf16's amax at 40 registers: 6 of 8 blocks per SM resident)
  after         the product: one reciprocal per block and a correction to the exact quotient
                (kernels.primitives.fp8.quotient), launch_bounds(256, 8) on both kernels (32 registers):
                    inv = 1 / scale; q0 = x * inv; r = fma(-q0, scale, x); q = fma(r, inv, q0)
  quot-nobound  the product's cast and the old amax, both without launch bounds (splits the two changes)
  mul (bound)   x * inv: not the op's arithmetic, an upper bound (its codes may differ at ties)

Checks: every variant's codes against kernels.ops.cast_fp8.reference on two of the timed inputs, the first
holding x whose quotients fall on, and one float32 ulp either side of, every e4m3 rounding midpoint.
2^26 elements (16384 x 4096), 3 input sets, medians of 30 CUDA-event timings.

    PYTHONPATH=<numpy 2.4 site>:. OUT=dir python lab/cast_fp8_div_ab.py
"""

from __future__ import annotations

import json
import os
import sys

import ml_dtypes
import numpy as np
from numba import cuda
from wide_rows_ab import SETS, copy_gbs, timed

from kernels.ops import cast_fp8 as C
from kernels.primitives.fp8 import e4m3x4
from kernels.runtime import arrays
from kernels.runtime.arrays import HostSync
from kernels.runtime.launch import context, kernel

FP8 = np.dtype(ml_dtypes.float8_e4m3fn)


@cuda.jit(device=True, inline="always")
def pack8_div(a, off, scale, inv):  # type: ignore[no-untyped-def]
    lo = e4m3x4(a[off] / scale, a[off + 1] / scale, a[off + 2] / scale, a[off + 3] / scale)
    hi = e4m3x4(a[off + 4] / scale, a[off + 5] / scale, a[off + 6] / scale, a[off + 7] / scale)
    return lo, hi


@cuda.jit(device=True, inline="always")
def pack8_mul(a, off, scale, inv):  # type: ignore[no-untyped-def]
    lo = e4m3x4(a[off] * inv, a[off + 1] * inv, a[off + 2] * inv, a[off + 3] * inv)
    hi = e4m3x4(a[off + 4] * inv, a[off + 5] * inv, a[off + 6] * inv, a[off + 7] * inv)
    return lo, hi


def adversarial(dt: np.dtype, n: int) -> np.ndarray:
    """x with amax 448 * 4 (scale 4) whose quotients x / 4 sit on and one float32 ulp around each e4m3
    midpoint, in dtype dt (values not representable in dt are rounded by the cast, still near midpoints)."""
    codes = np.arange(0, 0x7F, dtype=np.uint8).view(FP8).astype(np.float64)  # 0 .. 448, finite, >= 0
    mids = (codes[:-1] + codes[1:]) / 2
    mids32 = mids.astype(np.float32)
    around = np.concatenate([np.nextafter(mids32, np.float32(-np.inf)), mids32, np.nextafter(mids32, np.float32(np.inf))])
    vals = np.concatenate([[448.0], around, -around]).astype(np.float32) * np.float32(4.0)
    x = np.resize(vals, n).astype(dt)
    x[0] = dt.type(1792.0)
    return x


def main() -> int:
    out_dir = os.environ.get("OUT", ".")
    gbs = copy_gbs()
    rng = np.random.default_rng(0)
    m, n = (16384, 4096) if len(sys.argv) < 2 else (int(sys.argv[1]), int(sys.argv[2]))
    ctx = context()
    cvt = C.hardware_cvt(ctx)
    rows = []
    for dt in (C.BF16, C.F16, C.F32):
        sig_a, sig_c = C._AMAX_SIGS[dt], C._CAST_SIGS[dt]
        amax_lb = C._AMAX_VEC[dt]  # the product's: launch_bounds(THREADS, BLOCKS_PER_SM)
        amax_free = kernel(cuda.jit(C._AMAX_VEC_FNS[dt].py_func), sig_a)  # as before: no launch bounds
        cast_div = C._make_cast_vec(C._LOAD[dt], C.WIDTH[dt], C.GROUPS[dt], pack8_div)
        cast_mul = C._make_cast_vec(C._LOAD[dt], C.WIDTH[dt], C.GROUPS[dt], pack8_mul)
        variants = {  # (amax kernel, cast kernel)
            "before": (amax_free, kernel(cuda.jit(cast_div.py_func), sig_c)),  # division, no bounds
            "after": (amax_lb, C._CAST_VEC[(dt, cvt)]),  # the product: quotient, bounds
            "quot-nobound": (amax_free, kernel(cuda.jit(C._CAST_VEC_FNS[(dt, cvt)].py_func), sig_c)),
            "mul (bound)": (amax_lb, kernel(cast_mul, sig_c)),
        }
        xs_h = [(3 * rng.standard_normal(m * n)).astype(dt) for _ in range(SETS)]
        xs_h[0][: 4096] = adversarial(dt, 4096)
        xs = [arrays.to_device(h) for h in xs_h]
        sync = HostSync()
        op = lambda name, d: arrays.operand(name, d, sync)  # noqa: E731  (the launch's pointer + shape)
        xo = [op("x", d) for d in xs]
        g = C.parts(ctx)
        per = C.GROUP * C.GROUPS[dt]
        grid = max(1, min(g, (m * n + C.THREADS * per - 1) // (C.THREADS * per)))
        ws = {k: op("workspace", cuda.device_array(g, np.uint32)) for k in variants}
        outs = {k: [cuda.device_array(m * n, np.uint8) for _ in range(SETS)] for k in variants}
        oo = {k: [op("out", d) for d in outs[k]] for k in variants}
        so = {k: op("scale_out", cuda.device_array(1, np.float32)) for k in variants}
        def call(k):  # type: ignore[no-untyped-def]
            amax, cast = variants[k]
            return lambda s: (amax.launch(grid, C.THREADS, (xo[s], ws[k])),
                              cast.launch(grid, C.THREADS, (xo[s], ws[k], grid, oo[k][s], so[k])))

        names = list(variants)
        ts = timed([call(k) for k in names])
        nbytes = m * n * (2 * dt.itemsize + 1)  # amax reads x, the cast reads x and writes one byte each
        checks = {}
        for s in (0, 1):
            ref, _ = C.reference(xs_h[s])
            want = ref.view(np.uint8)
            for k in names:
                call(k)(s)
                got = outs[k][s].copy_to_host()
                bad = int(np.count_nonzero(got != want))
                checks.setdefault(k, 0)
                checks[k] += bad
        for k, t in zip(names, ts, strict=True):
            r = {"dtype": dt.name, "shape": f"{m}x{n}", "variant": k, "us": round(t, 2),
                 "sol": round(nbytes / t / 1e3 / gbs, 3), "x_before": round(ts[0] / t, 3), "codes_differing": checks[k]}
            rows.append(r)
            print(json.dumps(r), flush=True)
    with open(os.path.join(out_dir, "cast_fp8_div_ab.json"), "w") as f:
        json.dump({"copy_gbs": gbs, "device": str(cuda.get_current_device().name), "rows": rows}, f, indent=1)
    print(f"{'dtype':9s} {'variant':12s} {'us':>8s} {'sol':>6s} {'x before':>8s} codes-differing")
    for r in rows:
        print(f"{r['dtype']:9s} {r['variant']:12s} {r['us']:8.1f} {r['sol']:6.3f} {r['x_before']:8.3f} {r['codes_differing']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
