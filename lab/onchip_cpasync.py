# ruff: noqa: E501
"""Probe (not shipped): the on-chip rows' shared part filled by cp.async (LDGSTS: global -> shared with no
register in between) instead of 16-byte loads into registers and shared stores, against the product's
kernels, with lab/onchip_prefetch.py's A/B (interleaved, every output checked against float64).

Why (Nsight Compute on an H100, 2026-12-06, ninth session, benchmarks/h100/2026-12-06/ncu/): the shipped
on-chip kernels run DRAM at 64-73 % of peak with 0.86-1.4 eligible warps per scheduler and 46-54 % of issue
slots idle: latency-bound. Each thread keeps `vectors` = 2 16-byte loads in flight (the registers allow no
more: 64 at launch_bounds(1024, 1)), so an SM has 1024 x 32 B = 32 KB in flight, about what Little's law asks
at ~23 GB/s per SM and 1-1.5 us of loaded DRAM latency, with no margin. cp.async puts a whole row's shared
part in flight (13.7 vectors per thread at 128256 columns: ~220 KB per SM) at no register cost; the write
pass refills each slot with the next row's vector right after reading it, and the thread waits for them all
(cp.async.wait_all) only before summing the next row. The shared part holds each vector's 16 bytes as they
are in memory (4 words: columns 2p, 2p + 1 in word p, the low half first: the pair encoding of
rows.onchip_pairs), read back with one 16-byte shared load; a warp's 32 vectors are 512 contiguous bytes.

Variants for rmsnorm and softmax (their shipped forms are "shipped"): "cpasync" reads 2 vectors of the
shared part (and their weights) per step of the write pass before any is used, "cpasync1" one.
    PYTHONPATH=<numpy 2.4 site>:. OUT=dir python lab/onchip_cpasync.py   (OP_SHAPES, OP_OPS, OP_DTYPES as
    lab/onchip_prefetch.py)
Under the simulator it runs small shapes for correctness only (no timing).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from numba import cuda, float32, uint32

sys.path.insert(0, str(Path(__file__).resolve().parent))
import onchip_prefetch as base  # noqa: E402

from kernels.ops.rows import OnChipRows, onchip_pairs, vec_jit  # noqa: E402
from kernels.ops.softmax import _fast_exp, _fold  # noqa: E402
from kernels.primitives.cp_async import commit, cp16, lds4, wait_all  # noqa: E402, F401  (the probes' names)
from kernels.primitives.reductions import NEG_INF, make_block_max, make_block_sum, row_slots  # noqa: E402
from kernels.primitives.vector import ldg_into, make_row_io, stg_from  # noqa: E402
from kernels.runtime.arrays import SIMULATED  # noqa: E402

# cp16 / commit / wait_all / lds4: the product's since the twenty-third session (the same PTX as this probe's)


def make_io(width: int, word: bool) -> Any:
    """take4(t, off, part, i): vector i of the shared part (words 4i..4i+3) into t[off:off + width]."""
    _, lo, hi = onchip_pairs(word)

    @cuda.jit(device=True, inline="always")
    def take4(t, off, part, i):  # type: ignore[no-untyped-def]
        a, b, c, d = lds4(part, 4 * i)
        t[off] = lo(a)
        t[off + 1] = hi(a)
        t[off + 2] = lo(b)
        t[off + 3] = hi(b)
        t[off + 4] = lo(c)
        t[off + 5] = hi(c)
        t[off + 6] = lo(d)
        t[off + 7] = hi(d)

    return take4


def rms_cpasync(config: OnChipRows, width: int, word: bool, unroll: int = 2):  # type: ignore[no-untyped-def]
    threads, per, nvec = config.threads, config.per, unroll
    load_row, col_of = make_row_io(width, threads, per)
    bsum, slots = make_block_sum(threads), row_slots(threads)
    nsm = 2 * slots
    head = threads * per
    nv = per // width
    nvals = nvec * width
    take4 = make_io(width, word)
    assert width == 8

    @cuda.jit(**vec_jit(threads, config.min_blocks, False))
    def k(x, w, out, eps):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(nsm, float32)
        part = cuda.shared.array(0, uint32)
        v = cuda.local.array(per, float32)
        to = cuda.local.array(nvals, float32)
        tw = cuda.local.array(nvals, float32)
        tid = cuda.threadIdx.x
        rows = x.shape[0]
        n = x.shape[1]
        nt = (n - head) // width
        row = cuda.blockIdx.x
        if row >= rows:
            return
        xr = x[row]
        i = tid
        while i < nt:  # the whole shared part in flight
            cp16(part, 4 * i, xr, head + i * width)
            i += threads
        commit()
        load_row(v, xr, n, float32(0.0))
        acc = float32(0.0)
        for e in range(per):
            acc += v[e] * v[e]
        wait_all()
        i = tid
        while i < nt:
            take4(to, 0, part, i)
            for e in range(width):
                acc += to[e] * to[e]
            i += threads
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
                load_row(v, xn, n, float32(0.0))  # in flight during the shared part's pass
            j = tid
            while j < nt:
                for u in range(nvec):
                    i = j + u * threads
                    if i < nt:
                        ldg_into(tw, u * width, w, head + i * width)
                        take4(to, u * width, part, i)
                for u in range(nvec):
                    i = j + u * threads
                    if i < nt:
                        for e in range(width):
                            to[u * width + e] = to[u * width + e] * inv * tw[u * width + e]
                        stg_from(orow, head + i * width, to, u * width)
                        if more:  # the slot is read: refill it with the next row's vector
                            cp16(part, 4 * i, xn, head + i * width)
                j += nvec * threads
            commit()
            acc = float32(0.0)
            if more:
                for e in range(per):
                    acc += v[e] * v[e]
                wait_all()
                i = tid
                while i < nt:
                    take4(to, 0, part, i)
                    for e in range(width):
                        acc += to[e] * to[e]
                    i += threads
            row = nxt

    return k


def sm_cpasync(config: OnChipRows, width: int, word: bool, unroll: int = 2):  # type: ignore[no-untyped-def]
    threads, per, nvec = config.threads, config.per, unroll
    load_row, col_of = make_row_io(width, threads, per)
    bmax, bsum, half = make_block_max(threads), make_block_sum(threads), row_slots(threads)
    smem_size = 4 * half
    head = threads * per
    nv = per // width
    nvals = nvec * width
    take4 = make_io(width, word)
    jit_kw: dict[str, Any] = {} if SIMULATED else {"launch_bounds": (threads, config.min_blocks)}

    @cuda.jit(**jit_kw)
    def k(x, out):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(smem_size, float32)
        part = cuda.shared.array(0, uint32)
        v = cuda.local.array(per, float32)
        to = cuda.local.array(nvals, float32)
        tid = cuda.threadIdx.x
        rows = x.shape[0]
        n = x.shape[1]
        nt = (n - head) // width
        row = cuda.blockIdx.x
        if row >= rows:
            return
        xr = x[row]
        i = tid
        while i < nt:
            cp16(part, 4 * i, xr, head + i * width)
            i += threads
        commit()
        load_row(v, xr, n, NEG_INF)
        m, s = _fold(NEG_INF, float32(0.0), v, per, True)
        wait_all()
        i = tid
        while i < nt:
            take4(to, 0, part, i)
            m, s = _fold(m, s, to, width, True)
            i += threads
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
            if more:
                load_row(v, xn, n, NEG_INF)
            j = tid
            while j < nt:
                for u in range(nvec):
                    i = j + u * threads
                    if i < nt:
                        take4(to, u * width, part, i)
                for u in range(nvec):
                    i = j + u * threads
                    if i < nt:
                        for e in range(width):
                            to[u * width + e] = _fast_exp(to[u * width + e] - mb) * inv
                        stg_from(orow, head + i * width, to, u * width)
                        if more:
                            cp16(part, 4 * i, xn, head + i * width)
                j += nvec * threads
            commit()
            m = NEG_INF
            s = float32(0.0)
            if more:
                m, s = _fold(m, s, v, per, True)
                wait_all()
                i = tid
                while i < nt:
                    take4(to, 0, part, i)
                    m, s = _fold(m, s, to, width, True)
                    i += threads
            row = nxt

    return k


base.BUILDERS.clear()
base.BUILDERS.update(
    {
        op: {"cpasync": make, "cpasync1": lambda c, w, word, make=make: make(c, w, word, 1)}
        for op, make in (("rmsnorm", rms_cpasync), ("softmax", sm_cpasync))
    }
)
if __name__ == "__main__":
    base.OPS[:] = [op for op in base.OPS if op in base.BUILDERS]
    raise SystemExit(base.main())
