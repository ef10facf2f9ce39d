"""clip_grad_norm: total = sqrt(sum over arrays of sum(g^2)); if total > max_norm every g is scaled in place
by max_norm / (total + 1e-6) (PyTorch's rule); returns total.

Floors for N elements in all: 2N FLOP for the norm (+1N for the scale when it clips); bytes = N * itemsize
to read for the norm, plus 2N * itemsize to read and write when it clips (the norm must be complete before
any scaling, so the data is read twice unless it fits in L2).

What "auto" runs (v4, section "v4" below; benchmarks/notes-clip.md has every figure): for up to SLOTS
16-byte aligned arrays and no `workspace`, the "two" path: kernel 1 = sum of squares over the tiles of ALL
arrays numbered as one sequence and dealt round-robin to a persistent grid (16-byte loads, one fp32 partial
per block, no atomics); kernel 2 = every block sums the partials in one fixed order (the same norm in every
block) and scales its tiles walking from the end of the sequence (what kernel 1 read last may still be in
L2). H200: 211 / 110.5 us of device time for the bench case (fp32 / fp16, 0.92 / 0.88 of copy). Device
arrays with `norm_out` take a lean host path (parameter words written with one struct.pack_into per
kernel, remembered per array objects). Other paths stay selectable: "one" (both passes in one launch with
a grid barrier: same device time, less host time, but needs a co-resident grid), "two_last", and the
older ones below. More arrays or a `workspace` take "split".

Kernels of the older paths, all on one stream, no host round trip between them:
  1. `_zero`: clears a float64 accumulator on the device;
  2. `_sumsq` per array: persistent blocks over contiguous tiles, fp32 sum of squares per thread (8 or 16
     loads in flight), a block reduction, then one float64 atomic add per block;
  3. `_scale` per array: one block per tile; every thread reads the accumulator, derives the coefficient
     itself and returns at once when there is nothing to clip (no traffic); block 0 writes the norm.
That is the v2 "split" path: 1 + 2 x count launches. The v3 "fused" path does it all in one launch:
  clip_grad_norm in ONE launch (v3): every array's sum of squares, a grid-wide barrier, then every array's
  scaling, in one persistent kernel over up to SLOTS arrays. The v2 path (kernels/ops/clip_grad_norm.py,
  "split") takes 1 + 2 x count launches, each ending in a tail: 17 for 8 arrays, 0.66 / 0.43 of copy.

  Why a software barrier: the norm must be complete before any element is scaled. numba's grid group sync
  needs a cooperative launch through its dispatcher (28 us of host overhead, FACTS.md); the fast launch path
  (kernels.runtime.launch) does a plain cuLaunchKernel. So the grid is sized to be co-resident (SMs x
  FUSED_BLOCKS_PER_SM, capped by the occupancy query) and thread 0 of each block arrives on a device counter:
  the last block to arrive resets the counter and bumps a generation word; the others spin on an atomic read
  of the generation, for at most SPIN_LIMIT polls (~1 s): a block that gives up (a grid that was not
  co-resident after all, e.g. another stream's kernel held SMs) scales nothing and writes NaN as the norm,
  so the caller sees the failure instead of a silently wrong clip. The state lives on the device between
  calls, so a call needs no memset launch:
    bar[0]  arrivals in this call (the last arrival puts it back to 0)
    bar[1]  generation: the number of completed calls (read by every block before it arrives)
    acc[gen & 1]  this call's float64 sum of squares; block 0 zeroes acc[1 - (gen & 1)] for the next call
      (nobody reads it any more: the previous call's readers finished with their kernel).
  Scaling walks arrays and tiles in reverse order: the data read last by the sum of squares is still in L2
  (50 MB on the H200) and is scaled first.
  The CUDA simulator runs blocks one after another, so a spinning block would wait forever: under it the
  grid is one block (the barrier's arithmetic still runs). Calls on several streams at once must not share
  this state: they pass `workspace`, which selects the split path.
"""

from __future__ import annotations

import ctypes
import math
import struct
import weakref
from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np
from numba import cuda, float32, float64, int32, int64, uint64

from kernels.primitives.cache_hints import l2_evict_first, l2_evict_last, ldg_hint_into, stg_hint_from
from kernels.primitives.reductions import BLOCK, block_sum
from kernels.primitives.vector import AUTO_VECTOR, VEC_BYTES, WIDTH, ldg_into, stg_from, vector_ok
from kernels.registry import Case, OpSpec, Problem, register
from kernels.runtime import arrays
from kernels.runtime import launch as _launch
from kernels.runtime.arrays import FLOAT_IO, SIMULATED, HostSync, Operand
from kernels.runtime.launch import (
    USE_DISPATCHER,
    GraphCache,
    Kernel,
    LaunchError,
    _stream_handle,
    kernel,
    sm_count,
)

BLOCKS_PER_SM = 8
PATHS = ("auto", "split", "fused", "fused_vector", "two", "two_last", "one")
CLIP_EPS = 1e-6
MAX_GRID = 2**31 - 1


@cuda.jit
def _zero(acc):  # type: ignore[no-untyped-def]
    if cuda.grid(1) == 0:
        acc[0] = 0.0


def _make_sumsq(unroll: int):  # type: ignore[no-untyped-def]
    """Persistent blocks walk contiguous tiles of BLOCK x unroll elements (all loads of a tile in flight),
    keep an fp32 partial per thread, reduce it per block, and add it to the float64 accumulator once."""

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
                    v[u] = float32(g[base + u * BLOCK])
                for u in range(unroll):
                    s += v[u] * v[u]
            else:
                for u in range(unroll):
                    i = base + u * BLOCK
                    if i < n:
                        t = float32(g[i])
                        s += t * t
            chunk += cuda.gridDim.x
        total = block_sum(s, smem)
        if tid == 0:
            cuda.atomic.add(acc, 0, float64(total))

    return k


def _make_scale(unroll: int):  # type: ignore[no-untyped-def]
    """One block per tile; every thread derives the coefficient from the accumulator itself and returns at
    once when there is nothing to clip. Block 0 publishes the norm."""

    @cuda.jit
    def k(g, acc, norm_out, max_norm):  # type: ignore[no-untyped-def]
        norm = math.sqrt(acc[0])
        tid = cuda.threadIdx.x
        if tid == 0 and cuda.blockIdx.x == 0:
            norm_out[0] = float32(norm)
        coef = max_norm / (norm + CLIP_EPS)
        if coef >= 1.0:
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
                    v[u] = float32(g[base + u * BLOCK])
                for u in range(unroll):
                    g[base + u * BLOCK] = v[u] * c
            else:
                for u in range(unroll):
                    i = base + u * BLOCK
                    if i < n:
                        g[i] = float32(g[i]) * c
            chunk += cuda.gridDim.x

    return k


F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
SUMSQ_UNROLL = {F32: 8, F16: 16}
SCALE_UNROLL = {F32: 4, F16: 8}
_sumsq = {dt: _make_sumsq(u) for dt, u in SUMSQ_UNROLL.items()}
_scale = {dt: _make_scale(u) for dt, u in SCALE_UNROLL.items()}


