"""rmsnorm: out[i, :] = x[i, :] / sqrt(mean(x[i, :]^2) + eps) * weight, row-wise over the last dimension.

Floors per row of n: 4n FLOP (square+add, scale, weight); bytes = 2 * n * itemsize (x read once, out written
once; weight is n elements shared by every row). Bandwidth-bound.
Kernel: one block of 256 threads per row. Pass 1 reads the row with four independent loads in flight per
thread and reduces the sum of squares in fp32 (warp shuffles, then one slot per warp). Pass 2 reads the row
again: it was read microseconds before by the same block, so it comes from L1/L2, not device memory.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda, float32

from kernels import arrays
from kernels.arrays import FLOAT_IO, HostSync
from kernels.launch import kernel
from kernels.reduce import BLOCK, block_sum
from kernels.registry import Case, OpSpec, Problem, register
from kernels.rowcases import row_cases


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
            v0 = float32(x[row, j])
            v1 = float32(x[row, j + BLOCK])
            v2 = float32(x[row, j + 2 * BLOCK])
            v3 = float32(x[row, j + 3 * BLOCK])
            a0 += v0 * v0
            a1 += v1 * v1
            a2 += v2 * v2
            a3 += v3 * v3
            j += 4 * BLOCK
        while j < n:
            v = float32(x[row, j])
            a0 += v * v
            j += BLOCK
        total = block_sum((a0 + a1) + (a2 + a3), smem)
        inv = float32(1.0) / math.sqrt(total / float32(n) + eps)
        j = tid
        while j + 3 * BLOCK < n:
            v0 = float32(x[row, j])
            v1 = float32(x[row, j + BLOCK])
            v2 = float32(x[row, j + 2 * BLOCK])
            v3 = float32(x[row, j + 3 * BLOCK])
            out[row, j] = v0 * inv * float32(w[j])
            out[row, j + BLOCK] = v1 * inv * float32(w[j + BLOCK])
            out[row, j + 2 * BLOCK] = v2 * inv * float32(w[j + 2 * BLOCK])
            out[row, j + 3 * BLOCK] = v3 * inv * float32(w[j + 3 * BLOCK])
            j += 4 * BLOCK
        while j < n:
            out[row, j] = float32(x[row, j]) * inv * float32(w[j])
            j += BLOCK
        row += cuda.gridDim.x


_SIGS = {
    np.dtype(np.float32): "void(float32[:, ::1], float32[::1], float32[:, ::1], float32)",
    np.dtype(np.float16): "void(float16[:, ::1], float16[::1], float16[:, ::1], float32)",
}
_KERNELS = {dt: kernel(_rmsnorm_kernel, sig) for dt, sig in _SIGS.items()}
MAX_GRID = 2**31 - 1


def rmsnorm(x: Any, weight: Any, out: Any = None, *, eps: float = 1e-6, stream: int = 0) -> Any:
    """Row-wise RMS norm over the last dimension of x (any ndim >= 1), times weight [x.shape[-1]]."""
    sync = HostSync()
    xo = arrays.operand("x", x, sync)
    wo = arrays.operand("weight", weight, sync)
    arrays.check_dtype(xo, FLOAT_IO)
    arrays.check_nonempty(xo)
    arrays.check_contiguous(xo)
    arrays.check_same_dtype(wo, xo)
    arrays.check_shape(wo, (xo.shape[-1],), "x's last dimension")
    arrays.check_contiguous(wo)
    e = arrays.check_positive("eps", eps)
    oo = arrays.output("out", out, sync, xo.shape, xo.dtype)
    xr = arrays.as_rows(xo)
    _KERNELS[xo.dtype].launch(
        min(xr.shape[0], MAX_GRID), BLOCK, (xr, wo, arrays.as_rows(oo), e), stream=stream
    )
    return arrays.finish(sync, oo, out, xo)


def reference(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    return x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps) * w.astype(np.float64)


EPS = 1e-6


def _make_problem(case: Case, rng: np.random.Generator) -> Problem:
    rows, n = case.params["rows"], case.params["cols"]
    dt = np.dtype(case.dtype)
    x = (rng.standard_normal((rows, n), dtype=np.float32) * 2.0 + 0.5).astype(dt)
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
        dtypes=("float32", "float16"),
        make_problem=_make_problem,
        launch=_spec_launch,
        flops=lambda c: 4.0 * c.params["rows"] * c.params["cols"],
        bytes=_bytes,
        tolerance={"float32": 1e-5, "float16": 2e-3},
        **row_cases(),
        cupy=_cupy,
        bound="memory",
        ptx_kernels=tuple((f"rmsnorm_{dt.name}", _rmsnorm_kernel, sig) for dt, sig in _SIGS.items()),
    )
)
