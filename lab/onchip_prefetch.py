# ruff: noqa: E501, B023  (a probe: each closure is called within its own loop iteration)
"""Probe (not shipped): the row ops' on-chip kernels (rows.OnChipRows, each op's make_onchip) with the next
row's loads overlapping this row's write pass, against the two-pass form, interleaved call by call with the
bench's method (kernels.harness.bench.time_interleaved), each output checked against float64.

Why: with one 1024-thread block per SM (ONCHIP_ROWS, 128256 columns) each row is load, block reduction,
write, in turn, and every SM does the same phase at the same time, so DRAM idles while the SMs drain their
stores and ramp their next loads (0.77 of copy on an H100, 2026-12-06). A block that owns its shared-memory
slots (no other thread touches them) can refill a slot with the next row's vector as soon as it has written
this row's from it: the write of row r and the load of row r + grid share one pass, and only the block
reduction stands between rows.

Variants (the shape is the one the product picks for the width: ONCHIP_MID_ROWS at 32776-65536,
ONCHIP_ROWS at 128256-131584):
  shipped   the product's kernel: since the eighth session each op's "early" or "overlap" form below
            (rmsnorm early, layernorm overlap, softmax early)
  twopass   the op's kernel as shipped until then (at 17e9d62: load pass, reduction, write pass)
  overlap   per step: write `vectors` vectors of row r from their slots, then load row r + grid's vectors
            into them (the loads issued after the stores; no register more than the two-pass form).
            Here for rmsnorm and softmax, whose shipped form is "early"
  early     per step: issue row r + grid's loads first (into registers), then write row r's vectors from
            the slots, then keep the loads in the slots (loads in flight during the stores; 8 more registers)
  earlyreg  rmsnorm's early form with the next row's register part loaded right after this row's register
            part is written, not after the shared pass (ninth session: lab/onchip_timeline.py showed 1.4-2.1
            us per row of block reduction while those loads' latency stood alone before it)

As run on 2026-12-06 (benchmarks/h100/2026-12-06/mid-shipped/, then overlap/), this file held rmsnorm's
two-pass kernel as "shipped" and its overlap / early forms; then layernorm's overlap and softmax's overlap /
early forms against their two-pass kernels (at commits a8b4dee and 8554e4f).

    PYTHONPATH=<numpy 2.4 site>:. OUT=dir python lab/onchip_prefetch.py     (OP_SHAPES=261x128256,1024x40960;
    OP_OPS=rmsnorm,layernorm,softmax; OP_DTYPES=bfloat16,float16; OP_VARIANTS=earlyreg)
Under the simulator it runs small shapes for correctness only (no timing).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
from numba import cuda, float32, uint32

from kernels.harness.bench import SETS, time_interleaved
from kernels.ops import layernorm, rmsnorm, softmax
from kernels.ops.rows import ONCHIP_MID_ROWS, ONCHIP_ROWS, OnChipRows, for_machine, onchip_part, vec_jit
from kernels.ops.softmax import _fast_exp, _fold
from kernels.primitives.reductions import NEG_INF, make_block_max, make_block_sum, make_block_sum2, row_slots
from kernels.primitives.vector import ldg_into, make_row_io, stg_from
from kernels.runtime import arrays, device
from kernels.runtime.arrays import BF16, SIMULATED
from kernels.runtime.launch import FastCache, dynamic_smem, kernel

SHAPES = [
    tuple(map(int, s.split("x")))
    for s in os.environ.get("OP_SHAPES", "261x128256,1024x128256,1024x40960,512x65536").split(",")
]
if SIMULATED:
    SHAPES = [(7, 2568), (9, 1800)]
OPS = os.environ.get("OP_OPS", "rmsnorm,layernorm,softmax").split(",")
DTYPES = [
    np.dtype(np.float16) if d == "float16" else BF16
    for d in os.environ.get("OP_DTYPES", "bfloat16,float16").split(",")
]
MODS = {"rmsnorm": rmsnorm, "layernorm": layernorm, "softmax": softmax}
WIDTH = 8
F16 = np.dtype(np.float16)


def rms_twopass(config: OnChipRows, width: int, word: bool):  # type: ignore[no-untyped-def]
    """rmsnorm's make_onchip as shipped until the eighth session (at 17e9d62)."""
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
        tid = cuda.threadIdx.x
        rows = x.shape[0]
        n = x.shape[1]
        nt = (n - head) // width
        row = cuda.blockIdx.x
        base = 0
        while row < rows:
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
            inv = float32(1.0) / math.sqrt(bsum(acc, sm, base) / float32(n) + eps)
            base = slots - base
            orow = out[row]
            for q in range(nv):
                col = col_of(q)
                ldg_into(t, 0, w, col)
                for e in range(width):
                    t[e] = v[q * width + e] * inv * t[e]
                stg_from(orow, col, t, 0)
            j = tid
            while j < nt:
                col = head + j * width
                ldg_into(tw, 0, w, col)
                take(t, part, j, nt)
                for e in range(width):
                    t[e] = t[e] * inv * tw[e]
                stg_from(orow, col, t, 0)
                j += threads
            row += cuda.gridDim.x

    return k


