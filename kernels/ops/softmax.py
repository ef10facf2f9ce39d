"""softmax: out[i, :] = exp(x[i, :] - max_i) / sum(exp(x[i, :] - max_i)), row-wise over the last dimension.

Floors per row of n: ~5n FLOP (counting each exp as one); bytes = 2 * n * itemsize. Bandwidth-bound on the
H200 (2 exps per element through the SFUs cost ~1/4 of the memory time at fp32).
Kernels, one block of 256 threads per row:
  - `_make_reg` (rows of up to BLOCK * PER = 4096): the row sits in registers; block max, then each
    element's exp(v - max) is computed once, kept in its register, summed, and scaled on the way out:
    one read, one write, one exp per element.
  - `_softmax_vec` (same rows when x and out are 16-byte aligned and a row is a multiple of 16 bytes): the
    register kernel with 16-byte loads and stores (kernels.primitives.vector).
  - `make_rows_blocked`: the vector kernel with other block shapes, reductions and numba's fastmath;
    kernels/ops/rows.py ROW_KERNELS sends fp16 "auto" calls to it (exp as ex2.approx, 2 SASS instructions
    per element instead of 5). fp32 keeps the register kernel. The measurements, and the kernels that lost,
    are in benchmarks/notes-memory.md.
  - `_make_stream` (longer rows): pass 1 is the online softmax: each thread carries (max, sum of
    exp(v - max)) and rescales its sum when the max grows, so the row is read from memory once; the partials
    merge across the block with the same rule. Pass 2 re-reads the row from L1/L2 and writes.
  - bf16 (`ml_dtypes.bfloat16`, the same dtype as residual_add / cast): the register and streaming kernels
    above, built from the same bodies with kernels.ops.rows.WORDS: uint16 words widened exactly to fp32,
    fp32 arithmetic, one round to nearest even on the store (NaN stays NaN); on a GPU the blocked vector
    kernel of fp16 (ROW_KERNELS), moving the words as 16-byte vectors of 8.
  - Vector rows in fp16 / bf16 outside its 4096 columns: the blocked kernel at a kernels.ops.rows WIDE_ROWS
    shape (32 x 32 up to 1024 x 32 threads x values, rows.wide_for), so rows of up to 32768 columns are read
    once instead of streamed twice; rows of 5121-32768 columns (the 8192-32768 shapes) take
    `make_rows_packed` (rows.WIDE_PACKED: half the threads x 64 values as packed pairs, twice the rows per SM;
    1.05-1.09x at 32768 on an H100, level to 1.03x at 8192-16384).
  - `make_onchip` (fp16 / bf16 rows of kernels.ops.rows.ONCHIP_ROWS.from_cols to .cols columns: 128256 to
    131584, the vocabularies, and built again as rows.ONCHIP_MID_ROWS for rows of 32776 to 65536: two
    blocks of 512 threads per SM; "auto" and "vector" take it there, on GPUs that let a block opt in to its
    shared memory: rows.chip_fits, sm_90): rmsnorm's on-chip layout (1024 threads x 16 values in
    registers, the rest in the thread's own slots of dynamic shared memory) with the streaming kernel's
    fold, so the row is read once, and the next row loaded in the write pass (on an H100, 2026-12-06, bf16 at
    261 x 128256: 0.83 of copy; the two-pass form in packed pairs before it: 0.78, 1.10-1.16x its streaming
    kernel).
  - `make_stream_vec` (path="vector" on rows past what registers hold: 32768 columns in fp16 / bf16, e.g.
    vocabularies of 128256; 4096 in fp32): the streaming kernel on 16-byte vectors, 1024 threads per row,
    L2 hints so that pass 2 re-reads the row from L2 (kernels.ops.rows.STREAM_ROWS). "auto" takes it in the
    rows.STREAM_VECTOR_AUTO dtypes, fp32 from rows.STREAM_VECTOR_AUTO_FROM's width (on the H200 1.1-3.0x
    the scalar streaming kernel).
Rows that are entirely -inf give NaN, as the float64 reference does.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda, float32, uint32
from numba.cuda import libdevice

from kernels.ops.rows import (
    BF16_ELEM_TOL,
    BF16_TOL,
    BlockedRows,
    OnChipRows,
    RowConfig,
    RowIO,
    RowKernels,
    StreamRows,
    VectorRows,
    WideRows,
    make_stream_loads,
    onchip_part,
    packed_row_io,
    row_cases,
    row_choice_of,
    row_path_of,
    vec_jit,
)
from kernels.primitives.cache_hints import l2_evict_first, l2_evict_last
from kernels.primitives.reductions import (
    BLOCK,
    NEG_INF,
    PER,
    ROW_JIT,
    VEC_ROW_JIT,
    block_max,
    block_max_sum,
    block_sum,
    make_block_max,
    make_block_sum,
    row_slots,
)
from kernels.primitives.vector import make_row_io, stg_from, vector_ok
from kernels.registry import SPECIALS, Case, OpSpec, Problem, poison, register
from kernels.runtime import arrays
from kernels.runtime.arrays import BF16, FLOAT_IO_BF16, SIMULATED, HostSync
from kernels.runtime.launch import FastCache

NAN = float32(math.nan)


@cuda.jit(device=True, inline="always")
def _push(m, s, v):  # type: ignore[no-untyped-def]
    """Add one value to an online-softmax partial (m, s). NaN and +inf make the sum NaN, as they make the
    float64 reference's exp(x - max) sum NaN: a NaN or +inf anywhere gives a NaN row."""
    if v > m:  # v - v: 0, or NaN for v = +inf (exp(inf - inf) in the reference)
        return v, s * math.exp(m - v) + (v - v + float32(1.0))
    if m == NEG_INF:  # v is -inf (it adds exp(-inf) = 0; -inf - -inf would be NaN) or NaN (kept)
        return m, (s if v == m else v)
    return m, s + math.exp(v - m)


