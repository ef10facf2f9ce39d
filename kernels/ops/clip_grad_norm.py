"""clip_grad_norm: total = sqrt(sum over arrays of sum(g^2)); if total > max_norm every g is scaled in place
by max_norm / (total + 1e-6) (PyTorch's rule); returns total.

Non-finite gradients: a NaN anywhere makes total NaN, an infinity (or a sum of squares past the fp32 / fp64
range) makes it +inf. Either way the gradients are left exactly as they are, and the non-finite total is
returned: scaling by NaN or by 0 would destroy every finite gradient, and the caller is the one who decides
(skip the step, lower the loss scale). PyTorch instead multiplies by the NaN / 0 coefficient.

Floors for N elements in all: 2N FLOP for the norm (+1N for the scale when it clips); bytes = N * itemsize
to read for the norm, plus 2N * itemsize to read and write when it clips (the norm must be complete before
any scaling, so the data is read twice unless it fits in L2). Measured figures: benchmarks/notes-clip.md.

Three strategies (`PATHS`):
  - "two_pass" (what "auto" runs for up to SLOTS 16-byte aligned fp32 / fp16 arrays and no `workspace`):
    kernel 1 = sum of squares over the tiles of ALL arrays numbered as one sequence and dealt round-robin
    to a persistent grid (16-byte loads, one fp32 partial per block, no atomics; the last `l2_keep_mb` MB
    are loaded with an L2 evict_last policy); kernel 2 = every block sums the partials in one fixed order
    (the same norm in every block) and scales its tiles walking from the end of the sequence (what kernel 1
    read last is still in L2). Device arrays with `norm_out` take a lean host path (parameter words written
    with one struct.pack_into per kernel, remembered per array objects; repeat calls replay a CUDA graph).
  - "table" (what "auto" runs for more than SLOTS aligned arrays, or bf16, and no `workspace`): two_pass's
    tiles over a device table of (address, elements, first tiles) rows instead of SLOTS array arguments (each
    block finds its tiles' rows by a search from its last one), so any number of arrays takes two launches,
    with the same bits. Device arrays with `norm_out` take a lean host path too (`_TableCall`: per set of
    arrays, one CUDA graph, a new max_norm updated in place).
  - "per_array" (unaligned arrays, or a `workspace`: calls on several streams at once), all on one stream,
    no host round trip: `_zero` clears a float64 accumulator; `_sumsq` per array: persistent blocks over
    contiguous tiles, fp32 sum of squares per thread, a block reduction, one float64 atomic add per block;
    `_scale` per array: one block per tile, every thread derives the coefficient from the accumulator and
    returns at once when there is nothing to clip; block 0 writes the norm.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import struct
import sys
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import cuda, float32, float64, int64, uint64

from kernels.ops.rows import BF16_ELEM_TOL, BF16_TOL, IO_OF, NATIVE, RowIO
from kernels.primitives.cache_hints import l2_evict_first, l2_evict_last, ldg_hint_into
from kernels.primitives.pointers import address_of, view_at
from kernels.primitives.reductions import BLOCK, block_sum
from kernels.primitives.vector import VEC_BYTES, WIDTH, ldg_into, stg_from, vector_ok
from kernels.registry import SPECIALS, Case, Choice, OpSpec, Problem, poison, register
from kernels.runtime import arrays
from kernels.runtime import launch as _launch
from kernels.runtime.arrays import BF16, FLOAT_IO_BF16, SIMULATED, HostSync, Operand
from kernels.runtime.device import compute_capability
from kernels.runtime.launch import (
    USE_DISPATCHER,
    GraphCache,
    Kernel,
    LaunchError,
    LaunchGraph,
    _stream_handle,
    kernel,
    sm_count,
)

BLOCKS_PER_SM = 8
PATHS = ("auto", "two_pass", "table", "per_array")
CLIP_EPS = 1e-6
MAX_GRID = 2**31 - 1


@cuda.jit
def _zero(acc):  # type: ignore[no-untyped-def]
    if cuda.grid(1) == 0:
        acc[0] = 0.0


def _make_sumsq(unroll: int, io: RowIO = NATIVE):  # type: ignore[no-untyped-def]
    """Persistent blocks walk contiguous tiles of BLOCK x unroll elements (all loads of a tile in flight),
    keep an fp32 partial per thread, reduce it per block, and add it to the float64 accumulator once.
    `io`: how elements load (bf16 words through kernels.ops.rows.WORDS)."""
    load = io.load

    @cuda.jit
    def k(g, acc):  # type: ignore[no-untyped-def]
        smem = cuda.shared.array(BLOCK, float32)
        v = cuda.local.array(unroll, float32)
        n = g.shape[0]
        tid = cuda.threadIdx.x
        tile = BLOCK * unroll
        chunk = cuda.blockIdx.x
        s = float32(0.0)
        while chunk * tile < n:
            base = chunk * tile + tid
            if base + (unroll - 1) * BLOCK < n:
                for u in range(unroll):
                    v[u] = load(g[base + u * BLOCK])
                for u in range(unroll):
                    s += v[u] * v[u]
            else:
                for u in range(unroll):
                    i = base + u * BLOCK
                    if i < n:
                        t = load(g[i])
                        s += t * t
            chunk += cuda.gridDim.x
        total = block_sum(s, smem)
        if tid == 0:
            cuda.atomic.add(acc, 0, float64(total))

    return k


def _make_scale(unroll: int, io: RowIO = NATIVE):  # type: ignore[no-untyped-def]
    """One block per tile; every thread derives the coefficient from the accumulator itself and returns at
    once when there is nothing to clip. Block 0 publishes the norm."""
    load, store = io.load, io.store

    @cuda.jit
    def k(g, acc, norm_out, max_norm):  # type: ignore[no-untyped-def]
        norm = math.sqrt(acc[0])
        tid = cuda.threadIdx.x
        if tid == 0 and cuda.blockIdx.x == 0:
            norm_out[0] = float32(norm)
        coef = max_norm / (norm + CLIP_EPS)
        if not (coef < 1.0 and coef > 0.0):  # nothing to clip, or a non-finite norm (see the module doc)
            return
        c = float32(coef)
        v = cuda.local.array(unroll, float32)
        n = g.shape[0]
        tile = BLOCK * unroll
        chunk = cuda.blockIdx.x
        while chunk * tile < n:
            base = chunk * tile + tid
            if base + (unroll - 1) * BLOCK < n:
                for u in range(unroll):
                    v[u] = load(g[base + u * BLOCK])
                for u in range(unroll):
                    g[base + u * BLOCK] = store(v[u] * c)
            else:
                for u in range(unroll):
                    i = base + u * BLOCK
                    if i < n:
                        g[i] = store(load(g[i]) * c)
            chunk += cuda.gridDim.x

    return k


F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
DTYPES = (F32, F16, BF16)
SUMSQ_UNROLL: dict[np.dtype, int] = {F32: 8, F16: 16, BF16: 16}
SCALE_UNROLL: dict[np.dtype, int] = {F32: 4, F16: 8, BF16: 8}
_sumsq = {dt: _make_sumsq(u, IO_OF[dt]) for dt, u in SUMSQ_UNROLL.items()}
_scale = {dt: _make_scale(u, IO_OF[dt]) for dt, u in SCALE_UNROLL.items()}


_ZERO_SIG = "void(float64[::1])"
_SUMSQ_SIGS: dict[np.dtype, str] = {
    F32: "void(float32[::1], float64[::1])",
    F16: "void(float16[::1], float64[::1])",
    BF16: "void(uint16[::1], float64[::1])",  # bf16 as its words
}
_SCALE_SIGS: dict[np.dtype, str] = {
    F32: "void(float32[::1], float64[::1], float32[::1], float64)",
    F16: "void(float16[::1], float64[::1], float32[::1], float64)",
    BF16: "void(uint16[::1], float64[::1], float32[::1], float64)",
}
_ZERO = kernel(_zero, _ZERO_SIG)
_SUMSQ: dict[np.dtype, Kernel] = {dt: kernel(_sumsq[dt], s) for dt, s in _SUMSQ_SIGS.items()}
_SCALE: dict[np.dtype, Kernel] = {dt: kernel(_scale[dt], s) for dt, s in _SCALE_SIGS.items()}
# Device memory and device facts are per CUDA context (kernels.runtime.launch.context: each GPU's own); every
# cache below that holds either is keyed by the context first.


SLOTS = 8  # arrays per two_pass launch; more than that takes the per_array path
_empty_arrays: dict[tuple[int, np.dtype], Operand] = {}


def _empty(dt: np.dtype) -> Operand:
    """An empty array of dt for unused slots, made once per context: one element, never read (length 0 is
    what the kernel sees); a real allocation keeps pointers valid."""
    key = (_launch.context(), dt)
    op = _empty_arrays.get(key)
    if op is None:
        dev = cuda.device_array(1, dtype=dt)
        ptr = 0 if SIMULATED else int(dev.device_ctypes_pointer.value or 0)
        new = Operand(f"empty_{dt.name}", ptr, (0,), (dt.itemsize,), dt, dev[:0], None, dev[:0])
        op = _empty_arrays.setdefault(key, new)  # racing threads all get the one kept
    return op


# --- two_pass: balanced global tiles, per-block partials --------------------------------------------------
#
# The tiles of ALL arrays are numbered in one global sequence (array 0's tiles, then array 1's, ...) and that
# sequence is dealt round-robin to the blocks, so no block has more than one tile more than another over the
# whole call. Each block writes its fp32 partial to its own slot (no atomics, no zeroing); the scale kernel
# sums the slots in one fixed order, so every block derives the same norm (deterministic). Tiles are BLOCK x
# unroll 16-byte vectors; each array's last partial tile is done in scalar code. Arrays must start 16-byte
# aligned (`vector_ok`), otherwise "auto" takes the per_array path.

TWO_PASS = ("two_pass",)


@dataclass(frozen=True)
class TwoPassConfig:
    """`norm_unroll` / `scale_unroll`: 16-byte vectors per thread per tile of the two kernels;
    `norm_blocks_per_sm` / `scale_blocks_per_sm`: their persistent grids (and launch bounds);
    `l2_keep_mb` >= 0: the norm pass loads its last `l2_keep_mb` MB (10^6 bytes, whole norm tiles, which
    the backward scale walk reads first) with an L2 evict_last policy and every earlier tile with
    evict_first (needs sm_80); < 0: plain loads."""

    norm_unroll: int
    scale_unroll: int
    norm_blocks_per_sm: int
    scale_blocks_per_sm: int
    l2_keep_mb: int = -1


def _two_pass_parts(
    u_sq: int, u_sc: int, width: int, hint_sq: bool = False, io: RowIO = NATIVE
) -> tuple[Any, Any, Any, Any, Any]:
    """Device helpers over one array slot, for block b of a grid of G blocks:
    ntiles(g, tile): tiles of `tile` elements covering g;
    sq_tile(g, base, n, t, acc, v, lim, pl, pf): adds the squares of g's norm tile at `base` (g has n
      elements; t: the tile's global index, for the L2 hint) to acc;
    sc_tile(g, base, n, c, v): scales g's scale tile at `base` by c;
    sq_one(g, b, G, e, acc, v, lim, pl, pf): adds b's tiles of g to acc[0..u_sq) (e = global index of g's
      first tile; b owns the global tiles t = b mod G); returns e + ntiles. With `hint_sq`, a whole tile of
      global index t >= lim is loaded with L2 policy pl, an earlier one with pf (ignored otherwise);
    sc_one(g, b, G, end, T, c, v): scales b's tiles of g by c, highest first (g's tiles end at global
        index `end` of T; walking backwards, b owns the tiles t = T - 1 - b mod G); returns end - ntiles."""
    tq = BLOCK * u_sq * width
    tc = BLOCK * u_sc * width
    load, store = io.load, io.store  # the scalar tails' conversions (bf16: its words)

    @cuda.jit(device=True, inline="always")
    def ntiles(g, tile):  # type: ignore[no-untyped-def]
        return (int64(g.shape[0]) + tile - 1) // tile

    @cuda.jit(device=True, inline="always")
    def sq_tile(g, base, n, t, acc, v, lim, pl, pf):  # type: ignore[no-untyped-def]
        """The squares of one norm tile of `g` from `base` into acc: 16-byte vectors when the tile is whole
        (hinted by its global index t), else scalars into acc[0]."""
        tid = cuda.threadIdx.x
        if base + tq <= n:
            if hint_sq:  # (a compile-time constant)
                pol = pl if t >= lim else pf
                for u in range(u_sq):
                    ldg_hint_into(v, u * width, g, base + (u * BLOCK + tid) * width, pol)
            else:
                for u in range(u_sq):  # every load of the tile issues before the first use
                    ldg_into(v, u * width, g, base + (u * BLOCK + tid) * width)
            for u in range(u_sq):  # one accumulator per vector: u_sq independent FMA chains
                for w in range(width):
                    x = v[u * width + w]
                    acc[u] += x * x
        else:
            i = base + tid
            while i < n:
                x = load(g[i])
                acc[0] += x * x
                i += BLOCK

    @cuda.jit(device=True, inline="always")
    def sq_one(g, b, G, e, acc, v, lim, pl, pf):  # type: ignore[no-untyped-def]
        n = int64(g.shape[0])
        chunk = (b - e) % G
        while chunk * tq < n:
            sq_tile(g, chunk * tq, n, e + chunk, acc, v, lim, pl, pf)
            chunk += G
        return e + (n + tq - 1) // tq

    @cuda.jit(device=True, inline="always")
    def sc_tile(g, base, n, c, v):  # type: ignore[no-untyped-def]
        """Scale one tile of `g` from `base` by c: 16-byte vectors when the tile is whole, else scalars."""
        tid = cuda.threadIdx.x
        if base + tc <= n:
            for u in range(u_sc):
                ldg_into(v, u * width, g, base + (u * BLOCK + tid) * width)
            for e in range(u_sc * width):
                v[e] *= c
            for u in range(u_sc):
                stg_from(g, base + (u * BLOCK + tid) * width, v, u * width)
        else:
            i = base + tid
            while i < n:
                g[i] = store(load(g[i]) * c)
                i += BLOCK

    @cuda.jit(device=True, inline="always")
    def sc_one(g, b, G, end, T, c, v):  # type: ignore[no-untyped-def]
        n = int64(g.shape[0])
        nt = (n + tc - 1) // tc
        chunk = nt - 1 - (end - T + b) % G
        while chunk >= 0:
            sc_tile(g, chunk * tc, n, c, v)
            chunk -= G
        return end - nt

    return ntiles, sq_one, sc_one, sq_tile, sc_tile


def kept_tiles(keep_mb: int, u_sq: int) -> int:
    """Norm tiles in `keep_mb` MB (10^6 bytes): a tile is BLOCK x u_sq 16-byte vectors whatever the dtype."""
    return max(0, keep_mb) * 10**6 // (BLOCK * u_sq * VEC_BYTES)


@cuda.jit(device=True, inline="always")
def sum_parts(part, smem):  # type: ignore[no-untyped-def]
    """sum(part) in one fixed order: every block that calls it gets the same bits."""
    s = float32(0.0)
    i = cuda.threadIdx.x
    while i < part.shape[0]:
        s += part[i]
        i += BLOCK
    return block_sum(s, smem)


def _norm_policies(hint_sq: bool) -> Any:
    """policies(tiles, kt) -> (lim, pl, pf) for sq_one: with the L2 hints (`hint_sq`, a compile-time
    constant) the last kt of `tiles` norm tiles are loaded evict_last (pl), the rest evict_first (pf);
    without them nothing is hinted."""

    @cuda.jit(device=True, inline="always")
    def policies(tiles, kt):  # type: ignore[no-untyped-def]
        if hint_sq:
            return tiles - kt, l2_evict_last(), l2_evict_first()
        return int64(0), uint64(0), uint64(0)

    return policies


def _two_pass_kernels(
    u_sq: int, u_sc: int, width: int, bps_sq: int, bps_sc: int, keep_mb: int
) -> dict[str, Any]:
    """The two_pass kernels for one dtype width and config: "norm" (partials only) and "scale" (sums the
    partials, scales). keep_mb: TwoPassConfig.l2_keep_mb."""
    hint_sq = keep_mb >= 0
    keep_tiles = kept_tiles(keep_mb, u_sq)  # the norm tiles kept (evict_last): the last ones
    ntiles, sq_one, sc_one, _sq_tile, _sc_tile = _two_pass_parts(u_sq, u_sc, width, hint_sq)
    policies = _norm_policies(hint_sq)
    tq = BLOCK * u_sq * width
    tc = BLOCK * u_sc * width
    nv = max(u_sq, u_sc) * width
    jit_sq: dict[str, object] = {} if SIMULATED else {"launch_bounds": (BLOCK, bps_sq)}
    jit_sc: dict[str, object] = {} if SIMULATED else {"launch_bounds": (BLOCK, bps_sc)}

    @cuda.jit(device=True, inline="always")
    def block_sumsq(g0, g1, g2, g3, g4, g5, g6, g7, smem, kt):  # type: ignore[no-untyped-def]
        """This block's sum of squares over its tiles of the eight slots, returned to every thread (hinted:
        the last kt tiles of the global sequence are loaded evict_last, the others evict_first)."""
        v = cuda.local.array(nv, float32)
        acc = cuda.local.array(u_sq, float32)
        for u in range(u_sq):
            acc[u] = float32(0.0)
        b = int64(cuda.blockIdx.x)
        G = int64(cuda.gridDim.x)
        Tq = int64(0)
        if hint_sq:  # (a compile-time constant) only the hints need the total
            Tq = (ntiles(g0, tq) + ntiles(g1, tq) + ntiles(g2, tq) + ntiles(g3, tq) + ntiles(g4, tq)
                  + ntiles(g5, tq) + ntiles(g6, tq) + ntiles(g7, tq))  # fmt: skip
        lim, pl, pf = policies(Tq, kt)
        e = int64(0)
        e = sq_one(g0, b, G, e, acc, v, lim, pl, pf)
        e = sq_one(g1, b, G, e, acc, v, lim, pl, pf)
        e = sq_one(g2, b, G, e, acc, v, lim, pl, pf)
        e = sq_one(g3, b, G, e, acc, v, lim, pl, pf)
        e = sq_one(g4, b, G, e, acc, v, lim, pl, pf)
        e = sq_one(g5, b, G, e, acc, v, lim, pl, pf)
        e = sq_one(g6, b, G, e, acc, v, lim, pl, pf)
        e = sq_one(g7, b, G, e, acc, v, lim, pl, pf)
        s = float32(0.0)
        for u in range(u_sq):
            s += acc[u]
        return block_sum(s, smem)

    @cuda.jit(device=True, inline="always")
    def scale_all(g0, g1, g2, g3, g4, g5, g6, g7, c):  # type: ignore[no-untyped-def]
        v = cuda.local.array(nv, float32)
        b = int64(cuda.blockIdx.x)
        G = int64(cuda.gridDim.x)
        T = (ntiles(g0, tc) + ntiles(g1, tc) + ntiles(g2, tc) + ntiles(g3, tc) + ntiles(g4, tc)
             + ntiles(g5, tc) + ntiles(g6, tc) + ntiles(g7, tc))  # fmt: skip
        end = T
        end = sc_one(g7, b, G, end, T, c, v)
        end = sc_one(g6, b, G, end, T, c, v)
        end = sc_one(g5, b, G, end, T, c, v)
        end = sc_one(g4, b, G, end, T, c, v)
        end = sc_one(g3, b, G, end, T, c, v)
        end = sc_one(g2, b, G, end, T, c, v)
        end = sc_one(g1, b, G, end, T, c, v)
        end = sc_one(g0, b, G, end, T, c, v)

    @cuda.jit(**jit_sq)
    def norm(g0, g1, g2, g3, g4, g5, g6, g7, part):  # type: ignore[no-untyped-def]
        smem = cuda.shared.array(BLOCK, float32)
        total = block_sumsq(g0, g1, g2, g3, g4, g5, g6, g7, smem, keep_tiles)
        if cuda.threadIdx.x == 0:
            part[cuda.blockIdx.x] = total

    @cuda.jit(**jit_sc)
    def scale(g0, g1, g2, g3, g4, g5, g6, g7, part, norm_out, max_norm):  # type: ignore[no-untyped-def]
        smem = cuda.shared.array(BLOCK, float32)
        total = sum_parts(part, smem)
        nrm = math.sqrt(float64(total))
        if cuda.threadIdx.x == 0 and cuda.blockIdx.x == 0:
            norm_out[0] = float32(nrm)
        coef = max_norm / (nrm + CLIP_EPS)
        if not (coef < 1.0 and coef > 0.0):
            return  # nothing to clip (no traffic at all), or a non-finite norm (see the module doc)
        scale_all(g0, g1, g2, g3, g4, g5, g6, g7, float32(coef))

    return {
        "norm": norm,
        "scale": scale,
        "tq": tq,
        "tc": tc,
    }


def _two_pass_sigs(dt: np.dtype) -> dict[str, str]:
    a = ", ".join([f"{dt.name}[::1]"] * SLOTS)
    f1 = "float32[::1]"
    return {
        "norm": f"void({a}, {f1})",
        "scale": f"void({a}, {f1}, {f1}, float64)",
    }


# --- table: any number of arrays, two launches ------------------------------------------------------------
#
# two_pass's algorithm over a device table of rows (address, elements, first norm tile, first scale tile)
# instead of SLOTS array arguments: the same global tile numbering, dealt round-robin to the same persistent
# grids, the same L2 hints, the same fixed-order partial sums (kernels.primitives.pointers turns a row back
# into an array), so the same bits; a model's ~300 gradients take two launches, not 1 + 2N. Each block
# steps through its own tiles (b, b + G, ... in the norm pass; from the last in the scale pass) and finds
# each tile's row from its previous tile's (`_row_up` / `_row_down`: one load while the tile stays in that
# row, else a galloping search over the table's first-tile column). Until the twelfth session (2026-12-06)
# every block walked every row and dealt its tiles with per-row arithmetic (a 64-bit remainder among it):
# at Llama-3-8B / 64 (291 arrays, 251 MB of bf16) that cost ~400 us of 650 with no loads in flight; the
# search took it to 260 us (2.50x), fp32 712 -> 514 us (1.39x), and left Llama-3-8B / 8 level (0.996x,
# 0.998x), bit for bit (an H100: lab/clip_table_walk.py, at cd6bc2f -> benchmarks/h100/2026-12-06/twelfth/
# clip-walk/). As shipped, the registry bench in two runs: bf16 260.1 / 263.8 us, fp16 260.9 / 278.0 us, fp32
# 539.6 / 513.8 us, 0.90-0.97 of copy (benchmarks/h100/2026-12-06/thirteenth/clip/ and latest/).
# The table lives on the device and is reused while the same (address, elements) rows come back
# (`table_for`).

TAB_FIRST_Q, TAB_FIRST_C = 2, 3  # the table's columns of each row's first norm tile and first scale tile


@cuda.jit(device=True, inline="always")
def _last_at_most(tab, col, g, lo, hi):  # type: ignore[no-untyped-def]
    """The last row r in [lo, hi] with tab[r, col] <= g, given tab[lo, col] <= g (the column ascends)."""
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if tab[mid, col] <= g:
            lo = mid
        else:
            hi = mid - 1
    return lo


@cuda.jit(device=True, inline="always")
def _row_up(tab, col, g, j):  # type: ignore[no-untyped-def]
    """The row holding global tile g (first tiles in column `col`), from row j that holds an earlier tile
    (a block's norm tiles ascend): one load while g stays in row j, else a galloping search forward (steps
    1, 2, 4, ...) and a binary one inside the last step, O(log) per row skipped."""
    last = int64(tab.shape[0] - 1)
    if j == last or tab[j + 1, col] > g:
        return j
    lo = j + 1
    step = int64(1)
    while lo + step <= last and tab[lo + step, col] <= g:
        lo += step
        step *= 2
    return _last_at_most(tab, col, g, lo, min(lo + step - 1, last))


@cuda.jit(device=True, inline="always")
def _row_down(tab, col, g, j):  # type: ignore[no-untyped-def]
    """_row_up for a block whose tiles descend (the scale pass counts from the last tile): row j holds a
    later tile, so g's row is j or before it."""
    if tab[j, col] <= g:
        return j
    hi = j - 1  # g's row is at most hi (tab[hi + 1, col] > g)
    step = int64(1)
    p = hi
    while p > 0 and tab[p, col] > g:  # row 0's first tile is 0 <= g
        hi = p - 1
        step *= 2
        p = max(hi - step + 1, int64(0))
    return _last_at_most(tab, col, g, p, hi)


