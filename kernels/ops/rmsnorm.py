"""rmsnorm: out[i, :] = x[i, :] / sqrt(mean(x[i, :]^2) + eps) * weight, row-wise over the last dimension.

Floors per row of n: 4n FLOP (square+add, scale, weight); bytes = 2 * n * itemsize (x read once, out written
once; weight is n elements shared by every row). Bandwidth-bound.
Kernels, one block of 256 threads per row, fp32 sums (warp shuffles, then one slot per warp):
  - `_make_reg` (rows of up to BLOCK * PER = 4096): each thread loads its PER elements into registers
    with every load in flight at once, reduces, and writes from registers: one read, one write.
  - `_rmsnorm_vec` (same rows when x, weight, out are 16-byte aligned and a row is a multiple of 16
    bytes): the register kernel with 16-byte loads and stores (kernels.primitives.vector), 8 halves per
    instruction. kernels/ops/rows.py ROW_KERNELS sends fp32 "auto" calls to it as well (it was faster than the
    register kernel on the H200: benchmarks/notes-memory.md).
  - `_make_stream` (longer rows): pass 1 streams the row with four loads in flight per thread; pass 2
    reads it again, from L1/L2 (the same block read it microseconds before), not device memory.
  - bf16 (`ml_dtypes.bfloat16`, the same dtype as residual_add / cast): the register and streaming kernels
    above, built from the same bodies with kernels.ops.rows.WORDS: uint16 words widened exactly to fp32,
    fp32 arithmetic, one round to nearest even on the store (NaN stays NaN); and the vector kernel, which
    moves the words as 16-byte vectors of 8 (kernels.primitives.vector.ldg_into / stg_from).
  - Vector rows in fp16 / bf16 past BLOCK * PER, or much shorter: the vector kernel at a kernels.ops.rows
    WIDE_ROWS shape (32 x 32 up to 1024 x 32 threads x values), chosen by rows.wide_for, so rows of up to
    32768 columns stay in registers (one read of the row) instead of streaming (two). Rows of 5121-32768
    columns (the 8192-32768 shapes) take `_make_packed` instead (rows.WIDE_PACKED): the same shapes with the
    row as packed pairs, 32 registers, twice the blocks per SM (1.02-1.04x in bf16 on an H100).
  - `make_onchip` (fp16 / bf16 rows of kernels.ops.rows.ONCHIP_ROWS.from_cols to .cols columns: 128256 to
    131584, the vocabularies, and built again as rows.ONCHIP_MID_ROWS for rows of 32776 to 65536: two
    blocks of 512 threads per SM; "auto" and "vector" take it there, on GPUs that let a block opt in to its
    shared memory: rows.chip_fits, sm_90): 1024 threads x 16 values in registers and
    the rest of the row in up to 225 KB of dynamic shared memory, packed two columns to a 32-bit word
    (rows.onchip_pairs), each thread's own slots, so the row is read once, and a block loads its next row
    in the write pass (on an H100, bf16 at 261 x 128256: 0.80 of copy in the lab A/B, 0.85-0.86 in the
    bench's tables; make_onchip has the figures).
  - `make_stream_vec` (path="vector" on rows past what registers hold: 32768 columns in fp16 / bf16, e.g.
    vocabularies of 128256; 4096 in fp32): the streaming kernel on 16-byte vectors, 1024 threads per row,
    L2 hints so that pass 2 re-reads the row from L2 (kernels.ops.rows.STREAM_ROWS). "auto" takes it in the
    rows.STREAM_VECTOR_AUTO dtypes, fp32 from rows.STREAM_VECTOR_AUTO_FROM's width (on the H200 1.04-5.2x
    the scalar streaming kernel).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
from numba import cuda, float32, uint32

from kernels.ops.rows import (
    BF16_ELEM_TOL,
    BF16_TOL,
    OnChipRows,
    RowConfig,
    RowIO,
    RowKernels,
    StreamRows,
    VectorRows,
    WideRows,
    make_stream_loads,
    onchip_pairs,
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
    PER,
    ROW_JIT,
    block_sum,
    make_block_sum,
    row_slots,
)
from kernels.primitives.vector import ldg_into, make_row_io, round_like, stg_from, vector_ok
from kernels.registry import SPECIALS, Case, OpSpec, Problem, poison, register
from kernels.runtime import arrays
from kernels.runtime.arrays import BF16, FLOAT_IO_BF16, HostSync
from kernels.runtime.launch import FastCache


def _make_stream(io: RowIO):  # type: ignore[no-untyped-def]
    """The streaming kernel (rows longer than BLOCK * PER), reading and writing through `io`."""
    load = io.load
    scale_row = stream_scale(io)

    @cuda.jit
    def _rmsnorm_kernel(x, w, out, eps):  # type: ignore[no-untyped-def]
        smem = cuda.shared.array(BLOCK, float32)
        tid = cuda.threadIdx.x
        rows = x.shape[0]
        n = x.shape[1]
        row = cuda.blockIdx.x
        while row < rows:
            a0 = float32(0.0)
            a1 = float32(0.0)
            a2 = float32(0.0)
            a3 = float32(0.0)
            j = tid
            while j + 3 * BLOCK < n:
                v0 = load(x[row, j])
                v1 = load(x[row, j + BLOCK])
                v2 = load(x[row, j + 2 * BLOCK])
                v3 = load(x[row, j + 3 * BLOCK])
                a0 += v0 * v0
                a1 += v1 * v1
                a2 += v2 * v2
                a3 += v3 * v3
                j += 4 * BLOCK
            while j < n:
                v = load(x[row, j])
                a0 += v * v
                j += BLOCK
            total = block_sum((a0 + a1) + (a2 + a3), smem)
            scale_row(x, w, out, row, n, float32(1.0) / math.sqrt(total / float32(n) + eps))
            row += cuda.gridDim.x

    return _rmsnorm_kernel


def stream_scale(io: RowIO):  # type: ignore[no-untyped-def]
    """The streaming kernels' second pass (rmsnorm, fused_add_rmsnorm), a device function: out[row, :] =
    src[row, :] * inv * w, four loads in flight per thread, `src` read again (from L1/L2: the block read
    it microseconds before)."""
    load, store = io.load, io.store

    @cuda.jit(device=True, inline="always")
    def scale_row(src, w, out, row, n, inv):  # type: ignore[no-untyped-def]
        j = cuda.threadIdx.x
        while j + 3 * BLOCK < n:
            v0 = load(src[row, j])
            v1 = load(src[row, j + BLOCK])
            v2 = load(src[row, j + 2 * BLOCK])
            v3 = load(src[row, j + 3 * BLOCK])
            out[row, j] = store(v0 * inv * load(w[j]))
            out[row, j + BLOCK] = store(v1 * inv * load(w[j + BLOCK]))
            out[row, j + 2 * BLOCK] = store(v2 * inv * load(w[j + 2 * BLOCK]))
            out[row, j + 3 * BLOCK] = store(v3 * inv * load(w[j + 3 * BLOCK]))
            j += 4 * BLOCK
        while j < n:
            out[row, j] = store(load(src[row, j]) * inv * load(w[j]))
            j += BLOCK

    return scale_row


def _make_reg(io: RowIO):  # type: ignore[no-untyped-def]
    """The register kernel (rows of up to BLOCK * PER), reading and writing through `io`."""
    load = io.load
    norm_store = reg_norm_store(io)

    @cuda.jit(**ROW_JIT)
    def _rmsnorm_reg(x, w, out, eps):  # type: ignore[no-untyped-def]
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
            if full:  # no bounds checks: PER independent loads issue back to back
                for k in range(PER):
                    v[k] = load(xr[uint32(tid + k * BLOCK)])
            else:
                for k in range(PER):
                    j = uint32(tid + k * BLOCK)
                    v[k] = load(xr[j]) if j < n else float32(0.0)
            norm_store(v, w, orow, n, eps, smem)
            row += cuda.gridDim.x

    return _rmsnorm_reg


def reg_norm_store(io: RowIO):  # type: ignore[no-untyped-def]
    """The register kernels' second half (rmsnorm, fused_add_rmsnorm), a device function: the thread's PER
    values `v` (fp32, zero past the row's end) are squared and summed over the block, and orow[j] =
    v * inv * w[j] stored from registers."""
    load, store = io.load, io.store

    @cuda.jit(device=True, inline="always")
    def norm_store(v, w, orow, n, eps, smem):  # type: ignore[no-untyped-def]
        tid = cuda.threadIdx.x
        acc = float32(0.0)
        for k in range(PER):
            acc += v[k] * v[k]
        total = block_sum(acc, smem)
        inv = float32(1.0) / math.sqrt(total / float32(n) + eps)
        for k in range(PER):
            j = uint32(tid + k * BLOCK)
            if j < n:
                orow[j] = store(v[k] * inv * load(w[j]))

    return norm_store


def make_scale_write(width: int, threads: int, per: int):  # type: ignore[no-untyped-def]
    """The write pass of the vector kernels at a `threads` x `per` shape (this op's and fused_add_rmsnorm's):
    `write(orow, v, u, t, w, n, inv)` stores orow = v * inv * w, `v` the row's `per` values in registers,
    `u` (per) and `t` (width) the caller's scratch. Full rows load every weight vector before the first
    store (loaded beside each store, a load may not pass a store to memory that might alias it: one L2 round
    trip a vector, PERF.md eighteenth session); partial rows bound each vector by `n`."""
    _, col_of = make_row_io(width, threads, per)
    nv = per // width

    @cuda.jit(device=True, inline="always")
    def write(orow, v, u, t, w, n, inv):  # type: ignore[no-untyped-def]
        if n >= threads * per:
            for q in range(nv):
                ldg_into(u, q * width, w, col_of(q))
            for q in range(nv):
                for e in range(width):
                    u[q * width + e] = v[q * width + e] * inv * u[q * width + e]
                stg_from(orow, col_of(q), u, q * width)
        else:
            for q in range(nv):
                col = col_of(q)
                if col < n:
                    ldg_into(t, 0, w, col)
                    for e in range(width):
                        t[e] = v[q * width + e] * inv * t[e]
                    stg_from(orow, col, t, 0)

    return write


def _make_vec(  # type: ignore[no-untyped-def]
    width: int, fastmath: bool = False, threads: int = BLOCK, per: int = PER, min_blocks: int = 0
):
    """The vector kernel: `threads` x `per` values per row in registers (rows of <= threads * per), 16-byte
    loads and stores. The default shape is BLOCK x PER under VEC_ROW_JIT's register cap; other shapes
    (kernels.ops.rows.WIDE_ROWS) take launch_bounds(threads, min_blocks) (kernels.ops.rows.vec_jit)."""
    load_row, _ = make_row_io(width, threads, per)
    write = make_scale_write(width, threads, per)
    bsum, slots = make_block_sum(threads), row_slots(threads)
    nsm = 2 * slots  # a compile-time constant for the shared array (numba folds names, not expressions)
    jit_kw = vec_jit(threads, min_blocks, fastmath)

    @cuda.jit(**jit_kw)
    def k(x, w, out, eps):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(nsm, float32)  # two halves: consecutive rows alternate (reductions)
        v = cuda.local.array(per, float32)
        u = cuda.local.array(per, float32)
        t = cuda.local.array(width, float32)
        rows = x.shape[0]
        n = x.shape[1]
        row = cuda.blockIdx.x
        base = 0
        while row < rows:
            orow = out[row]
            load_row(v, x[row], n, float32(0.0))
            acc = float32(0.0)
            for e in range(per):
                acc += v[e] * v[e]
            inv = float32(1.0) / math.sqrt(bsum(acc, sm, base) / float32(n) + eps)
            base = slots - base
            write(orow, v, u, t, w, n, inv)
            row += cuda.gridDim.x

    return k


def _make_packed(  # type: ignore[no-untyped-def]
    width: int, threads: int, per: int, min_blocks: int, word: bool, add: bool = False
):
    """`_make_vec` at a WideRows.packed shape (kernels.ops.rows.WIDE_PACKED): the row's values kept as packed
    pairs (rows.packed_row_io; `word`: bf16 words, else fp16), unpacked where used, the same fp32 arithmetic
    per value. 32 registers at 32 values a thread (ptxas sm_90), so launch_bounds(threads, 2x the blocks).

    `add`: fused_add_rmsnorm's kernel, k(x, r, w, out, eps), from the same text (as make_onchip's): the row
    of x loaded as pairs, then every residual vector loaded (a full row takes no bounds compare, so the loads
    issue together, no store between them), added to its pair in fp32, rounded to the dtype (round_like: what
    storing and reloading gives) and packed back, exact, into the same words; then the rounded sums stored to
    r, and rmsnorm's sum and write pass over them, so out is bit for bit this kernel's rmsnorm of the new r.
    The same bytes as the op's WIDE_ROWS kernel (x and r read once, r and out written once)."""
    load_row, col_of, lo, hi = packed_row_io(width, threads, per, word)
    pack, _, _ = onchip_pairs(word)
    bsum, slots = make_block_sum(threads), row_slots(threads)
    nsm, npair, nv, hw = 2 * slots, per // 2, per // width, width // 2

    @cuda.jit(device=True, inline="always")
    def add_row(v, t, rr, n):  # type: ignore[no-untyped-def]
        """With `add`: v <- round(x + r), pair by pair, every residual load before the first store; then
        the sums stored to rr."""
        if add:
            for q in range(nv):
                if n >= threads * per or col_of(q) < n:  # full rows: no compare (as load_row)
                    ldg_into(t, 0, rr, col_of(q))
                    for p in range(hw):
                        i = q * hw + p
                        v[i] = pack(
                            round_like(rr, lo(v[i]) + t[2 * p]), round_like(rr, hi(v[i]) + t[2 * p + 1])
                        )
            for q in range(nv):
                col = col_of(q)
                if col < n:
                    for p in range(hw):
                        t[2 * p] = lo(v[q * hw + p])
                        t[2 * p + 1] = hi(v[q * hw + p])
                    stg_from(rr, col, t, 0)

    @cuda.jit(device=True, inline="always")
    def rows_packed(x, r, w, out, eps, sm, v, t):  # type: ignore[no-untyped-def]
        rows, n = x.shape[0], x.shape[1]
        row, base = cuda.blockIdx.x, 0
        while row < rows:
            orow = out[row]
            load_row(v, t, x[row], n, float32(0.0))
            add_row(v, t, r[row], n)
            acc = float32(0.0)
            for i in range(npair):
                a, b = lo(v[i]), hi(v[i])
                acc += a * a
                acc += b * b
            inv = float32(1.0) / math.sqrt(bsum(acc, sm, base) / float32(n) + eps)
            base = slots - base
            for q in range(nv):
                col = col_of(q)
                if col < n:
                    ldg_into(t, 0, w, col)
                    for p in range(hw):
                        t[2 * p] = lo(v[q * hw + p]) * inv * t[2 * p]
                        t[2 * p + 1] = hi(v[q * hw + p]) * inv * t[2 * p + 1]
                    stg_from(orow, col, t, 0)
            row += cuda.gridDim.x

    if add:

        @cuda.jit(**vec_jit(threads, min_blocks, False))
        def fused(x, r, w, out, eps):  # type: ignore[no-untyped-def]
            sm = cuda.shared.array(nsm, float32)  # two halves: consecutive rows alternate (reductions)
            v = cuda.local.array(npair, uint32)
            t = cuda.local.array(width, float32)
            rows_packed(x, r, w, out, eps, sm, v, t)

        return fused

    @cuda.jit(**vec_jit(threads, min_blocks, False))
    def k(x, w, out, eps):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(nsm, float32)  # two halves: consecutive rows alternate (reductions)
        v = cuda.local.array(npair, uint32)
        t = cuda.local.array(width, float32)
        rows_packed(x, x, w, out, eps, sm, v, t)  # r: unused without `add`

    return k