def rms_overlap(config: OnChipRows, width: int, word: bool):  # type: ignore[no-untyped-def]
    """rmsnorm, the next row's loads issued after this row's stores in each step."""
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
        tid = cuda.threadIdx.x
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
        base = 0
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
                    t[e] = v[q * width + e] * inv * tw[e]
                stg_from(orow, col, t, 0)
            acc = float32(0.0)
            j = tid
            while j < nt:
                for u in range(nvec):
                    i = j + u * threads
                    if i < nt:
                        col = head + i * width
                        ldg_into(tw, 0, w, col)
                        take(t, part, i, nt)
                        for e in range(width):
                            t[e] = t[e] * inv * tw[e]
                        stg_from(orow, col, t, 0)
                if more:
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


def rms_earlyreg(config: OnChipRows, width: int, word: bool):  # type: ignore[no-untyped-def]
    """rmsnorm as shipped ("early"), but the next row's register part loads right after this row's register
    part is written (in flight during the shared part's pass) instead of after it, where their latency
    stood alone before the block reduction (lab/onchip_timeline.py, ninth session)."""
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
        base = 0
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
            if more:
                load_row(v, xn, n, float32(0.0))
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
                for e in range(per):
                    acc += v[e] * v[e]
            row = nxt

    return k


def ln_twopass(config: OnChipRows, width: int, word: bool):  # type: ignore[no-untyped-def]
    """layernorm's make_onchip as shipped until the eighth session (at 17e9d62)."""
    threads, per, nvec = config.threads, config.per, config.vectors
    load_row, col_of = make_row_io(width, threads, per)
    bsum2, slots = make_block_sum2(threads), row_slots(threads)
    nsm = 4 * slots  # two sums, two halves: consecutive rows alternate (reductions)
    head = threads * per  # columns held in registers
    nv = per // width
    nvals = nvec * width  # a name, not an expression: numba folds names into local array sizes
    load_step, keep_step, take = onchip_part(config, width, word)

    @cuda.jit(**vec_jit(threads, config.min_blocks, False))
    def k(x, w, b, out, eps):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(nsm, float32)
        part = cuda.shared.array(0, uint32)  # the shared part (rows.onchip_part)
        v = cuda.local.array(per, float32)
        t = cuda.local.array(nvals, float32)
        tw = cuda.local.array(width, float32)
        tb = cuda.local.array(width, float32)
        tid = cuda.threadIdx.x
        rows = x.shape[0]
        n = x.shape[1]
        fn = float32(n)
        nt = (n - head) // width
        row = cuda.blockIdx.x
        base = 0
        while row < rows:
            xr = x[row]
            ldg_into(tb, 0, xr, 0)  # the shift: every thread reads the row's first vector (a broadcast)
            shift = tb[0]
            load_row(v, xr, n, float32(0.0))
            s = float32(0.0)
            q2 = float32(0.0)
            j = tid
            while j < nt:
                load_step(t, xr, j, nt, shift)  # a missing vector's shift adds nothing
                for e in range(nvals):
                    d = t[e] - shift
                    s += d
                    q2 += d * d
                keep_step(t, part, j, nt)
                j += nvec * threads
            for e in range(per):  # the register part: whole (takes: n > head), no padding lanes
                d = v[e] - shift
                s += d
                q2 += d * d
            s, q2 = bsum2(s, q2, sm, base)
            base = 2 * slots - base
            dmean = s / fn  # the mean of v - shift
            # abs, not max(., 0): a GPU max drops a NaN (the streaming kernel's rule, and why)
            rstd = float32(1.0) / math.sqrt(abs(q2 / fn - dmean * dmean) + eps)
            mean = shift + dmean
            orow = out[row]
            for q in range(nv):
                col = col_of(q)
                ldg_into(t, 0, w, col)
                ldg_into(tb, 0, b, col)
                for e in range(width):
                    t[e] = (v[q * width + e] - mean) * rstd * t[e] + tb[e]
                stg_from(orow, col, t, 0)
            j = tid
            while j < nt:  # this thread's own slots: no other thread reads or writes them
                col = head + j * width
                ldg_into(tw, 0, w, col)
                ldg_into(tb, 0, b, col)
                take(t, part, j, nt)
                for e in range(width):
                    t[e] = (t[e] - mean) * rstd * tw[e] + tb[e]
                stg_from(orow, col, t, 0)
                j += threads
            row += cuda.gridDim.x

    return k