def _table_kernels(
    u_sq: int, u_sc: int, width: int, bps_sq: int, bps_sc: int, keep_mb: int, dt: np.dtype
) -> dict[str, Any]:
    """ "norm" (tab, part, tiles): partials over the arrays of `tab` (int64 rows: address, elements, first
    norm tile, first scale tile), whose norm tiles number `tiles` in all; "scale" (tab, part, norm_out,
    max_norm, tiles): sums the partials, publishes the norm and scales, `tiles` being the scale tiles in
    all."""
    hint_sq = keep_mb >= 0
    keep_tiles = kept_tiles(keep_mb, u_sq)
    _ntiles, _sq_one, _sc_one, sq_tile, sc_tile = _two_pass_parts(u_sq, u_sc, width, hint_sq, IO_OF[dt])
    policies = _norm_policies(hint_sq)
    at = view_at(dt)
    tq, tc = BLOCK * u_sq * width, BLOCK * u_sc * width
    nv = max(u_sq, u_sc) * width
    jit_sq: dict[str, object] = {} if SIMULATED else {"launch_bounds": (BLOCK, bps_sq)}
    jit_sc: dict[str, object] = {} if SIMULATED else {"launch_bounds": (BLOCK, bps_sc)}

    @cuda.jit(**jit_sq)
    def norm(tab, part, tiles):  # type: ignore[no-untyped-def]
        smem = cuda.shared.array(BLOCK, float32)
        v = cuda.local.array(nv, float32)
        acc = cuda.local.array(u_sq, float32)
        for u in range(u_sq):
            acc[u] = float32(0.0)
        G = int64(cuda.gridDim.x)
        lim, pl, pf = policies(tiles, keep_tiles)
        t = int64(cuda.blockIdx.x)
        j = int64(0)
        while t < tiles:  # this block's tiles, ascending: the order of its partial sum
            j = _row_up(tab, TAB_FIRST_Q, t, j)
            n = tab[j, 1]
            sq_tile(at(tab[j, 0], n), (t - tab[j, TAB_FIRST_Q]) * tq, n, t, acc, v, lim, pl, pf)
            t += G
        s = float32(0.0)
        for u in range(u_sq):
            s += acc[u]
        total = block_sum(s, smem)
        if cuda.threadIdx.x == 0:
            part[cuda.blockIdx.x] = total

    @cuda.jit(**jit_sc)
    def scale(tab, part, norm_out, max_norm, tiles):  # type: ignore[no-untyped-def]
        smem = cuda.shared.array(BLOCK, float32)
        total = sum_parts(part, smem)
        nrm = math.sqrt(float64(total))
        if cuda.threadIdx.x == 0 and cuda.blockIdx.x == 0:
            norm_out[0] = float32(nrm)
        coef = max_norm / (nrm + CLIP_EPS)
        if not (coef < 1.0 and coef > 0.0):
            return  # nothing to clip (no traffic at all), or a non-finite norm (see the module doc)
        c = float32(coef)
        v = cuda.local.array(nv, float32)
        G = int64(cuda.gridDim.x)
        s = int64(cuda.blockIdx.x)
        j = int64(tab.shape[0] - 1)
        while s < tiles:  # from the last tile: what the norm pass read last is still in L2
            t = tiles - 1 - s
            j = _row_down(tab, TAB_FIRST_C, t, j)
            n = tab[j, 1]
            sc_tile(at(tab[j, 0], n), (t - tab[j, TAB_FIRST_C]) * tc, n, c, v)
            s += G

    return {"norm": norm, "scale": scale, "tq": tq, "tc": tc}


