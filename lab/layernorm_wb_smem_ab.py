# ruff: noqa: B023, E501  (a probe: each lambda is timed within its own loop iteration)
"""A/B probe (not shipped): layernorm's WIDE_ROWS kernels with the row's weight and bias copied into shared
memory by cp.async while the row loads and reduces, so the write pass waits on no L2 round trip.

Why (benchmarks/PERF.md, twenty-first session): staging the NEXT row did not pay (the persistent grid it
needs costs 3-7 %; +1 % net at 32768 only). What is left of layernorm's gap at 16384-32768 (0.84-0.88 of
copy on an H100, rmsnorm 0.89-0.92 there) is the write pass and the second reduction. The shipped write pass
loads each group of 2 vectors' weight and bias from L2 (a load may not pass a store that might alias it), so
a thread of the 1024 x 32 shape makes 2 dependent L2 round trips after its block's second reduction, with
no other block on the SM to cover them (one block an SM at 32768 columns). Here every block keeps the
hardware's scheduling (grid = rows, as shipped) and:
  wb_early  cp.async's (LDGSTS: no registers) its thread's weight and bias vectors into the block's shared
            part before it loads its row; the write pass reads them with one 16-byte shared load each
  wb_late   the same copies issued after the row's loads (the row's bytes ask HBM first)
  wb_one    wb_early with one block reduction a row instead of two: the sums of d and d^2, d = x - k with
            k the row's first value (make_stream_vec's shift, so no cancellation for rows far from 0);
            not the shipped arithmetic, so checked against float64 only
Shared memory: 2 n x itemsize a block (128 KB at 32768 bf16), at the shipped shape's blocks an SM (all fit
227 KB: 4-128 KB a block x 1-32 blocks). Each thread reads only the words it copied: cp.async.wait_all, no
barrier. wb_early's and wb_late's arithmetic and its order are the shipped kernel's: their outputs must be
bit-equal to it.

Predictions (written before the run): wb_early / wb_late 1.03-1.06x at 32768 (one block an SM: the 2 round
trips, ~0.4-0.6 us of a ~6.9 us row, are exposed), 1.00-1.03x at 16384 (two blocks an SM cover part of
them), level (+-1.5 %) at 1024-8192 (4-32 blocks an SM); wb_late >= wb_early at 32768. If 32768 gains
< 2 %, the write pass's L2 reads are not the gap either, and what is left is the reductions and the row
boundary (launch, the first load's HBM latency) with one block an SM. wb_one: a further 1-2 % at 32768 over
wb_early (one barrier and one shuffle tree fewer a row), level elsewhere.

    source benchmarks/h200_env.sh; OUT=$OUT $PY lab/layernorm_wb_smem_ab.py   (AB_COLS, AB_DTYPES)
Under the simulator (NUMBA_ENABLE_CUDASIM=1, AB_ELEMS=8192) it checks correctness at small shapes, no timing.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
from numba import cuda, float32, uint32

sys.path.insert(0, str(Path(__file__).resolve().parent))
import onchip_cpasync as cpa  # noqa: E402  (cp16 / commit / wait_all, and take4)
from layernorm_prefetch_ab import BF16, ELEMS, PATH, SETS, WIDTH, reference  # noqa: E402

from kernels.ops import layernorm as ln  # noqa: E402
from kernels.ops.rows import WideRows, vec_jit  # noqa: E402
from kernels.primitives.reductions import make_block_sum, make_block_sum2, row_slots  # noqa: E402
from kernels.primitives.vector import ldg_into, make_row_io, stg_from  # noqa: E402
from kernels.runtime import arrays, device  # noqa: E402
from kernels.runtime.arrays import SIMULATED  # noqa: E402
from kernels.runtime.launch import dynamic_smem, kernel  # noqa: E402

VARIANTS = ("shipped", "wb_early", "wb_late", "wb_one")


def ln_wb_smem(threads: int, per: int, min_blocks: int, word: bool, early: bool, one: bool = False):  # type: ignore[no-untyped-def]
    """The shipped full-row vector kernel (layernorm._make_vec at rows of exactly threads x per), one block a
    row, with the weight and bias vectors of each thread copied into shared memory by cp.async (before the
    row's loads if `early`, after them otherwise) and read from there in the write pass. Thread t's weight
    vector q sits in words 4 (q * threads + t) .. + 3, its bias vector in 4 ((nv + q) * threads + t) .. + 3.
    `one`: the mean and variance from one reduction of shifted sums (module docstring, wb_one)."""
    width = WIDTH
    load_row, col_of = make_row_io(width, threads, per)
    bsum, slots = make_block_sum(threads), row_slots(threads)
    bsum2 = make_block_sum2(threads)
    nsm = 2 * slots
    nv = per // width
    take4 = cpa.make_io(width, word)
    cp16, commit, wait_all = cpa.cp16, cpa.commit, cpa.wait_all

    @cuda.jit(**vec_jit(threads, min_blocks, False))
    def k(x, w, b, out, eps):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(nsm, float32)
        part = cuda.shared.array(0, uint32)
        v = cuda.local.array(per, float32)
        tw = cuda.local.array(width, float32)
        tb = cuda.local.array(width, float32)
        tid = cuda.threadIdx.x
        n = x.shape[1]
        fn = float32(n)
        row = cuda.blockIdx.x
        if early:
            for q in range(nv):
                cp16(part, 4 * (q * threads + tid), w, col_of(q))
                cp16(part, 4 * ((nv + q) * threads + tid), b, col_of(q))
            commit()
        load_row(v, x[row], n, float32(0.0))
        if not early:
            for q in range(nv):
                cp16(part, 4 * (q * threads + tid), w, col_of(q))
                cp16(part, 4 * ((nv + q) * threads + tid), b, col_of(q))
            commit()
        if one:
            ldg_into(tw, 0, x[row], 0)  # the shift: the row's first vector, a broadcast
            shift = tw[0]
            s = float32(0.0)
            q2 = float32(0.0)
            for e in range(per):
                d = v[e] - shift
                s += d
                q2 += d * d
            s, q2 = bsum2(s, q2, sm, 0)
            dmean = s / fn
            rstd = float32(1.0) / math.sqrt(abs(q2 / fn - dmean * dmean) + eps)
            mean = shift + dmean
        else:
            s = float32(0.0)
            for e in range(per):
                s += v[e]
            mean = bsum(s, sm, 0) / fn
            q2 = float32(0.0)
            for e in range(per):
                d = v[e] - mean
                q2 += d * d
            rstd = float32(1.0) / math.sqrt(bsum(q2, sm, slots) / fn + eps)
        orow = out[row]
        wait_all()
        for q in range(nv):
            take4(tw, 0, part, q * threads + tid)
            take4(tb, 0, part, (nv + q) * threads + tid)
            for e in range(width):
                tw[e] = (v[q * width + e] - mean) * rstd * tw[e] + tb[e]
            stg_from(orow, col_of(q), tw, 0)

    return k


def main() -> int:
    from kernels.harness.bench import time_interleaved

    out_dir = os.environ.get("OUT", ".")
    rng = np.random.default_rng(0)
    copy = 1.0 if SIMULATED else float(device.peaks()["mem_gbs"] or 1.0)
    cols = [int(c) for c in os.environ.get("AB_COLS", "32768,16384,8192,5120,1024").split(",")]
    dts = [np.dtype(BF16 if d == "bfloat16" else d) for d in os.environ.get("AB_DTYPES", "bfloat16,float16").split(",")]
    report: dict[str, Any] = {"device": device.describe().get("name"), "copy_gbs": copy, "rows": []}
    ok = True
    print(f"copy {copy:.0f} GB/s on {report['device']}")
    for dt in dts:
        for n in cols:
            m = max(ELEMS // n, 1)
            k0, threads, _ = ln._K.pick(PATH, dt, True, n, m)
            shape = next((c for (d, c), kk in ln._K.wide_k.items() if d == dt and kk is k0), None)
            if not isinstance(shape, WideRows) or shape.threads * shape.per != n:
                print(f"layernorm {dt.name} {m}x{n}: auto takes no full-row wide kernel here; skipped")
                continue
            smem = 2 * n * dt.itemsize  # the weight and the bias
            word = dt == BF16
            built = {v: kernel(ln_wb_smem(shape.threads, shape.per, shape.min_blocks, word, v != "wb_late", v == "wb_one"),
                               ln._SIGS[dt], on_load=dynamic_smem(smem)) for v in VARIANTS[1:]}  # fmt: skip
            xs_h = [(rng.standard_normal((m, n)) * 2 + 0.5).astype(dt) for _ in range(SETS)]
            w_h = (1 + 0.5 * rng.standard_normal(n)).astype(dt)
            b_h = (0.5 * rng.standard_normal(n)).astype(dt)
            xs = [arrays.to_device(x) for x in xs_h]
            w, b = arrays.to_device(w_h), arrays.to_device(b_h)
            outs = {p: [arrays.to_device(np.zeros((m, n), dt)) for _ in range(SETS)] for p in VARIANTS}
            eps = float(ln.EPS)

            def call(p: str, s: int) -> None:
                if p == "shipped":
                    ln.layernorm(xs[s], w, b, outs[p][s], path=PATH)
                    return
                named = (("x", xs[s]), ("w", w), ("b", b), ("out", outs[p][s]))
                built[p].launch(m, threads, (*(arrays.operand(nm, a, None) for nm, a in named), eps), smem)

            for p in VARIANTS:
                for s in range(SETS):
                    call(p, s)
            cuda.synchronize()
            if SIMULATED:
                t = [[1.0]] * len(VARIANTS)
            else:
                t = time_interleaved([(lambda a, p=p: call(p, a["s"]), [{"s": s} for s in range(SETS)], None) for p in VARIANTS], 30)
            errs, same = {}, {}
            shipped_bits = [arrays.to_host(outs["shipped"][s]).view(np.uint16) for s in range(SETS)]
            for p in VARIANTS:
                worst, eq = 0.0, True
                for s in range(SETS):
                    got_h = arrays.to_host(outs[p][s])
                    ref = reference("layernorm", xs_h[s], w_h, b_h, eps)
                    worst = max(worst, float(np.abs(got_h.astype(np.float64) - ref).max() / np.abs(ref).max()))
                    eq &= bool(np.array_equal(got_h.view(np.uint16), shipped_bits[s]))
                errs[p], same[p] = worst, eq
            ok &= max(errs.values()) < 8e-3 and same["wb_early"] and same["wb_late"]
            us = {p: float(np.median(t[i])) for i, p in enumerate(VARIANTS)}
            nbytes = 2 * m * n * dt.itemsize
            r = {"op": "layernorm", "dtype": dt.name, "rows": m, "cols": n, "shape": shape.label, "smem": smem,
                 "us": {p: round(us[p], 2) for p in VARIANTS},
                 "of_copy": {p: round(nbytes / us[p] / 1e3 / copy, 3) for p in VARIANTS},
                 "x_shipped": {p: round(us["shipped"] / us[p], 3) for p in VARIANTS},
                 "max_rel_err": errs, "bits_equal_shipped": same}  # fmt: skip
            report["rows"].append(r)
            print(json.dumps(r), flush=True)
            del xs, outs
    with open(os.path.join(out_dir, "layernorm_wb_smem_ab.json"), "w") as fh:
        json.dump(report, fh, indent=1)
    print(f"{'dtype':9} {'shape':12} {'kernel':15} {'shipped us':>10} {'of copy':>7} {'wb_early x':>10} {'wb_late x':>9} {'wb_one x':>8} {'best copy':>9} bits")
    for r in report["rows"]:
        x = r["x_shipped"]
        print(f"{r['dtype']:9} {r['rows']}x{r['cols']:<7} {r['shape']:15} {r['us']['shipped']:10.1f} {r['of_copy']['shipped']:7.3f} "
              f"{x['wb_early']:10.3f} {x['wb_late']:9.3f} {x['wb_one']:8.3f} {max(r['of_copy'].values()):9.3f} {r['bits_equal_shipped']['wb_early'] and r['bits_equal_shipped']['wb_late']}")  # fmt: skip
    print("all outputs within tolerance (wb_early's and wb_late's bit-equal to shipped)" if ok else "SOME OUTPUT FAILED ITS CHECK")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