_ZERO_SIG = "void(float64[::1])"
_SUMSQ_SIGS = {
    np.dtype(np.float32): "void(float32[::1], float64[::1])",
    np.dtype(np.float16): "void(float16[::1], float64[::1])",
}
_SCALE_SIGS = {
    np.dtype(np.float32): "void(float32[::1], float64[::1], float32[::1], float64)",
    np.dtype(np.float16): "void(float16[::1], float64[::1], float32[::1], float64)",
}
_ZERO = kernel(_zero, _ZERO_SIG)
_SUMSQ: dict[np.dtype, Kernel] = {dt: kernel(_sumsq[dt], s) for dt, s in _SUMSQ_SIGS.items()}
_SCALE: dict[np.dtype, Kernel] = {dt: kernel(_scale[dt], s) for dt, s in _SCALE_SIGS.items()}
_workspace: Operand | None = None


# --- v3: one fused launch ------------------------------------------------------------------------------

SLOTS = 8  # arrays per fused launch; more than that takes the split path
FUSED_BLOCKS_PER_SM = 4
SPIN_LIMIT = 1 << 22  # atomic reads of the generation word, >= ~1 s
_FUSED_JIT: dict[str, object] = {} if SIMULATED else {"launch_bounds": (BLOCK, FUSED_BLOCKS_PER_SM)}
# scalar loads in flight per thread (sum of squares, scale) and 16-byte vectors per thread
FUSED_UNROLL = {F32: (8, 8), F16: (16, 16)}
FUSED_VEC_UNROLL = (4, 2)


def _parts(unroll_sq: int, unroll_sc: int, vec: bool, width: int) -> tuple[Any, Any]:
    """Device helpers over one array: `sumsq(g, s, v)` adds this block's share of sum(g^2) to s, and
    `scale(g, c, v)` multiplies this block's share by c. A block's share: tiles blockIdx, blockIdx + grid,
    ... (scale: the same tiles counted from the end)."""
    if vec:
        tile_sq = BLOCK * unroll_sq * width
        tile_sc = BLOCK * unroll_sc * width
    else:
        tile_sq = BLOCK * unroll_sq
        tile_sc = BLOCK * unroll_sc

    @cuda.jit(device=True, inline="always")
    def sumsq(g, s, v):  # type: ignore[no-untyped-def]
        n = g.shape[0]
        tid = cuda.threadIdx.x
        chunk = cuda.blockIdx.x
        while chunk * tile_sq < n:
            base = chunk * tile_sq
            if base + tile_sq <= n:
                if vec:
                    for u in range(unroll_sq):
                        ldg_into(v, u * width, g, base + (u * BLOCK + tid) * width)
                    for e in range(unroll_sq * width):
                        s += v[e] * v[e]
                else:
                    for u in range(unroll_sq):
                        v[u] = float32(g[base + u * BLOCK + tid])
                    for u in range(unroll_sq):
                        s += v[u] * v[u]
            else:
                i = base + tid
                while i < n:
                    t = float32(g[i])
                    s += t * t
                    i += BLOCK
            chunk += cuda.gridDim.x
        return s

    @cuda.jit(device=True, inline="always")
    def scale(g, c, v):  # type: ignore[no-untyped-def]
        n = g.shape[0]
        tid = cuda.threadIdx.x
        # signed on purpose: the walk ends below 0 (blockIdx/gridDim are uint32)
        chunk = (n + tile_sc - 1) // tile_sc - 1 - int64(cuda.blockIdx.x)
        while chunk >= 0:
            base = chunk * tile_sc
            if base + tile_sc <= n:
                if vec:
                    for u in range(unroll_sc):
                        ldg_into(v, u * width, g, base + (u * BLOCK + tid) * width)
                    for e in range(unroll_sc * width):
                        v[e] *= c
                    for u in range(unroll_sc):
                        stg_from(g, base + (u * BLOCK + tid) * width, v, u * width)
                else:
                    for u in range(unroll_sc):
                        v[u] = float32(g[base + u * BLOCK + tid])
                    for u in range(unroll_sc):
                        g[base + u * BLOCK + tid] = v[u] * c
            else:
                i = base + tid
                while i < n:
                    g[i] = float32(g[i]) * c
                    i += BLOCK
            chunk -= int64(cuda.gridDim.x)

    return sumsq, scale


def _make_fused(unroll_sq: int, unroll_sc: int, vec: bool, width: int):  # type: ignore[no-untyped-def]
    sumsq, scale = _parts(unroll_sq, unroll_sc, vec, width)
    nv = max(unroll_sq, unroll_sc) * (width if vec else 1)

    @cuda.jit(**_FUSED_JIT)
    def k(g0, g1, g2, g3, g4, g5, g6, g7, acc, bar, norm_out, max_norm):  # type: ignore[no-untyped-def]
        smem = cuda.shared.array(BLOCK, float32)
        gen_s = cuda.shared.array(1, int32)
        tot_s = cuda.shared.array(1, float64)
        late = cuda.shared.array(1, int32)  # 1: this block gave up waiting at the barrier
        v = cuda.local.array(nv, float32)
        tid = cuda.threadIdx.x
        if tid == 0:
            gen_s[0] = cuda.atomic.add(bar, 1, 0)  # atomic read: never a stale cached value
            late[0] = 0
        cuda.syncthreads()
        gen = gen_s[0]
        slot = gen & 1
        if tid == 0 and cuda.blockIdx.x == 0:
            acc[1 - slot] = 0.0
        s = float32(0.0)
        s = sumsq(g0, s, v)
        s = sumsq(g1, s, v)
        s = sumsq(g2, s, v)
        s = sumsq(g3, s, v)
        s = sumsq(g4, s, v)
        s = sumsq(g5, s, v)
        s = sumsq(g6, s, v)
        s = sumsq(g7, s, v)
        total = block_sum(s, smem)
        if tid == 0:
            cuda.atomic.add(acc, slot, float64(total))
            cuda.threadfence()  # this block's partial is visible before it counts as arrived
            if cuda.atomic.add(bar, 0, 1) == cuda.gridDim.x - 1:
                bar[0] = 0  # nobody touches the count again in this call
                cuda.threadfence()
                cuda.atomic.add(bar, 1, 1)  # release every spinning block
            else:
                # bounded: if the grid were ever not co-resident the GPU must not hang; a block that gives
                # up does not know the norm, so it scales nothing and reports NaN (never a wrong norm). A
                # real wait is one block's share, ~100 us.
                spins = 0
                while cuda.atomic.add(bar, 1, 0) == gen and spins < SPIN_LIMIT:
                    spins += 1
                if spins >= SPIN_LIMIT:
                    late[0] = 1
            cuda.threadfence()
            tot_s[0] = cuda.atomic.add(acc, slot, 0.0)  # every partial is in: read it coherently
        cuda.syncthreads()
        if late[0] == 1:
            if tid == 0:
                norm_out[0] = float32(math.nan)
            return
        norm = math.sqrt(tot_s[0])
        if tid == 0 and cuda.blockIdx.x == 0:
            norm_out[0] = float32(norm)
        coef = max_norm / (norm + CLIP_EPS)
        if coef >= 1.0:
            return
        c = float32(coef)
        scale(g7, c, v)
        scale(g6, c, v)
        scale(g5, c, v)
        scale(g4, c, v)
        scale(g3, c, v)
        scale(g2, c, v)
        scale(g1, c, v)
        scale(g0, c, v)

    return k


def _sig(dt: np.dtype) -> str:
    a = f"{dt.name}[::1]"
    return f"void({', '.join([a] * SLOTS)}, float64[::1], int32[::1], float32[::1], float64)"