def sm_twopass(config: OnChipRows, width: int, word: bool):  # type: ignore[no-untyped-def]
    """softmax's make_onchip as shipped until the eighth session (at 17e9d62)."""
    threads, per, nvec = config.threads, config.per, config.vectors
    load_row, col_of = make_row_io(width, threads, per)
    bmax, bsum, half = make_block_max(threads), make_block_sum(threads), row_slots(threads)
    smem_size = 4 * half  # max and sum slots, two halves each: they alternate between rows
    head = threads * per  # columns held in registers
    nv = per // width
    nvals = nvec * width  # a name, not an expression: numba folds names into local array sizes
    load_step, keep_step, take = onchip_part(config, width, word)
    jit_kw: dict[str, Any] = {} if SIMULATED else {"launch_bounds": (threads, config.min_blocks)}

    @cuda.jit(**jit_kw)
    def k(x, out):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(smem_size, float32)
        part = cuda.shared.array(0, uint32)  # the shared part (rows.onchip_part)
        v = cuda.local.array(per, float32)
        t = cuda.local.array(nvals, float32)
        tid = cuda.threadIdx.x
        rows = x.shape[0]
        n = x.shape[1]
        nt = (n - head) // width
        row = cuda.blockIdx.x
        base = 0
        while row < rows:
            xr = x[row]
            load_row(v, xr, n, NEG_INF)  # the register part is always full (OnChipRows.takes)
            m, s = _fold(NEG_INF, float32(0.0), v, per, True)
            j = tid
            while j < nt:
                load_step(t, xr, j, nt, NEG_INF)  # a missing vector's -inf adds exp(-inf) = 0
                m, s = _fold(m, s, t, nvals, True)
                keep_step(t, part, j, nt)
                j += nvec * threads
            mb = bmax(m, sm, base)
            # a thread that saw only -inf has s = 0 and adds 0; an all -inf row is NaN (as streaming)
            s = bsum(s * math.exp(m - mb), sm, base + half)
            base = 2 * half - base
            inv = float32(1.0) / s
            orow = out[row]
            for q in range(nv):
                for e in range(width):
                    t[e] = _fast_exp(v[q * width + e] - mb) * inv
                stg_from(orow, col_of(q), t, 0)
            j = tid
            while j < nt:  # this thread's own slots: no other thread reads or writes them
                take(t, part, j, nt)
                for e in range(width):
                    t[e] = _fast_exp(t[e] - mb) * inv
                stg_from(orow, head + j * width, t, 0)
                j += threads
            row += cuda.gridDim.x

    return k


