# ruff: noqa: B023, E501  (a probe: each lambda is timed within its own loop iteration)
"""Probe (GPU only, not shipped): shapes of the 16-byte streaming row kernel (kernels.ops.rows.StreamRows:
threads per block, 16-byte vectors in flight per thread, blocks per SM) against the committed STREAM_ROWS,
interleaved call by call in one process on the same operands, at 2^25 elements per operand. Each variant's
kernel is built with the op's own make_stream_vec and launched through the op (path="vector"): the op's
RowKernels entry and its grid (blocks per SM x SMs) are swapped in for the variant's first, warm-up call,
whose bound launch the op then replays. Every variant's output is compared with the committed kernel's.
Prints one line per case and writes $OUT/stream_vec_variants.json. SV_COLS, SV_DTYPES, SV_OPS select.

    PYTHONPATH=<numpy 2.4 site>:. python lab/stream_vec_variants.py
"""

from __future__ import annotations

import json
import os
import sys

import ml_dtypes
import numpy as np
from numba import cuda

from kernels.ops import layernorm, rmsnorm, rows, softmax
from kernels.ops.rows import STREAM_ROWS, StreamRows
from kernels.primitives.cache_hints import l2_evict_first, stg_hint_from
from kernels.primitives.vector import WIDTH
from kernels.runtime import arrays
from kernels.runtime.launch import kernel, sm_count

BF16 = np.dtype(ml_dtypes.bfloat16)
ELEMS = 1 << 25
ITERS, WARMUP, SETS = 30, 5, 3
# name -> (shape, pass 2's stores marked L2 evict_first); SV_SET picks "shapes" or "store"
VARIANT_SETS = {
    "shapes": {
        "1024x4x1 (committed)": (STREAM_ROWS, False),
        "1024x1x1": (StreamRows(1024, 1, 1), False),
        "1024x2x1": (StreamRows(1024, 2, 1), False),
        "512x2x2": (StreamRows(512, 2, 2), False),
        "512x4x2": (StreamRows(512, 4, 2), False),
        "256x4x4": (StreamRows(256, 4, 4), False),
    },
    # whether the output's writes evict the rows pass 2 re-reads (fp32 / fp16 only: the hinted store has
    # no bf16 rounding)
    "store": {
        "1024x4x1 (committed)": (STREAM_ROWS, False),
        "1024x4x1 stores evict_first": (STREAM_ROWS, True),
    },
}
VARIANTS = VARIANT_SETS[os.environ.get("SV_SET", "shapes")]
COMMITTED = next(iter(VARIANTS))


@cuda.jit(device=True)
def _stg_drop(arr, idx, src, off):  # type: ignore[no-untyped-def]
    stg_hint_from(arr, idx, src, off, l2_evict_first())


MODS = {"rmsnorm": rmsnorm, "layernorm": layernorm, "softmax": softmax}