FUSED_SIGS = {dt: _sig(dt) for dt in (F32, F16)}
FUSED_FNS = {
    (dt, vec): _make_fused(*(FUSED_VEC_UNROLL if vec else FUSED_UNROLL[dt]), vec, WIDTH[dt])
    for dt in FUSED_SIGS
    for vec in (False, True)
}
_FUSED: dict[tuple[np.dtype, bool], Kernel] = {
    key: kernel(d, FUSED_SIGS[key[0]]) for key, d in FUSED_FNS.items()
}
_state: dict[str, Operand] = {}
_fgrid: dict[tuple[np.dtype, bool], int] = {}


def _device_state(dt: np.dtype) -> tuple[Operand, Operand, Operand]:
    """(acc float64[2], bar int32[2], an empty array of dt for unused slots), made once, zeroed."""
    if "acc" not in _state:
        for name, shape, dtype in (("acc", (2,), np.float64), ("bar", (2,), np.int32)):
            dev = cuda.to_device(np.zeros(shape, dtype))
            ptr = 0 if SIMULATED else int(dev.device_ctypes_pointer.value or 0)
            dt_ = np.dtype(dtype)
            _state[name] = Operand(name, ptr, shape, (dt_.itemsize,), dt_, dev, None, dev)
    key = f"empty_{dt.name}"
    if key not in _state:
        # one element, never read (length 0 is what the kernel sees): a real allocation keeps pointers valid
        dev = cuda.device_array(1, dtype=dt)
        ptr = 0 if SIMULATED else int(dev.device_ctypes_pointer.value or 0)
        _state[key] = Operand(key, ptr, (0,), (dt.itemsize,), dt, dev[:0], None, dev[:0])
    return _state["acc"], _state["bar"], _state[key]


def fused_grid(dt: np.dtype, vec: bool) -> int:
    """Co-resident blocks: SMs x FUSED_BLOCKS_PER_SM, capped by the occupancy query; 1 under the simulator."""
    key = (dt, vec)
    if key not in _fgrid:
        if SIMULATED:
            _fgrid[key] = 1
        else:
            want = sm_count() * FUSED_BLOCKS_PER_SM
            fits = FUSED_FNS[key].compile(FUSED_SIGS[dt]).max_cooperative_grid_blocks(BLOCK)
            _fgrid[key] = max(1, min(want, int(fits)))
    return _fgrid[key]


def _launch_fused(flat: list[Operand], norm_out: Operand, max_norm: float, vec: bool, stream: int) -> None:
    """One fused launch over `flat` (1 <= len <= SLOTS contiguous 1-d operands of one dtype)."""
    dt = flat[0].dtype
    acc, bar, empty = _device_state(dt)
    slots = flat + [empty] * (SLOTS - len(flat))
    args = (*slots, acc, bar, norm_out, max_norm)
    _FUSED[(dt, vec)].launch(fused_grid(dt, vec), BLOCK, args, stream=stream)


_FUSED_PTX = tuple(
    (f"clip_grad_norm_fused{'_vec' if vec else ''}_{dt.name}", FUSED_FNS[(dt, vec)], FUSED_SIGS[dt])
    for dt in FUSED_SIGS
    for vec in (False, True)
)


# --- v4: balanced global tiles, per-block partials, two launches or one -------------------------------
#
# Why v3's one-launch path missed (notes-clip.md): every array's tiles were dealt out from block 0 again, so
# the same blocks got the extra tile of every array; the barrier had every block poll one word with atomics
# in a tight loop, next to the arrival counter; and the fp64 atomic accumulator needed double buffering.
# v4 numbers the tiles of ALL arrays in one global sequence (array 0's tiles, then array 1's, ...) and deals
# that sequence round-robin to the blocks, so no block has more than one tile more than another over the
# whole call. Each block writes its fp32 partial to its own slot (no atomics, no zeroing); whoever needs the
# total sums the slots in one fixed order, so every block derives the same norm (deterministic).
#   "two": kernel 1 = sum of squares (persistent grid) -> partials; kernel 2 = every block sums the partials,
#          then scales its tiles (persistent grid, tiles walked from the END of the sequence: what the norm
#          pass read last is still in L2 and is scaled first).
#   "two_last": kernel 1's last block to finish (an arrival counter it resets itself) sums the partials into
#          one slot; kernel 2 has one block per tile (no per-block reduction to amortise).
#   "one": both passes in one co-resident launch with a grid barrier whose waiters back off with nanosleep
#          (no polling storm on the word the last arrival must write).
# Tiles are BLOCK x unroll 16-byte vectors; each array's last partial tile is done in scalar code. Arrays
# must start 16-byte aligned (`vector_ok`), otherwise "auto" takes the split path.

V4_KINDS = ("two", "two_last", "one")
V4_SPIN_NS = 256  # a waiting block sleeps this long between polls of the barrier generation
BAR_GEN = 32  # the generation word sits 128 bytes after the arrival counter: another L2 line


class V4Config:
    """Unrolls (16-byte vectors per thread per tile) of the two passes, blocks per SM of their grids, and
    whether the scale pass walks the tiles backwards (True: the L2 reuse; False only to measure it).

    L2 cache-policy hints (v5, notes-clip.md; off by default: `keep_mb` < 0 and `sc_first` False compile the
    v4 code unchanged):
      keep_mb >= 0: the norm pass loads its last `keep_mb` MB (10^6 bytes, whole norm tiles, in the global
        tile order, which the backward scale walk reads first) with an L2 evict_last policy and every
        earlier tile with evict_first;
      sc_first: the scale pass loads and stores with evict_first (its own traffic does not push out the
        kept lines, and the kept lines it re-reads and rewrites lose their evict_last priority)."""

    __slots__ = ("u_sq", "u_sc", "bps_sq", "bps_sc", "rev", "keep_mb", "sc_first")

    def __init__(
        self,
        u_sq: int,
        u_sc: int,
        bps_sq: int,
        bps_sc: int,
        rev: bool = True,
        keep_mb: int = -1,
        sc_first: bool = False,
    ) -> None:
        self.u_sq, self.u_sc, self.bps_sq, self.bps_sc, self.rev = u_sq, u_sc, bps_sq, bps_sc, rev
        self.keep_mb, self.sc_first = int(keep_mb), bool(sc_first)

    def key(self) -> tuple[int, ...]:
        hint = (max(-1, self.keep_mb), int(self.sc_first))
        return (self.u_sq, self.u_sc, self.bps_sq, self.bps_sc, int(self.rev), *hint)

    def __repr__(self) -> str:
        return (f"V4Config(u_sq={self.u_sq}, u_sc={self.u_sc}, bps_sq={self.bps_sq}, bps_sc={self.bps_sc}, "
                f"rev={self.rev}, keep_mb={self.keep_mb}, sc_first={self.sc_first})")  # fmt: skip