def _make_stream(io: RowIO):  # type: ignore[no-untyped-def]
    """The streaming kernel (rows longer than BLOCK * PER), reading and writing through `io`."""
    load, store = io.load, io.store

    @cuda.jit
    def _softmax_kernel(x, out):  # type: ignore[no-untyped-def]
        smem = cuda.shared.array(BLOCK, float32)
        smem2 = cuda.shared.array(BLOCK, float32)
        tid = cuda.threadIdx.x
        rows = x.shape[0]
        n = x.shape[1]
        row = cuda.blockIdx.x
        while row < rows:
            m = NEG_INF
            s = float32(0.0)
            j = tid
            while j + 3 * BLOCK < n:
                v0 = load(x[row, j])
                v1 = load(x[row, j + BLOCK])
                v2 = load(x[row, j + 2 * BLOCK])
                v3 = load(x[row, j + 3 * BLOCK])
                m, s = _push(m, s, v0)
                m, s = _push(m, s, v1)
                m, s = _push(m, s, v2)
                m, s = _push(m, s, v3)
                j += 4 * BLOCK
            while j < n:
                m, s = _push(m, s, load(x[row, j]))
                j += BLOCK
            m, s = block_max_sum(m, s, smem, smem2)
            inv = float32(1.0) / s
            j = tid
            while j + 3 * BLOCK < n:
                v0 = load(x[row, j])
                v1 = load(x[row, j + BLOCK])
                v2 = load(x[row, j + 2 * BLOCK])
                v3 = load(x[row, j + 3 * BLOCK])
                out[row, j] = store(math.exp(v0 - m) * inv)
                out[row, j + BLOCK] = store(math.exp(v1 - m) * inv)
                out[row, j + 2 * BLOCK] = store(math.exp(v2 - m) * inv)
                out[row, j + 3 * BLOCK] = store(math.exp(v3 - m) * inv)
                j += 4 * BLOCK
            while j < n:
                out[row, j] = store(math.exp(load(x[row, j]) - m) * inv)
                j += BLOCK
            row += cuda.gridDim.x

    return _softmax_kernel


