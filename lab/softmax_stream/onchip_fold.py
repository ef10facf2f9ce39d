# ruff: noqa
"""Lab (not shipped, imported by lab/softmax_stream_ab.py only): softmax's on-chip kernel (the layout of
rmsnorm's `make_onchip`, lab/onchip/softmax_onchip.py) with the streaming kernel's 2026-12-05 fold: one exp
per value, the SFU's (libdevice fast_expf), a step's values folded at once. The first on-chip softmax (with
`_push` and the accurate expf) ran 0.83-0.88x the streaming kernel of its day on an H100: with one block per
SM, the SM's exp work does not overlap another row's loads."""

import math
from typing import Any

from numba import cuda, float32

from kernels.ops.rows import OnChipRows, onchip_words
from kernels.ops.softmax import _fast_exp, _fold
from kernels.primitives.reductions import NEG_INF, make_block_max, make_block_sum, row_slots
from kernels.primitives.vector import ldg_into, make_row_io, stg_from
from kernels.runtime.arrays import SIMULATED


def make_onchip(config: OnChipRows, width: int, word: bool):  # type: ignore[no-untyped-def]
    threads, per, nvec = config.threads, config.per, config.vectors
    load_row, col_of = make_row_io(width, threads, per)
    bmax, bsum, half = make_block_max(threads), make_block_sum(threads), row_slots(threads)
    smem_size = 4 * half
    head = threads * per
    nv = per // width
    nvals = nvec * width
    elem, narrow, widen = onchip_words(word)
    jit_kw: dict[str, Any] = {} if SIMULATED else {"launch_bounds": (threads, config.min_blocks)}

    @cuda.jit(**jit_kw)
    def k(x, out):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(smem_size, float32)
        part = cuda.shared.array(0, elem)
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
            load_row(v, xr, n, NEG_INF)
            m, s = _fold(NEG_INF, float32(0.0), v, per, True)
            j = tid
            while j < nt:
                for u in range(nvec):
                    if j + u * threads < nt:
                        ldg_into(t, u * width, xr, head + (j + u * threads) * width)
                    else:
                        for e in range(width):
                            t[u * width + e] = NEG_INF
                m, s = _fold(m, s, t, nvals, True)
                for u in range(nvec):
                    if j + u * threads < nt:
                        for e in range(width):
                            part[e * nt + j + u * threads] = narrow(t[u * width + e])
                j += nvec * threads
            mb = bmax(m, sm, base)
            s = bsum(s * math.exp(m - mb), sm, base + half)
            base = 2 * half - base
            inv = float32(1.0) / s
            orow = out[row]
            for q in range(nv):
                for e in range(width):
                    t[e] = _fast_exp(v[q * width + e] - mb) * inv
                stg_from(orow, col_of(q), t, 0)
            j = tid
            while j < nt:
                for e in range(width):
                    t[e] = _fast_exp(widen(part[e * nt + j]) - mb) * inv
                stg_from(orow, head + j * width, t, 0)
                j += threads
            row += cuda.gridDim.x

    return k