def _v4_parts(
    u_sq: int, u_sc: int, width: int, hint_sq: bool = False, hint_sc: bool = False
) -> tuple[Any, Any, Any, Any]:
    """Device helpers over one array slot, for block b of a grid of G blocks:
    ntiles(g, tile): tiles of `tile` elements covering g;
    sq_one(g, b, G, e, acc, v, lim, pl, pf): adds b's tiles of g to acc[0..u_sq) (e = global index of g's
      first tile; b owns the global tiles t = b mod G); returns e + ntiles. With `hint_sq`, a whole tile of
      global index t >= lim is loaded with L2 policy pl, an earlier one with pf (ignored otherwise);
    sc_one(g, b, G, end, T, c, v, pol): scales b's tiles of g by c, highest first (g's tiles end at global
        index `end` of T; walking backwards, b owns the tiles t = T - 1 - b mod G); returns end - ntiles.
        With `hint_sc`, whole tiles are loaded and stored with L2 policy pol;
    sc_fwd(g, b, G, e, c, v, pol): the same tiles as sq_one, ascending (no L2 reuse: for measuring it)."""
    tq = BLOCK * u_sq * width
    tc = BLOCK * u_sc * width

    @cuda.jit(device=True, inline="always")
    def ntiles(g, tile):  # type: ignore[no-untyped-def]
        return (int64(g.shape[0]) + tile - 1) // tile

    @cuda.jit(device=True, inline="always")
    def sq_one(g, b, G, e, acc, v, lim, pl, pf):  # type: ignore[no-untyped-def]
        n = int64(g.shape[0])
        tid = cuda.threadIdx.x
        chunk = (b - e) % G
        while chunk * tq < n:
            base = chunk * tq
            if base + tq <= n:
                if hint_sq:  # (a compile-time constant)
                    pol = pl if e + chunk >= lim else pf
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
                    x = float32(g[i])
                    acc[0] += x * x
                    i += BLOCK
            chunk += G
        return e + (n + tq - 1) // tq

    @cuda.jit(device=True, inline="always")
    def sc_tile(g, base, n, tid, c, v, pol):  # type: ignore[no-untyped-def]
        """Scale one tile of `g` from `base` by c: 16-byte vectors when the tile is whole, else scalars."""
        if base + tc <= n:
            if hint_sc:  # (a compile-time constant)
                for u in range(u_sc):
                    ldg_hint_into(v, u * width, g, base + (u * BLOCK + tid) * width, pol)
                for e in range(u_sc * width):
                    v[e] *= c
                for u in range(u_sc):
                    stg_hint_from(g, base + (u * BLOCK + tid) * width, v, u * width, pol)
            else:
                for u in range(u_sc):
                    ldg_into(v, u * width, g, base + (u * BLOCK + tid) * width)
                for e in range(u_sc * width):
                    v[e] *= c
                for u in range(u_sc):
                    stg_from(g, base + (u * BLOCK + tid) * width, v, u * width)
        else:
            i = base + tid
            while i < n:
                g[i] = float32(g[i]) * c
                i += BLOCK

    @cuda.jit(device=True, inline="always")
    def sc_one(g, b, G, end, T, c, v, pol):  # type: ignore[no-untyped-def]
        n = int64(g.shape[0])
        tid = cuda.threadIdx.x
        nt = (n + tc - 1) // tc
        chunk = nt - 1 - (end - T + b) % G
        while chunk >= 0:
            sc_tile(g, chunk * tc, n, tid, c, v, pol)
            chunk -= G
        return end - nt

    @cuda.jit(device=True, inline="always")
    def sc_fwd(g, b, G, e, c, v, pol):  # type: ignore[no-untyped-def]
        n = int64(g.shape[0])
        tid = cuda.threadIdx.x
        chunk = (b - e) % G
        while chunk * tc < n:
            sc_tile(g, chunk * tc, n, tid, c, v, pol)
            chunk += G
        return e + (n + tc - 1) // tc

    return ntiles, sq_one, sc_one, sc_fwd


def v4_keep_tiles(keep_mb: int, u_sq: int) -> int:
    """Norm tiles in `keep_mb` MB (10^6 bytes): a tile is BLOCK x u_sq 16-byte vectors whatever the dtype."""
    return max(0, keep_mb) * 10**6 // (BLOCK * u_sq * VEC_BYTES)


