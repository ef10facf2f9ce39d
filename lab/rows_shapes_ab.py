# ruff: noqa: B023, E501  (a probe: each lambda is timed within its own loop iteration)
"""A/B probe (GPU only, not shipped): block shapes for the 16-byte register row kernels, and the bf16 store's
rounding (cvt.rn.bf16x2.f32 against the integer rounding), side by side in one process.

For each row op (rmsnorm, layernorm, softmax, fused_add_rmsnorm), dtype (bf16; fp16 at 4096 as the target)
and width, the kernel "auto" takes today is timed call by call against candidate kernels built from the same
factory (`_K.row_kernel(WideRows(threads, per, min_blocks), width)`, one block per row) and, at some widths,
the same kernel compiled with the integer bf16 rounding (kernels.primitives.bf16.CVT_FROM_ARCH set past any
GPU while it compiles). 2^25 elements per operand, 3 input sets in rotation, medians of 30 CUDA-event timings.
Every candidate's output is checked against auto's (max relative difference; bf16 rounding allows ~8e-3).

    PYTHONPATH=<numpy 2.4 site>:. OUT=dir python lab/rows_shapes_ab.py   (RS_OPS, RS_COLS narrow it)

Prints one JSON line per case and a table; $OUT/rows_shapes_ab.json holds everything.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from typing import Any

import ml_dtypes
import numpy as np
from numba import cuda
from wide_rows_ab import ITERS, SETS, WARMUP, timed  # the same interleaved timing (lab/ is on sys.path)

import kernels.primitives.bf16 as bf16mod
from kernels.ops.rows import WideRows
from kernels.runtime import arrays
from kernels.runtime.arrays import HostSync
from kernels.runtime.launch import kernel

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
ELEMS = int(os.environ.get("RS_ELEMS", 1 << 25))  # RS_ELEMS=2048: a simulator smoke run
T0 = time.perf_counter()

# candidate shapes per width: (threads, per, min_blocks); per is values per thread (a multiple of 8)
CANDIDATES: dict[int, list[tuple[int, int, int]]] = {
    1024: [(32, 32, 32), (64, 16, 16), (128, 8, 16)],
    2048: [(64, 32, 16), (128, 16, 8), (256, 8, 8)],
    4096: [(128, 32, 8), (256, 16, 4), (512, 8, 4)],
    5120: [(320, 16, 3), (640, 8, 3), (160, 32, 6)],
    8192: [(256, 32, 4), (512, 16, 3), (1024, 8, 2)],
    16384: [(512, 32, 2), (1024, 16, 2)],
    32768: [(1024, 32, 1)],
}
INT_AT = (4096, 8192, 32768)  # widths where the auto kernel is also built with the integer bf16 rounding


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def main() -> int:
    out_dir = os.environ.get("OUT", ".")
    from kernels.runtime.device import peaks

    gbs = float(peaks()["mem_gbs"] or 1.0)
    log(f"copy {gbs:.0f} GB/s")
    rng = np.random.default_rng(0)
    ops = os.environ.get("RS_OPS", "rmsnorm,softmax,layernorm,fused_add_rmsnorm").split(",")
    widths = [int(c) for c in os.environ.get("RS_COLS", ",".join(map(str, CANDIDATES))).split(",")]
    rows_out: list[dict[str, Any]] = []
    for opname in ops:
        mod = importlib.import_module(f"kernels.ops.{opname}")
        fn_auto = getattr(mod, opname)
        K = mod._K
        cases = [(BF16, n) for n in widths] + [(F16, 4096)] * (4096 in widths)
        for dt, n in cases:
            m = ELEMS // n
            sync = HostSync()
            xs = [arrays.to_device(rng.standard_normal((m, n)).astype(dt)) for _ in range(SETS)]
            rs = [arrays.to_device(rng.standard_normal((m, n)).astype(dt)) for _ in range(SETS)]
            w = arrays.to_device((1 + 0.1 * rng.standard_normal(n)).astype(dt))
            b = arrays.to_device((0.1 * rng.standard_normal(n)).astype(dt))
            outs: dict[str, list[Any]] = {}

            def new_out(label: str) -> list[Any]:
                outs[label] = [cuda.device_array((m, n), dt) for _ in range(SETS)]
                return outs[label]

            def auto_call(o: list[Any]):  # type: ignore[no-untyped-def]
                if opname == "rmsnorm":
                    return lambda s: fn_auto(xs[s], w, o[s])
                if opname == "layernorm":
                    return lambda s: fn_auto(xs[s], w, b, o[s])
                if opname == "softmax":
                    return lambda s: fn_auto(xs[s], o[s])
                # fused_add_rmsnorm updates residual in place: time it on the drifting residual (the
                # bytes are the same; values stay finite over these few calls at unit scale)
                return lambda s: fn_auto(xs[s], rs[s], w, o[s])

            def args_of(s: int, o: list[Any]) -> tuple[Any, ...]:
                xo = arrays.as_rows(arrays.operand("x", xs[s], sync))
                oo = arrays.as_rows(arrays.operand("out", o[s], sync))
                wo = arrays.operand("weight", w, sync)
                if opname == "rmsnorm":
                    return (xo, wo, oo, 1e-6)
                if opname == "layernorm":
                    return (xo, wo, arrays.operand("bias", b, sync), oo, 1e-6)
                if opname == "softmax":
                    return (xo, oo)
                ro = arrays.as_rows(arrays.operand("residual", rs[s], sync))
                return (xo, ro, wo, oo, 1e-6)

            labels = ["auto"]
            calls = [auto_call(new_out("auto"))]
            built: list[tuple[str, Any, int]] = []
            for threads, per, mb in CANDIDATES.get(n, []) if dt == BF16 else []:
                if threads * per < n:
                    continue
                try:
                    fn, thr, _ = mod._row_kernel(WideRows(threads=threads, per=per, min_blocks=mb), 8, word=dt == BF16)
                    k = kernel(fn, K.sigs[dt])
                    k._prepare()
                    built.append((f"{threads}x{per}/{mb}", k, thr))
                except Exception as e:  # a shape the op's factory refuses or ptxas cannot fit
                    log(f"{opname} {n}: {threads}x{per}/{mb} not built: {type(e).__name__}: {str(e)[:200]}")
            if dt == BF16 and n in INT_AT:
                # the kernel auto takes, compiled again with the integer rounding
                _, thr, _ = K.pick("auto", dt, True, n, m)
                try:
                    bf16mod.CVT_FROM_ARCH = 10**6
                    k = kernel(_rebuild(mod, dt, n), K.sigs[dt])
                    k._prepare()
                    built.append(("auto-int-round", k, thr))
                except Exception as e:
                    log(f"{opname} {n}: int-round rebuild failed: {type(e).__name__}: {str(e)[:200]}")
                finally:
                    bf16mod.CVT_FROM_ARCH = 800
            for label, k, thr in built:
                o = new_out(label)
                argsets = [args_of(s, o) for s in range(SETS)]
                grid = m
                labels.append(label)
                calls.append(
                    lambda s, k=k, thr=thr, argsets=argsets, grid=grid: k.launch(grid, thr, argsets[s])
                )
            try:
                ts = timed(calls)
            except Exception as e:
                log(f"{opname} {dt.name} {n}: timing failed: {type(e).__name__}: {e}")
                continue
            ref = arrays.to_host(outs["auto"][(WARMUP + ITERS - 1) % SETS]).astype(np.float64)
            nbytes = (4 if opname == "fused_add_rmsnorm" else 2) * m * n * dt.itemsize
            for label, t in zip(labels, ts, strict=True):
                got = arrays.to_host(outs[label][(WARMUP + ITERS - 1) % SETS]).astype(np.float64)
                if opname == "fused_add_rmsnorm":
                    diff = None  # residual drifts between providers' calls: outputs differ by design
                else:
                    diff = float(np.nanmax(np.abs(got - ref)) / max(np.nanmax(np.abs(ref)), 1e-30))
                r = {
                    "op": opname,
                    "dtype": dt.name,
                    "cols": n,
                    "rows": m,
                    "kernel": label,
                    "us": round(t, 2),
                    "sol": round(nbytes / t / 1e3 / gbs, 3),
                    "x_auto": round(ts[0] / t, 3),
                    "max_rel_diff_vs_auto": diff,
                }
                rows_out.append(r)
                print(json.dumps(r), flush=True)
    with open(os.path.join(out_dir, "rows_shapes_ab.json"), "w") as f:
        json.dump(
            {
                "copy_gbs": gbs,
                "device": str(getattr(cuda.get_current_device(), "name", "simulator")),
                "rows": rows_out,
            },
            f,
            indent=1,
        )
    print(f"{'op':18s} {'dtype':9s} {'cols':>6s} {'kernel':16s} {'us':>8s} {'sol':>6s} {'x auto':>6s} diff")
    for r in rows_out:
        d = r["max_rel_diff_vs_auto"]
        print(
            f"{r['op']:18s} {r['dtype']:9s} {r['cols']:6d} {r['kernel']:16s} {r['us']:8.1f} {r['sol']:6.3f} "
            f"{r['x_auto']:6.2f} {'-' if d is None else f'{d:.1e}'}"
        )
    return 0


def _rebuild(mod: Any, dt: np.dtype, n: int) -> Any:
    """A fresh dispatcher of the kernel `auto` picks for bf16 rows of n (same factory, same shape)."""
    from kernels.ops.rows import ROW_KERNELS, for_machine, wide_for

    shape = wide_for(dt, n, mod._K.name)
    if shape is not None:
        return mod._row_kernel(shape, 8, word=dt == BF16)[0]
    cfg = ROW_KERNELS.get(mod._K.name, {}).get(dt)
    if cfg is not None:
        return mod._row_kernel(for_machine(cfg), 8, word=dt == BF16)[0]
    return mod._make_vec(8)


if __name__ == "__main__":
    sys.exit(main())
