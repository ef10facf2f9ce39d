# ruff: noqa: E501, B023  (a probe: each closure is called within its own loop iteration)
"""Probe (not shipped): rmsnorm's on-chip kernels (rows.OnChipRows, the ops' make_onchip) with the next row's
loads overlapping this row's write pass, against the shipped kernels, interleaved call by call with the
bench's method (kernels.harness.bench.time_interleaved), each output checked against float64.

Why: with one 1024-thread block per SM (ONCHIP_ROWS, 128256 columns) each row is load, block reduction,
write, in turn, and every SM does the same phase at the same time, so DRAM idles while the SMs drain their
stores and ramp their next loads (0.77 of copy on an H100, 2026-12-06). A block that owns its shared-memory
slots (no other thread touches them) can refill a slot with the next row's vector as soon as it has written
this row's from it: the write of row r and the load of row r + grid share one pass, and only the block
reduction stands between rows.

Variants (the shape is the one the product picks for the width: ONCHIP_MID_ROWS at 40960-65536,
ONCHIP_ROWS at 128256-131584):
  shipped   the product's kernel (load pass, reduction, write pass)
  overlap   per step: write `vectors` vectors of row r from their slots, then load row r + grid's vectors
            into them (the loads issued after the stores)
  early     per step: issue row r + grid's loads first (into registers), then write row r's vectors from
            the slots, then keep the loads in the slots (loads in flight during the stores; 8 more registers)

    PYTHONPATH=<numpy 2.4 site>:. OUT=dir python lab/onchip_prefetch.py     (OP_SHAPES=261x128256,1024x40960)
Under the simulator it runs small shapes for correctness only (no timing).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
from numba import cuda, float32, uint32

from kernels.harness.bench import SETS, time_interleaved
from kernels.ops import rmsnorm
from kernels.ops.rows import ONCHIP_MID_ROWS, ONCHIP_ROWS, OnChipRows, for_machine, onchip_part, vec_jit
from kernels.primitives.reductions import make_block_sum, row_slots
from kernels.primitives.vector import ldg_into, make_row_io, stg_from
from kernels.runtime import arrays, device
from kernels.runtime.arrays import BF16, SIMULATED
from kernels.runtime.launch import FastCache, dynamic_smem, kernel

SHAPES = [tuple(map(int, s.split("x"))) for s in os.environ.get("OP_SHAPES", "261x128256,1024x128256,1024x40960,512x65536").split(",")]
if SIMULATED:
    SHAPES = [(7, 2568), (9, 1800)]
SIGS = {np.dtype(np.float16): "void(float16[:, ::1], float16[::1], float16[:, ::1], float32)",
        BF16: "void(uint16[:, ::1], uint16[::1], uint16[:, ::1], float32)"}
WIDTH = 8


def make_overlap(config: OnChipRows, width: int, word: bool, early: bool):  # type: ignore[no-untyped-def]
    threads, per, nvec = config.threads, config.per, config.vectors
    load_row, col_of = make_row_io(width, threads, per)
    bsum, slots = make_block_sum(threads), row_slots(threads)
    nsm = 2 * slots
    head = threads * per
    nv = per // width
    nvals = nvec * width
    load_step, keep_step, take = onchip_part(config, width, word)

    @cuda.jit(**vec_jit(threads, config.min_blocks, False))
    def k(x, w, out, eps):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(nsm, float32)
        part = cuda.shared.array(0, uint32)
        v = cuda.local.array(per, float32)
        t = cuda.local.array(nvals, float32)
        tw = cuda.local.array(width, float32)
        to = cuda.local.array(width, float32)
        tid = cuda.threadIdx.x
        rows = x.shape[0]
        n = x.shape[1]
        nt = (n - head) // width
        row = cuda.blockIdx.x
        if row >= rows:
            return
        base = 0
        # prologue: row's load pass, as the shipped kernel's
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
        while row < rows:
            inv = float32(1.0) / math.sqrt(bsum(acc, sm, base) / float32(n) + eps)
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
                if early and more:
                    load_step(t, xn, j, nt, float32(0.0))  # in flight while this row's vectors go out
                for u in range(nvec):
                    jj = j + u * threads
                    if jj < nt:
                        col = head + jj * width
                        ldg_into(tw, 0, w, col)
                        take(to, part, jj, nt)
                        for e in range(width):
                            to[e] = to[e] * inv * tw[e]
                        stg_from(orow, col, to, 0)
                if more:
                    if not early:
                        load_step(t, xn, j, nt, float32(0.0))
                    for e in range(nvals):
                        acc += t[e] * t[e]
                    keep_step(t, part, j, nt)
                j += nvec * threads
            if more:
                load_row(v, xn, n, float32(0.0))
                for e in range(per):
                    acc += v[e] * v[e]
            row = nxt

    return k


def reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return rmsnorm.reference(x.astype(np.float32), w, 1e-6)


def main() -> int:
    rng = np.random.default_rng(0)
    copy = device.peaks()["mem_gbs"] if not SIMULATED else 1.0
    out: dict[str, object] = {"device": device.describe().get("name"), "copy_gbs": copy, "rows": []}
    m = rmsnorm
    shapes = {"chip": for_machine(ONCHIP_ROWS), "mid": for_machine(ONCHIP_MID_ROWS)}
    built = {}
    for sk, cfg in shapes.items():
        assert isinstance(cfg, OnChipRows)
        for dt in SIGS:
            for var, early in (("overlap", False), ("early", True)):
                fn = make_overlap(cfg, WIDTH, dt == BF16, early)
                built[(sk, dt, var)] = kernel(fn, SIGS[dt], on_load=dynamic_smem(cfg.smem))
    ok = True
    print(f"{'dtype':9} {'shape':12} {'kernel':5} {'shipped':>9} {'overlap':>9} {'early':>9}  overlap/shipped early/shipped  of copy (shipped, overlap, early)  err")
    for dt in SIGS:
        for rows, cols in SHAPES:
            xs_h = [(rng.standard_normal((rows, cols)) * 2 + 0.5).astype(dt) for _ in range(SETS)]
            w_h = (1 + 0.5 * rng.standard_normal(cols)).astype(dt)
            xs = [arrays.to_device(x) for x in xs_h]
            w = arrays.to_device(w_h)
            variants = ("shipped", "overlap", "early")
            outs = {p: [arrays.to_device(np.zeros((rows, cols), dt)) for _ in range(SETS)] for p in variants}
            caches = {p: FastCache() for p in variants}
            k0, _, _ = m._K.pick("vector", dt, True, cols, rows)
            kk = getattr(k0, "kernel", k0)
            sk = "mid" if kk is m._K.mid_k.get(dt) else "chip" if kk is m._K.chip_k.get(dt) else None
            if sk is None:
                print(f"{dt.name} {rows}x{cols}: the product streams this width; skipped")
                continue
            store = m._K.mid_k if sk == "mid" else m._K.chip_k
            saved, saved_k = m._FAST, store[dt]

            def use(p: str) -> None:
                m._FAST = caches[p]
                store[dt] = saved_k if p == "shipped" else built[(sk, dt, p)]

            def call(p: str, s: int) -> None:
                use(p)
                m.rmsnorm(xs[s], w, outs[p][s], path="vector")

            try:
                for p in variants:
                    for s in range(SETS):
                        call(p, s)
                if SIMULATED:
                    t = [[1.0]] * len(variants)
                else:
                    t = time_interleaved([(lambda a, p=p: call(p, a["s"]), [{"s": s} for s in range(SETS)], None) for p in variants], 30)
            finally:
                m._FAST, store[dt] = saved, saved_k
            cuda.synchronize()
            errs = {}
            for p in variants:
                worst = 0.0
                for s in range(SETS):
                    ref = reference(xs_h[s], w_h)
                    got = arrays.to_host(outs[p][s]).astype(np.float64)
                    worst = max(worst, float(np.abs(got - ref).max() / np.abs(ref).max()))
                errs[p] = worst
            ok &= max(errs.values()) < 8e-3
            us = {p: float(np.median(t[i])) for i, p in enumerate(variants)}
            nbytes = 2 * rows * cols * dt.itemsize
            frac = {p: round(nbytes / us[p] / 1e3 / copy, 3) for p in variants}
            row = {"dtype": dt.name, "rows": rows, "cols": cols, "shape": sk, "us": us, "of_copy": frac, "err": errs,
                   "overlap_vs_shipped": round(us["shipped"] / us["overlap"], 3), "early_vs_shipped": round(us["shipped"] / us["early"], 3)}
            out["rows"].append(row)  # type: ignore[attr-defined]
            print(f"{dt.name:9} {rows}x{cols:<7} {sk:5} {us['shipped']:9.2f} {us['overlap']:9.2f} {us['early']:9.2f}  {row['overlap_vs_shipped']:15.3f} {row['early_vs_shipped']:13.3f}  "
                  + " ".join(f"{frac[p]:.3f}" for p in variants) + f"  {max(errs.values()):.2e}")
    for key, kk in built.items():
        try:
            print(f"{key[0]} {key[1]} {key[2]}: registers {kk.dispatcher.get_regs_per_thread()}, local bytes {kk.dispatcher.get_local_mem_per_thread()}")
        except Exception as e:  # noqa: BLE001
            print(f"{key}: no resource figures ({e})")
    Path(os.environ.get("OUT", "."), "onchip_prefetch.json").write_text(json.dumps(out, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