def make_stream_vec(config: StreamRows, width: int):  # type: ignore[no-untyped-def]
    """Rows past what registers hold (kernels.ops.rows.StreamRows): pass 1 sums the squares of the row
    over 16-byte vectors, `config.vectors` in flight per thread, marking it evict_last in L2; pass 2
    (`stream_vec_scale`) re-reads it evict_first (its last use) and writes x * inv * w."""
    threads, nvec = config.threads, config.vectors
    span = threads * width  # columns that one vector per thread covers
    nvals = nvec * width
    step, tail = make_stream_loads(config, width)
    scale_row = stream_vec_scale(config, width)
    bsum, slots = make_block_sum(threads), row_slots(threads)
    nsm = 2 * slots  # two halves: consecutive rows alternate (reductions)
    jit_kw = vec_jit(threads, config.min_blocks, False)

    @cuda.jit(**jit_kw)
    def k(x, w, out, eps):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(nsm, float32)
        v = cuda.local.array(nvals, float32)
        t = cuda.local.array(width, float32)
        keep = l2_evict_last()
        drop = l2_evict_first()
        rows = x.shape[0]
        n = x.shape[1]
        first = cuda.threadIdx.x * width
        row = cuda.blockIdx.x
        base = 0
        while row < rows:
            xr = x[row]
            acc = float32(0.0)
            col = first
            while col + (nvec - 1) * span < n:
                step(v, xr, col, keep)
                for e in range(nvals):
                    acc += v[e] * v[e]
                col += nvec * span
            # the rest: fewer than nvec vectors of this thread, their loads all in flight at once
            tail(v, xr, col, n, keep)
            for u in range(nvec - 1):
                if col + u * span < n:
                    for e in range(width):
                        acc += v[u * width + e] * v[u * width + e]
            inv = float32(1.0) / math.sqrt(bsum(acc, sm, base) / float32(n) + eps)
            base = slots - base
            scale_row(v, t, xr, w, out[row], n, inv, drop)
            row += cuda.gridDim.x

    return k


