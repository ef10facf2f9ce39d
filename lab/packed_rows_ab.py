# ruff: noqa: B023, E501  (a probe: each lambda is timed within its own loop iteration)
"""A/B probe (not shipped): the register row kernels with the row held as packed pairs, two blocks per SM
where today's WIDE_ROWS shape fits one (benchmarks/PERF.md, "twelfth session").

Why. At 1024 x 32768 the register kernels run at 0.79-0.87 of copy (rmsnorm 0.87, softmax 0.83, layernorm
0.79, H100, eleventh session's table), against 0.90-0.93 at 5120-16384. Their shape there, WideRows(1024,
32, 1), holds 32 fp32 values a thread under launch_bounds(1024, 1): one block per SM, one row per block
(grid = rows), so each row's load latency, block reductions and stores stand alone on the SM, and the next
block starts only when this one exits. The mid on-chip shape shows what a second block per SM does past
32776 columns (1.01-1.26x the streaming kernel).

Variant ("packed"): the same kernels with the row in registers as packed pairs (rows.onchip_pairs: one
uint32 per two columns, exact for values loaded from bf16 / fp16), unpacked to fp32 where used: 64 values a
thread in 32 registers, so 512 threads x 64 fit two blocks per SM under launch_bounds(512, 2)'s 64-register
cap. The arithmetic per element is the shipped kernels' (only the threads' split of the row, hence the
sums' order, differs), so the outputs are checked against float64 with the ops' bf16 / fp16 bounds.

Since rows.WIDE_PACKED shipped rmsnorm's and softmax's winners, "auto" is the product's packed kernel there
and "block" the WIDE_ROWS kernel of that width (auto's before), timed beside the probe's own builds.

Candidates per width (threads x per / launch_bounds' blocks per SM), each against the kernel `auto` takes:
  32768: packed 512x64/2, packed 1024x32/2 (32 registers), and the shipped kernel itself at 1024x32/1
  16384: packed 256x64/4, packed 512x32/4 (auto: 512x32/2)
   8192: packed 128x64/8, packed 256x32/8 (auto: 256x32/4)
and for layernorm each shape again as "packed-shifted" (make_layernorm_shifted: one block reduction a row,
the sums shifted by the row's first element; timed in the thirteenth session: no gain), and "packed-held"
at 8192 and 16384 (make_layernorm_held: the weight and the bias held as packed pairs too, loaded once per
block, on a persistent grid: the write pass loads nothing; 512x16/2 and 1024x16/1, 56 registers; written in
the thirteenth session, checked in the simulator, not yet timed).

Prediction (from the mid shape's two blocks per SM, 1.08-1.22x the one-block layout at 40960): 1.04-1.10x
at 32768, 1.00-1.04x at 16384, level at 8192; layernorm (two block reductions per row) gaining most.

    source benchmarks/h200_env.sh; OUT=$OUT $PY lab/packed_rows_ab.py   (PR_OPS, PR_COLS, PR_DTYPES narrow it)
    NUMBA_ENABLE_CUDASIM=1 python lab/packed_rows_ab.py                   (simulator: correctness only)
    NUMBA_ENABLE_CUDASIM=0 python lab/packed_rows_ab.py --ptxas           (offline: registers, spills; sm_90)

Timed with kernels.harness.bench.time_interleaved (a device-side pause before every call, CUDA events,
rotation over SETS input sets), 2^25 elements per operand. Prints one JSON line per case and a table last;
$OUT/packed_rows_ab.json holds everything, registers and local memory included.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any

import numpy as np
from numba import cuda, float32, uint32

from kernels.harness.bench import SETS, time_interleaved
from kernels.ops import layernorm, rmsnorm, softmax
from kernels.ops.rows import WIDE_ROWS, WideRows, for_machine, packed_row_io, vec_jit
from kernels.primitives.reductions import make_block_sum, make_block_sum2, row_slots
from kernels.primitives.vector import ldg_into, stg_from
from kernels.runtime import arrays
from kernels.runtime.arrays import BF16, SIMULATED, HostSync
from kernels.runtime.launch import kernel

F16 = np.dtype(np.float16)
MODS = {"rmsnorm": rmsnorm, "layernorm": layernorm, "softmax": softmax}
ELEMS = 1 << 25
T0 = time.perf_counter()
CANDIDATES: dict[int, list[tuple[int, int, int]]] = {
    32768: [(512, 64, 2), (1024, 32, 2)],
    16384: [(256, 64, 4), (512, 32, 4)],
    8192: [(128, 64, 8), (256, 32, 8)],
}
SIM_CANDIDATES: dict[int, list[tuple[int, int, int]]] = {128: [(2, 64, 1), (4, 32, 1)], 120: [(2, 64, 1)]}
# PR_CANDS="8192:256x32/6,16384:512x32/3" replaces CANDIDATES (fifteenth session: layernorm's packed builds
# at fewer blocks per SM, 39-40 registers and no spills where the 8-block / 4-block builds spill 20-48 bytes)
if os.environ.get("PR_CANDS"):
    CANDIDATES = {}
    for _c in os.environ["PR_CANDS"].split(","):
        _w, _s = _c.split(":")
        _t, _rest = _s.split("x")
        _p, _mb = _rest.split("/")
        CANDIDATES.setdefault(int(_w), []).append((int(_t), int(_p), int(_mb)))


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def layernorm_write(width: int, threads: int, per: int, word: bool):  # type: ignore[no-untyped-def]
    """The packed layernorm's write pass (both builds): (x - mean) * rstd * w + b for the thread's vectors."""
    _, col_of, lo, hi = packed_row_io(width, threads, per, word)
    nv, hw = per // width, width // 2

    @cuda.jit(device=True, inline="always")
    def write(v, tw, tb, w, b, orow, n, mean, rstd):  # type: ignore[no-untyped-def]
        for q in range(nv):
            col = col_of(q)
            if col < n:
                ldg_into(tw, 0, w, col)
                ldg_into(tb, 0, b, col)
                for p in range(hw):
                    tw[2 * p] = (lo(v[q * hw + p]) - mean) * rstd * tw[2 * p] + tb[2 * p]
                    tw[2 * p + 1] = (hi(v[q * hw + p]) - mean) * rstd * tw[2 * p + 1] + tb[2 * p + 1]
                stg_from(orow, col, tw, 0)

    return write


def layernorm_stats(width: int, threads: int, per: int, word: bool):  # type: ignore[no-untyped-def]
    """The packed two-reduction builds' row statistics: stats(v, sm, n, eps) -> (mean, rstd) of the row in v
    (packed pairs), the mean, then the variance of the deviations (two block reductions, alternating halves
    of `sm`, 2 * row_slots(threads) floats)."""
    _, col_of, lo, hi = packed_row_io(width, threads, per, word)
    bsum, slots = make_block_sum(threads), row_slots(threads)
    npair, nv, hw = per // 2, per // width, width // 2

    @cuda.jit(device=True, inline="always")
    def stats(v, sm, n, eps):  # type: ignore[no-untyped-def]
        fn = float32(n)
        s = float32(0.0)
        for i in range(npair):
            s += lo(v[i])
            s += hi(v[i])
        mean = bsum(s, sm, 0) / fn
        q2 = float32(0.0)
        for q in range(nv):
            if col_of(q) < n:  # padding lanes hold 0, not the mean
                for p in range(hw):
                    d = lo(v[q * hw + p]) - mean
                    q2 += d * d
                    d = hi(v[q * hw + p]) - mean
                    q2 += d * d
        return mean, float32(1.0) / math.sqrt(bsum(q2, sm, slots) / fn + eps)

    return stats


def make_layernorm(width: int, threads: int, per: int, min_blocks: int, word: bool):  # type: ignore[no-untyped-def]
    load_row = packed_row_io(width, threads, per, word)[0]
    stats, write = layernorm_stats(width, threads, per, word), layernorm_write(width, threads, per, word)
    nsm, npair = 2 * row_slots(threads), per // 2

    @cuda.jit(**vec_jit(threads, min_blocks, False))
    def k(x, w, b, out, eps):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(nsm, float32)
        v = cuda.local.array(npair, uint32)
        tw = cuda.local.array(width, float32)
        tb = cuda.local.array(width, float32)
        rows, n = x.shape[0], x.shape[1]
        row = cuda.blockIdx.x
        while row < rows:
            orow = out[row]
            load_row(v, tw, x[row], n, float32(0.0))
            mean, rstd = stats(v, sm, n, eps)
            write(v, tw, tb, w, b, orow, n, mean, rstd)
            row += cuda.gridDim.x

    return k


def make_layernorm_shifted(width: int, threads: int, per: int, min_blocks: int, word: bool):  # type: ignore[no-untyped-def]
    """make_layernorm with one block reduction a row instead of two: the sums of (x - k) and (x - k)^2 in one
    pass over the pairs, k the row's first element (the streaming and on-chip kernels' shift: no
    cancellation for rows far from 0), then mean = k + S1 / n, var = S2 / n - (S1 / n)^2. One unpacking pass
    and one barrier fewer per row (twelfth session: the two-pass packed build lost 2-5 % in fp16)."""
    load_row, col_of, lo, hi = packed_row_io(width, threads, per, word)
    bsum2, slots = make_block_sum2(threads), row_slots(threads)
    write = layernorm_write(width, threads, per, word)
    nsm, npair, nv, hw = 4 * slots, per // 2, per // width, width // 2

    @cuda.jit(**vec_jit(threads, min_blocks, False))
    def k(x, w, b, out, eps):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(nsm, float32)  # two halves: consecutive rows alternate
        v = cuda.local.array(npair, uint32)
        tw = cuda.local.array(width, float32)
        tb = cuda.local.array(width, float32)
        rows, n = x.shape[0], x.shape[1]
        fn = float32(n)
        row, base = cuda.blockIdx.x, 0
        while row < rows:
            orow = out[row]
            xr = x[row]
            ldg_into(tb, 0, xr, 0)  # the shift: every thread reads the row's first vector (a broadcast)
            sh = tb[0]
            load_row(v, tw, xr, n, float32(0.0))
            s1 = float32(0.0)
            s2 = float32(0.0)
            for q in range(nv):
                if col_of(q) < n:  # padding lanes hold 0, not k
                    for p in range(hw):
                        d = lo(v[q * hw + p]) - sh
                        s1 += d
                        s2 += d * d
                        d = hi(v[q * hw + p]) - sh
                        s1 += d
                        s2 += d * d
            t1, t2 = bsum2(s1, s2, sm, base)
            base = 2 * slots - base
            md = t1 / fn
            mean = sh + md
            rstd = float32(1.0) / math.sqrt(max(t2 / fn - md * md, float32(0.0)) + eps)
            write(v, tw, tb, w, b, orow, n, mean, rstd)
            row += cuda.gridDim.x

    return k


def make_layernorm_held(width: int, threads: int, per: int, min_blocks: int, word: bool):  # type: ignore[no-untyped-def]
    """make_layernorm with the weight and the bias held in registers as packed pairs too, loaded once per block
    before its first row, and a persistent grid (PERSISTENT: resident blocks x SMs, each looping over rows).
    The write pass then makes no load at all: each row costs its own read and write, where the WIDE_ROWS
    kernel (one block per row) reads the weight and the bias from L2 again for every row, two more streams the
    size of the row's own, each load ahead of the store that waits on it (thirteenth session: neither packed
    build gained, so layernorm's gap to rmsnorm is not its reductions). The same sums and rounding as
    make_layernorm (two reductions a row). Outcome (fourteenth session, an H100,
    benchmarks/h100/2026-12-06/fourteenth/probes/): lost, 0.77x auto at 2048 x 16384 and 0.86-0.88x at 4096
    x 8192, bf16 and fp16."""
    load_row, col_of, lo, hi = packed_row_io(width, threads, per, word)
    stats = layernorm_stats(width, threads, per, word)
    nsm, npair, nv, hw = 2 * row_slots(threads), per // 2, per // width, width // 2

    @cuda.jit(**vec_jit(threads, min_blocks, False))
    def k(x, w, b, out, eps):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(nsm, float32)
        v = cuda.local.array(npair, uint32)
        vw = cuda.local.array(npair, uint32)
        vb = cuda.local.array(npair, uint32)
        t = cuda.local.array(width, float32)
        rows, n = x.shape[0], x.shape[1]
        row = cuda.blockIdx.x
        if row < rows:
            load_row(vw, t, w, n, float32(0.0))
            load_row(vb, t, b, n, float32(0.0))
        while row < rows:
            orow = out[row]
            load_row(v, t, x[row], n, float32(0.0))
            mean, rstd = stats(v, sm, n, eps)
            for q in range(nv):
                col = col_of(q)
                if col < n:
                    for p in range(hw):
                        i = q * hw + p
                        t[2 * p] = (lo(v[i]) - mean) * rstd * lo(vw[i]) + lo(vb[i])
                        t[2 * p + 1] = (hi(v[i]) - mean) * rstd * hi(vw[i]) + hi(vb[i])
                    stg_from(orow, col, t, 0)
            row += cuda.gridDim.x

    return k


# rmsnorm's and softmax's packed kernels shipped (rows.WIDE_PACKED): the product's factories, the same code
# this probe first timed; layernorm's (not shipped: it lost in fp16) stays here
MAKERS = {"rmsnorm": rmsnorm._make_packed, "layernorm": make_layernorm, "softmax": softmax.make_rows_packed}
# further packed builds per op, timed at every candidate shape beside MAKERS' (label suffix, factory)
EXTRA: dict[str, list[tuple[str, Any]]] = {
    "layernorm": [("shifted", make_layernorm_shifted), ("held", make_layernorm_held)]
}
if "PR_EXTRA" in os.environ:  # PR_EXTRA=shifted: only those further builds (PR_EXTRA= : none)
    EXTRA = {op: [(x, f) for x, f in fs if x in os.environ["PR_EXTRA"].split(",")] for op, fs in EXTRA.items()}
# builds launched on a persistent grid (resident blocks x SMs, rows looped) instead of one block per row
PERSISTENT = {"packed-held"}
# a build's own shapes where they differ from CANDIDATES (threads x per / blocks per SM). "held" keeps three
# packed arrays (the row, the weight, the bias): at 32 values a thread it spills 120-136 bytes (ptxas sm_90,
# 64-register cap), at 16 it takes 56 registers and no spills, so twice the threads at WIDE_ROWS' 1024 threads
# per SM; 32768 columns would need 2048 threads a row
SHAPES: dict[str, dict[int, list[tuple[int, int, int]]]] = {
    "packed-held": {16384: [(1024, 16, 1)], 8192: [(512, 16, 2)]}
}
SIM_SHAPES: dict[str, dict[int, list[tuple[int, int, int]]]] = {
    "packed-held": {128: [(8, 16, 1)], 120: [(8, 16, 1)]}
}


def reference(op: str, x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    if op == "rmsnorm":
        return rmsnorm.reference(x, w.astype(np.float64), 1e-6)
    if op == "layernorm":
        return layernorm.reference(x, w.astype(np.float64), b.astype(np.float64), 1e-6)
    return softmax.reference(x)


def main() -> int:
    from kernels.runtime.device import peaks

    out_dir = os.environ.get("OUT")
    gbs = 1.0 if SIMULATED else float(peaks()["mem_gbs"] or 1.0)
    log(f"copy {gbs:.0f} GB/s")
    rng = np.random.default_rng(0)
    ops = os.environ.get("PR_OPS", "rmsnorm,layernorm,softmax").split(",")
    cands = SIM_CANDIDATES if SIMULATED else CANDIDATES
    widths = [int(c) for c in os.environ.get("PR_COLS", ",".join(map(str, cands))).split(",")]
    dts = [np.dtype(BF16 if d == "bfloat16" else d) for d in os.environ.get("PR_DTYPES", "bfloat16").split(",")]
    rows_out: list[dict[str, Any]] = []
    resources: dict[str, Any] = {}
    ok = True
    for op in ops:
        mod = MODS[op]
        for dt in dts:
            for n in widths:
                m = 7 if SIMULATED else ELEMS // n
                sync = HostSync()
                # each row at its own scale (2^-2 .. 2^2), so a row normed with another row's statistics errs
                # far past the bound (rows drawn alike differ by well under 1 % in their statistics)
                rs = (2.0 ** (np.arange(m) % 5 - 2))[:, None]
                xh = [((rng.standard_normal((m, n)) * 2 + 0.5) * rs).astype(dt) for _ in range(SETS)]
                wh = (1 + 0.5 * rng.standard_normal(n)).astype(dt)
                bh = (0.5 * rng.standard_normal(n)).astype(dt)
                xs = [arrays.to_device(x) for x in xh]
                w, b = arrays.to_device(wh), arrays.to_device(bh)
                outs: dict[str, list[Any]] = {}

                def new_out(label: str) -> list[Any]:
                    outs[label] = [cuda.device_array((m, n), dt) for _ in range(SETS)]
                    return outs[label]

                def args_of(s: int, o: list[Any]) -> tuple[Any, ...]:
                    xo = arrays.as_rows(arrays.operand("x", xs[s], sync))
                    oo = arrays.as_rows(arrays.operand("out", o[s], sync))
                    if op == "softmax":
                        return (xo, oo)
                    wo = arrays.operand("weight", w, sync)
                    if op == "rmsnorm":
                        return (xo, wo, oo, 1e-6)
                    return (xo, wo, arrays.operand("bias", b, sync), oo, 1e-6)

                o_auto = new_out("auto")
                if op == "softmax":
                    calls = [lambda s: mod.softmax(xs[s], o_auto[s])]
                elif op == "rmsnorm":
                    calls = [lambda s: mod.rmsnorm(xs[s], w, o_auto[s], eps=1e-6)]
                else:
                    calls = [lambda s: mod.layernorm(xs[s], w, b, o_auto[s], eps=1e-6)]
                labels = ["auto"]
                # the WIDE_ROWS kernel of this width (auto's before rows.WIDE_PACKED), then the probe's packed
                old = [(c.threads, c.per, c.min_blocks, "wide") for c in map(for_machine, WIDE_ROWS) if c.cols == n]
                makers = [("packed", MAKERS[op])] + [(f"packed-{x}", f) for x, f in EXTRA.get(op, [])]
                shapes = SIM_SHAPES if SIMULATED else SHAPES
                arms = old + [(*c, kind) for kind, _ in makers for c in shapes.get(kind, cands).get(n, [])]
                for threads, per, mb, kind in arms:
                    label = f"{'block' if kind == 'wide' else kind} {threads}x{per}/{mb}"
                    try:
                        if kind == "wide":
                            fn = mod._row_kernel(WideRows(threads, per, mb), 8, word=dt == BF16)[0]
                        else:
                            fn = dict(makers)[kind](8, threads, per, mb, dt == BF16)
                        k = kernel(fn, mod._K.sigs[dt])
                        k._prepare()
                    except Exception as e:  # noqa: BLE001  (a shape ptxas cannot fit is a finding)
                        log(f"{op} {dt.name} {n}: {label} not built: {type(e).__name__}: {str(e)[:300]}")
                        continue
                    if not SIMULATED:
                        d = k.dispatcher
                        resources[f"{op} {dt.name} {label}"] = {  # one signature: its figure
                            "registers": next(iter(d.get_regs_per_thread().values())),
                            "local_bytes": next(iter(d.get_local_mem_per_thread().values())),
                            "resident_blocks": k.resident_blocks(threads),
                        }
                        log(f"{op} {dt.name} {label}: {resources[f'{op} {dt.name} {label}']}")
                    o = new_out(label)
                    argsets = [args_of(s, o) for s in range(SETS)]
                    labels.append(label)
                    grid = m
                    if kind in PERSISTENT and not SIMULATED:
                        sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
                        grid = min(m, k.resident_blocks(threads) * sms)
                    elif kind in PERSISTENT:
                        grid = 3  # the simulator: fewer blocks than rows, so blocks loop
                    calls.append(lambda s, k=k, g=grid, thr=threads, a=argsets: k.launch(g, thr, a[s]))
                for c in calls:  # every set once, so each output holds its own input's result
                    for s in range(SETS):
                        c(s)
                if SIMULATED:
                    ts = [[1.0] for _ in calls]
                else:
                    ts = time_interleaved([(c, list(range(SETS)), None) for c in calls], 30)
                cuda.synchronize()
                # the first rows, the middle ones and the last (a persistent grid's blocks reach these in
                # their row loop)
                idx = np.unique(np.r_[0:64, m // 2 : m // 2 + 64, m - 64 : m].clip(0, m - 1))
                ref = reference(op, xh[0][idx], wh, bh)
                scale = np.abs(ref).max()
                for label, t in zip(labels, ts, strict=True):
                    got = arrays.to_host(outs[label][0])[idx].astype(np.float64)
                    err = float(np.abs(got - ref).max() / scale)
                    good = bool(np.isfinite(got).all()) and err < (8e-3 if dt == BF16 else 2e-3)
                    ok &= good
                    us = float(np.median(t))
                    r = {"op": op, "dtype": dt.name, "rows": m, "cols": n, "kernel": label, "us": round(us, 2),
                         "of_copy": round(2 * m * n * dt.itemsize / us / 1e3 / gbs, 3),
                         "x_auto": round(float(np.median(ts[0])) / us, 3), "err": err, "ok": good}
                    rows_out.append(r)
                    print(json.dumps(r), flush=True)
    if out_dir:
        with open(os.path.join(out_dir, "packed_rows_ab.json"), "w") as f:
            json.dump({"copy_gbs": gbs, "rows": rows_out, "resources": resources}, f, indent=1)
    print(f"{'op':10s} {'dtype':9s} {'shape':12s} {'kernel':20s} {'us':>8s} {'of copy':>7s} {'x auto':>6s} err")
    for r in rows_out:
        print(f"{r['op']:10s} {r['dtype']:9s} {r['rows']}x{r['cols']:<7d} {r['kernel']:20s} {r['us']:8.2f} "
              f"{r['of_copy']:7.3f} {r['x_auto']:6.3f} {r['err']:.1e}{'' if r['ok'] else ' BAD'}")
    print("all outputs right:", "yes" if ok else "NO")
    return 0 if ok else 1


def ptxas_report() -> int:
    """Offline (no GPU): every candidate's and the shipped WIDE_ROWS kernels' registers and spills, ptxas sm_90."""
    from kernels.runtime import ptx

    for op in os.environ.get("PR_OPS", "rmsnorm,layernorm,softmax").split(","):
        mod = MODS[op]
        for dt in (BF16, F16):
            builds = [(f"shipped {t}x{p}/{mb}", mod._row_kernel(WideRows(t, p, mb), 8, word=dt == BF16)[0])
                      for t, p, mb in ((1024, 32, 1), (512, 32, 2), (256, 32, 4))]
            makers = [("packed", MAKERS[op])] + [(f"packed-{x}", f) for x, f in EXTRA.get(op, [])]
            builds += [(f"{kind} {t}x{p}/{mb}", f(8, t, p, mb, dt == BF16))
                       for kind, f in makers for cs in SHAPES.get(kind, CANDIDATES).values()
                       for t, p, mb in cs]
            for label, fn in builds:
                r = ptx._ptxas(ptx.compile_one(fn, mod._K.sigs[dt], (9, 0)), (9, 0), False)
                print(f"{op:9s} {dt.name:8s} {label:22s} registers {r.get('registers')}, spills {r.get('spill_bytes')}",
                      r.get("ptxas", "") if r.get("registers") is None else "", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(ptxas_report() if "--ptxas" in sys.argv else main())
