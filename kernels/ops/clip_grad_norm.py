"""clip_grad_norm: total = sqrt(sum over arrays of sum(g^2)); if total > max_norm every g is scaled in place
by max_norm / (total + 1e-6) (PyTorch's rule); returns total.

Floors for N elements in all: 2N FLOP for the norm (+1N for the scale when it clips); bytes = N * itemsize
to read for the norm, plus 2N * itemsize to read and write when it clips (the norm must be complete before
any scaling, so the data is read twice unless it fits in L2).
Kernels, all on one stream, no host round trip between them:
  1. `_zero`: clears a float64 accumulator on the device;
  2. `_sumsq` per array: persistent blocks over contiguous tiles, fp32 sum of squares per thread (8 or 16
     loads in flight), a block reduction, then one float64 atomic add per block;
  3. `_scale` per array: one block per tile; every thread reads the accumulator, derives the coefficient
     itself and returns at once when there is nothing to clip (no traffic); block 0 writes the norm.
One launch per array: with many small arrays the op is launch-bound (see notes-memory.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import cuda, float32, float64

from kernels import arrays
from kernels.arrays import FLOAT_IO, HostSync, Operand
from kernels.launch import Kernel, kernel, sm_count
from kernels.reduce import BLOCK, block_sum
from kernels.registry import Case, OpSpec, Problem, register

BLOCKS_PER_SM = 8
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
) -> Any:
    """Clip `grads` (fp32 or fp16 arrays, one dtype) in place to a global L2 norm of `max_norm`.

    Returns the norm before clipping as a Python float, or, when `norm_out` (a float32 device array of one
    element) is given, writes it there and returns `norm_out` without waiting for the device.
    """
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


def _grads(a: dict[str, Any]) -> list[Any]:
    return [a[f"g{k}"] for k in range(sum(1 for key in a if key[0] == "g" and key[1:].isdigit()))]


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
        ),
    )
)