def stream_vec_scale(config: StreamRows, width: int):  # type: ignore[no-untyped-def]
    """The 16-byte streaming kernels' second pass (rmsnorm, fused_add_rmsnorm), a device function:
    orow = src * inv * w, `src` re-read `config.vectors` vectors at a time with the L2 `policy` (its last
    use: evict_first), weight vectors loaded beside it; `v` (vectors x width values) and `t` (width) are
    the caller's local arrays."""
    nvec = config.vectors
    span = config.threads * width  # columns that one vector per thread covers
    step, tail = make_stream_loads(config, width)

    @cuda.jit(device=True, inline="always")
    def scale_row(v, t, src, w, orow, n, inv, policy):  # type: ignore[no-untyped-def]
        col = cuda.threadIdx.x * width
        while col + (nvec - 1) * span < n:
            step(v, src, col, policy)
            for u in range(nvec):
                ldg_into(t, 0, w, col + u * span)
                for e in range(width):
                    t[e] = v[u * width + e] * inv * t[e]
                stg_from(orow, col + u * span, t, 0)
            col += nvec * span
        tail(v, src, col, n, policy)  # fewer than nvec vectors of this thread, all in flight at once
        for u in range(nvec - 1):
            if col + u * span < n:
                ldg_into(t, 0, w, col + u * span)
                for e in range(width):
                    t[e] = v[u * width + e] * inv * t[e]
                stg_from(orow, col + u * span, t, 0)

    return scale_row


