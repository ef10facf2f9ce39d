"""clip_grad_norm: total = sqrt(sum over arrays of sum(g^2)); if total > max_norm every g is scaled in place
by max_norm / (total + 1e-6) (PyTorch's rule); returns total.

Floors for N elements in all: 2N FLOP for the norm (+1N for the scale when it clips); bytes = N * itemsize
to read for the norm, plus 2N * itemsize to read and write when it clips (the norm must be complete before
any scaling, so the data is read twice unless it fits in L2).
Kernels, all on one stream, no host round trip between them:
  1. `_zero`: clears a float64 accumulator on the device;
  2. `_sumsq` per array: grid-stride sum of squares in fp32 per thread (four loads in flight), a block
     reduction, then one float64 atomic add per block;
  3. `_scale` per array: every thread reads the accumulator, derives the coefficient itself and returns at
     once when there is nothing to clip (no traffic); block 0 writes the norm to `norm_out`.
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
UNROLL = 4
CLIP_EPS = 1e-6


@cuda.jit
def _zero(acc):  # type: ignore[no-untyped-def]
    if cuda.grid(1) == 0:
        acc[0] = 0.0


@cuda.jit
def _sumsq(g, acc):  # type: ignore[no-untyped-def]
    smem = cuda.shared.array(BLOCK, float32)
    n = g.shape[0]
    stride = cuda.gridsize(1)
    i = cuda.grid(1)
    a0 = float32(0.0)
    a1 = float32(0.0)
    a2 = float32(0.0)
    a3 = float32(0.0)
    while i + 3 * stride < n:
        v0 = float32(g[i])
        v1 = float32(g[i + stride])
        v2 = float32(g[i + 2 * stride])
        v3 = float32(g[i + 3 * stride])
        a0 += v0 * v0
        a1 += v1 * v1
        a2 += v2 * v2
        a3 += v3 * v3
        i += 4 * stride
    while i < n:
        v = float32(g[i])
        a0 += v * v
        i += stride
    total = block_sum((a0 + a1) + (a2 + a3), smem)
    if cuda.threadIdx.x == 0:
        cuda.atomic.add(acc, 0, float64(total))


@cuda.jit
def _scale(g, acc, norm_out, max_norm):  # type: ignore[no-untyped-def]
    norm = math.sqrt(acc[0])
    i = cuda.grid(1)
    if i == 0:
        norm_out[0] = float32(norm)
    coef = max_norm / (norm + CLIP_EPS)
    if coef >= 1.0:
        return
    c = float32(coef)
    n = g.shape[0]
    stride = cuda.gridsize(1)
    while i + 3 * stride < n:
        v0 = float32(g[i]) * c
        v1 = float32(g[i + stride]) * c
        v2 = float32(g[i + 2 * stride]) * c
        v3 = float32(g[i + 3 * stride]) * c
        g[i] = v0
        g[i + stride] = v1
        g[i + 2 * stride] = v2
        g[i + 3 * stride] = v3
        i += 4 * stride
    while i < n:
        g[i] = float32(g[i]) * c
        i += stride


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
_SUMSQ: dict[np.dtype, Kernel] = {dt: kernel(_sumsq, s) for dt, s in _SUMSQ_SIGS.items()}
_SCALE: dict[np.dtype, Kernel] = {dt: kernel(_scale, s) for dt, s in _SCALE_SIGS.items()}
_workspace: Operand | None = None


def _accumulator() -> Operand:
    """One float64 device scalar, reused by every call: calls on one stream are ordered, so reuse is safe;
    callers running clip_grad_norm on several streams at once pass their own `workspace`."""
    global _workspace
    if _workspace is None:
        _workspace = arrays.empty_like_device("workspace", (1,), np.dtype(np.float64))
    return _workspace


def _grid(n: int, threads: int) -> int:
    return max(1, min(sm_count() * BLOCKS_PER_SM, (n + threads * UNROLL - 1) // (threads * UNROLL)))


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
    sumsq = _SUMSQ[dt]
    for f in flat:
        sumsq.launch(_grid(f.size, BLOCK), BLOCK, (f, acc), stream=stream)
    scale = _SCALE[dt]
    for f in flat:
        scale.launch(_grid(f.size, BLOCK), BLOCK, (f, acc, no, mx), stream=stream)
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
            *((f"clip_grad_norm_sumsq_{dt.name}", _sumsq, s) for dt, s in _SUMSQ_SIGS.items()),
            *((f"clip_grad_norm_scale_{dt.name}", _scale, s) for dt, s in _SCALE_SIGS.items()),
        ),
    )
)