def _make_reg(io: RowIO):  # type: ignore[no-untyped-def]
    """The register kernel (rows of up to BLOCK * PER), reading and writing through `io`."""
    load, store = io.load, io.store

    @cuda.jit(**ROW_JIT)
    def _softmax_reg(x, out):  # type: ignore[no-untyped-def]
        smem = cuda.shared.array(BLOCK, float32)
        v = cuda.local.array(PER, float32)
        tid = cuda.threadIdx.x
        rows = x.shape[0]
        n = x.shape[1]
        full = n >= BLOCK * PER
        row = cuda.blockIdx.x
        while row < rows:
            # 1-d row views and uint32 column indices: no negative-index wraparound code and one running
            # address per array instead of PER precomputed 64-bit ones (171 -> 34 registers for rmsnorm)
            xr = x[row]
            orow = out[row]
            if full:
                for k in range(PER):
                    v[k] = load(xr[uint32(tid + k * BLOCK)])
            else:
                for k in range(PER):
                    j = uint32(tid + k * BLOCK)
                    v[k] = load(xr[j]) if j < n else NEG_INF
            m = NEG_INF
            for k in range(PER):
                m = max(m, v[k])
            m = block_max(m, smem)
            s = float32(0.0)
            for k in range(PER):
                e = math.exp(v[k] - m) if tid + k * BLOCK < n else float32(0.0)
                v[k] = e
                s += e
            inv = float32(1.0) / block_sum(s, smem)
            for k in range(PER):
                j = uint32(tid + k * BLOCK)
                if j < n:
                    orow[j] = store(v[k] * inv)
            row += cuda.gridDim.x

    return _softmax_reg