def _v4_kernels(
    u_sq: int,
    u_sc: int,
    width: int,
    bps_sq: int,
    bps_sc: int,
    rev: bool,
    keep_mb: int = -1,
    sc_first: bool = False,
) -> dict[str, Any]:
    """The v4 kernels for one dtype width and config: "norm" (partials only), "norm_last" (partials, then the
    last block sums them into fin[0]), "scale" (sums `part`, scales) and "one" (all of it, one launch).
    keep_mb / sc_first: V4Config's L2 hints (off: keep_mb < 0, sc_first False)."""
    hint_sq = keep_mb >= 0
    keep_tiles = v4_keep_tiles(keep_mb, u_sq)  # the norm tiles kept (evict_last): the last ones
    ntiles, sq_one, sc_one, sc_fwd = _v4_parts(u_sq, u_sc, width, hint_sq, sc_first)
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
        if hint_sq:  # (a compile-time constant) the last keep_tiles tiles: evict_last; the rest evict_first
            Tq = (ntiles(g0, tq) + ntiles(g1, tq) + ntiles(g2, tq) + ntiles(g3, tq) + ntiles(g4, tq)
                  + ntiles(g5, tq) + ntiles(g6, tq) + ntiles(g7, tq))  # fmt: skip
            lim = Tq - kt
            pl = l2_evict_last()
            pf = l2_evict_first()
        else:
            lim = int64(0)
            pl = uint64(0)
            pf = uint64(0)
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
    def sum_parts(part, smem):  # type: ignore[no-untyped-def]
        """sum(part) in one fixed order: every block that calls it gets the same bits."""
        s = float32(0.0)
        i = cuda.threadIdx.x
        while i < part.shape[0]:
            s += part[i]
            i += BLOCK
        return block_sum(s, smem)

    @cuda.jit(device=True, inline="always")
    def scale_all(g0, g1, g2, g3, g4, g5, g6, g7, c):  # type: ignore[no-untyped-def]
        v = cuda.local.array(nv, float32)
        b = int64(cuda.blockIdx.x)
        G = int64(cuda.gridDim.x)
        T = (ntiles(g0, tc) + ntiles(g1, tc) + ntiles(g2, tc) + ntiles(g3, tc) + ntiles(g4, tc)
             + ntiles(g5, tc) + ntiles(g6, tc) + ntiles(g7, tc))  # fmt: skip
        pol = l2_evict_first() if sc_first else uint64(0)  # (sc_first: a compile-time constant)
        if rev:  # (a compile-time constant)
            end = T
            end = sc_one(g7, b, G, end, T, c, v, pol)
            end = sc_one(g6, b, G, end, T, c, v, pol)
            end = sc_one(g5, b, G, end, T, c, v, pol)
            end = sc_one(g4, b, G, end, T, c, v, pol)
            end = sc_one(g3, b, G, end, T, c, v, pol)
            end = sc_one(g2, b, G, end, T, c, v, pol)
            end = sc_one(g1, b, G, end, T, c, v, pol)
            end = sc_one(g0, b, G, end, T, c, v, pol)
        else:
            e = int64(0)
            e = sc_fwd(g0, b, G, e, c, v, pol)
            e = sc_fwd(g1, b, G, e, c, v, pol)
            e = sc_fwd(g2, b, G, e, c, v, pol)
            e = sc_fwd(g3, b, G, e, c, v, pol)
            e = sc_fwd(g4, b, G, e, c, v, pol)
            e = sc_fwd(g5, b, G, e, c, v, pol)
            e = sc_fwd(g6, b, G, e, c, v, pol)
            e = sc_fwd(g7, b, G, e, c, v, pol)

    @cuda.jit(**jit_sq)
    def norm(g0, g1, g2, g3, g4, g5, g6, g7, part):  # type: ignore[no-untyped-def]
        smem = cuda.shared.array(BLOCK, float32)
        total = block_sumsq(g0, g1, g2, g3, g4, g5, g6, g7, smem, keep_tiles)
        if cuda.threadIdx.x == 0:
            part[cuda.blockIdx.x] = total

    @cuda.jit(**jit_sq)
    def norm_keep(g0, g1, g2, g3, g4, g5, g6, g7, part, kt):  # type: ignore[no-untyped-def]
        """ "norm" with the kept tile count an argument (kt tiles of BLOCK x u_sq 16-byte vectors; only
        meaningful when the config is hinted): one compiled kernel for every keep size a probe sweeps."""
        smem = cuda.shared.array(BLOCK, float32)
        total = block_sumsq(g0, g1, g2, g3, g4, g5, g6, g7, smem, kt)
        if cuda.threadIdx.x == 0:
            part[cuda.blockIdx.x] = total

    @cuda.jit(**jit_sq)
    def norm_last(g0, g1, g2, g3, g4, g5, g6, g7, part, fin, cnt):  # type: ignore[no-untyped-def]
        smem = cuda.shared.array(BLOCK, float32)
        last = cuda.shared.array(1, int32)
        total = block_sumsq(g0, g1, g2, g3, g4, g5, g6, g7, smem, keep_tiles)
        tid = cuda.threadIdx.x
        if tid == 0:
            part[cuda.blockIdx.x] = total
            cuda.threadfence()  # the partial is visible device-wide before this block counts as done
            ticket = cuda.atomic.add(cnt, 0, 1)
            last[0] = 1 if ticket == cuda.gridDim.x - 1 else 0
        cuda.syncthreads()
        if last[0] == 1:
            # every other block has fenced its partial and arrived; this block never read `part` before,
            # so no stale line of it is in this SM's L1
            cuda.threadfence()
            t = sum_parts(part, smem)
            if tid == 0:
                fin[0] = t
                cnt[0] = 0  # nobody else touches the counter in this launch: ready for the next call

    @cuda.jit(**jit_sc)
    def scale(g0, g1, g2, g3, g4, g5, g6, g7, part, norm_out, max_norm):  # type: ignore[no-untyped-def]
        smem = cuda.shared.array(BLOCK, float32)
        total = sum_parts(part, smem)
        nrm = math.sqrt(float64(total))
        if cuda.threadIdx.x == 0 and cuda.blockIdx.x == 0:
            norm_out[0] = float32(nrm)
        coef = max_norm / (nrm + CLIP_EPS)
        if coef >= 1.0:
            return  # nothing to clip: no traffic at all
        scale_all(g0, g1, g2, g3, g4, g5, g6, g7, float32(coef))

    @cuda.jit(**jit_sq)
    def one(g0, g1, g2, g3, g4, g5, g6, g7, part, bar, norm_out, max_norm):  # type: ignore[no-untyped-def]
        smem = cuda.shared.array(BLOCK, float32)
        gen_s = cuda.shared.array(1, int32)
        late = cuda.shared.array(1, int32)  # 1: this block gave up waiting at the barrier
        tid = cuda.threadIdx.x
        if tid == 0:
            gen_s[0] = cuda.atomic.add(bar, BAR_GEN, 0)  # atomic read: never a stale cached value
            late[0] = 0
        total = block_sumsq(
            g0, g1, g2, g3, g4, g5, g6, g7, smem, keep_tiles
        )  # (its block_sum syncs gen_s too)
        if tid == 0:
            gen = gen_s[0]
            part[cuda.blockIdx.x] = total
            cuda.threadfence()
            if cuda.atomic.add(bar, 0, 1) == cuda.gridDim.x - 1:
                bar[0] = 0
                cuda.threadfence()
                cuda.atomic.add(bar, BAR_GEN, 1)  # release the waiting blocks
            else:
                # bounded: a grid that is not co-resident must not hang the GPU. A block that gives up
                # does not know the norm: it scales nothing and reports NaN (never a silently wrong norm).
                spins = 0
                while cuda.atomic.add(bar, BAR_GEN, 0) == gen and spins < SPIN_LIMIT:
                    cuda.nanosleep(V4_SPIN_NS)
                    spins += 1
                if spins >= SPIN_LIMIT:
                    late[0] = 1
            cuda.threadfence()
        cuda.syncthreads()
        if late[0] == 1:
            if tid == 0:
                norm_out[0] = float32(math.nan)
            return
        t = sum_parts(part, smem)
        nrm = math.sqrt(float64(t))
        if tid == 0 and cuda.blockIdx.x == 0:
            norm_out[0] = float32(nrm)
        coef = max_norm / (nrm + CLIP_EPS)
        if coef >= 1.0:
            return
        scale_all(g0, g1, g2, g3, g4, g5, g6, g7, float32(coef))

    return {
        "norm": norm,
        "norm_keep": norm_keep,
        "norm_last": norm_last,
        "scale": scale,
        "one": one,
        "tq": tq,
        "tc": tc,
    }


def _v4_sigs(dt: np.dtype) -> dict[str, str]:
    a = ", ".join([f"{dt.name}[::1]"] * SLOTS)
    f1 = "float32[::1]"
    return {
        "norm": f"void({a}, {f1})",
        "norm_keep": f"void({a}, {f1}, int64)",
        "norm_last": f"void({a}, {f1}, {f1}, int32[::1])",
        "scale": f"void({a}, {f1}, {f1}, float64)",
        "one": f"void({a}, {f1}, int32[::1], {f1}, float64)",
    }


# what "auto" and the named v4 paths run, from the H200 side-by-side run of 2026-11-30 (notes-clip.md, round
# 1, device time of "two"): fp32 (4,2,4,4) 211.1 us, the other three configs 210.4-221.3; fp16 (4,2,4,4)
# 110.1 us against (2,1,4,4) 113.8, (4,2,8,8) 110.9, (2,2,8,8) 115.8. 64 KB of loads in flight per SM in the
# norm pass; ptxas: 64 registers, no spills, for every kernel of both.
# keep_mb=24 (v5, L2 hints): the norm pass loads its last 24 MB with evict_last and the rest with evict_first,
# so the backward scale pass finds them in L2. H200 2026-11-30T04:36Z (benchmarks/probe_clip_l2.py, two
# rounds, device time): fp16 110.7 -> 104.5 us (r1 -6.9, r2 -5.8), fp32 211.5 -> 209.0 (-2.4, -2.9); keep 0 /
# 40 / 56 MB and an evict_first scale pass were each worse than keep 24 in fp16 (notes-clip.md, v5 outcome).
V4_DEFAULT: dict[np.dtype, V4Config] = {
    F32: V4Config(4, 2, 4, 4, keep_mb=24),
    F16: V4Config(4, 2, 4, 4, keep_mb=24),
}


def v4_config(dt: np.dtype) -> V4Config:
    """V4_DEFAULT[dt] for the current device: without the L2 hints below cc 8.0 (`createpolicy` and the
    cache-hinted loads need sm_80; ptxas rejects them for older targets). The simulator keeps them (it runs
    plain loads in their place)."""
    c = V4_DEFAULT[dt]
    if (c.keep_mb < 0 and not c.sc_first) or SIMULATED or _device_cc() >= (8, 0):
        return c
    return V4Config(c.u_sq, c.u_sc, c.bps_sq, c.bps_sc, c.rev)


