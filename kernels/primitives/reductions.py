"""Block-wide reductions shared by the row operators (rmsnorm, layernorm, softmax) and clip_grad_norm.

Every helper reduces one value per thread of a block of `BLOCK` threads and returns the result to EVERY
thread. On a GPU: warp shuffles (5 steps, no shared memory) then one shared-memory slot per warp, read back
and reduced again by each warp. The CUDA simulator has no warp shuffles (FACTS.md), so under it the same
names are bound to a shared-memory tree reduction: the kernels calling them are identical.

Helpers are `inline="always"` so kernels compile offline with `cuda.compile_ptx` (non-inlined device calls
fail there, FACTS.md). `smem` is a float32 shared array of `BLOCK` slots owned by the caller; each helper
ends with a barrier so the caller may reuse `smem` straight away.
"""

from __future__ import annotations

import math

from numba import cuda, float32, uint32

from kernels.runtime.arrays import SIMULATED

# threads per block of the row kernels: 8 warps on a GPU; one warp under the simulator, which runs every
# thread as a Python thread (the kernel bodies are written for any power-of-two BLOCK)
BLOCK = 32 if SIMULATED else 256
WARPS = BLOCK // 32
# register-resident rows: each thread keeps PER elements of its row in registers (fully unrolled loops over a
# local array, which LLVM promotes to registers: no .local traffic in the PTX), so a row of up to
# BLOCK * PER elements (4096 on a GPU) is read from memory once, with all PER loads in flight at once
PER = 16
# register cap for those kernels: 5 blocks of 256 per SM (<= 51 registers). Without it the softmax and
# layernorm register kernels take 72-79 registers (3 blocks per SM); ptxas meets the cap with no spills.
# The simulator's jit has no launch_bounds option.
ROW_JIT: dict[str, object] = {} if SIMULATED else {"launch_bounds": (BLOCK, 5)}
# the 16-byte-load row kernels (kernels.primitives.vector) need fewer registers: 6 blocks per SM (<= 42
# registers) fit them with no spills (ptxas, sm_90: 37-40), one more row in flight per SM for a
# per-row-latency-bound kernel; 8 blocks (32 registers) spill 8-40 bytes in five of the six
VEC_ROW_JIT: dict[str, object] = {} if SIMULATED else {"launch_bounds": (BLOCK, 6)}
FULL = 0xFFFFFFFF
NEG_INF = float32(-math.inf)


@cuda.jit(device=True, inline="always")
def _warp_sum(v):  # type: ignore[no-untyped-def]
    v += cuda.shfl_down_sync(FULL, v, 16)
    v += cuda.shfl_down_sync(FULL, v, 8)
    v += cuda.shfl_down_sync(FULL, v, 4)
    v += cuda.shfl_down_sync(FULL, v, 2)
    v += cuda.shfl_down_sync(FULL, v, 1)
    return cuda.shfl_sync(FULL, v, 0)