_TABLE_SIGS = {
    "norm": "void(int64[:, ::1], float32[::1], int64)",
    "scale": "void(int64[:, ::1], float32[::1], float32[::1], float64, int64)",
}


# per dtype, from the H200 side-by-side runs (notes-clip.md): 64 KB of loads in flight per SM in the norm pass
# (ptxas: 64 registers, no spills); the last 24 MB of the norm pass kept in L2 for the backward scale pass
_TUNED = TwoPassConfig(
    norm_unroll=4, scale_unroll=2, norm_blocks_per_sm=4, scale_blocks_per_sm=4, l2_keep_mb=24
)
TWO_PASS_DEFAULT: dict[np.dtype, TwoPassConfig] = {F32: _TUNED, F16: _TUNED, BF16: _TUNED}
TWO_PASS_DTYPES = (F32, F16)  # what the SLOTS kernels (and their lean host path) take; bf16 runs "table"


def two_pass_config(dt: np.dtype) -> TwoPassConfig:
    """TWO_PASS_DEFAULT[dt] for the current device: without the L2 hints below cc 8.0 (`createpolicy` and the
    cache-hinted loads need sm_80; ptxas rejects them for older targets). The simulator keeps them (it runs
    plain loads in their place)."""
    c = TWO_PASS_DEFAULT[dt]
    if c.l2_keep_mb < 0 or SIMULATED or (compute_capability() or (0, 0)) >= (8, 0):
        return c
    return dataclasses.replace(c, l2_keep_mb=-1)


