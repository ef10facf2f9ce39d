# ruff: noqa: E501, B023  (a probe: span_of is called within its own loop iteration)
"""Probe (GPU only, not shipped): where an on-chip row's time goes, phase by phase, in rmsnorm's shipped
on-chip kernel (kernels.ops.rmsnorm.make_onchip, copied here with clock marks and nothing else changed).

Thread 0 of every block writes %globaltimer (ns, one clock for every SM) at: its start, the end of its
first row's load pass, and for each row the start and the end of the block reduction and the end of the
write pass (which also loads the next row). From them: per row, the reduction (from thread 0's arrival to
the block's release: the wait for the slowest thread plus the reduction itself) and the write pass; the first
load pass; the spread of block starts and ends; and the kernel's span against its bytes. The marks cost
registers: ptxas sm_90 spills some bytes here where the shipped kernel spills none (printed below), so the
spans run a little over the product's.

Why (ninth session): Nsight Compute showed DRAM at 64-73 % of peak and eligible warps scarce (latency-bound),
but filling the shared part with cp.async (a whole row in flight per SM, lab/onchip_cpasync.py) moved rmsnorm
by 1-3 % and cost softmax 9 %: bytes in flight are not what holds these kernels. This says what does.

    PYTHONPATH=<numpy 2.4 site>:. OUT=dir python lab/onchip_timeline.py   (TL_SHAPES=261x128256,1024x128256,512x65536)
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

from kernels.ops.rmsnorm import _SIGS, reference
from kernels.ops.rows import ONCHIP_MID_ROWS, ONCHIP_ROWS, OnChipRows, for_machine, onchip_part, vec_jit
from kernels.primitives.reductions import make_block_sum, row_slots
from kernels.primitives.vector import ldg_into, make_row_io, stg_from
from kernels.runtime import arrays, device
from kernels.runtime.arrays import BF16, HostSync
from kernels.runtime.launch import dynamic_smem, kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ptx_asm import special_register  # noqa: E402

SHAPES = [
    tuple(map(int, s.split("x")))
    for s in os.environ.get("TL_SHAPES", "261x128256,1024x128256,512x65536").split(",")
]
MAXR = 12  # rows per block recorded (a shape must give no block more)
MARKS = 2 + 3 * MAXR


gt = special_register("globaltimer", 64)


def make_timed(config: OnChipRows, width: int, word: bool):  # type: ignore[no-untyped-def]
    threads, per, nvec = config.threads, config.per, config.vectors
    load_row, col_of = make_row_io(width, threads, per)
    bsum, slots = make_block_sum(threads), row_slots(threads)
    nsm = 2 * slots
    head = threads * per
    nv = per // width
    nvals = nvec * width
    load_step, keep_step, take = onchip_part(config, width, word)

    @cuda.jit(**vec_jit(threads, config.min_blocks, False))
    def k(x, w, out, eps, tl):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(nsm, float32)
        part = cuda.shared.array(0, uint32)
        v = cuda.local.array(per, float32)
        t = cuda.local.array(nvals, float32)
        tw = cuda.local.array(width, float32)
        to = cuda.local.array(width, float32)
        tid = cuda.threadIdx.x
        mark = tid == 0
        mi = cuda.blockIdx.x * MARKS  # this block's marks in the flat table (blocks x MARKS)
        if mark:
            tl[mi] = gt()
        rows = x.shape[0]
        n = x.shape[1]
        nt = (n - head) // width
        row = cuda.blockIdx.x
        if row >= rows:
            return
        xr = x[row]
        load_row(v, xr, n, float32(0.0))
        acc = float32(0.0)
        j = tid
        while j < nt:
            load_step(t, xr, j, nt, float32(0.0))
            for e in range(nvals):
                acc += t[e] * t[e]
            keep_step(t, part, j, nt)
            j += nvec * threads
        for e in range(per):
            acc += v[e] * v[e]
        if mark:
            tl[mi + 1] = gt()
        mi += 2
        base = 0
        while row < rows:
            if mark:
                tl[mi] = gt()
            inv = float32(1.0) / math.sqrt(bsum(acc, sm, base) / float32(n) + eps)
            if mark:
                tl[mi + 1] = gt()
            base = slots - base
            nxt = row + cuda.gridDim.x
            more = nxt < rows
            xn = x[nxt if more else row]
            orow = out[row]
            for q in range(nv):
                col = col_of(q)
                ldg_into(tw, 0, w, col)
                for e in range(width):
                    to[e] = v[q * width + e] * inv * tw[e]
                stg_from(orow, col, to, 0)
            acc = float32(0.0)
            j = tid
            while j < nt:
                if more:
                    load_step(t, xn, j, nt, float32(0.0))
                for u in range(nvec):
                    i = j + u * threads
                    if i < nt:
                        col = head + i * width
                        ldg_into(tw, 0, w, col)
                        take(to, part, i, nt)
                        for e in range(width):
                            to[e] = to[e] * inv * tw[e]
                        stg_from(orow, col, to, 0)
                if more:
                    for e in range(nvals):
                        acc += t[e] * t[e]
                    keep_step(t, part, j, nt)
                j += nvec * threads
            if more:
                load_row(v, xn, n, float32(0.0))
                for e in range(per):
                    acc += v[e] * v[e]
            if mark:
                tl[mi + 2] = gt()
            mi += 3
            row = nxt

    return k


def main() -> int:
    rng = np.random.default_rng(0)
    copy = device.peaks()["mem_gbs"]
    nsm = device.describe().get("sm_count") or 132
    report: dict[str, Any] = {"device": device.describe().get("name"), "copy_gbs": copy, "shapes": []}
    ok = True
    for rows, cols in SHAPES:
        cfg = for_machine(ONCHIP_ROWS if cols > ONCHIP_MID_ROWS.cols else ONCHIP_MID_ROWS)
        assert isinstance(cfg, OnChipRows) and cfg.takes(cols)
        sig = _SIGS[BF16].replace(", float32)", ", float32, int64[::1])")
        assert -(-rows // (nsm * cfg.min_blocks)) <= MAXR
        kk = kernel(make_timed(cfg, 8, True), sig, on_load=dynamic_smem(cfg.smem))
        grid = min(rows, nsm * cfg.min_blocks)
        xh = (rng.standard_normal((rows, cols)) * 2 + 0.5).astype(BF16)
        wh = (1 + 0.5 * rng.standard_normal(cols)).astype(BF16)
        x, w = arrays.to_device(xh), arrays.to_device(wh)
        out = arrays.to_device(np.zeros((rows, cols), BF16))
        tl = arrays.to_device(np.zeros(grid * MARKS, np.int64))
        sync = HostSync()
        args = tuple(arrays.operand(nm, a, sync) for nm, a in (("x", x), ("w", w), ("out", out))) + (
            np.float32(1e-6),
            arrays.operand("tl", tl, sync),
        )
        spans = []
        for _ in range(12):
            kk.launch(grid, cfg.threads, args, cfg.smem)
            cuda.synchronize()
            spans.append(arrays.to_host(tl).reshape(1, grid, MARKS))
        got = arrays.to_host(out).astype(np.float64)
        ref = reference(xh.astype(np.float32), wh, 1e-6)
        err = float(np.abs(got - ref).max() / np.abs(ref).max())
        ok &= err < 8e-3
        nr = [len(range(b, rows, grid)) for b in range(grid)]

        def span_of(a: np.ndarray) -> int:
            return max(int(a[0, b, 4 + 3 * (min(nr[b], MAXR) - 1)]) for b in range(grid)) - int(
                a[0, :, 0].min()
            )

        h = sorted(spans[2:], key=span_of)[
            len(spans[2:]) // 2
        ]  # the median launch by span, after two warm-ups
        t0 = int(h[0, :, 0].min())
        rel = (h - t0).astype(np.float64) / 1e3  # us from the first block's start
        ends = np.array([rel[0, b, 4 + 3 * (min(nr[b], MAXR) - 1)] for b in range(grid)])
        span = float(ends.max())
        nbytes = 2 * rows * cols * 2
        red = [
            rel[0, b, 3 + 3 * r] - rel[0, b, 2 + 3 * r] for b in range(grid) for r in range(min(nr[b], MAXR))
        ]
        wpass = [
            rel[0, b, 4 + 3 * r] - rel[0, b, 3 + 3 * r] for b in range(grid) for r in range(min(nr[b], MAXR))
        ]
        first = [rel[0, b, 1] - rel[0, b, 0] for b in range(grid)]
        rec = {
            "rows": rows,
            "cols": cols,
            "grid": grid,
            "threads": cfg.threads,
            "err": err,
            "span_us": span,
            "of_copy_in_span": nbytes / span / 1e3 / copy,
            "start_spread_us": float(rel[0, :, 0].max()),
            "end_spread_us": float(span - ends.min()),
            "first_load_us": [float(np.median(first)), float(np.max(first))],
            "reduction_us": [float(np.median(red)), float(np.percentile(red, 90))],
            "write_pass_us": [float(np.median(wpass)), float(np.percentile(wpass, 90))],
            "block0": rel[0, 0, : 2 + 3 * min(nr[0], MAXR)].round(2).tolist(),
        }
        report["shapes"].append(rec)
        print(
            f"bf16 {rows}x{cols} grid {grid}x{cfg.threads}: span {span:.1f} us ({rec['of_copy_in_span']:.3f} of copy), "
            f"starts spread {rec['start_spread_us']:.1f}, ends spread {rec['end_spread_us']:.1f}; first load pass "
            f"{rec['first_load_us'][0]:.1f} (max {rec['first_load_us'][1]:.1f}); per row: reduction {rec['reduction_us'][0]:.2f} "
            f"(p90 {rec['reduction_us'][1]:.2f}), "
            f"write pass {rec['write_pass_us'][0]:.1f} (p90 {rec['write_pass_us'][1]:.1f}); err {err:.2e}",
            flush=True,
        )
        print("  block 0 marks (us):", rec["block0"], flush=True)
    try:
        print(
            "registers",
            list(kk.dispatcher.get_regs_per_thread().values()),
            "local bytes",
            list(kk.dispatcher.get_local_mem_per_thread().values()),
        )
    except Exception as e:  # noqa: BLE001
        print("no resource figures", e)
    Path(os.environ.get("OUT", "."), "onchip_timeline.json").write_text(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