def sm_overlap(config: OnChipRows, width: int, word: bool):  # type: ignore[no-untyped-def]
    """softmax's make_onchip (the early form) with the next row's loads after this row's stores."""
    threads, per, nvec = config.threads, config.per, config.vectors
    load_row, col_of = make_row_io(width, threads, per)
    bmax, bsum, half = make_block_max(threads), make_block_sum(threads), row_slots(threads)
    smem_size = 4 * half
    head = threads * per
    nv = per // width
    nvals = nvec * width
    load_step, keep_step, take = onchip_part(config, width, word)
    jit_kw = {} if SIMULATED else {"launch_bounds": (threads, config.min_blocks)}

    @cuda.jit(**jit_kw)
    def k(x, out):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(smem_size, float32)
        part = cuda.shared.array(0, uint32)
        v = cuda.local.array(per, float32)
        t = cuda.local.array(nvals, float32)
        to = cuda.local.array(width, float32)
        tid = cuda.threadIdx.x
        rows = x.shape[0]
        n = x.shape[1]
        nt = (n - head) // width
        row = cuda.blockIdx.x
        if row >= rows:
            return
        xr = x[row]
        load_row(v, xr, n, NEG_INF)
        m, s = _fold(NEG_INF, float32(0.0), v, per, True)
        j = tid
        while j < nt:
            load_step(t, xr, j, nt, NEG_INF)
            m, s = _fold(m, s, t, nvals, True)
            keep_step(t, part, j, nt)
            j += nvec * threads
        base = 0
        while row < rows:
            mb = bmax(m, sm, base)
            s = bsum(s * math.exp(m - mb), sm, base + half)
            base = 2 * half - base
            inv = float32(1.0) / s
            nxt = row + cuda.gridDim.x
            more = nxt < rows
            xn = x[nxt if more else row]
            orow = out[row]
            for q in range(nv):
                for e in range(width):
                    to[e] = _fast_exp(v[q * width + e] - mb) * inv
                stg_from(orow, col_of(q), to, 0)
            m = NEG_INF
            s = float32(0.0)
            j = tid
            while j < nt:
                for u in range(nvec):
                    i = j + u * threads
                    if i < nt:
                        take(to, part, i, nt)
                        for e in range(width):
                            to[e] = _fast_exp(to[e] - mb) * inv
                        stg_from(orow, head + i * width, to, 0)
                if more:
                    load_step(t, xn, j, nt, NEG_INF)
                    m, s = _fold(m, s, t, nvals, True)
                    keep_step(t, part, j, nt)
                j += nvec * threads
            if more:
                load_row(v, xn, n, NEG_INF)
                m, s = _fold(m, s, v, per, True)
            row = nxt

    return k


BUILDERS = {
    "rmsnorm": {"twopass": rms_twopass, "overlap": rms_overlap, "earlyreg": rms_earlyreg},
    "layernorm": {"twopass": ln_twopass},
    "softmax": {"twopass": sm_twopass, "overlap": sm_overlap},
}
if os.environ.get("OP_VARIANTS"):  # e.g. OP_VARIANTS=earlyreg: only those against the shipped kernel
    BUILDERS = {
        op: {v: f for v, f in b.items() if v in os.environ["OP_VARIANTS"].split(",")}
        for op, b in BUILDERS.items()
    }
SIGS = {op: {dt: MODS[op]._SIGS[dt] for dt in (F16, BF16)} for op in MODS}


def run(op: str, x, w, b, out) -> None:  # type: ignore[no-untyped-def]
    if op == "rmsnorm":
        rmsnorm.rmsnorm(x, w, out, path="vector")
    elif op == "layernorm":
        layernorm.layernorm(x, w, b, out, path="vector")
    else:
        softmax.softmax(x, out, path="vector")