def _make_vec(width: int, fastmath: bool = False):  # type: ignore[no-untyped-def]
    load_row, col_of = make_row_io(width, BLOCK, PER)
    jit_kw: dict[str, Any] = dict(VEC_ROW_JIT, fastmath=True) if fastmath and not SIMULATED else VEC_ROW_JIT

    @cuda.jit(**jit_kw)
    def k(x, out):  # type: ignore[no-untyped-def]
        smem = cuda.shared.array(BLOCK, float32)
        v = cuda.local.array(PER, float32)
        rows = x.shape[0]
        n = x.shape[1]
        row = cuda.blockIdx.x
        while row < rows:
            orow = out[row]
            load_row(v, x[row], n, NEG_INF)
            m = NEG_INF
            for e in range(PER):
                m = max(m, v[e])
            m = block_max(m, smem)
            s = float32(0.0)
            for q in range(PER // width):
                inside = col_of(q) < n
                for e in range(width):
                    ex = math.exp(v[q * width + e] - m) if inside else float32(0.0)
                    v[q * width + e] = ex
                    s += ex
            inv = float32(1.0) / block_sum(s, smem)
            for e in range(PER):
                v[e] *= inv
            for q in range(PER // width):
                col = col_of(q)
                if col < n:
                    stg_from(orow, col, v, q * width)
            row += cuda.gridDim.x

    return k


def make_rows_blocked(  # type: ignore[no-untyped-def]
    width: int, threads: int, per: int, min_blocks: int, fastmath: bool
):
    """Register-row kernel (rows of <= threads * per, 16-byte loads, kernels.primitives.vector rules) in the
    vector kernel's order (block max, then exp(v - max) once per element kept in its register, block sum,
    scale on the way out) with unrolled reducers whose slots alternate between rows, so two barriers per row
    instead of four, and `fastmath` (numba's flag: exp becomes ex2.approx of x * log2(e), one FMUL + one MUFU
    per element; the division fast too). `threads` per block and `per` values per thread set how many rows an
    SM holds in registers (`min_blocks` = launch_bounds' blocks per SM)."""
    nv = per // width
    load_row, col_of = make_row_io(width, threads, per)
    bmax = make_block_max(threads)
    bsum = make_block_sum(threads)
    half = row_slots(threads)
    smem_size = 4 * half  # max and sum slots, two halves each: they alternate between rows
    jit_kw: dict[str, Any] = {} if SIMULATED else {"launch_bounds": (threads, min_blocks)}
    if fastmath:
        jit_kw["fastmath"] = True

    @cuda.jit(**jit_kw)
    def k(x, out):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(smem_size, float32)
        v = cuda.local.array(per, float32)
        rows = x.shape[0]
        n = x.shape[1]
        row = cuda.blockIdx.x
        base = 0
        while row < rows:
            load_row(v, x[row], n, NEG_INF)
            m = NEG_INF
            for e in range(per):
                m = max(m, v[e])
            m = bmax(m, sm, base)
            s = float32(0.0)
            for e in range(per):
                ex = math.exp(v[e] - m)  # padding: exp(-inf) = 0
                v[e] = ex
                s += ex
            s = bsum(s, sm, base + half)
            base = 2 * half - base
            inv = float32(1.0) / s
            orow = out[row]
            for q in range(nv):
                col = col_of(q)
                if col < n:
                    for e in range(width):
                        v[q * width + e] *= inv
                    stg_from(orow, col, v, q * width)
            row += cuda.gridDim.x

    return k


def make_rows_packed(width: int, threads: int, per: int, min_blocks: int, word: bool):  # type: ignore[no-untyped-def]
    """`make_rows_blocked` at a WideRows.packed shape (kernels.ops.rows.WIDE_PACKED): the row kept as packed
    pairs (rows.packed_row_io; `word`: bf16 words, else fp16), so the exps cannot stay in its registers: the
    block max, the block sum of exp(v - max), then exp(v - max) again in the write pass, times 1 / sum (two
    SFU exps per value under fastmath, as the blocked kernel's one). Padding lanes are left out of both
    sums; a NaN or +inf in the row makes it NaN, as in make_rows_blocked and the float64 reference."""
    load_row, col_of, lo, hi = packed_row_io(width, threads, per, word)
    bmax, bsum, slots = make_block_max(threads), make_block_sum(threads), row_slots(threads)
    nsm, npair, nv, hw = 2 * slots, per // 2, per // width, width // 2

    @cuda.jit(**vec_jit(threads, min_blocks, True))
    def k(x, out):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(nsm, float32)  # the max's slots, then the sum's
        v = cuda.local.array(npair, uint32)
        t = cuda.local.array(width, float32)
        rows, n = x.shape[0], x.shape[1]
        row = cuda.blockIdx.x
        while row < rows:
            orow = out[row]
            load_row(v, t, x[row], n, NEG_INF)
            mx = NEG_INF
            for q in range(nv):
                if col_of(q) < n:
                    for p in range(hw):
                        mx = max(mx, max(lo(v[q * hw + p]), hi(v[q * hw + p])))
            mx = bmax(mx, sm, 0)
            s = float32(0.0)
            for q in range(nv):
                if col_of(q) < n:
                    for p in range(hw):
                        s += math.exp(lo(v[q * hw + p]) - mx)
                        s += math.exp(hi(v[q * hw + p]) - mx)
            inv = float32(1.0) / bsum(s, sm, slots)
            for q in range(nv):
                col = col_of(q)
                if col < n:
                    for p in range(hw):
                        t[2 * p] = math.exp(lo(v[q * hw + p]) - mx) * inv
                        t[2 * p + 1] = math.exp(hi(v[q * hw + p]) - mx) * inv
                    stg_from(orow, col, t, 0)
            row += cuda.gridDim.x

    return k


# on a GPU, x * log2(e) then ex2.approx.f32 (no ftz without fastmath: ptxas adds a scale for results under
# 2^-126, so subnormal outputs are kept; about 5 SASS instructions against the accurate expf's ~10); the
# simulator has no libdevice (its exp is the exact one)
_fast_exp = math.exp if SIMULATED else libdevice.fast_expf


@cuda.jit(device=True, inline="always")
def _fold(m, s, v, nvals, fast):  # type: ignore[no-untyped-def]
    """Fold `nvals` values of v into an online-softmax partial (m, s) with one exp per value: the group's max
    g first (a NaN never compares greater, so the max stays a number), then s * exp(m - g) + sum(exp(v - g)).
    Relative to g, or to 0 while every value so far is -inf (-inf - -inf would be NaN): a -inf adds 0, a NaN
    or a +inf (inf - inf) makes the sum NaN, as the float64 reference's row is NaN. `fast`: the SFU's exp
    (16-bit rows; its ~1e-6 relative error is far under their rounding), else the accurate one."""
    g = m
    for e in range(nvals):
        if v[e] > g:
            g = v[e]
    r = g if g != NEG_INF else float32(0.0)
    t = float32(0.0)
    if fast:
        for e in range(nvals):
            t += _fast_exp(v[e] - r)
        return g, s * _fast_exp(m - r) + t
    for e in range(nvals):
        t += math.exp(v[e] - r)
    return g, s * math.exp(m - r) + t


def make_stream_vec(config: StreamRows, width: int):  # type: ignore[no-untyped-def]
    """Rows past what registers hold (kernels.ops.rows.StreamRows): an online softmax over 16-byte vectors,
    `config.vectors` in flight per thread. Pass 1 reads the row with L2 evict_last and folds each step's
    values into the thread's (max, sum) with one exp per value (`_fold`); the block merges them (max, then
    each thread's sum rescaled to it); pass 2 re-reads the row evict_first (its last use) and writes
    exp(v - max) / sum. 16-bit rows (width 8) take the SFU's exp (libdevice fast_expf) in both passes: with
    the accurate expf and a branch per value, the kernel's SM throughput (ncu) was 62 % at 261 x 128256
    bf16 on an H100 (ncu, 2026-12-05) and reached 0.61 of copy; fp32 keeps the accurate exp. No fastmath
    flag: numba-cuda 0.30.4 turns any fastmath setting into all of LLVM's (nnan and ninf with the rest),
    which would let it fold the infinity and NaN tests away."""
    threads, nvec = config.threads, config.vectors
    span = threads * width  # columns that one vector per thread covers
    nvals = nvec * width
    fast = width == 8
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
                m, s = _fold(m, s, v, nvals, fast)
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
                if fast:
                    for e in range(nvals):
                        v[e] = _fast_exp(v[e] - mb) * inv
                else:
                    for e in range(nvals):
                        v[e] = math.exp(v[e] - mb) * inv
                for u in range(nvec):
                    stg_from(orow, col + u * span, v, u * width)
                col += nvec * span
            tail(v, xr, col, n, drop)
            for u in range(nvec - 1):
                if col + u * span < n:
                    if fast:
                        for e in range(width):
                            v[u * width + e] = _fast_exp(v[u * width + e] - mb) * inv
                    else:
                        for e in range(width):
                            v[u * width + e] = math.exp(v[u * width + e] - mb) * inv
                    stg_from(orow, col + u * span, v, u * width)
            row += cuda.gridDim.x

    return k


def make_onchip(config: OnChipRows, width: int, word: bool):  # type: ignore[no-untyped-def]
    """Rows past what registers hold, read once (kernels.ops.rows.OnChipRows; fp16 / bf16 `word`s), the
    layout of rmsnorm's `make_onchip`: the block's first row loads its first threads x per columns into
    registers and streams the rest into the thread's own shared-memory slots (packed pairs,
    rows.onchip_pairs), `config.vectors` 16-byte loads in flight, folding each step into the thread's (max,
    sum) as the streaming kernel does (`_fold`: one SFU exp per value; a step's missing vectors count as
    -inf). Then, row after row: the block merges them, and one pass writes exp(v - max) / sum from registers
    and from each slot and, in the same step, refills the slot with the next row's vector (its loads issued
    before this row's stores, rmsnorm's `early` order), folding it. One read of the row where the streaming
    kernel takes two. The first build (a branch and the accurate expf per value; lab/onchip/softmax_onchip.py
    at b690f6f) ran 0.83-0.88x the streaming kernel of its day: with one block per SM, an SM's exp work does
    not overlap another row's loads. Against the two-pass form on an H100 (2026-12-06,
    lab/onchip_prefetch.py's "early", bf16 -> benchmarks/h100/2026-12-06/overlap/): 1.050x at 261 x 128256
    (0.83 of copy against 0.79), 1.015x at 512 x 65536 (0.82 against 0.81); the loads after the stores
    ("overlap") 1.035x / 1.003x. ptxas sm_90: 64 registers, no spills (the two-pass form: 59-62)."""
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
        t = cuda.local.array(nvals, float32)  # the next row's vectors, in flight
        to = cuda.local.array(width, float32)  # this row's vector on its way out
        tid = cuda.threadIdx.x
        rows = x.shape[0]
        n = x.shape[1]
        nt = (n - head) // width
        row = cuda.blockIdx.x
        if row >= rows:
            return
        # the block's first row: its load pass alone
        xr = x[row]
        load_row(v, xr, n, NEG_INF)  # the register part is always full (OnChipRows.takes)
        m, s = _fold(NEG_INF, float32(0.0), v, per, True)
        j = tid
        while j < nt:
            load_step(t, xr, j, nt, NEG_INF)  # a missing vector's -inf adds exp(-inf) = 0
            m, s = _fold(m, s, t, nvals, True)
            keep_step(t, part, j, nt)
            j += nvec * threads
        base = 0
        while row < rows:
            mb = bmax(m, sm, base)
            # a thread that saw only -inf has s = 0 and adds 0; an all -inf row is NaN (as streaming)
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
            while j < nt:  # this thread's own slots: no other thread reads or writes them
                if more:
                    load_step(t, xn, j, nt, NEG_INF)  # in flight while this row's vectors go out
                for u in range(nvec):
                    i = j + u * threads
                    if i < nt:
                        take(to, part, i, nt)
                        for e in range(width):
                            to[e] = _fast_exp(to[e] - mb) * inv
                        stg_from(orow, head + i * width, to, 0)
                if more:
                    m, s = _fold(m, s, t, nvals, True)
                    keep_step(t, part, j, nt)
                j += nvec * threads
            if more:
                load_row(v, xn, n, NEG_INF)
                m, s = _fold(m, s, v, per, True)
            row = nxt

    return k


_SIGS: dict[np.dtype, str] = {
    np.dtype(np.float32): "void(float32[:, ::1], float32[:, ::1])",
    np.dtype(np.float16): "void(float16[:, ::1], float16[:, ::1])",
    BF16: "void(uint16[:, ::1], uint16[:, ::1])",  # bf16 as words (rows.WORDS)
}


def _row_kernel(config: RowConfig, width: int, *, word: bool) -> tuple[Any, int, bool]:
    """(dispatcher, threads per block, grid-stride?) of a kernels.ops.rows.ROW_KERNELS entry or a wide shape
    (`word`: the operands are bf16 words, for a packed shape's pairs)."""
    if isinstance(config, VectorRows):
        return _make_vec(width, config.fastmath), BLOCK, False
    if isinstance(config, BlockedRows):
        c = config
        return make_rows_blocked(width, c.threads, c.per, c.min_blocks, c.fastmath), c.threads, False
    if isinstance(config, WideRows) and config.packed:
        w = config
        return make_rows_packed(width, w.threads, w.per, w.min_blocks, word), w.threads, False
    if isinstance(config, WideRows):  # the fp16 "auto" kernel (BlockedRows, fastmath) at that shape
        w = config
        return make_rows_blocked(width, w.threads, w.per, w.min_blocks, True), w.threads, False
    raise ValueError(f"softmax: no row kernel for {config}")


_K = RowKernels(
    "softmax",
    _SIGS,
    stream=_make_stream,
    reg=_make_reg,
    make_vec=_make_vec,
    row_kernel=_row_kernel,
    stream_vec=make_stream_vec,
    onchip=make_onchip,
)
_FAST = FastCache()  # validated launches by operand layout (kernels.runtime.launch.FastCache)


def softmax(x: Any, out: Any = None, *, stream: int = 0, path: str = "auto") -> Any:
    """Numerically stable softmax over the last dimension of x (any ndim >= 1).
    `path`: "auto", "scalar" or "vector" (kernels.primitives.vector.choose; vector covers aligned rows of up
    to kernels.ops.rows.vector_cols columns: BLOCK * PER, or 32768 in fp16 / bf16 on a GPU)."""
    if out is not None:
        bound, ptrs = _FAST.find((x, out), path)
        if bound is not None:
            bound.launch(ptrs, stream)
            return out
    sync = HostSync()
    xo = arrays.operand("x", x, sync)
    arrays.check_dtype(xo, FLOAT_IO_BF16)
    arrays.check_nonempty(xo)
    arrays.check_contiguous(xo)
    oo = arrays.output("out", out, sync, xo.shape, xo.dtype)
    xr = arrays.as_rows(xo)
    n = xr.shape[1]
    aligned = vector_ok((xo.ptr, oo.ptr), n * xo.dtype.itemsize)
    k, block, grid = _K.pick(path, xo.dtype, aligned, n, xr.shape[0])
    args = (xr, arrays.as_rows(oo))
    k.launch(grid, block, args, stream=stream)
    if out is not None and xo.host is None and oo.host is None:
        _FAST.store((x, out), path, k.bind(grid, block, args))
    return arrays.finish(sync, oo, out, xo)


def reference(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=-1, keepdims=True))
    out: np.ndarray = e / e.sum(axis=-1, keepdims=True)
    return out


def _make_problem(case: Case, rng: np.random.Generator) -> Problem:
    rows, n = case.params["rows"], case.params["cols"]
    dt = np.dtype(case.dtype)
    # a wide spread (std 4) and a large offset: an unstable softmax overflows exp() here
    x = (rng.standard_normal((rows, n), dtype=np.float32) * 4.0 + 40.0).astype(dt)
    if case.params.get(SPECIALS):
        x = poison(x, case.params[SPECIALS])
        x[1] = -np.inf  # a row that is all -inf
    return Problem(inputs={"x": x}, outputs={"out": ((rows, n), dt)}, reference={"out": reference(x)})


def _spec_launch(a: dict[str, Any]) -> None:
    softmax(a["x"], a["out"])


def _cupy(a: dict[str, Any]) -> None:
    import cupy as cp

    xf = a["x"].astype(cp.float32, copy=False)
    e = cp.exp(xf - cp.max(xf, axis=-1, keepdims=True))
    cp.divide(e, cp.sum(e, axis=-1, keepdims=True), out=a["out"], casting="unsafe")


def _bytes(c: Case) -> float:
    return float(2 * c.params["rows"] * c.params["cols"] * np.dtype(c.dtype).itemsize)


SPEC = register(
    OpSpec(
        name="softmax",
        dtypes=("float32", "float16", "bfloat16"),
        make_problem=_make_problem,
        launch=_spec_launch,
        flops=lambda c: 5.0 * c.params["rows"] * c.params["cols"],
        bytes=_bytes,
        # bf16: one rounding to 8 significant bits, at most 2^-8 = 3.9e-3 relative per element (and so in the
        # norm); kernels.ops.rows.BF16_TOL says what was measured
        tolerance={"float32": 1e-5, "float16": 2e-3, "bfloat16": BF16_TOL},
        elem_tolerance={"bfloat16": BF16_ELEM_TOL},
        **row_cases(),
        cupy=_cupy,
        bound="memory",
        ptx_kernels=_K.ptx_kernels(),
        path=row_path_of("softmax"),
        choose=row_choice_of("softmax"),
    )
)
