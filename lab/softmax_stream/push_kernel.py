# ruff: noqa
"""Lab record (not shipped, imported by lab/softmax_stream_ab.py only): softmax's 16-byte streaming kernel as
it was before 2026-12-05's fold (kernels/ops/softmax.py make_stream_vec at 302a80d): pass 1 folds each value
into the online (max, sum) with `_push` (a branch and the accurate expf per value), pass 2 takes the accurate
expf. ncu on an H100 at 261 x 128256 bf16: 70 us, SM issue 62 %, 0.61 of copy."""

import math
from typing import Any

from numba import cuda, float32

from kernels.ops.rows import StreamRows, make_stream_loads
from kernels.ops.softmax import _push
from kernels.primitives.cache_hints import l2_evict_first, l2_evict_last
from kernels.primitives.reductions import NEG_INF, make_block_max, make_block_sum, row_slots
from kernels.primitives.vector import stg_from
from kernels.runtime.arrays import SIMULATED


def make_stream_vec(config: StreamRows, width: int):  # type: ignore[no-untyped-def]
    """Rows past what registers hold (kernels.ops.rows.StreamRows): the streaming kernel's online softmax
    over 16-byte vectors, `config.vectors` in flight per thread. Pass 1 reads the row with L2 evict_last
    and folds each value into the thread's (max, sum); the block merges them (max, then each thread's sum
    rescaled to it); pass 2 re-reads the row evict_first (its last use) and writes exp(v - max) / sum.
    No fastmath: numba-cuda 0.30.4 turns any fastmath setting, a set of flags included, into all of them
    (nnan and ninf with the rest), which would let LLVM fold `_push`'s infinity and NaN tests away; the A/B
    on a GPU can say what a hand-written fast exp would gain."""
    threads, nvec = config.threads, config.vectors
    span = threads * width  # columns that one vector per thread covers
    nvals = nvec * width
    step, tail = make_stream_loads(config, width)
    bmax, bsum, half = make_block_max(threads), make_block_sum(threads), row_slots(threads)
    smem_size = 4 * half  # max and sum slots, two halves each: they alternate between rows
    jit_kw: dict[str, Any] = {} if SIMULATED else {"launch_bounds": (threads, config.min_blocks)}

    @cuda.jit(**jit_kw)
    def k(x, out):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(smem_size, float32)
        v = cuda.local.array(nvals, float32)
        keep = l2_evict_last()
        drop = l2_evict_first()
        rows = x.shape[0]
        n = x.shape[1]
        first = cuda.threadIdx.x * width
        row = cuda.blockIdx.x
        base = 0
        while row < rows:
            xr = x[row]
            m = NEG_INF
            s = float32(0.0)
            col = first
            while col + (nvec - 1) * span < n:
                step(v, xr, col, keep)
                for e in range(nvals):
                    m, s = _push(m, s, v[e])
                col += nvec * span
            # the rest: fewer than nvec vectors of this thread, their loads all in flight at once
            tail(v, xr, col, n, keep)
            for u in range(nvec - 1):
                if col + u * span < n:
                    for e in range(width):
                        m, s = _push(m, s, v[u * width + e])
            mb = bmax(m, sm, base)
            # a thread that saw only -inf (or nothing) has s = 0 and adds 0; an all -inf row is NaN
            s = bsum(s * math.exp(m - mb), sm, base + half)
            base = 2 * half - base
            inv = float32(1.0) / s
            orow = out[row]
            col = first
            while col + (nvec - 1) * span < n:
                step(v, xr, col, drop)
                for e in range(nvals):
                    v[e] = math.exp(v[e] - mb) * inv
                for u in range(nvec):
                    stg_from(orow, col + u * span, v, u * width)
                col += nvec * span
            tail(v, xr, col, n, drop)
            for u in range(nvec - 1):
                if col + u * span < n:
                    for e in range(width):
                        v[u * width + e] = math.exp(v[u * width + e] - mb) * inv
                    stg_from(orow, col + u * span, v, u * width)
            row += cuda.gridDim.x

    return k