@cache
def _device_cc() -> tuple[int, int]:
    cc = cuda.get_current_device().compute_capability
    return int(cc[0]), int(cc[1])


_V4_FNS: dict[tuple[np.dtype, tuple[int, ...]], dict[str, Any]] = {}
_V4_K: dict[tuple[np.dtype, tuple[int, ...], str], Kernel] = {}
_v4_state: dict[tuple[str, int], Operand] = {}
_v4_grid: dict[tuple[np.dtype, tuple[int, ...], str], int] = {}
SIM_GRID = 2  # blocks of the two-kernel grids under the simulator (see v4_grid)


def v4_fns(dt: np.dtype, cfg: V4Config) -> dict[str, Any]:
    key = (dt, cfg.key())
    if key not in _V4_FNS:
        _V4_FNS[key] = _v4_kernels(
            cfg.u_sq, cfg.u_sc, WIDTH[dt], cfg.bps_sq, cfg.bps_sc, cfg.rev, cfg.keep_mb, cfg.sc_first
        )
    return _V4_FNS[key]


def _v4_kernel(dt: np.dtype, cfg: V4Config, name: str) -> Kernel:
    key = (dt, cfg.key(), name)
    k = _V4_K.get(key)
    if k is None:
        k = _V4_K[key] = kernel(v4_fns(dt, cfg)[name], _v4_sigs(dt)[name])
    return k


def _v4_buf(name: str, n: int, dtype: Any) -> Operand:
    """A zeroed device buffer of n elements kept for every later call (partials, counters)."""
    key = (name, n)
    op = _v4_state.get(key)
    if op is None:
        dev = cuda.to_device(np.zeros(n, dtype))
        ptr = 0 if SIMULATED else int(dev.device_ctypes_pointer.value or 0)
        dt_ = np.dtype(dtype)
        op = _v4_state[key] = Operand(name, ptr, (n,), (dt_.itemsize,), dt_, dev, None, dev)
    return op


def v4_grid(dt: np.dtype, cfg: V4Config, name: str) -> int:
    """Persistent grids: SMs x blocks per SM ("one": capped by the occupancy query so it is co-resident;
    1 block under the simulator, which runs blocks one after another). Under the simulator the two-kernel
    grids are 2 blocks: enough to deal tiles to several blocks and sum several partials, while every idle
    simulated block (256 Python threads) would cost the fleet's simulated verify seconds per node."""
    key = (dt, cfg.key(), name)
    g = _v4_grid.get(key)
    if g is None:
        bps = cfg.bps_sc if name == "scale" else cfg.bps_sq
        g = sm_count() * bps
        if SIMULATED and name != "one":
            g = min(g, SIM_GRID)
        if name == "one":
            if SIMULATED:
                g = 1
            else:
                fits = v4_fns(dt, cfg)["one"].compile(_v4_sigs(dt)["one"]).max_cooperative_grid_blocks(BLOCK)
                g = max(1, min(g, int(fits)))
        _v4_grid[key] = g
    return g


