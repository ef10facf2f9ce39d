# ruff: noqa: B023, E501  (a probe: each lambda is timed within its own loop iteration)
"""A/B probe (GPU only, not shipped): the 16-byte vector kernels of swiglu, fused_add_rmsnorm and rope against
path="scalar" (the kernels "auto" took before them), interleaved call by call in one process, CUDA events
per call, inputs rotated over SETS device copies, the median of ITERS calls. Shapes: the registry's bench
shapes (fp16 and bf16) and, for fused_add_rmsnorm, the bf16 width sweep of benchmarks/h200_llm.py (2^25
elements per operand, 1024 to 32768 columns). SOL = the op's byte model over kernels.runtime.device.peaks()
["mem_gbs"] (the copy ceiling benchmarks/h200_llm.py uses).

Checks, on fresh inputs after the timing: swiglu and rope, the two paths' outputs bit for bit; fused_add_rmsnorm,
the new residual bit for bit and `out` within the bf16 / fp16 tolerance of the scalar path's (the two sum the
squares in another order). In-place ops (rope's x, fused_add_rmsnorm's residual) are timed on drifting inputs
(a rotation keeps norms; the residual grows by x per call and stays finite). cast_fp8: the vector kernel
with the hardware cvt, with the integer conversion, and the scalar kernel, three ways, codes bit for bit
(no NaN in the inputs). Prints one line per case and writes $OUT/llm_vector_ab.json.

    PYTHONPATH=<numpy 2.4 site>:. python lab/llm_vector_ab.py
"""

from __future__ import annotations

import json
import os
import sys

import ml_dtypes
import numpy as np
from numba import cuda

from kernels.ops.fused_add_rmsnorm import fused_add_rmsnorm
from kernels.ops.rope import rope, tables
from kernels.ops.swiglu import swiglu
from kernels.runtime import arrays
from wide_rows_ab import SETS, timed  # the same interleaved CUDA-event timing (lab/ is on sys.path: the script's dir)

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
ELEMS = int(os.environ.get("AB_ELEMS", 1 << 25))  # AB_ELEMS=4096 AB_COLS=512: a simulator smoke run
SMALL = ELEMS < 1 << 20  # the smoke run's swiglu / rope shapes too
PATHS = ("vector", "scalar")


def host(d) -> np.ndarray:  # type: ignore[no-untyped-def]
    return np.asarray(arrays.to_host(d))


def row(op: str, dt: np.dtype, shape: str, nbytes: float, tv: float, ts: float, gbs: float, **check) -> dict:  # type: ignore[no-untyped-def]
    return {"op": op, "dtype": dt.name, "shape": shape, "vector_us": round(tv, 2), "scalar_us": round(ts, 2),
            "vector_sol": round(nbytes / tv / 1e3 / gbs, 3), "scalar_sol": round(nbytes / ts / 1e3 / gbs, 3),
            "scalar_over_vector": round(ts / tv, 3), **check}  # fmt: skip


def ab_swiglu(rng, gbs: float) -> list[dict]:  # type: ignore[no-untyped-def]
    out = []
    for dt in (F16, BF16):
        for m, n in ((16, 256), (8, 448)) if SMALL else ((16384, 4096), (4096, 14336)):
            a_s = [arrays.to_device((3 * rng.standard_normal((m, n))).astype(dt)) for _ in range(SETS)]
            b_s = [arrays.to_device(rng.standard_normal((m, n)).astype(dt)) for _ in range(SETS)]
            o = {p: [cuda.device_array((m, n), dt) for _ in range(SETS)] for p in PATHS}
            tv, ts = timed([lambda s: swiglu(a_s[s], b_s[s], o["vector"][s], path="vector"),
                            lambda s: swiglu(a_s[s], b_s[s], o["scalar"][s], path="scalar")])  # fmt: skip
            same = bool(np.array_equal(host(o["vector"][0]).view(np.uint16), host(o["scalar"][0]).view(np.uint16)))
            out.append(row("swiglu", dt, f"{m}x{n}", 3 * m * n * dt.itemsize, tv, ts, gbs, bit_identical=same))
            print(json.dumps(out[-1]), flush=True)
            del a_s, b_s, o
    return out