def make_onchip(config: OnChipRows, width: int, word: bool, add: bool = False):  # type: ignore[no-untyped-def]
    """Rows past what registers hold, read once (kernels.ops.rows.OnChipRows; fp16 / bf16 `word`s): the
    block's first row loads its first threads x per columns into registers and streams the rest into the
    thread's own shared-memory slots (`config.vectors` 16-byte loads in flight), two columns to a uint32
    (rows.onchip_pairs: 4 shared stores per vector), summing squares as it goes. Then, row after row: the
    block reduction, and one pass that writes x * inv * w from registers and from each slot and, in the same
    step, refills the slot with the next row's vector (its loads issued before this row's stores, summing its
    squares), since no other thread touches the slot. So the write of row r and the load of row r + grid
    share one pass: where each row was a load pass, a reduction and a write pass in turn (every SM in the
    same phase at once, DRAM idle while the stores drained and the next loads ramped up), only the block
    reduction stands between rows. One read and one write of the row, where the streaming kernel reads it
    twice. Measured against the two-pass form on an H100 (2026-12-06, lab/onchip_prefetch.py's "early" ->
    benchmarks/h100/2026-12-06/mid-shipped/prefetch.txt, fp16 and bf16): 1.047-1.065x at 261 x 128256
    (0.80-0.82 of copy against 0.77), 1.02x at 1024 x 128256 and 1024 x 40960, 1.06x at 512 x 65536 (0.84
    against 0.79). ptxas sm_90: 64 registers, no spills (the two-pass form: 48 / 54).

    `add`: fused_add_rmsnorm's kernel, k(x, r, w, out, eps), from the same text: each vector of x arrives
    with its residual vector (both loads in flight: half `config.vectors` of each, the same bytes), their
    sum in fp32 is rounded to the dtype (round_like: what storing and reloading gives), stored to r, and
    kept on chip as the row; the norm is the rounded sum's. One read of x and r, one write of r and out,
    where the op's streaming kernel reads r back in a second pass. Measured against that streaming kernel
    (the one "auto" took) on an H100 (2026-12-06, lab/fused_onchip_ab.py ->
    benchmarks/h100/2026-12-06/fourteenth/probes/): 1.09-1.11x at 261 x 128256 and 256 x 131072 (0.89-0.90
    of copy against 0.81), 1.02x at 512 x 65536, 1.00-1.01x at 1024 x 40960. ptxas sm_90: 61-64 registers,
    no spills (two vectors of each input in flight: 244-296 bytes of spills)."""
    threads, per = config.threads, config.per
    nvec = max(1, config.vectors // 2) if add else config.vectors
    load_row, col_of = make_row_io(width, threads, per)
    bsum, slots = make_block_sum(threads), row_slots(threads)
    nsm = 2 * slots  # two halves: consecutive rows alternate (reductions)
    head = threads * per  # columns held in registers
    nv = per // width
    nvals = nvec * width  # a name, not an expression: numba folds names into local array sizes
    load_step, keep_step, take = onchip_part(replace(config, vectors=nvec), width, word)

    @cuda.jit(device=True, inline="always")
    def head_load(v, u, xr, rr, n):  # type: ignore[no-untyped-def]
        """Issue the loads of the row's register part into v (with `add`, the residual's into u)."""
        load_row(v, xr, n, float32(0.0))
        if add:
            load_row(u, rr, n, float32(0.0))

    @cuda.jit(device=True, inline="always")
    def head_add(v, u, rr):  # type: ignore[no-untyped-def]
        """With `add`: v <- round(x + r) over the register part, stored to rr (u is free after it)."""
        if add:
            for q in range(nv):  # the register part is always whole (OnChipRows.takes)
                for e in range(width):
                    v[q * width + e] = round_like(rr, v[q * width + e] + u[q * width + e])
                stg_from(rr, col_of(q), v, q * width)

    @cuda.jit(device=True, inline="always")
    def head_sum(v, acc):  # type: ignore[no-untyped-def]
        """acc plus the register part's squares, one by one."""
        for e in range(per):
            acc += v[e] * v[e]
        return acc

    @cuda.jit(device=True, inline="always")
    def part_load(t, tu, xr, rr, j, nt):  # type: ignore[no-untyped-def]
        """Issue the loads of this thread's shared-part vectors j + k * threads, k < nvec (with `add`, the
        residual's too); a vector past nt reads as zeros."""
        load_step(t, xr, j, nt, float32(0.0))
        if add:
            load_step(tu, rr, j, nt, float32(0.0))

    @cuda.jit(device=True, inline="always")
    def part_keep(t, tu, rr, part, j, nt, acc):  # type: ignore[no-untyped-def]
        """Those vectors (with `add`: round(x + r), stored to rr) into the thread's slots; acc plus their
        squares, one by one, so the sum's order is the row's at any vector count (a vector past nt adds 0
        and is neither stored nor kept)."""
        if add:
            for k in range(nvec):
                for e in range(width):
                    t[k * width + e] = round_like(rr, t[k * width + e] + tu[k * width + e])
                if j + k * threads < nt:
                    stg_from(rr, head + (j + k * threads) * width, t, k * width)
        for e in range(nvals):
            acc += t[e] * t[e]
        keep_step(t, part, j, nt)
        return acc

    @cuda.jit(device=True, inline="always")
    def rows_on_chip(x, r, w, out, eps, sm, part, v, u, t, tu, tw, to):  # type: ignore[no-untyped-def]
        tid = cuda.threadIdx.x
        rows = x.shape[0]
        n = x.shape[1]
        nt = (n - head) // width
        row = cuda.blockIdx.x
        if row >= rows:
            return
        # the block's first row: its load pass alone
        xr, rr = x[row], r[row]
        head_load(v, u, xr, rr, n)
        head_add(v, u, rr)  # (with `add`: before the shared part, so u is not held through it)
        acc = float32(0.0)
        j = tid
        while j < nt:
            part_load(t, tu, xr, rr, j, nt)
            acc = part_keep(t, tu, rr, part, j, nt, acc)
            j += nvec * threads
        acc = head_sum(v, acc)  # the shared part's squares, then the register part's, as in every row
        base = 0
        while row < rows:
            inv = float32(1.0) / math.sqrt(bsum(acc, sm, base) / float32(n) + eps)
            base = slots - base
            nxt = row + cuda.gridDim.x
            more = nxt < rows
            xn, rn = x[nxt if more else row], r[nxt if more else row]
            orow = out[row]
            for g in range(0, nv, nvec):  # the register part, nvec vectors' weights before their stores
                for q in range(g, min(g + nvec, nv)):
                    ldg_into(tw, (q - g) * width, w, col_of(q))
                for q in range(g, min(g + nvec, nv)):
                    for e in range(width):
                        to[e] = v[q * width + e] * inv * tw[(q - g) * width + e]
                    stg_from(orow, col_of(q), to, 0)
            acc = float32(0.0)
            j = tid
            while j < nt:  # this thread's own slots: no other thread reads or writes them
                if more:
                    part_load(t, tu, xn, rn, j, nt)  # in flight while this row's vectors go out
                for k in range(nvec):
                    i = j + k * threads
                    if i < nt:
                        ldg_into(tw, k * width, w, head + i * width)
                for k in range(nvec):
                    i = j + k * threads
                    if i < nt:
                        take(to, part, i, nt)
                        for e in range(width):
                            to[e] = to[e] * inv * tw[k * width + e]
                        stg_from(orow, head + i * width, to, 0)
                if more:
                    acc = part_keep(t, tu, rn, part, j, nt, acc)
                j += nvec * threads
            if more:
                head_load(v, u, xn, rn, n)
                head_add(v, u, rn)
                acc = head_sum(v, acc)
            row = nxt

    if add:

        @cuda.jit(**vec_jit(threads, config.min_blocks, False))
        def fused(x, r, w, out, eps):  # type: ignore[no-untyped-def]
            sm = cuda.shared.array(nsm, float32)
            part = cuda.shared.array(0, uint32)  # the shared part (rows.onchip_part)
            v = cuda.local.array(per, float32)
            u = cuda.local.array(per, float32)  # the register part's residual, on its way in
            t = cuda.local.array(nvals, float32)  # the next row's vectors, in flight
            tu = cuda.local.array(nvals, float32)  # and its residual's
            tw = cuda.local.array(nvals, float32)
            to = cuda.local.array(width, float32)  # this row's vector on its way out
            rows_on_chip(x, r, w, out, eps, sm, part, v, u, t, tu, tw, to)

        return fused

    @cuda.jit(**vec_jit(threads, config.min_blocks, False))
    def k(x, w, out, eps):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(nsm, float32)
        part = cuda.shared.array(0, uint32)  # the shared part (rows.onchip_part)
        v = cuda.local.array(per, float32)
        t = cuda.local.array(nvals, float32)  # the next row's vectors, in flight
        tw = cuda.local.array(nvals, float32)
        to = cuda.local.array(width, float32)  # this row's vector on its way out
        rows_on_chip(x, x, w, out, eps, sm, part, v, v, t, t, tw, to)  # r, u, tu: unused without `add`

    return k


_SIGS: dict[np.dtype, str] = {
    np.dtype(np.float32): "void(float32[:, ::1], float32[::1], float32[:, ::1], float32)",
    np.dtype(np.float16): "void(float16[:, ::1], float16[::1], float16[:, ::1], float32)",
    BF16: "void(uint16[:, ::1], uint16[::1], uint16[:, ::1], float32)",  # bf16 as words (rows.WORDS)
}


def _row_kernel(config: RowConfig, width: int, *, word: bool) -> tuple[Any, int, bool]:
    """(dispatcher, threads per block, grid-stride?) of a kernels.ops.rows.ROW_KERNELS entry or a wide shape
    (`word`: the operands are bf16 words, for a packed shape's pairs)."""
    if isinstance(config, VectorRows):
        return _make_vec(width, config.fastmath), BLOCK, False
    if isinstance(config, WideRows):
        c = config
        if c.packed:
            return _make_packed(width, c.threads, c.per, c.min_blocks, word), c.threads, False
        return _make_vec(width, False, c.threads, c.per, c.min_blocks), c.threads, False
    raise ValueError(f"rmsnorm: no row kernel for {config}")


_K = RowKernels(
    "rmsnorm",
    _SIGS,
    stream=_make_stream,
    reg=_make_reg,
    make_vec=_make_vec,
    row_kernel=_row_kernel,
    stream_vec=make_stream_vec,
    onchip=make_onchip,
)
_FAST = FastCache()  # validated launches by operand layout (kernels.runtime.launch.FastCache)


def rmsnorm(
    x: Any, weight: Any, out: Any = None, *, eps: float = 1e-6, stream: int = 0, path: str = "auto"
) -> Any:
    """Row-wise RMS norm over the last dimension of x (any ndim >= 1), times weight [x.shape[-1]].
    `path`: "auto", "scalar" or "vector" (kernels.primitives.vector.choose; vector covers rows of <= BLOCK *
    PER)."""
    if out is not None:
        bound, ptrs = _FAST.find((x, weight, out), (eps, path))
        if bound is not None:
            bound.launch(ptrs, stream)
            return out
    sync = HostSync()
    xo = arrays.operand("x", x, sync)
    wo = arrays.operand("weight", weight, sync)
    arrays.check_dtype(xo, FLOAT_IO_BF16)
    arrays.check_nonempty(xo)
    arrays.check_contiguous(xo)
    arrays.check_vector(wo, xo, xo.shape[-1], "x's last dimension")
    e = arrays.check_positive("eps", eps)
    oo = arrays.output("out", out, sync, xo.shape, xo.dtype)
    xr = arrays.as_rows(xo)
    n = xr.shape[1]
    aligned = vector_ok((xo.ptr, wo.ptr, oo.ptr), n * xo.dtype.itemsize)
    k, block, grid = _K.pick(path, xo.dtype, aligned, n, xr.shape[0])
    args = (xr, wo, arrays.as_rows(oo), e)
    k.launch(grid, block, args, stream=stream)
    if out is not None and xo.host is None and wo.host is None and oo.host is None:
        _FAST.store((x, weight, out), (eps, path), k.bind(grid, block, args))
    return arrays.finish(sync, oo, out, xo)


def reference(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    out: np.ndarray = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps) * w.astype(np.float64)
    return out


EPS = 1e-6


def _make_problem(case: Case, rng: np.random.Generator) -> Problem:
    rows, n = case.params["rows"], case.params["cols"]
    dt = np.dtype(case.dtype)
    x = (rng.standard_normal((rows, n), dtype=np.float32) * 2.0 + 0.5).astype(dt)
    if case.params.get(SPECIALS):
        x = poison(x, case.params[SPECIALS])
    w = (1.0 + 0.5 * rng.standard_normal(n)).astype(dt)
    return Problem(
        inputs={"x": x, "weight": w},
        outputs={"out": ((rows, n), dt)},
        reference={"out": reference(x, w, EPS)},
        scalars={"eps": EPS},
    )


def _spec_launch(a: dict[str, Any]) -> None:
    rmsnorm(a["x"], a["weight"], a["out"], eps=a["eps"])


def _cupy(a: dict[str, Any]) -> None:
    import cupy as cp

    xf = a["x"].astype(cp.float32, copy=False)
    ms = cp.mean(xf * xf, axis=-1, keepdims=True)
    cp.multiply(xf * cp.reciprocal(cp.sqrt(ms + a["eps"])), a["weight"], out=a["out"], casting="unsafe")


def _bytes(c: Case) -> float:
    it = np.dtype(c.dtype).itemsize
    return float((2 * c.params["rows"] + 1) * c.params["cols"] * it)


SPEC = register(
    OpSpec(
        name="rmsnorm",
        dtypes=("float32", "float16", "bfloat16"),
        make_problem=_make_problem,
        launch=_spec_launch,
        flops=lambda c: 4.0 * c.params["rows"] * c.params["cols"],
        bytes=_bytes,
        # bf16: one rounding to 8 significant bits, at most 2^-8 = 3.9e-3 relative per element (and so in the
        # norm); kernels.ops.rows.BF16_TOL says what was measured
        tolerance={"float32": 1e-5, "float16": 2e-3, "bfloat16": BF16_TOL},
        elem_tolerance={"bfloat16": BF16_ELEM_TOL},
        **row_cases(),
        cupy=_cupy,
        bound="memory",
        ptx_kernels=_K.ptx_kernels(),
        path=row_path_of("rmsnorm"),
        choose=row_choice_of("rmsnorm"),
    )
)