def v4_launches(
    kind: str, flat: list[Operand], norm_out: Operand, max_norm: float, cfg: V4Config | None = None
) -> list[tuple[Kernel, int, tuple[Any, ...]]]:
    """The launches of one v4 call over `flat` (1 <= len <= SLOTS contiguous, 16-byte aligned 1-d operands
    of one dtype), in order: (kernel, grid, arguments). The lean launcher must write the same blocks."""
    dt = flat[0].dtype
    c = v4_config(dt) if cfg is None else cfg
    empty = _device_state(dt)[2]
    slots = (*flat, *([empty] * (SLOTS - len(flat))))
    if kind == "one":
        g = v4_grid(dt, c, "one")
        part = _v4_buf("part", g, np.float32)
        bar = _v4_buf("bar", 2 * BAR_GEN, np.int32)
        return [(_v4_kernel(dt, c, "one"), g, (*slots, part, bar, norm_out, max_norm))]
    gq = v4_grid(dt, c, "norm")
    part = _v4_buf("part", gq, np.float32)
    if kind == "two":
        gs = v4_grid(dt, c, "scale")
        return [
            (_v4_kernel(dt, c, "norm"), gq, (*slots, part)),
            (_v4_kernel(dt, c, "scale"), gs, (*slots, part, norm_out, max_norm)),
        ]
    fin = _v4_buf("fin", 1, np.float32)
    cnt = _v4_buf("cnt", 1, np.int32)
    tc = v4_fns(dt, c)["tc"]
    tiles = max(1, sum((f.size + tc - 1) // tc for f in flat))
    return [
        (_v4_kernel(dt, c, "norm_last"), gq, (*slots, part, fin, cnt)),
        (_v4_kernel(dt, c, "scale"), tiles, (*slots, fin, norm_out, max_norm)),
    ]


def launch_v4(
    kind: str,
    flat: list[Operand],
    norm_out: Operand,
    max_norm: float,
    stream: int,
    cfg: V4Config | None = None,
) -> None:
    """One v4 call through the general (Kernel.launch) path."""
    for k, grid, args in v4_launches(kind, flat, norm_out, max_norm, cfg):
        k.launch(grid, BLOCK, args, stream=stream)


# --- v4 host path: a lean launcher for device arrays -----------------------------------------------------
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


def fast_values(grads: Sequence[Any], norm_out: Any) -> tuple[np.dtype, list[int], int] | None:
    """(dtype, the 7 int64 parameter words of every grads slot, norm_out pointer), or None when the fast
    path does not apply. The words of a 1-d C-contiguous slot, as numba lays out an array argument:
    meminfo 0, parent 0, nitems, itemsize, data pointer, shape[0], stride (= itemsize)."""
    t = type(grads)
    if (t is not list and t is not tuple) or not 0 < len(grads) <= SLOTS:
        return None
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
            if d is not F32 and d is not F16:
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
    """Everything a fast call of one (dtype, kind) needs, resolved once: kernels, grids, buffers, formats."""

    def __init__(self, dt: np.dtype, kind: str, cfg: V4Config) -> None:
        self.kind = kind
        empty = _device_state(dt)[2]
        self.empty_words = [0, 0, 0, dt.itemsize, empty.ptr, 0, dt.itemsize]
        names = {"two": ("norm", "scale"), "two_last": ("norm_last", "scale"), "one": ("one",)}[kind]
        self.kernels = []
        for nm in names:
            k = _v4_kernel(dt, cfg, nm)
            if not k._ready:
                k._prepare()
            # a private copy with its own parameter block: nothing else (Kernel.launch of the general path)
            # writes it, so a repeat call whose blocks are already packed (see `launch`) launches as they are
            own = Kernel.__new__(Kernel)
            own.__dict__.update(k.__dict__)
            own.build_plan()
            self.kernels.append(own)
        self._last: tuple[Any, float] | None = None  # (values, max_norm) the blocks hold now
        # (id(values), max_norm) -> (values, graph): the call's launches captured once (see `launch`)
        self._graphs = GraphCache(GRAPHS_MAX)
        self._grids: list[int] = []
        q = 7 * SLOTS
        if kind == "one":
            g = v4_grid(dt, cfg, "one")
            part = _v4_buf("part", g, np.float32)
            bar = _v4_buf("bar", 2 * BAR_GEN, np.int32)
            self.grids = [g]
            self.tail = [[0, 0, g, 4, part.ptr, g, 4, 0, 0, 2 * BAR_GEN, 4, bar.ptr, 2 * BAR_GEN, 4]]
            self.fmts = [struct.Struct(f"<{q + 21}qd")]
            self.tc = 0
            return
        gq = v4_grid(dt, cfg, "norm")
        part = _v4_buf("part", gq, np.float32)
        pw = [0, 0, gq, 4, part.ptr, gq, 4]
        if kind == "two":
            self.grids = [gq, v4_grid(dt, cfg, "scale")]
            self.tail = [pw, pw]
            self.fmts = [struct.Struct(f"<{q + 7}q"), struct.Struct(f"<{q + 14}qd")]
            self.tc = 0
        else:
            fin = _v4_buf("fin", 1, np.float32)
            cnt = _v4_buf("cnt", 1, np.int32)
            fw = [0, 0, 1, 4, fin.ptr, 1, 4]
            self.grids = [gq, 0]  # the scale grid is the tile count of the call
            self.tail = [pw + fw + [0, 0, 1, 4, cnt.ptr, 1, 4], fw]
            self.fmts = [struct.Struct(f"<{q + 21}q"), struct.Struct(f"<{q + 14}qd")]
            self.tc = v4_fns(dt, cfg)["tc"]

    def pack(self, i: int, words: list[int], p_no: int, mx: float) -> int:
        """Write kernel i's whole parameter block (`words`: SLOTS slots, padded); returns its grid."""
        k = self.kernels[i]
        if i == len(self.kernels) - 1:  # the kernel that scales: + norm_out, max_norm
            self.fmts[i].pack_into(k._block, 0, *words, *self.tail[i], 0, 0, 1, 4, p_no, 1, 4, mx)
        else:
            self.fmts[i].pack_into(k._block, 0, *words, *self.tail[i])
        g = self.grids[i]
        if g == 0:  # one block per scale tile
            tc = self.tc
            for j in range(SLOTS):
                g += (words[7 * j + 2] + tc - 1) // tc
        return max(1, g)

    def launch(self, fv: tuple[np.dtype, list[int], int], mx: float, hs: Any) -> None:
        """Replay the graph of (`fv`, `mx`) if there is one. Else pack both blocks (skipped when they already
        hold `fv`, the very object, and `mx`) and launch; the second call in a row with the same (`fv`, `mx`)
        captures the launches into a graph first and replays it from then on."""
        key = (id(fv), mx)
        graph = self._graphs.find(key, fv)
        if graph is not None:
            graph.launch(hs)
            return
        last = self._last
        if last is not None and last[0] is fv and last[1] != mx:
            # only max_norm changed: rewrite that one parameter (the scaling kernel's last, a float64)
            i = len(self.kernels) - 1
            _F64.pack_into(self.kernels[i]._block, self.fmts[i].size - 8, mx)
            self._last = (fv, mx)
            self._record(hs)
            return
        if last is None or last[0] is not fv or last[1] != mx:
            self._last = None  # a pack that fails part-way must not leave a stale match
            words, p_no = fv[1], fv[2]
            cnt = len(words) // 7
            if cnt < SLOTS:
                words = words + self.empty_words * (SLOTS - cnt)  # a new list: the cached one stays unpadded
            self._grids = [self.pack(i, words, p_no, mx) for i in range(len(self.kernels))]
            self._last = (fv, mx)  # holds fv: its id cannot be reused while it is compared by identity
        elif _launch.GRAPH_REPLAY:
            self._graphs.add(key, self._record, fv).launch(hs)  # the driver copies the packed blocks now
            return
        self._record(hs)

    def _record(self, hs: Any) -> None:
        for k, g in zip(self.kernels, self._grids, strict=True):
            rc = k._launch(k._func, g, 1, 1, BLOCK, 1, 1, 0, hs, k._params, None)
            if rc != 0:
                raise LaunchError(f"cuLaunchKernel failed with CUresult {rc} for {k.sig}")


# Repeat calls replay a CUDA graph of the call's launches (kernels.runtime.launch.LaunchGraph): one cuGraphLaunch
# costs the host 1.8 us where the two cuLaunchKernel calls of "two" cost 10.2 us (H200 host, 2026-11-30,
# benchmarks/probe_launch.py). A graph is built on the second call in a row with the same arrays (the cached
# values object) and max_norm, the case of a training loop; calls that change them launch directly.
# kernels.runtime.launch.GRAPH_REPLAY switches it off.
GRAPHS_MAX = 8  # graphs per plan


_fast_plans: dict[tuple[np.dtype, str], _FastPlan] = {}
# the v4 kind "auto" takes per dtype (absent: the v3 rules). H200, rounds 1 and 2 (notes-clip.md): "one" and
# "two" take the same device time (fp32 211.3 / 211.9 us, fp16 110.6 / 110.5); timed as kernels.harness.bench times
# them, "two" was faster in all four comparisons (by 4-13 us), while "one" has less host time per call in a
# steady loop (8.3 vs 15.0 us, one launch instead of two). "two" is the default because it has no grid
# barrier: "one" needs every block co-resident, and a block that waits past SPIN_LIMIT (another stream's
# long kernel holding SMs, e.g. a collective) would scale with an incomplete norm. "two_last" is 2-3x
# slower (one short block per tile).
AUTO_V4: dict[np.dtype, str] = {F32: "two", F16: "two"}


# Calls on the same array objects (a training loop's gradients; the bench's input sets) skip even the
# per-array extraction: the words are remembered per tuple of object ids. Only for array types whose
# pointer and size cannot change in place (numba device arrays, CuPy arrays: a CuPy `shape` assignment keeps
# the size, and the kernels see every array flat), and only while every object is alive: each entry holds
# weak references whose callbacks drop it before an id can be reused. No strong reference is kept, so the
# cache never holds device memory alive.
_WORDS_MAX = 64
_words: dict[tuple[int, ...], tuple[np.dtype, list[int], int]] = {}
_words_refs: dict[tuple[int, ...], list[Any]] = {}


def _immutable_layout(t: type) -> bool:
    mod = t.__module__ or ""
    return (mod.startswith("numba.cuda") and hasattr(t, "device_ctypes_pointer")) or (
        mod.startswith("cupy") and t.__name__ == "ndarray"
    )


def cached_values(grads: Sequence[Any], norm_out: Any) -> tuple[np.dtype, list[int], int] | None:
    """`fast_values`, remembered per tuple of object ids while every object lives (see above)."""
    t = type(grads)
    if t is not list and t is not tuple:
        return None
    key = (*map(id, grads), id(norm_out))
    hit = _words.get(key)
    if hit is not None:
        return hit
    fv = fast_values(grads, norm_out)
    if fv is None or len(_words) >= _WORDS_MAX:
        return fv
    objs = (*grads, norm_out)
    if not all(_immutable_layout(type(o)) for o in objs):
        return fv

    def drop(_ref: Any, key: tuple[int, ...] = key) -> None:
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
    fv = cached_values(grads, norm_out)
    if fv is None:
        return False
    dt = fv[0]
    kind = AUTO_V4.get(dt, "") if path == "auto" else path
    if not kind:
        return False
    mx = float(max_norm)
    if not mx > 0.0:  # also NaN; the general path raises the error
        return False
    plan = _fast_plans.get((dt, kind))
    if plan is None:
        plan = _fast_plans[(dt, kind)] = _FastPlan(dt, kind, v4_config(dt))
    h = stream if type(stream) is int else _stream_handle(stream)
    plan.launch(fv, mx, ctypes.c_void_p(h) if h else None)
    return True


def _accumulator() -> Operand:
    """One float64 device scalar, reused by every call: calls on one stream are ordered, so reuse is safe;
    callers running clip_grad_norm on several streams at once pass their own `workspace`."""
    global _workspace
    if _workspace is None:
        _workspace = arrays.empty_like_device("workspace", (1,), np.dtype(np.float64))
    return _workspace


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
    """Clip `grads` (fp32 or fp16 arrays, one dtype) in place to a global L2 norm of `max_norm`.

    Returns the norm before clipping as a Python float, or, when `norm_out` (a float32 device array of one
    element) is given, writes it there and returns `norm_out` without waiting for the device.
    `path`: "auto" (up to SLOTS 16-byte aligned arrays and no `workspace`: AUTO_V4's v4 path, "two";
    otherwise "split"), "two" / "two_last" / "one" (v4: two launches / two launches, the second one block per
    tile / one launch with a grid barrier), "split" (v2: 1 + 2 x count launches), "fused" (v3: one launch,
    scalar loads) or "fused_vector" (v3: one launch, 16-byte loads).
    """
    if (
        not USE_DISPATCHER
        and norm_out is not None
        and workspace is None
        and (path == "auto" or path in V4_KINDS)
        and _fast_call(grads, max_norm, norm_out, stream, path)
    ):
        return norm_out
    if path not in PATHS:
        raise ValueError(f"path: {path!r} is not a path; expected one of: {', '.join(PATHS)}")
    if isinstance(grads, (str, bytes)) or not isinstance(grads, Sequence) or len(grads) == 0:
        raise ValueError(f"grads: expected a non-empty list of arrays, got {type(grads).__name__}")
    mx = arrays.check_positive("max_norm", max_norm)
    sync = HostSync()
    ops = [arrays.operand(f"grads[{k}]", g, sync, writeback=True) for k, g in enumerate(grads)]
    arrays.check_dtype(ops[0], FLOAT_IO)
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
    if chosen in V4_KINDS:
        launch_v4(chosen, flat, no, mx, stream)
        sync.finish()
        return float(no.dev.copy_to_host()[0]) if norm_out is None else norm_out
    if chosen != "split":
        _launch_fused(flat, no, mx, chosen == "fused_vector", stream)
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


def _choose_path(path: str, flat: list[Operand], has_workspace: bool) -> str:
    fits = len(flat) <= SLOTS and not has_workspace
    aligned = vector_ok((f.ptr for f in flat), 0)
    if path == "auto":
        kind = AUTO_V4.get(flat[0].dtype, "")
        if kind and fits and aligned:
            return kind  # the lean launcher's choice too (numpy inputs, no norm_out, ... come here)
        # (the v3 rule, for a dtype without an AUTO_V4 entry: one launch with 16-byte loads for aligned fp16
        # on a GPU, split otherwise; the v4 paths replace it wherever they apply)
        vec = fits and aligned and not SIMULATED and flat[0].dtype in AUTO_VECTOR
        return "fused_vector" if vec else "split"
    if path != "split" and not fits:
        why = "a workspace was given" if has_workspace else f"{len(flat)} arrays (at most {SLOTS})"
        raise ValueError(f"path: {path!r} cannot run here: {why}; use 'auto' or 'split'")
    if (path == "fused_vector" or path in V4_KINDS) and not aligned:
        raise ValueError(f"path: {path!r} needs 16-byte aligned arrays; use 'auto', 'split' or 'fused'")
    return path


def reference(grads: list[np.ndarray], max_norm: float) -> tuple[float, list[np.ndarray]]:
    g64 = [g.astype(np.float64) for g in grads]
    total = math.sqrt(sum(float(np.sum(g * g)) for g in g64))
    coef = max_norm / (total + CLIP_EPS)
    return total, [g * coef for g in g64] if coef < 1.0 else g64


def _make_problem(case: Case, rng: np.random.Generator) -> Problem:
    count, elems = case.params["count"], case.params["elems"]
    dt = np.dtype(case.dtype)
    # sizes differ and are odd, so every per-array launch sees its own tail
    grads = [(rng.standard_normal(elems + 7 * k, dtype=np.float32) * 0.1).astype(dt) for k in range(count)]
    norm = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads))
    # clip=1: max_norm at half the norm (scales); clip=0: twice the norm (leaves the arrays alone)
    max_norm = norm * (0.5 if case.params["clip"] else 2.0)
    total, scaled = reference(grads, max_norm)
    names = [f"g{k}" for k in range(count)]
    return Problem(
        inputs=dict(zip(names, grads, strict=True)),
        outputs={"norm": ((1,), np.dtype(np.float32))},
        reference={"norm": np.array([total]), **dict(zip(names, scaled, strict=True))},
        inplace=tuple(names),
        scalars={"max_norm": max_norm},
    )