def reference(op: str, x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    x = x.astype(np.float32)
    if op == "rmsnorm":
        return rmsnorm.reference(x, w, 1e-6)
    if op == "layernorm":
        return layernorm.reference(x, w, b, 1e-5)
    return softmax.reference(x)


def main() -> int:
    rng = np.random.default_rng(0)
    copy = device.peaks()["mem_gbs"] if not SIMULATED else 1.0
    out: dict[str, object] = {"device": device.describe().get("name"), "copy_gbs": copy, "rows": []}
    shapes = {"chip": for_machine(ONCHIP_ROWS), "mid": for_machine(ONCHIP_MID_ROWS)}
    built = {}
    for op in OPS:
        for sk, cfg in shapes.items():
            assert isinstance(cfg, OnChipRows)
            for dt in DTYPES:
                for var, make in BUILDERS[op].items():
                    built[(op, sk, dt, var)] = kernel(
                        make(cfg, WIDTH, dt == BF16), SIGS[op][dt], on_load=dynamic_smem(cfg.smem)
                    )
    ok = True
    print(f"{'op':9} {'dtype':9} {'shape':12} {'kernel':5}  us (variants)  vs shipped  of copy  err")
    for op in OPS:
        m = MODS[op]
        variants = ("shipped", *BUILDERS[op])
        for dt in DTYPES:
            for rows, cols in SHAPES:
                xs_h = [(rng.standard_normal((rows, cols)) * 2 + 0.5).astype(dt) for _ in range(SETS)]
                w_h = (1 + 0.5 * rng.standard_normal(cols)).astype(dt)
                b_h = (0.5 * rng.standard_normal(cols)).astype(dt)
                xs = [arrays.to_device(x) for x in xs_h]
                w, b = arrays.to_device(w_h), arrays.to_device(b_h)
                outs = {
                    p: [arrays.to_device(np.zeros((rows, cols), dt)) for _ in range(SETS)] for p in variants
                }
                caches = {p: FastCache() for p in variants}
                k0, _, _ = m._K.pick("vector", dt, True, cols, rows)
                kk = getattr(k0, "kernel", k0)
                sk = "mid" if kk is m._K.mid_k.get(dt) else "chip" if kk is m._K.chip_k.get(dt) else None
                if sk is None:
                    print(f"{op} {dt.name} {rows}x{cols}: the product streams this width; skipped")
                    continue
                store = m._K.mid_k if sk == "mid" else m._K.chip_k
                saved, saved_k = m._FAST, store[dt]

                def use(p: str) -> None:
                    m._FAST = caches[p]
                    store[dt] = saved_k if p == "shipped" else built[(op, sk, dt, p)]

                def call(p: str, s: int) -> None:
                    use(p)
                    run(op, xs[s], w, b, outs[p][s])

                try:
                    for p in variants:
                        use(p)
                        assert m._K.pick("vector", dt, True, cols, rows)[0].kernel is store[dt]
                        for s in range(SETS):
                            call(p, s)
                    if SIMULATED:
                        t = [[1.0]] * len(variants)
                    else:
                        t = time_interleaved(
                            [
                                (lambda a, p=p: call(p, a["s"]), [{"s": s} for s in range(SETS)], None)
                                for p in variants
                            ],
                            30,
                        )
                finally:
                    m._FAST, store[dt] = saved, saved_k
                cuda.synchronize()
                errs = {}
                for p in variants:
                    worst = 0.0
                    for s in range(SETS):
                        ref = reference(op, xs_h[s], w_h, b_h)
                        got = arrays.to_host(outs[p][s]).astype(np.float64)
                        worst = max(worst, float(np.abs(got - ref).max() / np.abs(ref).max()))
                    errs[p] = worst
                ok &= max(errs.values()) < 8e-3
                us = {p: float(np.median(t[i])) for i, p in enumerate(variants)}
                nbytes = 2 * rows * cols * dt.itemsize
                frac = {p: round(nbytes / us[p] / 1e3 / copy, 3) for p in variants}
                vs = {p: round(us["shipped"] / us[p], 3) for p in variants}
                out["rows"].append(
                    {
                        "op": op,
                        "dtype": dt.name,
                        "rows": rows,
                        "cols": cols,
                        "shape": sk,
                        "us": us,
                        "of_copy": frac,
                        "err": errs,
                        "shipped_over": vs,
                    }
                )  # type: ignore[attr-defined]
                print(
                    f"{op:9} {dt.name:9} {rows}x{cols:<7} {sk:5}  "
                    + " ".join(f"{p} {us[p]:.2f}" for p in variants)
                    + "  "
                    + " ".join(f"{p} {vs[p]:.3f}" for p in variants[1:])
                    + "  "
                    + " ".join(f"{frac[p]:.3f}" for p in variants)
                    + f"  {max(errs.values()):.2e}"
                )
    for key, kk in built.items():
        try:
            print(
                f"{key[0]} {key[1]} {key[2]} {key[3]}: registers {list(kk.dispatcher.get_regs_per_thread().values())}, local bytes {list(kk.dispatcher.get_local_mem_per_thread().values())}"
            )
        except Exception as e:  # noqa: BLE001
            print(f"{key}: no resource figures ({e})")
    Path(os.environ.get("OUT", "."), "onchip_prefetch.json").write_text(json.dumps(out, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
