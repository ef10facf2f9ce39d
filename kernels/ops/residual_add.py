"""residual_add: out = x + r, elementwise, any shape (C-contiguous), fp32, fp16 or bf16 I/O.

Floors per element: 1 FLOP; bytes = 3 * itemsize (two reads, one write). Pure bandwidth.
Kernels: the arrays are seen as flat; one block per contiguous tile.
  - scalar: each thread keeps UNROLL independent element pairs in flight, one scalar load each.
  - vector: each thread loads VEC_UNROLL 16-byte vectors per operand (kernels.primitives.vector: 8 halves or
    4 floats per `ld.global.v4.b32`), so fp16 moves 512 B per warp instruction instead of 64 B. Needs
    16-byte aligned pointers (device allocations are 256-aligned); the last partial tile is done in scalar.
`path="auto"` takes the vector kernel for fp16 on a GPU when aligned (kernels.primitives.vector.choose);
both stay selectable so they can be timed side by side. fp16 adds in fp32 and rounds once.
  - bf16: the raw 16-bit words (kernels.primitives.bf16), widened to fp32 exactly, added, rounded to
    nearest even once, in either kernel: the vector kernel moves them as 16-byte vectors of 8 words (the
    default on a GPU, as for fp16), the scalar one word by word. Integer conversions: the simulator runs
    the same bodies.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda, float32

from kernels.ops.rows import NATIVE, WORDS, RowIO
from kernels.primitives.reductions import BLOCK
from kernels.primitives.vector import AUTO_VECTOR, WIDTH, choose, ldg_into, stg_from, vector_ok
from kernels.registry import SPECIALS, Case, Choice, OpSpec, Problem, poison, register
from kernels.runtime import arrays
from kernels.runtime.arrays import BF16, FLOAT_IO_BF16, HostSync, Operand
from kernels.runtime.launch import FastCache, Kernel, kernel

THREADS = BLOCK  # 256 on a GPU, 32 under the simulator (kernels.primitives.reductions)
# elements per thread: fp16 loads carry half the bytes, so twice as many are kept in flight
UNROLL = {np.dtype(np.float32): 4, np.dtype(np.float16): 8, BF16: 8}
# 16-byte vectors per operand per thread in the vector kernel: 2 x 16 B x 2 inputs = 64 B in flight per
# thread, twice the scalar kernels' 32 B (Little's law at 4.1 TB/s x ~1 us wants ~30 KB per SM: 8 blocks of
# 256 threads hold 128 KB, so latency is covered with room to spare)
VEC_UNROLL = 2


def make_tiles(unroll: int, io: RowIO, fn: Any):  # type: ignore[no-untyped-def]
    """The scalar elementwise kernel k(x, r, out): out = io.store(fn(io.load(x), io.load(r))) over flat
    arrays (residual_add: fn = add; swiglu: silu(a) * b). Block-contiguous tiles of THREADS x unroll
    elements: every load of a tile is issued before the first `fn`, and a block's accesses stay inside one
    contiguous 4-8 KB span (measured on the H200: 4.3 TB/s, against 3.7 TB/s for a grid-stride loop whose
    four loads per thread lie a whole grid apart). `io`: kernels.ops.rows.NATIVE (fp32 / fp16) or WORDS
    (bf16 as raw words, widened exactly, rounded to nearest even once on the store)."""
    load, store = io.load, io.store

    @cuda.jit
    def k(x, r, out):  # type: ignore[no-untyped-def]
        a = cuda.local.array(unroll, float32)
        b = cuda.local.array(unroll, float32)
        n = x.shape[0]
        tid = cuda.threadIdx.x
        tile = THREADS * unroll
        chunk = cuda.blockIdx.x
        while chunk * tile < n:
            base = chunk * tile + tid
            if base + (unroll - 1) * THREADS < n:
                for u in range(unroll):
                    a[u] = load(x[base + u * THREADS])
                for u in range(unroll):
                    b[u] = load(r[base + u * THREADS])
                for u in range(unroll):
                    out[base + u * THREADS] = store(fn(a[u], b[u]))
            else:
                for u in range(unroll):
                    i = base + u * THREADS
                    if i < n:
                        out[i] = store(fn(load(x[i]), load(r[i])))
            chunk += cuda.gridDim.x

    return k


@cuda.jit(device=True, inline="always")
def _add(a, b):  # type: ignore[no-untyped-def]
    return a + b


def make_vec_tiles(width: int, vunroll: int, io: RowIO, fn: Any):  # type: ignore[no-untyped-def]
    """The vector elementwise kernel k(x, r, out): out = fn(x, r) over flat arrays, as `make_tiles` but in
    tiles of THREADS x vunroll 16-byte vectors per operand (kernels.primitives.vector.ldg_into / stg_from):
    thread `tid`'s vector u covers elements base + (u * THREADS + tid) * width ... + width - 1, so a warp's
    32 vectors are 512 contiguous bytes. Every load of a tile issues before the first `fn`. `io` converts
    the elements of the last, partial tile (the vectors convert their own). Needs 16-byte aligned x, r,
    out (`vector_ok`). residual_add: fn = add; swiglu: silu(a) * b."""
    per = width * vunroll
    load, store = io.load, io.store

    @cuda.jit
    def k(x, r, out):  # type: ignore[no-untyped-def]
        a = cuda.local.array(per, float32)
        b = cuda.local.array(per, float32)
        n = x.shape[0]
        tid = cuda.threadIdx.x
        tile = THREADS * per
        chunk = cuda.blockIdx.x
        while chunk * tile < n:
            base = chunk * tile
            if base + tile <= n:
                for u in range(vunroll):
                    ldg_into(a, u * width, x, base + (u * THREADS + tid) * width)
                for u in range(vunroll):
                    ldg_into(b, u * width, r, base + (u * THREADS + tid) * width)
                for e in range(per):
                    a[e] = fn(a[e], b[e])
                for u in range(vunroll):
                    stg_from(out, base + (u * THREADS + tid) * width, a, u * width)
            else:  # the last, partial tile: one element per thread per step
                i = base + tid
                while i < n:
                    out[i] = store(fn(load(x[i]), load(r[i])))
                    i += THREADS
            chunk += cuda.gridDim.x

    return k


_SIGS: dict[np.dtype, str] = {
    np.dtype(np.float32): "void(float32[::1], float32[::1], float32[::1])",
    np.dtype(np.float16): "void(float16[::1], float16[::1], float16[::1])",
}
_DISPATCHERS = {dt: make_tiles(UNROLL[dt], NATIVE, _add) for dt in _SIGS}
_KERNELS = {dt: kernel(_DISPATCHERS[dt], sig) for dt, sig in _SIGS.items()}
_WORDS_SIG = "void(uint16[::1], uint16[::1], uint16[::1])"
_WORDS_DISPATCHER = make_tiles(UNROLL[BF16], WORDS, _add)
_WORDS = kernel(_WORDS_DISPATCHER, _WORDS_SIG)
_VEC_SIGS = {**_SIGS, BF16: _WORDS_SIG}
_VEC_DISPATCHERS = {
    dt: make_vec_tiles(WIDTH[dt], VEC_UNROLL, WORDS if dt == BF16 else NATIVE, _add) for dt in _VEC_SIGS
}
_VEC = {dt: kernel(_VEC_DISPATCHERS[dt], sig) for dt, sig in _VEC_SIGS.items()}
MAX_GRID = 2**31 - 1
_FAST = FastCache()  # validated launches by operand layout (kernels.runtime.launch.FastCache)


def grid_for(n: int, unroll: int) -> int:
    """One block per tile (the loop in the kernel only runs past 2^31 - 1 tiles)."""
    return max(1, min(MAX_GRID, (n + THREADS * unroll - 1) // (THREADS * unroll)))


def residual_add(x: Any, r: Any, out: Any = None, *, stream: int = 0, path: str = "auto") -> Any:
    """out = x + r. Returns `out` (a new device array when None; a numpy array when the inputs are numpy).
    `path`: "auto", "scalar" or "vector" (kernels.primitives.vector.choose)."""
    # (the cache is skipped while tests/kernels/test_verify.py has swapped in its own _launch)
    own = _launch is _LAUNCH
    if out is not None and own:
        bound, ptrs = _FAST.find((x, r, out), path)
        if bound is not None:
            bound.launch(ptrs, stream)
            return out
    sync = HostSync()
    xo = arrays.operand("x", x, sync)
    ro = arrays.operand("r", r, sync)
    arrays.check_dtype(xo, FLOAT_IO_BF16)
    arrays.check_contiguous(xo)
    arrays.check_nonempty(xo)
    arrays.check_like(ro, xo, "same as x")
    oo = arrays.output("out", out, sync, xo.shape, xo.dtype)
    # (the default path is not passed: tests/kernels/test_verify.py swaps in a 4-argument _launch)
    _launch(xo, ro, oo, stream) if path == "auto" else _launch(xo, ro, oo, stream, path)
    if own and out is not None and xo.host is None and ro.host is None and oo.host is None:
        k, grid = _plan(xo, ro, oo, path)
        _FAST.store((x, r, out), path, k.bind(grid, THREADS, (xo, ro, oo)))
    return arrays.finish(sync, oo, out, xo)


def _plan(xo: Operand, ro: Operand, oo: Operand, path: str) -> tuple[Kernel, int]:
    """The kernel and grid for these operands (1-d kernel slots take the N-d operands as flat)."""
    dt = xo.dtype
    if choose(path, dt, vector_ok((xo.ptr, ro.ptr, oo.ptr), 0)):
        return _VEC[dt], grid_for(xo.size, VEC_UNROLL * WIDTH[dt])
    return (_WORDS if dt == BF16 else _KERNELS[dt]), grid_for(xo.size, UNROLL[dt])


def _launch(xo: Operand, ro: Operand, oo: Operand, stream: int = 0, path: str = "auto") -> None:
    k, grid = _plan(xo, ro, oo, path)
    k.launch(grid, THREADS, (xo, ro, oo), stream=stream)


_LAUNCH = _launch


# --- registry ---------------------------------------------------------------------------------------------


def _make_problem(case: Case, rng: np.random.Generator) -> Problem:
    shape = (case.params["rows"], case.params["cols"])
    dt = np.dtype(case.dtype)
    x = rng.standard_normal(shape, dtype=np.float32).astype(dt, copy=False)
    r = rng.standard_normal(shape, dtype=np.float32).astype(dt, copy=False)
    if case.params.get(SPECIALS):
        x = poison(x, case.params[SPECIALS])
    ref = x.astype(np.float64) + r.astype(np.float64)
    return Problem(inputs={"x": x, "r": r}, outputs={"out": (shape, dt)}, reference={"out": ref})


def _spec_launch(a: dict[str, Any]) -> None:
    residual_add(a["x"], a["r"], a["out"])


def _cupy(a: dict[str, Any]) -> None:
    import cupy as cp

    cp.add(a["x"], a["r"], out=a["out"])


def _elems(c: Case) -> int:
    return c.params["rows"] * c.params["cols"]


def _cases(shapes: list[tuple[str, int, int]], **extra: int) -> tuple[Case, ...]:
    return tuple(
        Case(label, {"rows": m, "cols": n, **extra}, dt)
        for label, m, n in shapes
        for dt in ("float32", "float16", "bfloat16")
    )


def tiles_choice(case: Case) -> Choice:
    """What "auto" runs for a registry case of an elementwise-tiles op (residual_add, swiglu): device
    allocations are aligned, so only the dtype decides."""
    dt = np.dtype(case.dtype)
    if arrays.SIMULATED:
        return Choice("scalar", "simulated", "the CUDA simulator runs the scalar kernel")
    if dt in AUTO_VECTOR:
        return Choice("vector", "primary", f"{dt}: 16-byte vector loads")
    return Choice("scalar", "primary", f"{dt}: coalesced scalar tiles, several loads in flight per thread")


SPEC = register(
    OpSpec(
        name="residual_add",
        dtypes=("float32", "float16", "bfloat16"),
        make_problem=_make_problem,
        launch=_spec_launch,
        flops=lambda c: float(_elems(c)),
        bytes=lambda c: float(3 * _elems(c) * np.dtype(c.dtype).itemsize),
        # bf16: one rounding of the fp32 sum, 2^-9 relative at most (rms ~1.1e-3 of the values)
        tolerance={"float32": 1e-6, "float16": 1e-3, "bfloat16": 4e-3},
        sim_cases=_cases([("tiny-odd", 3, 37)]),
        verify_cases=_cases([("odd", 37, 1001), ("tall", 4099, 257)]),
        special_cases=_cases([("specials", 4, 136)], specials=1),
        # 16384 x 4096: fp32 moves 805 MB, fp16 403 MB
        bench_cases=_cases([("16384x4096", 16384, 4096)]),
        cupy=_cupy,
        bound="memory",
        ptx_kernels=(
            *((f"residual_add_{dt.name}", _DISPATCHERS[dt], sig) for dt, sig in _SIGS.items()),
            *((f"residual_add_vec_{dt.name}", _VEC_DISPATCHERS[dt], sig) for dt, sig in _VEC_SIGS.items()),
            ("residual_add_bfloat16", _WORDS_DISPATCHER, _WORDS_SIG),
        ),
        path=lambda c: tiles_choice(c).path,
        choose=tiles_choice,
    )
)