_FNS: dict[tuple[np.dtype, TwoPassConfig], dict[str, Any]] = {}
_KERNELS: dict[tuple[np.dtype, TwoPassConfig, str], Kernel] = {}
_buffers: dict[tuple[int, str, int], Operand] = {}
_grids: dict[tuple[int, np.dtype, TwoPassConfig, str], int] = {}
SIM_GRID = 2  # blocks of the two grids under the simulator (see two_pass_grid)


def two_pass_fns(dt: np.dtype, cfg: TwoPassConfig) -> dict[str, Any]:
    key = (dt, cfg)
    if key not in _FNS:
        _FNS[key] = _two_pass_kernels(
            cfg.norm_unroll, cfg.scale_unroll, WIDTH[dt], cfg.norm_blocks_per_sm, cfg.scale_blocks_per_sm,
            cfg.l2_keep_mb,
        )  # fmt: skip
    return _FNS[key]


def _two_pass_kernel(dt: np.dtype, cfg: TwoPassConfig, name: str) -> Kernel:
    key = (dt, cfg, name)
    k = _KERNELS.get(key)
    if k is None:
        k = _KERNELS[key] = kernel(two_pass_fns(dt, cfg)[name], _two_pass_sigs(dt)[name])
    return k


def _zeros(name: str, n: int, dtype: Any) -> Operand:
    """A new zeroed device buffer of n elements."""
    dev = cuda.to_device(np.zeros(n, dtype))
    ptr = 0 if SIMULATED else int(dev.device_ctypes_pointer.value or 0)
    dt_ = np.dtype(dtype)
    return Operand(name, ptr, (n,), (dt_.itemsize,), dt_, dev, None, dev)


def _buffer(name: str, n: int, dtype: Any) -> Operand:
    """A zeroed device buffer of n elements kept for every later call in this context (the partials).
    Callers that keep its pointer keep the Operand too: two threads racing here both get the one kept."""
    key = (_launch.context(), name, n)
    op = _buffers.get(key)
    if op is None:
        op = _buffers.setdefault(key, _zeros(name, n, dtype))
    return op


def two_pass_grid(dt: np.dtype, cfg: TwoPassConfig, name: str) -> int:
    """Persistent grids: SMs x blocks per SM. Under the simulator 2 blocks: enough to deal tiles to several
    blocks and sum several partials, while every idle simulated block (256 Python threads) would cost the
    fleet's simulated verify seconds per node. Per context: the SMs are the current device's."""
    key = (_launch.context(), dt, cfg, name)
    g = _grids.get(key)
    if g is None:
        g = sm_count() * (cfg.scale_blocks_per_sm if name == "scale" else cfg.norm_blocks_per_sm)
        if SIMULATED:
            g = min(g, SIM_GRID)
        _grids[key] = g
    return g


def two_pass_launches(
    flat: list[Operand], norm_out: Operand, max_norm: float, cfg: TwoPassConfig | None = None
) -> list[tuple[Kernel, int, tuple[Any, ...]]]:
    """The two launches of one call over `flat` (1 <= len <= SLOTS contiguous, 16-byte aligned 1-d operands
    of one dtype), in order: (kernel, grid, arguments). The lean launcher must write the same blocks."""
    dt = flat[0].dtype
    c = two_pass_config(dt) if cfg is None else cfg
    slots = (*flat, *([_empty(dt)] * (SLOTS - len(flat))))
    gq = two_pass_grid(dt, c, "norm")
    part = _buffer("part", gq, np.float32)
    return [
        (_two_pass_kernel(dt, c, "norm"), gq, (*slots, part)),
        (_two_pass_kernel(dt, c, "scale"), two_pass_grid(dt, c, "scale"), (*slots, part, norm_out, max_norm)),
    ]


def launch_two_pass(
    flat: list[Operand], norm_out: Operand, max_norm: float, stream: int, cfg: TwoPassConfig | None = None
) -> None:
    """One two_pass call through the general (Kernel.launch) path."""
    for k, grid, args in two_pass_launches(flat, norm_out, max_norm, cfg):
        k.launch(grid, BLOCK, args, stream=stream)


_TABLE_FNS: dict[tuple[np.dtype, TwoPassConfig], dict[str, Any]] = {}
_TABLE_KERNELS: dict[tuple[np.dtype, TwoPassConfig, str], Kernel] = {}
TABLES_MAX = 16  # device tables kept (one per set of arrays: a training loop needs one)
_tables: dict[tuple[Any, ...], tuple[Operand, int, int]] = {}


def table_fns(dt: np.dtype, cfg: TwoPassConfig) -> dict[str, Any]:
    key = (dt, cfg)
    if key not in _TABLE_FNS:
        _TABLE_FNS[key] = _table_kernels(
            cfg.norm_unroll, cfg.scale_unroll, WIDTH[dt], cfg.norm_blocks_per_sm, cfg.scale_blocks_per_sm,
            cfg.l2_keep_mb, dt,
        )  # fmt: skip
    return _TABLE_FNS[key]


def _table_kernel(dt: np.dtype, cfg: TwoPassConfig, name: str) -> Kernel:
    key = (dt, cfg, name)
    k = _TABLE_KERNELS.get(key)
    if k is None:
        k = _TABLE_KERNELS[key] = kernel(table_fns(dt, cfg)[name], _TABLE_SIGS[name])
    return k


def table_for(flat: list[Operand], cfg: TwoPassConfig) -> tuple[Operand, int, int]:
    """(the device table of `flat`'s rows (address, elements, first norm tile, first scale tile), norm tiles
    in all, scale tiles in all)."""
    rows = tuple((op.ptr if not SIMULATED else address_of(op.dev), op.size) for op in flat)
    return _table_of(flat[0].dtype, cfg, rows)


def _table_of(
    dt: np.dtype, cfg: TwoPassConfig, rows: tuple[tuple[int, int], ...]
) -> tuple[Operand, int, int]:
    """table_for on (address, elements) rows. Kept per rows: a table is keyed by its own contents, so a hit
    is right even when the arrays were freed and others allocated at the same addresses. Up to TABLES_MAX,
    the oldest dropped once the device has drained (no queued launch can read a freed table then, whatever
    the memory manager)."""
    key = (_launch.context(), dt, cfg, rows)
    hit = _tables.pop(key, None)
    if hit is None:
        fns = table_fns(dt, cfg)
        tq, tc = fns["tq"], fns["tc"]
        tab = np.zeros((len(rows), 4), np.int64)
        tab[:, :2] = np.array(rows, dtype=np.int64).reshape(len(rows), 2)
        nq, nc = (tab[:, 1] + tq - 1) // tq, (tab[:, 1] + tc - 1) // tc
        tab[1:, TAB_FIRST_Q], tab[1:, TAB_FIRST_C] = np.cumsum(nq)[:-1], np.cumsum(nc)[:-1]
        tiles_q, tiles_c = int(nq.sum()), int(nc.sum())
        dev = cuda.to_device(tab)
        # a copy from pageable memory may return before the data lands, and a kernel on a non-blocking
        # stream does not wait for the legacy stream: once per new table, wait for it
        cuda.synchronize()
        i64 = np.dtype(np.int64)
        ptr = 0 if SIMULATED else address_of(dev)
        hit = (Operand("table", ptr, (len(rows), 4), (32, 8), i64, dev, None, dev), tiles_q, tiles_c)
        # this context's tables, oldest first: from a snapshot (tuple() copies the keys in one step, while
        # threads of other GPUs may add or drop theirs)
        mine = [k for k in tuple(_tables) if k[0] == key[0]]
        if len(mine) >= TABLES_MAX:
            # no queued launch may still read a table dropped here (any allocator): the drain covers this
            # context, which is why only its own tables are dropped
            cuda.synchronize()
            for old in mine[: len(mine) - TABLES_MAX + 1]:
                _tables.pop(old, None)
    _tables[key] = hit  # (re)inserted last: the most recently used
    return hit


def table_launches(
    flat: list[Operand], norm_out: Operand, max_norm: float, cfg: TwoPassConfig | None = None
) -> list[tuple[Kernel, int, tuple[Any, ...]]]:
    """The two launches of one "table" call over `flat` (any number of contiguous, 16-byte aligned 1-d
    operands of one dtype), in order: (kernel, grid, arguments). The grids are two_pass's."""
    dt = flat[0].dtype
    c = two_pass_config(dt) if cfg is None else cfg
    tab, tiles_q, tiles_c = table_for(flat, c)
    gq = two_pass_grid(dt, c, "norm")
    part = _buffer("part", gq, np.float32)
    return [
        (_table_kernel(dt, c, "norm"), gq, (tab, part, tiles_q)),
        (
            _table_kernel(dt, c, "scale"),
            two_pass_grid(dt, c, "scale"),
            (tab, part, norm_out, max_norm, tiles_c),
        ),
    ]