@cuda.jit(device=True, inline="always")
def _block_sum_shfl(v, smem):  # type: ignore[no-untyped-def]
    tid = cuda.threadIdx.x
    v = _warp_sum(v)
    if tid % 32 == 0:
        smem[tid // 32] = v
    cuda.syncthreads()
    lane = tid % 32
    w = smem[lane] if lane < WARPS else float32(0.0)
    w = _warp_sum(w)
    cuda.syncthreads()
    return w


@cuda.jit(device=True, inline="always")
def _block_sum_tree(v, smem):  # type: ignore[no-untyped-def]
    tid = cuda.threadIdx.x
    smem[tid] = v
    cuda.syncthreads()
    step = BLOCK // 2
    while step > 0:
        if tid < step:
            smem[tid] += smem[tid + step]
        cuda.syncthreads()
        step //= 2
    out = smem[0]
    cuda.syncthreads()
    return out


@cuda.jit(device=True, inline="always")
def _warp_max(v):  # type: ignore[no-untyped-def]
    v = max(v, cuda.shfl_down_sync(FULL, v, 16))
    v = max(v, cuda.shfl_down_sync(FULL, v, 8))
    v = max(v, cuda.shfl_down_sync(FULL, v, 4))
    v = max(v, cuda.shfl_down_sync(FULL, v, 2))
    v = max(v, cuda.shfl_down_sync(FULL, v, 1))
    return cuda.shfl_sync(FULL, v, 0)


@cuda.jit(device=True, inline="always")
def _block_max_shfl(v, smem):  # type: ignore[no-untyped-def]
    tid = cuda.threadIdx.x
    v = _warp_max(v)
    if tid % 32 == 0:
        smem[tid // 32] = v
    cuda.syncthreads()
    lane = tid % 32
    w = smem[lane] if lane < WARPS else NEG_INF
    w = _warp_max(w)
    cuda.syncthreads()
    return w


@cuda.jit(device=True, inline="always")
def _block_max_tree(v, smem):  # type: ignore[no-untyped-def]
    tid = cuda.threadIdx.x
    smem[tid] = v
    cuda.syncthreads()
    step = BLOCK // 2
    while step > 0:
        if tid < step:
            smem[tid] = max(smem[tid], smem[tid + step])
        cuda.syncthreads()
        step //= 2
    out = smem[0]
    cuda.syncthreads()
    return out


@cuda.jit(device=True, inline="always")
def _merge_max_sum(m1, s1, m2, s2):  # type: ignore[no-untyped-def]
    """Merge two online-softmax partials (max, sum of exp(v - max)); -inf max means 'empty' (sum 0), or only
    -inf and NaN values seen (sum NaN): the sum is added, so a NaN is kept."""
    if m2 == NEG_INF:
        return m1, s1 + s2
    if m1 == NEG_INF:
        return m2, s2 + s1
    if m1 >= m2:
        return m1, s1 + s2 * math.exp(m2 - m1)
    return m2, s2 + s1 * math.exp(m1 - m2)


@cuda.jit(device=True, inline="always")
def _warp_max_sum(m, s):  # type: ignore[no-untyped-def]
    for off in (16, 8, 4, 2, 1):
        m2 = cuda.shfl_down_sync(FULL, m, off)
        s2 = cuda.shfl_down_sync(FULL, s, off)
        m, s = _merge_max_sum(m, s, m2, s2)
    return cuda.shfl_sync(FULL, m, 0), cuda.shfl_sync(FULL, s, 0)


@cuda.jit(device=True, inline="always")
def _block_max_sum_shfl(m, s, smem, smem2):  # type: ignore[no-untyped-def]
    tid = cuda.threadIdx.x
    m, s = _warp_max_sum(m, s)
    if tid % 32 == 0:
        smem[tid // 32] = m
        smem2[tid // 32] = s
    cuda.syncthreads()
    lane = tid % 32
    if lane < WARPS:
        m = smem[lane]
        s = smem2[lane]
    else:
        m = NEG_INF
        s = float32(0.0)
    m, s = _warp_max_sum(m, s)
    cuda.syncthreads()
    return m, s


@cuda.jit(device=True, inline="always")
def _block_max_sum_tree(m, s, smem, smem2):  # type: ignore[no-untyped-def]
    tid = cuda.threadIdx.x
    smem[tid] = m
    smem2[tid] = s
    cuda.syncthreads()
    step = BLOCK // 2
    while step > 0:
        if tid < step:
            mm, ss = _merge_max_sum(smem[tid], smem2[tid], smem[tid + step], smem2[tid + step])
            smem[tid] = mm
            smem2[tid] = ss
        cuda.syncthreads()
        step //= 2
    m = smem[0]
    s = smem2[0]
    cuda.syncthreads()
    return m, s


if SIMULATED:
    block_sum = _block_sum_tree
    block_max = _block_max_tree
    block_max_sum = _block_max_sum_tree
else:
    block_sum = _block_sum_shfl
    block_max = _block_max_shfl
    block_max_sum = _block_max_sum_shfl


# --- reducers for any block size, one barrier per reduction ----------------------------------------------
#
# The register row kernels' block reductions each end with a second barrier so `smem` can be reused. The
# factories here drop the trailing barrier: the caller passes a slot base that alternates between two halves
# of its shared array from one row to the next (row i and row i + 2 use the same half, and row i + 1's
# barrier separates the last read of one from the first write of the other). One barrier per reduction.


def row_slots(threads: int) -> int:
    """Shared float32 slots per value per half that the `make_*` reducers need for `threads` threads: one per
    warp on a GPU, one per thread under the simulator (its version merges serially)."""
    return threads if SIMULATED else threads // 32


def make_block_sum(threads: int):  # type: ignore[no-untyped-def]
    """block_sum1(v, sm, base) -> the block's sum in every thread; `sm` >= base + row_slots(threads);
    one barrier, none at the end."""
    nw = threads // 32
    slots = row_slots(threads)

    @cuda.jit(device=True, inline="always")
    def shfl(v, sm, base):  # type: ignore[no-untyped-def]
        tid = uint32(cuda.threadIdx.x)
        lane = tid & uint32(31)
        wid = tid >> uint32(5)
        v = _warp_sum(v)
        if lane == 0:
            sm[base + wid] = v
        cuda.syncthreads()
        w = sm[base + lane] if lane < nw else float32(0.0)
        return _warp_sum(w)

    @cuda.jit(device=True, inline="always")
    def serial(v, sm, base):  # type: ignore[no-untyped-def]
        tid = cuda.threadIdx.x
        sm[base + tid] = v
        cuda.syncthreads()
        acc = float32(0.0)
        for t in range(slots):
            acc += sm[base + t]
        return acc

    return serial if SIMULATED else shfl


# --- explicitly unrolled, division-free reducers ----------------------------------------------------------
# (a tuple loop `for off in (16, 8, 4, 2, 1)` is not unrolled in its second use, and a merged (Chan) reduction
# divides at every step: benchmarks/notes-memory.md has the measurements)


@cuda.jit(device=True, inline="always")
def _warp_sum2(a, b):  # type: ignore[no-untyped-def]
    """Sums of a and b over the warp, valid in lane 0."""
    a += cuda.shfl_down_sync(FULL, a, 16)
    b += cuda.shfl_down_sync(FULL, b, 16)
    a += cuda.shfl_down_sync(FULL, a, 8)
    b += cuda.shfl_down_sync(FULL, b, 8)
    a += cuda.shfl_down_sync(FULL, a, 4)
    b += cuda.shfl_down_sync(FULL, b, 4)
    a += cuda.shfl_down_sync(FULL, a, 2)
    b += cuda.shfl_down_sync(FULL, b, 2)
    a += cuda.shfl_down_sync(FULL, a, 1)
    b += cuda.shfl_down_sync(FULL, b, 1)
    return a, b


def make_block_sum2(threads: int):  # type: ignore[no-untyped-def]
    """block_sum2(a, b, sm, base) -> (sum of a, sum of b) over the block, in every thread; `sm` >= base +
    2 * row_slots(threads); one barrier, none at the end (alternate `base` between rows)."""
    nw = threads // 32
    slots = row_slots(threads)

    @cuda.jit(device=True, inline="always")
    def shfl(a, b, sm, base):  # type: ignore[no-untyped-def]
        tid = uint32(cuda.threadIdx.x)
        lane = tid & uint32(31)
        wid = tid >> uint32(5)
        a, b = _warp_sum2(a, b)
        if lane == 0:
            sm[base + wid] = a
            sm[base + slots + wid] = b
        cuda.syncthreads()
        if lane < nw:
            a = sm[base + lane]
            b = sm[base + slots + lane]
        else:
            a = float32(0.0)
            b = float32(0.0)
        a, b = _warp_sum2(a, b)
        return cuda.shfl_sync(FULL, a, 0), cuda.shfl_sync(FULL, b, 0)

    @cuda.jit(device=True, inline="always")
    def serial(a, b, sm, base):  # type: ignore[no-untyped-def]
        tid = cuda.threadIdx.x
        sm[base + tid] = a
        sm[base + slots + tid] = b
        cuda.syncthreads()
        sa = float32(0.0)
        sb = float32(0.0)
        for t in range(slots):
            sa += sm[base + t]
            sb += sm[base + slots + t]
        return sa, sb

    return serial if SIMULATED else shfl


def make_block_max(threads: int):  # type: ignore[no-untyped-def]
    """block_max1(v, sm, base) -> the block's max in every thread; `sm` >= base + row_slots(threads); one
    barrier, none at the end."""
    nw = threads // 32
    slots = row_slots(threads)

    @cuda.jit(device=True, inline="always")
    def shfl(v, sm, base):  # type: ignore[no-untyped-def]
        tid = uint32(cuda.threadIdx.x)
        lane = tid & uint32(31)
        wid = tid >> uint32(5)
        v = _warp_max(v)
        if lane == 0:
            sm[base + wid] = v
        cuda.syncthreads()
        w = sm[base + lane] if lane < nw else NEG_INF
        return _warp_max(w)

    @cuda.jit(device=True, inline="always")
    def serial(v, sm, base):  # type: ignore[no-untyped-def]
        tid = cuda.threadIdx.x
        sm[base + tid] = v
        cuda.syncthreads()
        m = NEG_INF
        for t in range(slots):
            m = max(m, sm[base + t])
        return m

    return serial if SIMULATED else shfl