def main() -> int:
    from kernels.runtime.device import peaks

    gbs = float(peaks()["mem_gbs"] or 1.0)
    out_dir = os.environ.get("OUT", ".")
    rng = np.random.default_rng(0)
    cols = [int(c) for c in os.environ.get("SV_COLS", "65536,128256").split(",")]
    dts = [
        np.dtype(BF16 if d == "bfloat16" else d)
        for d in os.environ.get("SV_DTYPES", "bfloat16,float32").split(",")
    ]
    ops = os.environ.get("SV_OPS", "rmsnorm,layernorm,softmax").split(",")
    nsm = sm_count()
    res = []
    for opname in ops:
        mod = MODS[opname]
        ks = mod._K
        for dt in dts:
            built = {}
            for name, (cfg, drop_stores) in VARIANTS.items():
                if drop_stores and dt.itemsize == 2 and dt != np.dtype(np.float16):
                    continue
                k = kernel(mod.make_stream_vec(cfg, WIDTH[dt]), ks.sigs[dt])
                saved_store = mod.stg_from
                mod.stg_from = _stg_drop if drop_stores else saved_store  # read when numba compiles it
                try:
                    k._prepare()
                finally:
                    mod.stg_from = saved_store
                built[name] = (cfg, k, k.regs)
            for n in cols:
                m = ELEMS // n
                xs = [arrays.to_device(rng.standard_normal((m, n)).astype(dt)) for _ in range(SETS)]
                w = arrays.to_device((1 + 0.1 * rng.standard_normal(n)).astype(dt))
                b = arrays.to_device((0.1 * rng.standard_normal(n)).astype(dt))
                outs = {v: [cuda.device_array((m, n), dt) for _ in range(SETS)] for v in built}

                def objs(v: str, s: int) -> tuple:
                    if opname == "rmsnorm":
                        return (xs[s], w, outs[v][s])
                    if opname == "layernorm":
                        return (xs[s], w, b, outs[v][s])
                    return (xs[s], outs[v][s])

                def run_op(v: str, s: int) -> None:
                    o = objs(v, s)
                    if opname == "rmsnorm":
                        rmsnorm.rmsnorm(o[0], o[1], o[2], path="vector")
                    elif opname == "layernorm":
                        layernorm.layernorm(o[0], o[1], o[2], o[3], path="vector")
                    else:
                        softmax.softmax(o[0], o[1], path="vector")

                # the op's FastCache is keyed by layout, not pointers: each variant's validated launch is
                # taken from it alone (cleared around it), then replayed directly with each set's pointers
                opts = "vector" if opname == "softmax" else (1e-6 if opname == "rmsnorm" else 1e-5, "vector")
                bound, ptrs = {}, {}
                saved = (ks.svec_k[dt], ks.svec_shape, rows.sm_count)
                try:
                    for v, (cfg, k, _) in built.items():
                        mod._FAST.clear()
                        ks.svec_k[dt], ks.svec_shape = k, cfg
                        rows.sm_count = lambda c=cfg: nsm * c.min_blocks
                        run_op(v, 0)
                        (bound[v],) = mod._FAST._d.values()
                        ptrs[v] = [mod._FAST.find(objs(v, s), opts)[1] for s in range(SETS)]
                finally:
                    ks.svec_k[dt], ks.svec_shape, rows.sm_count = saved
                    mod._FAST.clear()
                cuda.synchronize()
                ev: dict[str, list] = {v: [] for v in built}
                for i in range(WARMUP + ITERS):
                    for v in built:
                        a, e = cuda.event(), cuda.event()
                        a.record()
                        bound[v].launch(ptrs[v][i % SETS], 0)
                        e.record()
                        if i >= WARMUP:
                            ev[v].append((a, e))
                cuda.synchronize()
                ref = arrays.to_host(outs[COMMITTED][0]).astype(np.float64)
                nbytes = 2 * m * n * dt.itemsize
                for v, (_cfg, _, regs) in built.items():
                    us = float(np.median([a.elapsed_time(e) * 1e3 for a, e in ev[v]]))
                    got = arrays.to_host(outs[v][0]).astype(np.float64)
                    diff = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))
                    r = {"op": opname, "dtype": dt.name, "shape": f"{m}x{n}", "variant": v, "regs": regs,
                         "us": round(us, 2), "sol": round(nbytes / us / 1e3 / gbs, 3), "max_rel_diff": diff}  # fmt: skip
                    res.append(r)
                    print(json.dumps(r), flush=True)

    with open(os.path.join(out_dir, "stream_vec_variants.json"), "w") as f:
        json.dump({"copy_gbs": gbs, "device": str(cuda.get_current_device().name), "rows": res}, f, indent=1)
    print(f"{'op':10s} {'dtype':9s} {'shape':11s} {'variant':22s} {'regs':>4s} {'us':>7s} {'sol':>6s} diff")
    for r in res:
        print(
            f"{r['op']:10s} {r['dtype']:9s} {r['shape']:11s} {r['variant']:22s} {str(r['regs']):>4s} "
            f"{r['us']:7.1f} {r['sol']:6.3f} {r['max_rel_diff']:.1e}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