_GNAMES = tuple(f"g{k}" for k in range(1024))


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
    kind = AUTO_V4.get(np.dtype(c.dtype), "")
    if kind and c.params["count"] <= SLOTS:
        return kind
    vec = c.params["count"] <= SLOTS and not SIMULATED and np.dtype(c.dtype) in AUTO_VECTOR
    return "fused_vector" if vec else "split"


def _elems(c: Case) -> int:
    count, elems = c.params["count"], c.params["elems"]
    return count * elems + 7 * count * (count - 1) // 2


def _bytes(c: Case) -> float:
    passes = 3 if c.params["clip"] else 1
    return float(passes * _elems(c) * np.dtype(c.dtype).itemsize)


def _cases(label: str, count: int, elems: int, clips: tuple[int, ...] = (1, 0)) -> tuple[Case, ...]:
    return tuple(
        Case(f"{label}-{'clip' if clip else 'noclip'}", {"count": count, "elems": elems, "clip": clip}, dt)
        for clip in clips
        for dt in ("float32", "float16")
    )


SPEC = register(
    OpSpec(
        name="clip_grad_norm",
        dtypes=("float32", "float16"),
        make_problem=_make_problem,
        launch=_spec_launch,
        flops=lambda c: float((3 if c.params["clip"] else 2) * _elems(c)),
        bytes=_bytes,
        tolerance={"float32": 1e-5, "float16": 1e-3},
        sim_cases=_cases("3x101", 3, 101),
        verify_cases=_cases("5x100003", 5, 100003),
        # 8 arrays of ~8.4M: 268 MB of fp32 read for the norm, then read + written again: 805 MB moved
        bench_cases=_cases("8x8388608", 8, 8388608, clips=(1,)),
        cupy=_cupy,
        bound="memory",
        ptx_kernels=(
            ("clip_grad_norm_zero", _zero, _ZERO_SIG),
            *((f"clip_grad_norm_sumsq_{dt.name}", _sumsq[dt], s) for dt, s in _SUMSQ_SIGS.items()),
            *((f"clip_grad_norm_scale_{dt.name}", _scale[dt], s) for dt, s in _SCALE_SIGS.items()),
            *_FUSED_PTX,
            # what "auto" runs on a GPU: the v4 "two" kernels at their default configs
            *(
                (f"clip_grad_norm_v4_{name}_{dt.name}", v4_fns(dt, V4_DEFAULT[dt])[name], _v4_sigs(dt)[name])
                for dt in (F32, F16)
                for name in ("norm", "scale")
            ),
        ),
        path=_case_path,
    )
)