def ab_fused(rng, gbs: float) -> list[dict]:  # type: ignore[no-untyped-def]
    out = []
    cols = [int(c) for c in os.environ.get("AB_COLS", "1024,4096,5120,8192,16384,32768").split(",")]
    n16 = 512 if SMALL else 4096
    cases = [(F16, 2 * ELEMS // n16, n16)] + [(BF16, ELEMS // n, n) for n in cols]
    for dt, m, n in cases:
        xs = [arrays.to_device((2 * rng.standard_normal((m, n)) + 0.5).astype(dt)) for _ in range(SETS)]
        r0 = rng.standard_normal((m, n)).astype(dt)
        rs = {p: [arrays.to_device(r0) for _ in range(SETS)] for p in PATHS}
        w = arrays.to_device((1 + 0.5 * rng.standard_normal(n)).astype(dt))
        o = {p: [cuda.device_array((m, n), dt) for _ in range(SETS)] for p in PATHS}
        tv, ts = timed([lambda s: fused_add_rmsnorm(xs[s], rs["vector"][s], w, o["vector"][s], path="vector"),
                        lambda s: fused_add_rmsnorm(xs[s], rs["scalar"][s], w, o["scalar"][s], path="scalar")])  # fmt: skip
        fresh = {p: arrays.to_device(r0) for p in PATHS}
        for p in PATHS:
            fused_add_rmsnorm(xs[0], fresh[p], w, o[p][0], path=p)
        same_r = bool(np.array_equal(host(fresh["vector"]).view(np.uint16), host(fresh["scalar"]).view(np.uint16)))
        v, s = host(o["vector"][0]).astype(np.float64), host(o["scalar"][0]).astype(np.float64)
        diff = float(np.abs(v - s).max() / max(np.abs(s).max(), 1e-30))
        nbytes = (4 * m + 1) * n * dt.itemsize
        out.append(row("fused_add_rmsnorm", dt, f"{m}x{n}", nbytes, tv, ts, gbs, residual_bit_identical=same_r,
                       out_max_rel_diff=diff))  # fmt: skip
        print(json.dumps(out[-1]), flush=True)
        del xs, rs, o, fresh
    return out


def ab_rope(rng, gbs: float) -> list[dict]:  # type: ignore[no-untyped-def]
    out = []
    t, nh, d = (16, 4, 128) if SMALL else (16384, 32, 128)
    cos, sin = (arrays.to_device(a) for a in tables(rng.integers(0, 32768, t), d))
    for dt in (F16, BF16):
        x0 = rng.standard_normal((t, nh, d)).astype(dt)
        xs = {p: [arrays.to_device(x0) for _ in range(SETS)] for p in PATHS}
        tv, ts = timed([lambda s: rope(xs["vector"][s], cos, sin, path="vector"),
                        lambda s: rope(xs["scalar"][s], cos, sin, path="scalar")])  # fmt: skip
        fresh = {p: arrays.to_device(x0) for p in PATHS}
        for p in PATHS:
            rope(fresh[p], cos, sin, path=p)
        same = bool(np.array_equal(host(fresh["vector"]).view(np.uint16), host(fresh["scalar"]).view(np.uint16)))
        nbytes = 2 * t * nh * d * dt.itemsize + 2 * 4 * t * (d // 2)
        out.append(row("rope", dt, f"{t}x{nh}x{d}", nbytes, tv, ts, gbs, bit_identical=same))
        print(json.dumps(out[-1]), flush=True)
        del xs, fresh
    return out


def ab_cast_fp8(rng, gbs: float) -> list[dict]:  # type: ignore[no-untyped-def]
    """Three kernels: vector with the hardware cvt (what "auto" runs on the H200), vector with the integer
    conversion (what it runs before sm_89), scalar. `vector_us` is the cvt kernel's; the integer one is in
    `vector_int_us`."""
    import kernels.ops.cast_fp8 as cf

    hw = cf.hardware_cvt
    out = []
    m, n = (16, 512) if SMALL else (16384, 4096)
    for dt in (F16, BF16, np.dtype(np.float32)):
        xs = [arrays.to_device((rng.standard_normal((m, n)) * np.exp(rng.uniform(-6, 4, (m, n)))).astype(dt)) for _ in range(SETS)]
        o = {p: [cuda.device_array((m, n), np.uint8) for _ in range(SETS)] for p in ("cvt", "int", "scalar")}
        sc = cuda.device_array(1, np.float32)

        def call(p: str):  # type: ignore[no-untyped-def]
            def f(s: int) -> None:
                cf.hardware_cvt = hw if p == "cvt" else (lambda ctx=None: False)
                cf.cast_fp8(xs[s], o[p][s], sc, path="scalar" if p == "scalar" else "vector")
                cf.hardware_cvt = hw

            return f

        tc, ti, ts = timed([call("cvt"), call("int"), call("scalar")])
        codes = {p: host(o[p][0]) for p in o}
        same = bool(np.array_equal(codes["cvt"], codes["scalar"]) and np.array_equal(codes["int"], codes["scalar"]))
        r = row("cast_fp8", dt, f"{m}x{n}", m * n * (2 * dt.itemsize + 1), tc, ts, gbs, bit_identical=same,
                hardware_cvt=bool(hw()), vector_int_us=round(ti, 2))  # fmt: skip
        out.append(r)
        print(json.dumps(r), flush=True)
        del xs, o
    return out


def main() -> int:
    from kernels.runtime.device import peaks

    out_dir = os.environ.get("OUT", ".")
    rng = np.random.default_rng(0)
    gbs = float(peaks()["mem_gbs"] or 1.0)
    print(f"copy {gbs:.0f} GB/s", flush=True)
    which = os.environ.get("AB_OPS", "swiglu,rope,fused_add_rmsnorm,cast_fp8").split(",")
    fns = {"swiglu": ab_swiglu, "rope": ab_rope, "fused_add_rmsnorm": ab_fused, "cast_fp8": ab_cast_fp8}
    rows_out = [r for op in which for r in fns[op](rng, gbs)]
    with open(os.path.join(out_dir, "llm_vector_ab.json"), "w") as f:
        json.dump({"copy_gbs": gbs, "device": str(getattr(cuda.get_current_device(), "name", "simulator")), "rows": rows_out}, f, indent=1)
    print(f"{'op':17s} {'dtype':9s} {'shape':13s} {'vector':>8s} {'scalar':>8s} {'v sol':>6s} {'s sol':>6s} s/v  check")
    for r in rows_out:
        check = {k: v for k, v in r.items() if k.startswith(("bit", "residual", "out_", "vector_int", "hard"))}
        print(f"{r['op']:17s} {r['dtype']:9s} {r['shape']:13s} {r['vector_us']:8.1f} {r['scalar_us']:8.1f} "
              f"{r['vector_sol']:6.3f} {r['scalar_sol']:6.3f} {r['scalar_over_vector']:.2f} {check}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