# --- two_pass host path: a lean launcher for device arrays -------------------------------------------------
#
# Why: the bench restores the in-place inputs with host-heavy copies, so the GPU is idle when a timed call
# starts and the launcher's host time up to its first launch is part of the figure (notes-clip.md); issue 4
# also wants <= 10 us per call. The general path builds an Operand per array, a reshaped view per array and
# packs argument by argument (~20-40 us for 8 arrays). The fast path reads (pointer, shape, strides, dtype)
# through the cached per-type extractors, checks what the kernels need (one float dtype, C-contiguous,
# non-empty, 16-byte aligned, norm_out one float32) and writes each kernel's whole parameter block with ONE
# struct.pack_into. Anything else (numpy inputs, a workspace, odd layouts, errors) returns False and takes
# the general path, which validates and reports. Off under the simulator (launches go through numba's
# dispatcher there); `fast_values` is what the tests compare with Kernel.pack.

_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")


def fast_values(
    grads: Sequence[Any], norm_out: Any, table: bool = False
) -> tuple[np.dtype, list[int], int] | None:
    """(dtype, the 7 int64 parameter words of every grads slot, norm_out pointer), or None when the fast
    path does not apply. The words of a 1-d C-contiguous slot, as numba lays out an array argument:
    meminfo 0, parent 0, nitems, itemsize, data pointer, shape[0], stride (= itemsize). `table`: for the
    table path's lean call (any number of arrays, bf16 too) instead of two_pass's (SLOTS, fp32 / fp16)."""
    t = type(grads)
    if (t is not list and t is not tuple) or not 0 < len(grads) <= (1 << 20 if table else SLOTS):
        return None
    dtypes = DTYPES if table else TWO_PASS_DTYPES
    get = arrays._EXTRACTORS.get
    ex = get(type(norm_out))
    if ex is None:
        return None
    p_no, sh, st, d = ex(norm_out)
    if d is not F32 or tuple(sh) != (1,):
        return None
    words: list[int] = []
    dt = None
    for g in grads:
        ex = get(type(g))
        if ex is None:
            return None
        ptr, shape, strides, d = ex(g)
        if dt is None:
            if d not in dtypes:
                return None
            dt = d
        elif d is not dt:
            return None
        isz = dt.itemsize
        if len(shape) == 1:
            n = shape[0]
            if n > 1 and strides[0] != isz:
                return None
        else:
            n = 1
            for s in shape:
                n *= s
            if n > 1 and tuple(strides) != arrays.c_strides(tuple(shape), isz):
                return None
        if n == 0 or ptr & 15:
            return None
        words += (0, 0, n, isz, ptr, n, isz)
    assert dt is not None
    return dt, words, p_no


class _FastPlan:
    """Everything a fast call of one dtype needs, resolved once: kernels, grids, buffers, formats."""

    def __init__(self, dt: np.dtype, cfg: TwoPassConfig) -> None:
        empty = _empty(dt)
        self.empty_words = [0, 0, 0, dt.itemsize, empty.ptr, 0, dt.itemsize]
        names = ("norm", "scale")
        self.kernels = []
        for nm in names:
            k = _two_pass_kernel(dt, cfg, nm)
            # a private copy with its own parameter block: nothing else (Kernel.launch of the general path)
            # writes it, so a repeat call whose blocks are already packed (see `launch`) launches as they are
            own = k.clone()
            self.kernels.append(own)
        self._last: tuple[Any, float] | None = None  # (values, max_norm) the blocks hold now
        self._moving: tuple[Any, _TableCall] | None = None  # (values, their table call) for a moving max_norm
        # (id(values), max_norm) -> (values, graph): the call's launches captured once (see `launch`)
        self._graphs = GraphCache(GRAPHS_MAX)
        self._grids: list[int] = []
        self._lock = threading.Lock()  # one call at a time: the blocks and graphs are this plan's
        q = 7 * SLOTS
        gq = two_pass_grid(dt, cfg, "norm")
        part = self.part = _buffer("part", gq, np.float32)  # held: the blocks hold its address
        pw = [0, 0, gq, 4, part.ptr, gq, 4]
        self.grids = [gq, two_pass_grid(dt, cfg, "scale")]
        self.tail = [pw, pw]
        self.fmts = [struct.Struct(f"<{q + 7}q"), struct.Struct(f"<{q + 14}qd")]

    def pack(self, i: int, words: list[int], p_no: int, mx: float) -> int:
        """Write kernel i's whole parameter block (`words`: SLOTS slots, padded); returns its grid."""
        k = self.kernels[i]
        if i == len(self.kernels) - 1:  # the kernel that scales: + norm_out, max_norm
            self.fmts[i].pack_into(k._block, 0, *words, *self.tail[i], 0, 0, 1, 4, p_no, 1, 4, mx)
        else:
            self.fmts[i].pack_into(k._block, 0, *words, *self.tail[i])
        return self.grids[i]

    def launch(self, fv: tuple[np.dtype, list[int], int], mx: float, hs: Any, moving_ok: bool = True) -> None:
        """Replay the graph of (`fv`, `mx`) if there is one. Else pack both blocks (skipped when they already
        hold `fv`, the very object, and `mx`) and launch; the second call in a row with the same (`fv`, `mx`)
        captures the launches into a graph first and replays it from then on. While the caller captures the
        stream into a graph of its own, every call launches directly (its launches land in that graph)."""
        _launch.bind_thread()
        with self._lock:
            self._launch(fv, mx, hs, moving_ok)

    def _launch(self, fv: tuple[np.dtype, list[int], int], mx: float, hs: Any, moving_ok: bool) -> None:
        key = (id(fv), mx)
        cap = hs is not None and _launch.capturing(hs)
        graph = None if cap else self._graphs.find(key, fv)
        if graph is not None:
            graph.launch(hs)
            return
        last = self._last
        if last is not None and last[0] is fv and last[1] != mx and not moving_ok:
            # only max_norm changed, and the caller asked for "two_pass" itself: rewrite that one parameter
            # (the scaling kernel's last, a float64) and launch directly
            i = len(self.kernels) - 1
            _F64.pack_into(self.kernels[i]._block, self.fmts[i].size - 8, mx)
            self._last = (fv, mx)
            self._record(hs)
            return
        if last is not None and last[0] is fv and last[1] != mx:
            # only max_norm changed (a schedule that moves it every step): the table kernels over the same
            # arrays, which give these kernels' very bits (test_table_is_two_pass_bit_for_bit), replay ONE
            # graph whatever max_norm does (_TableCall); the blocks here keep `last` for a return to it
            moving = self._moving
            if moving is None or moving[0] is not fv:
                if moving is not None:
                    moving[1].close()
                self._moving = moving = (fv, _TableCall(*fv))
            moving[1].launch(mx, hs)
            return
        if last is None or last[0] is not fv or last[1] != mx:
            self._last = None  # a pack that fails part-way must not leave a stale match
            words, p_no = fv[1], fv[2]
            cnt = len(words) // 7
            if cnt < SLOTS:
                words = words + self.empty_words * (SLOTS - cnt)  # a new list: the cached one stays unpadded
            self._grids = [self.pack(i, words, p_no, mx) for i in range(len(self.kernels))]
            self._last = (fv, mx)  # holds fv: its id cannot be reused while it is compared by identity
        elif _launch.GRAPH_REPLAY and not cap:
            self._graphs.add(key, self._record, fv).launch(hs)  # the driver copies the packed blocks now
            return
        self._record(hs)

    def _record(self, hs: Any) -> None:
        for k, g in zip(self.kernels, self._grids, strict=True):
            rc = k._launch(k._func, g, 1, 1, BLOCK, 1, 1, 0, hs, k._params, None)
            if rc != 0:
                raise LaunchError(f"cuLaunchKernel failed with CUresult {rc} for {k.sig}")


# Repeat calls replay a CUDA graph of the call's launches (kernels.runtime.launch.LaunchGraph): one
# cuGraphLaunch costs the host a fraction of the two cuLaunchKernel calls (figures: benchmarks/notes-clip.md).
# A graph is built on the second call in a row with the same arrays (the cached
# values object) and max_norm, the case of a training loop; new arrays launch directly; a max_norm that moves
# alone (a schedule) goes to the table call over the same arrays: one graph, its scale launch updated
# in place.
# kernels.runtime.launch.GRAPH_REPLAY switches it off.
GRAPHS_MAX = 8  # graphs per plan


_fast_plans: dict[tuple[int, np.dtype], _FastPlan] = {}  # by (context, dtype)
_PLANS_LOCK = threading.Lock()


