# ruff: noqa: B023, E501  (a probe: each lambda is timed within its own loop iteration)
"""A/B probe (not shipped): layernorm's WIDE_ROWS kernels with the next row in flight.

Why (benchmarks/PERF.md, "The next GPU session" item 2): layernorm is the row op furthest from copy at
5120-32768 columns (H200 table, fourteenth session: 0.64-0.82; rmsnorm 0.90-0.95 at the same shapes on an
H100). The WIDE_ROWS kernels run one block per row (grid = rows): a block loads its row, then spends two
block reductions and a write pass with no load in flight; the SM's other resident blocks are the only
overlap, and at 32768 columns (1024 threads x 32 values, 62 registers) there is none: one block per SM.
layernorm pays this twice a row (mean, then variance), rmsnorm once.

Variants, each against the kernel `auto` takes (`shipped`), interleaved call by call
(kernels.harness.bench.time_interleaved), every output checked against float64 and against `shipped` bit for
bit (the same arithmetic in the same order must give the same bits):
  persist   the shipped kernel on a persistent grid (SMs x resident blocks; it already strides over rows):
            the control for "fewer, longer-lived blocks" alone
  prefetch  persistent, and each block's next row goes to shared memory by cp.async (LDGSTS, no registers)
            as soon as this row is in registers, so it streams in during the reductions and the write pass;
            the row is read from shared memory into the same registers (1 x 16-byte LDS a vector); shared
            memory: one row a block (64 KB at 32768 bf16). ptxas sm_90: 64 registers, 72 bytes spilled
  shared    persistent, two row buffers a block in shared memory: the next row is cp.async'd into one while
            this row is read from the other three times (sum, variance, write pass), so a thread holds one
            vector, not its 32 values: 55-56 registers, no spills
rmsnorm (AB_OPS=layernorm,rmsnorm, the default) gets `persist` and `shared` against its shipped kernels (the
packed pairs at 8192-32768, rows.WIDE_PACKED: checked against float64, not bit for bit).

Predictions (before the run): prefetch gains most where one block holds an SM (32768: 1.08-1.15x, to ~0.88
of copy on an H100), less at 8192-16384 (2-4 blocks an SM already overlap: 1.02-1.06x), nothing at 1024
(32 blocks an SM); persist level with shipped (+-2 %). If prefetch gains < 3 % at 32768, the reductions'
latency is not what the write pass waits on, and the next suspect is the write pass itself (two loads of
weight and bias per store).

    source benchmarks/h200_env.sh; OUT=$OUT $PY lab/layernorm_prefetch_ab.py   (AB_OPS, AB_COLS, AB_DTYPES)
Under the simulator (NUMBA_ENABLE_CUDASIM=1, AB_ELEMS=8192) it checks correctness at small shapes, no timing.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from numba import cuda, float32, uint32

sys.path.insert(0, str(Path(__file__).resolve().parent))
import onchip_cpasync as cpa  # noqa: E402  (cp16 / commit / wait_all / lds4, and take4)

from kernels.ops import layernorm as ln  # noqa: E402
from kernels.ops import rmsnorm as rms  # noqa: E402
from kernels.ops.rows import WideRows, vec_jit  # noqa: E402
from kernels.primitives.reductions import make_block_sum, row_slots  # noqa: E402
from kernels.primitives.vector import ldg_into, make_row_io, stg_from  # noqa: E402
from kernels.runtime import arrays, device  # noqa: E402
from kernels.runtime.arrays import SIMULATED  # noqa: E402
from kernels.runtime.launch import dynamic_smem, kernel, sm_count  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
WIDTH = 8
ELEMS = int(os.environ.get("AB_ELEMS", 1 << 25))
SETS = 3
PATH = "vector" if SIMULATED else "auto"  # the simulator's auto takes no WIDE_ROWS shape


def ln_prefetch(threads: int, per: int, min_blocks: int, word: bool):  # type: ignore[no-untyped-def]
    """The shipped full-row vector kernel (layernorm._make_vec, rows of exactly threads x per) with this
    row read from the block's shared part and the next row cp.async'd into it. Thread t's vector q sits in
    words 4 (q * threads + t) .. + 3, its own: no barrier guards the part, only cp.async.wait_all."""
    width = WIDTH
    _, col_of = make_row_io(width, threads, per)
    bsum, slots = make_block_sum(threads), row_slots(threads)
    nsm = 2 * slots
    nv = per // width
    group = min(ln.WRITE_GROUP, nv)
    gn = group * width
    take4 = cpa.make_io(width, word)
    cp16, commit, wait_all = cpa.cp16, cpa.commit, cpa.wait_all

    @cuda.jit(**vec_jit(threads, min_blocks, False))
    def k(x, w, b, out, eps):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(nsm, float32)
        part = cuda.shared.array(0, uint32)
        v = cuda.local.array(per, float32)
        gw = cuda.local.array(gn, float32)
        gb = cuda.local.array(gn, float32)
        tid = cuda.threadIdx.x
        rows = x.shape[0]
        n = x.shape[1]
        fn = float32(n)
        row = cuda.blockIdx.x
        if row >= rows:
            return
        xr = x[row]
        for q in range(nv):
            cp16(part, 4 * (q * threads + tid), xr, col_of(q))
        commit()
        while row < rows:
            wait_all()
            for q in range(nv):
                take4(v, q * width, part, q * threads + tid)
            s = float32(0.0)
            for e in range(per):
                s += v[e]
            nxt = row + cuda.gridDim.x
            if nxt < rows:  # every slot is in registers (s used them all): refill it with the next row
                xn = x[nxt]
                for q in range(nv):
                    cp16(part, 4 * (q * threads + tid), xn, col_of(q))
                commit()
            mean = bsum(s, sm, 0) / fn
            q2 = float32(0.0)
            for e in range(per):
                d = v[e] - mean
                q2 += d * d
            rstd = float32(1.0) / math.sqrt(bsum(q2, sm, slots) / fn + eps)
            orow = out[row]
            for g in range(0, nv, group):
                for q in range(g, g + group):
                    ldg_into(gw, (q - g) * width, w, col_of(q))
                    ldg_into(gb, (q - g) * width, b, col_of(q))
                for q in range(g, g + group):
                    o = (q - g) * width
                    for e in range(width):
                        gw[o + e] = (v[q * width + e] - mean) * rstd * gw[o + e] + gb[o + e]
                    stg_from(orow, col_of(q), gw, o)
            row = nxt

    return k


def ln_shared(threads: int, per: int, min_blocks: int, word: bool, group_rows: int = 0):  # type: ignore[no-untyped-def]
    """`shared`: the row never held in registers. Two row buffers a block in shared memory: the next row is
    cp.async'd into one while this row is read from the other, once for the sum, once for the variance and
    once for the write pass (8 values at a time), so a thread holds a vector, not a row (no spills where
    `prefetch` spills 72 bytes: ptxas sm_90, 64 registers at every WIDE_ROWS shape's launch bounds).
    `group_rows` 0: a persistent grid, block b takes rows b, b + grid, ...; R > 0: block b takes the R
    consecutive rows b R .. b R + R - 1 (grid = rows / R, the hardware schedules the blocks), staging each
    next one while it normalises the one before."""
    width = WIDTH
    _, col_of = make_row_io(width, threads, per)
    bsum, slots = make_block_sum(threads), row_slots(threads)
    nsm = 2 * slots
    nv = per // width
    group = min(ln.WRITE_GROUP, nv)
    gn = group * width
    rowv = threads * nv  # vectors a row
    take4 = cpa.make_io(width, word)
    cp16, commit, wait_all = cpa.cp16, cpa.commit, cpa.wait_all

    @cuda.jit(**vec_jit(threads, min_blocks, False))
    def k(x, w, b, out, eps):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(nsm, float32)
        part = cuda.shared.array(0, uint32)
        t = cuda.local.array(width, float32)
        gw = cuda.local.array(gn, float32)
        gb = cuda.local.array(gn, float32)
        tid = cuda.threadIdx.x
        rows = x.shape[0]
        n = x.shape[1]
        fn = float32(n)
        if group_rows:
            row = cuda.blockIdx.x * group_rows
            stride = 1
            end = min(rows, row + group_rows)
        else:
            row = cuda.blockIdx.x
            stride = cuda.gridDim.x
            end = rows
        if row >= end:
            return
        xr = x[row]
        for q in range(nv):
            cp16(part, 4 * (q * threads + tid), xr, col_of(q))
        commit()
        base = 0
        while row < end:
            wait_all()
            nxt = row + stride
            if nxt < end:
                xn = x[nxt]
                other = rowv - base
                for q in range(nv):
                    cp16(part, 4 * (other + q * threads + tid), xn, col_of(q))
                commit()
            s = float32(0.0)
            for q in range(nv):
                take4(t, 0, part, base + q * threads + tid)
                for e in range(width):
                    s += t[e]
            mean = bsum(s, sm, 0) / fn
            q2 = float32(0.0)
            for q in range(nv):
                take4(t, 0, part, base + q * threads + tid)
                for e in range(width):
                    d = t[e] - mean
                    q2 += d * d
            rstd = float32(1.0) / math.sqrt(bsum(q2, sm, slots) / fn + eps)
            orow = out[row]
            for g in range(0, nv, group):
                for q in range(g, g + group):
                    ldg_into(gw, (q - g) * width, w, col_of(q))
                    ldg_into(gb, (q - g) * width, b, col_of(q))
                for q in range(g, g + group):
                    o = (q - g) * width
                    take4(t, 0, part, base + q * threads + tid)
                    for e in range(width):
                        gw[o + e] = (t[e] - mean) * rstd * gw[o + e] + gb[o + e]
                    stg_from(orow, col_of(q), gw, o)
            base = rowv - base
            row = nxt

    return k


def rms_shared(threads: int, per: int, min_blocks: int, word: bool):  # type: ignore[no-untyped-def]
    """rmsnorm's `shared` form (the same double buffer as ln_shared): the sum of squares read from the
    part, one reduction, then every weight vector of the thread loaded before the first store (as
    rmsnorm.make_scale_write's full rows) and the row read from the part again for the write pass."""
    width = WIDTH
    _, col_of = make_row_io(width, threads, per)
    bsum, slots = make_block_sum(threads), row_slots(threads)
    nsm = 2 * slots
    nv = per // width
    rowv = threads * nv
    take4 = cpa.make_io(width, word)
    cp16, commit, wait_all = cpa.cp16, cpa.commit, cpa.wait_all

    @cuda.jit(**vec_jit(threads, min_blocks, False))
    def k(x, w, out, eps):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(nsm, float32)
        part = cuda.shared.array(0, uint32)
        t = cuda.local.array(width, float32)
        u = cuda.local.array(per, float32)
        tid = cuda.threadIdx.x
        rows = x.shape[0]
        n = x.shape[1]
        row = cuda.blockIdx.x
        if row >= rows:
            return
        xr = x[row]
        for q in range(nv):
            cp16(part, 4 * (q * threads + tid), xr, col_of(q))
        commit()
        base = 0
        half = 0
        while row < rows:
            wait_all()
            nxt = row + cuda.gridDim.x
            if nxt < rows:
                xn = x[nxt]
                other = rowv - base
                for q in range(nv):
                    cp16(part, 4 * (other + q * threads + tid), xn, col_of(q))
                commit()
            acc = float32(0.0)
            for q in range(nv):
                take4(t, 0, part, base + q * threads + tid)
                for e in range(width):
                    acc += t[e] * t[e]
            inv = float32(1.0) / math.sqrt(bsum(acc, sm, half) / float32(n) + eps)
            half = slots - half
            orow = out[row]
            for q in range(nv):
                ldg_into(u, q * width, w, col_of(q))
            for q in range(nv):
                take4(t, 0, part, base + q * threads + tid)
                for e in range(width):
                    u[q * width + e] = t[e] * inv * u[q * width + e]
                stg_from(orow, col_of(q), u, q * width)
            base = rowv - base
            row = nxt

    return k


SMEM_BUDGET = 200 * 1024  # of the 227 KB a block may opt in to on sm_90: the double buffers of every block an SM holds


def main() -> int:
    from kernels.harness.bench import time_interleaved

    out_dir = os.environ.get("OUT", ".")
    rng = np.random.default_rng(0)
    copy = 1.0 if SIMULATED else float(device.peaks()["mem_gbs"] or 1.0)
    cols = [int(c) for c in os.environ.get("AB_COLS", "32768,16384,8192,5120,1024").split(",")]
    dts = [np.dtype(BF16 if d == "bfloat16" else d) for d in os.environ.get("AB_DTYPES", "bfloat16,float16").split(",")]
    ops = os.environ.get("AB_OPS", "layernorm,rmsnorm").split(",")
    report: dict[str, Any] = {"device": device.describe().get("name"), "copy_gbs": copy, "rows": []}
    ok = True
    print(f"copy {copy:.0f} GB/s on {report['device']}")
    for op in ops:
        mod = ln if op == "layernorm" else rms
        variants = ("shipped", "persist", "prefetch", "shared", "rows2", "rows4") if op == "layernorm" else ("shipped", "persist", "shared")
        if os.environ.get("AB_VARIANTS"):  # e.g. AB_VARIANTS=shared,rows2,rows4: those against the shipped kernel
            variants = ("shipped", *(v for v in variants if v in os.environ["AB_VARIANTS"].split(",")))
        for dt in dts:
            for n in cols:
                m = max(ELEMS // n, 1)
                k0, threads, _ = mod._K.pick(PATH, dt, True, n, m)
                shape = next((c for (d, c), kk in mod._K.wide_k.items() if d == dt and kk is k0), None)
                if not isinstance(shape, WideRows) or shape.threads * shape.per != n:
                    print(f"{op} {dt.name} {m}x{n}: auto takes no full-row wide kernel here; skipped")
                    continue
                smem = n * dt.itemsize
                word = dt == BF16
                # the shared forms hold two rows a block: as many blocks an SM as the shipped shape, or fewer
                mb = max(1, min(shape.min_blocks, SMEM_BUDGET // (2 * smem)))
                built = {"shared": (kernel((ln_shared if op == "layernorm" else rms_shared)(shape.threads, shape.per, mb, word),
                                           mod._SIGS[dt], on_load=dynamic_smem(2 * smem)), 2 * smem)}  # fmt: skip
                for v, r in (("rows2", 2), ("rows4", 4)):
                    if v in variants:
                        built[v] = (kernel(ln_shared(shape.threads, shape.per, mb, word, r), mod._SIGS[dt],
                                           on_load=dynamic_smem(2 * smem)), 2 * smem)  # fmt: skip
                if "prefetch" in variants:
                    built["prefetch"] = (kernel(ln_prefetch(shape.threads, shape.per, shape.min_blocks, word), mod._SIGS[dt],
                                                on_load=dynamic_smem(smem)), smem)  # fmt: skip
                xs_h = [(rng.standard_normal((m, n)) * 2 + 0.5).astype(dt) for _ in range(SETS)]
                w_h = (1 + 0.5 * rng.standard_normal(n)).astype(dt)
                b_h = (0.5 * rng.standard_normal(n)).astype(dt)
                xs = [arrays.to_device(x) for x in xs_h]
                w, b = arrays.to_device(w_h), arrays.to_device(b_h)
                outs = {p: [arrays.to_device(np.zeros((m, n), dt)) for _ in range(SETS)] for p in variants}
                grids = {"persist": min(m, sm_count() * k0.resident_blocks(threads))}
                for p, (kk, sh) in built.items():
                    # rows2 / rows4: a block per 2 / 4 consecutive rows, scheduled by the hardware
                    grids[p] = -(-m // int(p[4:])) if p.startswith("rows") else min(m, sm_count() * kk.resident_blocks(threads, sh))
                eps = float(ln.EPS if op == "layernorm" else rms.EPS)

                def call(p: str, s: int) -> None:
                    if p == "shipped":
                        if op == "layernorm":
                            ln.layernorm(xs[s], w, b, outs[p][s], path=PATH)
                        else:
                            rms.rmsnorm(xs[s], w, outs[p][s], eps=eps, path=PATH)
                        return
                    named = (("x", xs[s]), ("w", w), ("b", b), ("out", outs[p][s])) if op == "layernorm" else (("x", xs[s]), ("w", w), ("out", outs[p][s]))
                    args = (*(arrays.operand(nm, a, None) for nm, a in named), eps)
                    if p == "persist":
                        k0.launch(grids[p], threads, args)
                    else:
                        kk, sh = built[p]
                        kk.launch(grids[p], threads, args, sh)

                for p in variants:
                    for s in range(SETS):
                        call(p, s)
                cuda.synchronize()
                if SIMULATED:
                    t = [[1.0]] * len(variants)
                else:
                    t = time_interleaved(
                        [(lambda a, p=p: call(p, a["s"]), [{"s": s} for s in range(SETS)], None) for p in variants], 30
                    )
                errs, same = {}, {}
                shipped_bits = [arrays.to_host(outs["shipped"][s]).view(np.uint16) for s in range(SETS)]
                for p in variants:
                    worst, eq = 0.0, True
                    for s in range(SETS):
                        got_h = arrays.to_host(outs[p][s])
                        ref = reference(op, xs_h[s], w_h, b_h, eps)
                        worst = max(worst, float(np.abs(got_h.astype(np.float64) - ref).max() / np.abs(ref).max()))
                        eq &= bool(np.array_equal(got_h.view(np.uint16), shipped_bits[s]))
                    errs[p], same[p] = worst, eq
                # layernorm's variants run the shipped arithmetic in the shipped order: the same bits; rmsnorm's
                # shipped kernels at 8192-32768 hold packed pairs (rows.WIDE_PACKED): checked against float64
                ok &= max(errs.values()) < 8e-3 and (op != "layernorm" or all(same.values()))
                us = {p: float(np.median(t[i])) for i, p in enumerate(variants)}
                nbytes = 2 * m * n * dt.itemsize
                r = {"op": op, "dtype": dt.name, "rows": m, "cols": n, "shape": shape.label, "grid": grids, "shared_min_blocks": mb,
                     "us": {p: round(us[p], 2) for p in variants},
                     "of_copy": {p: round(nbytes / us[p] / 1e3 / copy, 3) for p in variants},
                     "x_shipped": {p: round(us["shipped"] / us[p], 3) for p in variants},
                     "max_rel_err": errs, "bits_equal_shipped": same}  # fmt: skip
                report["rows"].append(r)
                print(json.dumps(r), flush=True)
                del xs, outs
    with open(os.path.join(out_dir, "layernorm_prefetch_ab.json"), "w") as fh:
        json.dump(report, fh, indent=1)
    print(f"{'op':9} {'dtype':9} {'shape':12} {'kernel':15} {'shipped us':>10} {'of copy':>7} {'persist x':>9} {'prefetch x':>10} {'shared x':>8} {'rows2 x':>7} {'rows4 x':>7} {'best copy':>9} bits")
    for r in report["rows"]:
        x = r["x_shipped"]
        print(f"{r['op']:9} {r['dtype']:9} {r['rows']}x{r['cols']:<7} {r['shape']:15} {r['us']['shipped']:10.1f} "
              f"{r['of_copy']['shipped']:7.3f} {x.get('persist', float('nan')):9.3f} {x.get('prefetch', float('nan')):10.3f} "
              f"{x.get('shared', float('nan')):8.3f} {x.get('rows2', float('nan')):7.3f} {x.get('rows4', float('nan')):7.3f} "
              f"{max(r['of_copy'].values()):9.3f} {all(r['bits_equal_shipped'].values())}")  # fmt: skip
    print("all outputs within tolerance (layernorm's bit-equal to shipped)" if ok else "SOME OUTPUT FAILED ITS CHECK")
    return 0 if ok else 1


def reference(op: str, x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    if op == "layernorm":
        return ln.reference(x64, w64, b.astype(np.float64), eps)
    return rms.reference(x64, w64, eps)


if __name__ == "__main__":
    sys.exit(main())