class _TableCall:
    """The table path's lean call over one set of device arrays (a training loop's gradients), resolved once
    and kept per tuple of array ids like `cached_values`: the device table, both kernels with private
    parameter blocks packed once, and from the second call on a CUDA graph of the two launches. A new
    max_norm rewrites that one parameter and updates the graph's scale launch in place
    (LaunchGraph.set_kernel_params: one driver call), so every later call is one graph launch whatever
    max_norm does. Why: the general path resolves and checks every array on every call, ~0.9 ms of host
    time for Llama-3-8B's 291 gradients (H200 host, 2026-12-03)."""

    def __init__(self, dt: np.dtype, words: list[int], p_no: int, own_partials: bool = False) -> None:
        """`own_partials`: a partials buffer of its own instead of the context's shared one, so that calls
        on other streams (other prepared sets) never share it (PreparedClip)."""
        cfg = two_pass_config(dt)
        rows = tuple((words[i + 4], words[i + 2]) for i in range(0, len(words), 7))
        self.tab, tiles_q, tiles_c = _table_of(dt, cfg, rows)
        gq = two_pass_grid(dt, cfg, "norm")
        part = _zeros("part", gq, np.float32) if own_partials else _buffer("part", gq, np.float32)
        self.part = part  # held: the kernels' blocks hold its address
        no = Operand("norm_out", p_no, (1,), (4,), F32, None)
        self.kernels: list[Kernel] = []
        calls = (("norm", (self.tab, part, tiles_q)), ("scale", (self.tab, part, no, 1.0, tiles_c)))
        for name, args in calls:
            k = _table_kernel(dt, cfg, name)
            own = k.clone()  # a private parameter block, as _FastPlan's
            own.pack(args)
            self.kernels.append(own)
        self.grids = (gq, two_pass_grid(dt, cfg, "scale"))
        self._mx_at = 8 * self.kernels[1]._plan[3][1]  # byte offset of max_norm (a float64) in its block
        self._mx = 1.0  # what the scale block holds
        self._graph: LaunchGraph | None = None
        self._graph_mx = 0.0  # what the graph's scale launch holds
        self._calls = 0
        self._lock = threading.Lock()  # one call at a time: max_norm is written into one block

    def launch(self, mx: float, hs: Any) -> None:
        _launch.bind_thread()
        with self._lock:
            self._launch(mx, hs)

    def _launch(self, mx: float, hs: Any) -> None:
        scale = self.kernels[1]
        if mx != self._mx:
            _F64.pack_into(scale._block, self._mx_at, mx)
            self._mx = mx
        if hs is not None and _launch.capturing(hs):  # the caller's own graph capture: direct launches
            self._record(hs)
            return
        g = self._graph
        if g is not None:
            if self._graph_mx != mx:
                g.set_kernel_params(1, scale, self.grids[1], BLOCK)
                self._graph_mx = mx
            g.launch(hs)
            return
        self._calls += 1
        if self._calls >= 2 and _launch.GRAPH_REPLAY:
            self._graph = _launch.LaunchGraph(self._record, updatable=True)
            self._graph_mx = mx
            self._graph.launch(hs)
            return
        self._record(hs)

    def _record(self, hs: Any) -> None:
        for k, g in zip(self.kernels, self.grids, strict=True):
            rc = k._launch(k._func, g, 1, 1, BLOCK, 1, 1, 0, hs, k._params, None)
            if rc != 0:
                raise LaunchError(f"cuLaunchKernel failed with CUresult {rc} for {k.sig}")

    def close(self) -> None:
        with self._lock:  # not while another thread launches the graph
            if self._graph is not None:
                self._graph.close()
                self._graph = None


def _tuple_ids_reader() -> Any:
    """A function giving the ids of a sequence's items as one bytes object, or None where this interpreter
    cannot be read that way. CPython stores a tuple's item pointers inline, `tuple.__basicsize__` bytes into
    the object, and an object's id is its address: so the ids of 291 items are one `ctypes.string_at` of a
    tuple of them (~1 us on the CI machine) instead of `tuple(map(id, ...))`, whose every id is a new int
    object (~9 us there: most of the plain 291-array clip's host time). Checked here, once, against
    `map(id)` on a tuple of fresh objects; any mismatch (another interpreter, another tuple layout) keeps
    the portable form. It reads a tuple (the callers' snapshot, see `item_ids`), whose length and items
    cannot change while it is read, and only its own `len` item pointers."""
    if sys.implementation.name != "cpython" or tuple.__itemsize__ != ctypes.sizeof(ctypes.c_void_p):
        return None
    at, size, string_at = tuple.__basicsize__, tuple.__itemsize__, ctypes.string_at
    probe = tuple(object() for _ in range(5))
    want = b"".join(i.to_bytes(size, sys.byteorder) for i in map(id, probe))
    if string_at(id(probe) + at, size * len(probe)) != want:  # (reads inside the probe: 5 items past `at`)
        return None

    def read(t: tuple[Any, ...]) -> bytes:
        return string_at(id(t) + at, size * len(t))

    return read


_read_ids = _tuple_ids_reader()


_READ_PAST = 12  # items; up to here a tuple of ids costs less than the ctypes call (~0.3 us, CI machine)


def item_ids(seq: Sequence[Any]) -> Any:
    """The ids of `seq`'s items in order, as one hashable value that is equal for equal id sequences (and
    only for them; the length alone picks the form, so two sequences of one length always get the same
    form): the key of the lean calls below. Meaningful only while every item lives, which the callers see
    to (weak references that drop the entry). Read from one snapshot, `tuple(seq)` (one C call; `seq`
    itself when it is a tuple), so a list that another thread changes meanwhile gives the ids of one of its
    states, never a mix; callers that also read the items pass that snapshot (`_table_fast_call`)."""
    t = seq if type(seq) is tuple else tuple(seq)
    if _read_ids is None or len(t) <= _READ_PAST:
        return tuple(map(id, t))
    return _read_ids(t)


TABLE_CALLS_MAX = 8  # sets of arrays with a lean table call kept (a training loop needs one)
_table_calls: dict[tuple[Any, ...], tuple[_TableCall, list[Any]]] = {}


def _table_fast_call(grads: Sequence[Any], max_norm: Any, norm_out: Any, stream: Any) -> bool:
    """The table path's lean call; False when it does not apply (nothing was launched then): arrays of a
    type whose layout can change in place, or anything `fast_values(table=True)` declines."""
    t = type(grads)
    if t is not list and t is not tuple:
        return False
    try:
        mx = float(max_norm)
    except (TypeError, ValueError):
        return False  # the general path names the error
    if not mx > 0.0:  # also NaN; the general path raises the error
        return False
    # one snapshot of the list for the key, the weak references and the values alike: a list another thread
    # changes meanwhile must not file one set's pointers under another set's ids
    grads = grads if t is tuple else tuple(grads)
    key = (_launch.context(), item_ids(grads), id(norm_out))
    hit = _table_calls.get(key)
    if hit is None:
        objs = (*grads, norm_out)
        if not all(_immutable_layout(type(o)) for o in objs):
            return False
        fv = fast_values(grads, norm_out, table=True)
        if fv is None:
            return False
        entry = _TableCall(*fv)

        def drop(_ref: Any, key: tuple[Any, ...] = key) -> None:
            gone = _table_calls.pop(key, None)
            if gone is not None:
                gone[0].close()

        try:
            refs = [weakref.ref(o, drop) for o in objs]
        except TypeError:  # a type without weak references: no lean call
            return False
        mine = [k for k in tuple(_table_calls) if k[0] == key[0]]  # this context's, oldest first (a snapshot)
        for old in mine[: max(0, len(mine) - TABLE_CALLS_MAX + 1)]:
            gone = _table_calls.pop(old, None)  # (a weakref callback may have dropped it meanwhile)
            if gone is not None:
                gone[0].close()
        hit = _table_calls[key] = (entry, refs)
    h = stream if type(stream) is int else _stream_handle(stream)
    hit[0].launch(mx, ctypes.c_void_p(h) if h else None)
    return True


# Calls on the same array objects (a training loop's gradients; the bench's input sets) skip even the
# per-array extraction: the words are remembered per tuple of object ids. Only for array types whose
# pointer and size cannot change in place (numba device arrays, CuPy arrays: a CuPy `shape` assignment keeps
# the size, and the kernels see every array flat), and only while every object is alive: each entry holds
# weak references whose callbacks drop it before an id can be reused. No strong reference is kept, so the
# cache never holds device memory alive.
_WORDS_MAX = 64
_words: dict[tuple[Any, ...], tuple[np.dtype, list[int], int]] = {}
_words_refs: dict[tuple[Any, ...], list[Any]] = {}


def _immutable_layout(t: type) -> bool:
    """numba device arrays (the simulator's too) and CuPy arrays: their pointer and size never change in
    place. Not torch tensors (`set_`, `.data =` replace the storage) nor other __cuda_array_interface__
    objects, whose owners may do the same."""
    mod = t.__module__ or ""
    numba_array = hasattr(t, "device_ctypes_pointer") or t.__name__ == "FakeCUDAArray"
    return (mod.startswith("numba.cuda") and numba_array) or (
        mod.startswith("cupy") and t.__name__ == "ndarray"
    )


def cached_values(grads: Sequence[Any], norm_out: Any) -> tuple[np.dtype, list[int], int] | None:
    """`fast_values`, remembered per tuple of object ids while every object lives (see above)."""
    t = type(grads)
    if t is not list and t is not tuple:
        return None
    grads = grads if t is tuple else tuple(grads)  # one snapshot for key and values (`_table_fast_call`)
    key = (item_ids(grads), id(norm_out))
    hit = _words.get(key)
    if hit is not None:
        return hit
    fv = fast_values(grads, norm_out)
    if fv is None or len(_words) >= _WORDS_MAX:
        return fv
    objs = (*grads, norm_out)
    if not all(_immutable_layout(type(o)) for o in objs):
        return fv

    def drop(_ref: Any, key: tuple[Any, ...] = key) -> None:
        _words.pop(key, None)
        _words_refs.pop(key, None)

    try:
        refs = [weakref.ref(o, drop) for o in objs]
    except TypeError:  # a type without weak references: no caching
        return fv
    _words[key] = fv
    _words_refs[key] = refs
    return fv


def _fast_call(grads: Sequence[Any], max_norm: Any, norm_out: Any, stream: Any, path: str) -> bool:
    """The lean launch; False when it does not apply (nothing was launched then)."""
    t = type(grads)
    if (t is not list and t is not tuple) or len(grads) > SLOTS:
        return False  # (more than SLOTS: before a key of every id is built; the table's lean call builds one)
    fv = cached_values(grads, norm_out)
    if fv is None:
        return False
    dt = fv[0]
    try:
        mx = float(max_norm)
    except (TypeError, ValueError):
        return False  # the general path names the error
    if not mx > 0.0:  # also NaN; the general path raises the error
        return False
    pk = (_launch.context(), dt)
    plan = _fast_plans.get(pk)
    if plan is None:
        with _PLANS_LOCK:  # one plan per context and dtype, whichever thread gets here first
            plan = _fast_plans.get(pk)
            if plan is None:
                plan = _fast_plans[pk] = _FastPlan(dt, two_pass_config(dt))
    h = stream if type(stream) is int else _stream_handle(stream)
    plan.launch(fv, mx, ctypes.c_void_p(h) if h else None, moving_ok=path == "auto")
    return True


def _accumulator() -> Operand:
    """One float64 device scalar per context, reused by every call: calls on one stream are ordered, so reuse
    is safe; callers running clip_grad_norm on several streams at once pass their own `workspace`."""
    return _buffer("workspace", 1, np.float64)


def _tiles(n: int, unroll: int) -> int:
    return max(1, (n + BLOCK * unroll - 1) // (BLOCK * unroll))


def clip_grad_norm(
    grads: Sequence[Any],
    max_norm: float,
    *,
    norm_out: Any = None,
    workspace: Any = None,
    stream: int = 0,
    path: str = "auto",
) -> Any:
    """Clip `grads` (fp32, fp16 or bf16 arrays, one dtype) in place to a global L2 norm of `max_norm`.

    Returns the norm before clipping as a Python float, or, when `norm_out` (a float32 device array of one
    element) is given, writes it there and returns `norm_out` without waiting for the device.
    `path`: "auto" ("two_pass" for up to SLOTS 16-byte aligned fp32 / fp16 arrays, "table" for more or for
    bf16, both without a `workspace`; otherwise "per_array"), "two_pass", "table" or "per_array" (see the
    module docstring).
    """
    if not USE_DISPATCHER and norm_out is not None and workspace is None:
        if (path == "auto" or path == "two_pass") and _fast_call(grads, max_norm, norm_out, stream, path):
            return norm_out
        # (auto: _fast_call took every set two_pass runs; what is left is "table" when aligned)
        if (path == "auto" or path == "table") and _table_fast_call(grads, max_norm, norm_out, stream):
            return norm_out
    if path not in PATHS:
        raise ValueError(f"path: {path!r} is not a path; expected one of: {', '.join(PATHS)}")
    if isinstance(grads, (str, bytes)) or not isinstance(grads, Sequence) or len(grads) == 0:
        raise ValueError(f"grads: expected a non-empty list of arrays, got {type(grads).__name__}")
    mx = arrays.check_positive("max_norm", max_norm)
    sync = HostSync()
    ops = [arrays.operand(f"grads[{k}]", g, sync, writeback=True) for k, g in enumerate(grads)]
    arrays.check_dtype(ops[0], FLOAT_IO_BF16)
    for op in ops:
        arrays.check_same_dtype(op, ops[0])
        arrays.check_contiguous(op)
        arrays.check_nonempty(op)
    if norm_out is None:
        no = arrays.empty_like_device("norm_out", (1,), np.dtype(np.float32))
    else:
        no = arrays.operand("norm_out", norm_out, sync, writeback=True)
        arrays.check_dtype(no, (np.dtype(np.float32),))
        arrays.check_shape(no, (1,), "one float32")
    acc = _accumulator() if workspace is None else arrays.operand("workspace", workspace)
    if workspace is not None:
        arrays.check_dtype(acc, (np.dtype(np.float64),))
        arrays.check_shape(acc, (1,), "one float64")
    dt = ops[0].dtype
    flat = [op.reshaped((op.size,)) for op in ops]
    chosen = _choose_path(path, flat, workspace is not None)
    if chosen == "two_pass" or chosen == "table":
        launches = (two_pass_launches if chosen == "two_pass" else table_launches)(flat, no, mx)
        for k, grid, args in launches:
            k.launch(grid, BLOCK, args, stream=stream)
        sync.finish()
        return float(no.dev.copy_to_host()[0]) if norm_out is None else norm_out
    _ZERO.launch(1, 1, (acc,), stream=stream)
    sumsq, su = _SUMSQ[dt], SUMSQ_UNROLL[dt]
    cap = sm_count() * BLOCKS_PER_SM  # persistent: one atomic per block, ~1000 per array at most
    for f in flat:
        sumsq.launch(min(cap, _tiles(f.size, su)), BLOCK, (f, acc), stream=stream)
    scale, cu = _SCALE[dt], SCALE_UNROLL[dt]
    for f in flat:
        scale.launch(min(MAX_GRID, _tiles(f.size, cu)), BLOCK, (f, acc, no, mx), stream=stream)
    sync.finish()
    if norm_out is None:
        return float(no.dev.copy_to_host()[0])
    return norm_out


class PreparedClip:
    """clip_grad_norm over one fixed set of device arrays, resolved once (`prepare`). `prepared(max_norm,
    stream=0)` clips them in place and returns `norm_out` (the norm before clipping, a float32 device array
    of one element) without waiting for the device; max_norm may change on every call.

    Why: clip_grad_norm(grads, ...) must find what it resolved for `grads`, which means looking at every
    array on every call: for Llama-3-8B's 291 gradients the plain call takes 6-9 us of host time, 10-13 us
    with a new max_norm each call, against 3-5 us here (an H100's host, 2026-12-06; the issue's goal is
    10 us). A training loop clips the same gradient arrays every step, as an
    optimizer updates the same parameters: this object holds them (strong references: they stay allocated
    while it lives, as an optimizer holds its parameters) and a call looks at none of them. It runs the
    "table" path: two launches whatever the count, replayed as one CUDA graph from the second call on, a
    new max_norm updated in place (`_TableCall`); the bits are two_pass's
    (test_table_is_two_pass_bit_for_bit). It belongs to the CUDA context (GPU) it was prepared in; a call
    from another one is refused.
    """

    __slots__ = ("grads", "norm_out", "_call", "_ctx", "__weakref__")

    def __init__(self, grads: tuple[Any, ...], norm_out: Any, call: _TableCall | None, ctx: int) -> None:
        self.grads, self.norm_out, self._call, self._ctx = grads, norm_out, call, ctx

    def __call__(self, max_norm: float, stream: Any = 0) -> Any:
        mx = max_norm if type(max_norm) is float else arrays.check_positive("max_norm", max_norm)
        if not mx > 0.0:  # also NaN
            arrays.check_positive("max_norm", mx)
        call = self._call
        if call is None:  # the simulator / dispatcher launch path: the general path, same kernels and checks
            return clip_grad_norm(list(self.grads), mx, norm_out=self.norm_out, stream=stream, path="table")
        if _launch.context() != self._ctx:
            raise RuntimeError(
                "prepared clip_grad_norm: called from another CUDA context (GPU) than the one it was "
                "prepared in; prepare one per GPU"
            )
        h = stream if type(stream) is int else _stream_handle(stream)
        call.launch(mx, ctypes.c_void_p(h) if h else None)
        return self.norm_out

    def close(self) -> None:
        """Free the CUDA graph now (also done when the object is collected); the arrays are released when
        the object is."""
        if self._call is not None:
            self._call.close()

    def __del__(self) -> None:
        # not at interpreter exit (the driver, even `sys`, may be gone: the exit frees everything), and
        # never raising (a collector thread without a context, a closed driver)
        try:
            if not sys.is_finalizing():
                self.close()
        except Exception:  # noqa: BLE001, S110
            pass


def prepare(grads: Sequence[Any], *, norm_out: Any = None) -> PreparedClip:
    """Resolve clip_grad_norm over `grads` once (see PreparedClip): a non-empty list of device arrays of one
    dtype (fp32, fp16 or bf16), C-contiguous, non-empty, 16-byte aligned; `norm_out` a float32 device array
    of one element, or None for one made here. Anything else is refused with one line naming what is
    allowed; nothing is launched here."""
    if isinstance(grads, (str, bytes)) or not isinstance(grads, Sequence) or len(grads) == 0:
        raise ValueError(f"grads: expected a non-empty list of device arrays, got {type(grads).__name__}")
    held = tuple(grads)
    ops = []
    for k, g in enumerate(held):
        op = arrays.operand(f"grads[{k}]", g)
        if op.host is not None:
            raise ValueError(
                f"grads[{k}]: prepare takes device arrays (numba, CuPy, __cuda_array_interface__), got a "
                "numpy array; clip numpy arrays with clip_grad_norm"
            )
        ops.append(op)
    arrays.check_dtype(ops[0], FLOAT_IO_BF16)
    for op in ops:
        arrays.check_same_dtype(op, ops[0])
        arrays.check_contiguous(op)
        arrays.check_nonempty(op)
    if not vector_ok((op.ptr for op in ops), 0):
        raise ValueError(
            "grads: prepare needs 16-byte aligned arrays; clip unaligned ones with clip_grad_norm"
        )
    if norm_out is None:
        norm_out = arrays.empty_like_device("norm_out", (1,), np.dtype(np.float32)).dev
    no = arrays.operand("norm_out", norm_out)
    if no.host is not None:
        raise ValueError("norm_out: prepare takes a float32 device array of one element, got a numpy array")
    arrays.check_dtype(no, (np.dtype(np.float32),))
    arrays.check_shape(no, (1,), "one float32")
    for k, o in enumerate((*held, norm_out)):
        if not _immutable_layout(type(o)):
            what = f"grads[{k}]" if k < len(held) else "norm_out"
            raise ValueError(
                f"{what}: prepare takes numba or CuPy device arrays, whose memory cannot move while the "
                f"prepared object holds them; got {type(o).__module__}.{type(o).__name__} (a torch tensor's "
                "storage can be replaced in place): clip those with clip_grad_norm"
            )
    if USE_DISPATCHER:
        return PreparedClip(held, norm_out, None, _launch.context())
    fv = fast_values(held, norm_out, table=True)
    if fv is None:  # the checks above are the table path's: only an array type without a fast extractor
        raise ValueError(
            f"grads: {type(held[0]).__name__} arrays cannot take the prepared path; use clip_grad_norm"
        )
    return PreparedClip(held, norm_out, _TableCall(*fv, own_partials=True), _launch.context())


def _choose_path(path: str, flat: list[Operand], has_workspace: bool) -> str:
    """What runs: "two_pass" for up to SLOTS fp32 / fp16 arrays, "table" for more (or bf16), both on 16-byte
    aligned arrays and without a `workspace`; "per_array" otherwise. An explicit path that cannot run here is
    an error naming why."""
    dt = flat[0].dtype
    aligned = vector_ok((f.ptr for f in flat), 0)
    slots = len(flat) <= SLOTS and dt in TWO_PASS_DTYPES
    if path == "auto":
        if has_workspace or not aligned:
            return "per_array"
        return "two_pass" if slots else "table"
    if path == "per_array":
        return path
    if has_workspace:
        why = "a workspace was given (calls on several streams at once take 'per_array')"
        raise ValueError(f"path: {path!r} cannot run here: {why}; use 'auto' or 'per_array'")
    if not aligned:
        raise ValueError(f"path: {path!r} needs 16-byte aligned arrays; use 'auto' or 'per_array'")
    if path == "two_pass" and not slots:
        why = f"{len(flat)} arrays (at most {SLOTS})" if len(flat) > SLOTS else f"dtype {dt.name}"
        raise ValueError(f"path: 'two_pass' cannot run here: {why}; use 'auto', 'table' or 'per_array'")
    return path


def reference(grads: list[np.ndarray], max_norm: float) -> tuple[float, list[np.ndarray]]:
    g64 = [g.astype(np.float64) for g in grads]
    total = math.sqrt(sum(float(np.sum(g * g)) for g in g64))
    coef = max_norm / (total + CLIP_EPS)  # NaN when total is NaN, 0 when it is infinite
    return total, [g * coef for g in g64] if 0.0 < coef < 1.0 else g64


def llama3_8b_sizes(div: int = 1) -> list[int]:
    """The elements of Llama-3-8B's 291 parameter tensors in model order (embedding; per layer of 32: the
    input norm, q, k, v, o, the post-attention norm, gate, up, down; the final norm; lm_head), each divided
    by `div` (at least 1 element)."""
    h, kv, mlp, vocab = 4096, 1024, 14336, 128256
    layer = [h, h * h, kv * h, kv * h, h * h, h, mlp * h, mlp * h, h * mlp]
    sizes = [vocab * h, *(layer * 32), h, vocab * h]
    return [max(1, n // div) for n in sizes]


def _sizes(c: Case) -> list[int]:
    """Every array's elements: Llama-3-8B's tensors / `llama_div`, or `count` arrays of elems + 7k (sizes
    that differ and are odd, so every array has its own tail)."""
    if "llama_div" in c.params:
        return llama3_8b_sizes(c.params["llama_div"])
    return [c.params["elems"] + 7 * k for k in range(c.params["count"])]


def _make_problem(case: Case, rng: np.random.Generator) -> Problem:
    dt = np.dtype(case.dtype)
    grads = [(rng.standard_normal(n, dtype=np.float32) * 0.1).astype(dt) for n in _sizes(case)]
    count = len(grads)
    norm = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads))
    # clip=1: max_norm at 0.37 of the norm (scales; not a power of two, so an fp16 scaling is not exact);
    # clip=0: twice the norm (leaves the arrays alone)
    max_norm = norm * (0.37 if case.params["clip"] else 2.0)
    if case.params.get(SPECIALS):  # a NaN / an infinity in the middle array: a non-finite norm
        grads[count // 2] = poison(grads[count // 2], case.params[SPECIALS])
    total, scaled = reference(grads, max_norm)
    names = [f"g{k}" for k in range(count)]
    return Problem(
        inputs=dict(zip(names, grads, strict=True)),
        outputs={"norm": ((1,), np.dtype(np.float32))},
        reference={"norm": np.array([total]), **dict(zip(names, scaled, strict=True))},
        inplace=tuple(names),
        scalars={"max_norm": max_norm},
    )


_GNAMES = tuple(f"g{k}" for k in range(1024))  # more than any case has (Llama-3-8B: 291)


def _grads(a: dict[str, Any]) -> list[Any]:
    """g0, g1, ... up to the first missing name (the bench times this call: no string building here)."""
    out = []
    for name in _GNAMES:
        g = a.get(name)
        if g is None:
            break
        out.append(g)
    return out


def _spec_launch(a: dict[str, Any]) -> None:
    clip_grad_norm(_grads(a), a["max_norm"], norm_out=a["norm"])


def _cupy(a: dict[str, Any]) -> None:
    # what torch.nn.utils.clip_grad_norm_ does, in CuPy: per-array norms, a total, one multiply per array
    import cupy as cp

    grads = _grads(a)
    sq = cp.zeros((), dtype=cp.float32)
    for g in grads:
        sq += cp.sum(cp.square(g.astype(cp.float32, copy=False)))
    total = cp.sqrt(sq)
    coef = cp.minimum(a["max_norm"] / (total + CLIP_EPS), 1.0)
    for g in grads:
        cp.multiply(g, coef, out=g, casting="unsafe")
    a["norm"][0] = total


def _case_path(c: Case) -> str:
    """What "auto" runs for a registry case (device allocations are 256-byte aligned)."""
    fits = len(_sizes(c)) <= SLOTS and np.dtype(c.dtype) in TWO_PASS_DTYPES
    return "two_pass" if fits else "table"


def _case_choice(c: Case) -> Choice:
    path, count = _case_path(c), len(_sizes(c))
    if SIMULATED:
        return Choice(path, "simulated", "the CUDA simulator runs the same kernels")
    if path == "two_pass":
        return Choice(path, "primary", f"{count} arrays <= {SLOTS}: one norm and one scale launch")
    return Choice(path, "primary", f"{count} arrays through a device table: one norm and one scale launch")


def _elems(c: Case) -> int:
    return sum(_sizes(c))


def _bytes(c: Case) -> float:
    passes = 3 if c.params["clip"] else 1
    return float(passes * _elems(c) * np.dtype(c.dtype).itemsize)


def _cases(
    label: str, count: int, elems: int, clips: tuple[int, ...] = (1, 0), **extra: int
) -> tuple[Case, ...]:
    return tuple(
        Case(
            f"{label}-{'clip' if clip else 'noclip'}",
            {"count": count, "elems": elems, "clip": clip, **extra},
            dt,
        )
        for clip in clips
        for dt in ("float32", "float16", "bfloat16")
    )


def _llama(div: int, clips: tuple[int, ...] = (1, 0)) -> tuple[Case, ...]:
    """Llama-3-8B's 291 gradient shapes / div (the table path: more arrays than SLOTS)."""
    return _cases(f"llama3-8b-div{div}", 0, 0, clips, llama_div=div)


SPEC = register(
    OpSpec(
        name="clip_grad_norm",
        dtypes=("float32", "float16", "bfloat16"),
        make_problem=_make_problem,
        launch=_spec_launch,
        flops=lambda c: float((3 if c.params["clip"] else 2) * _elems(c)),
        bytes=_bytes,
        # bf16: a correctly rounded scaled value is within 2^-8 of the float64 one (kernels.ops.rows.BF16_TOL)
        tolerance={"float32": 1e-5, "float16": 1e-3, "bfloat16": BF16_TOL},
        # the fp32 norm (and scaled fp32 arrays) to a few ulps of a float32-accumulated sum of squares
        elem_tolerance={"float32": 5e-6, "bfloat16": BF16_ELEM_TOL},
        # 3 arrays: two_pass (bf16: table); 12 arrays of a few tiles: the table path past SLOTS
        sim_cases=_cases("3x101", 3, 101) + _cases("12x2053", 12, 2053, (1,)),
        # Llama-3-8B / 4096: 291 arrays of 1-128256 elements, 2.0 M in all
        verify_cases=_cases("5x100003", 5, 100003) + _llama(4096),
        # NaN (and infinities), then +inf alone: the norm is NaN / inf and every array is left as it was
        special_cases=_cases("nan-3x101", 3, 101, (1,), specials=1)
        + _cases("inf-3x101", 3, 101, (1,), specials=2),
        # 8 arrays of ~8.4M: 268 MB of fp32 read for the norm, then read + written again: 805 MB moved;
        # Llama-3-8B / 64: 291 arrays, 125 M elements (251 MB of bf16 read, then read + written again); the
        # whole model (8.03 G elements) is benchmarks/clip_llama.py's
        bench_cases=_cases("8x8388608", 8, 8388608, clips=(1,)) + _llama(64, clips=(1,)),
        cupy=_cupy,
        bound="memory",
        ptx_kernels=(
            ("clip_grad_norm_zero", _zero, _ZERO_SIG),
            *((f"clip_grad_norm_sumsq_{dt.name}", _sumsq[dt], s) for dt, s in _SUMSQ_SIGS.items()),
            *((f"clip_grad_norm_scale_{dt.name}", _scale[dt], s) for dt, s in _SCALE_SIGS.items()),
            # what "auto" runs on a GPU for up to SLOTS aligned arrays, at the default configs
            *(
                (
                    f"clip_grad_norm_two_pass_{name}_{dt.name}",
                    two_pass_fns(dt, TWO_PASS_DEFAULT[dt])[name],
                    _two_pass_sigs(dt)[name],
                )
                for dt in (F32, F16)
                for name in ("norm", "scale")
            ),  # fmt: skip
            # what "auto" runs for more than SLOTS arrays (and for bf16)
            *(
                (
                    f"clip_grad_norm_table_{name}_{dt.name}",
                    table_fns(dt, TWO_PASS_DEFAULT[dt])[name],
                    _TABLE_SIGS[name],
                )
                for dt in DTYPES
                for name in ("norm", "scale")
            ),  # fmt: skip
        ),
        path=_case_path,
        choose=_case_choice,
    )
)
