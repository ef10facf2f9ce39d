"""residual_add: out = x + r, elementwise, any shape (C-contiguous), fp32 or fp16 I/O.

Floors per element: 1 FLOP; bytes = 3 * itemsize (two reads, one write). Pure bandwidth.
Kernel: the arrays are seen as flat; a grid-stride loop where each thread keeps UNROLL independent
element pairs in flight (numba has no 16-byte vector loads, so memory-level parallelism has to come from
independent scalar loads). fp16 adds in fp32 and rounds once.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda, float32

from kernels import arrays
from kernels.arrays import FLOAT_IO, HostSync, Operand
from kernels.launch import kernel, sm_count
from kernels.reduce import BLOCK
from kernels.registry import Case, OpSpec, Problem, register

THREADS = BLOCK  # 256 on a GPU, 32 under the simulator (kernels.reduce)
UNROLL = 4
BLOCKS_PER_SM = 8  # 8 x 256 = 2048 threads: a full H100/H200 multiprocessor


@cuda.jit
def _residual_add_kernel(x, r, out):  # type: ignore[no-untyped-def]
    n = x.shape[0]
    stride = cuda.gridsize(1)
    i = cuda.grid(1)
    # four loads of each input issued before the first add: 8 outstanding loads per thread
    while i + 3 * stride < n:
        a0 = x[i]
        a1 = x[i + stride]
        a2 = x[i + 2 * stride]
        a3 = x[i + 3 * stride]
        b0 = r[i]
        b1 = r[i + stride]
        b2 = r[i + 2 * stride]
        b3 = r[i + 3 * stride]
        out[i] = float32(a0) + float32(b0)
        out[i + stride] = float32(a1) + float32(b1)
        out[i + 2 * stride] = float32(a2) + float32(b2)
        out[i + 3 * stride] = float32(a3) + float32(b3)
        i += 4 * stride
    while i < n:
        out[i] = float32(x[i]) + float32(r[i])
        i += stride


_SIGS = {
    np.dtype(np.float32): "void(float32[::1], float32[::1], float32[::1])",
    np.dtype(np.float16): "void(float16[::1], float16[::1], float16[::1])",
}
_KERNELS = {dt: kernel(_residual_add_kernel, sig) for dt, sig in _SIGS.items()}


def grid_for(n: int) -> int:
    """Enough blocks to fill every SM, never more than the work needs."""
    return max(1, min(sm_count() * BLOCKS_PER_SM, (n + THREADS * UNROLL - 1) // (THREADS * UNROLL)))


def residual_add(x: Any, r: Any, out: Any = None, *, stream: int = 0) -> Any:
    """out = x + r. Returns `out` (a new device array when None; a numpy array when the inputs are numpy)."""
    sync = HostSync()
    xo = arrays.operand("x", x, sync)
    ro = arrays.operand("r", r, sync)
    arrays.check_dtype(xo, FLOAT_IO)
    arrays.check_same_dtype(ro, xo)
    arrays.check_shape(ro, xo.shape, "same as x")
    arrays.check_contiguous(xo)
    arrays.check_contiguous(ro)
    arrays.check_nonempty(xo)
    oo = arrays.output("out", out, sync, xo.shape, xo.dtype)
    _launch(xo, ro, oo, stream)
    return arrays.finish(sync, oo, out, xo)


def _launch(xo: Operand, ro: Operand, oo: Operand, stream: int = 0) -> None:
    n = xo.size
    flat = (n,)
    _KERNELS[xo.dtype].launch(
        grid_for(n), THREADS, (xo.reshaped(flat), ro.reshaped(flat), oo.reshaped(flat)), stream=stream
    )


# --- registry ---------------------------------------------------------------------------------------------


def _make_problem(case: Case, rng: np.random.Generator) -> Problem:
    shape = (case.params["rows"], case.params["cols"])
    dt = np.dtype(case.dtype)
    x = rng.standard_normal(shape, dtype=np.float32).astype(dt, copy=False)
    r = rng.standard_normal(shape, dtype=np.float32).astype(dt, copy=False)
    ref = x.astype(np.float64) + r.astype(np.float64)
    return Problem(inputs={"x": x, "r": r}, outputs={"out": (shape, dt)}, reference={"out": ref})


def _spec_launch(a: dict[str, Any]) -> None:
    residual_add(a["x"], a["r"], a["out"])


def _cupy(a: dict[str, Any]) -> None:
    import cupy as cp

    cp.add(a["x"], a["r"], out=a["out"])


def _elems(c: Case) -> int:
    return c.params["rows"] * c.params["cols"]


def _cases(shapes: list[tuple[str, int, int]]) -> tuple[Case, ...]:
    return tuple(
        Case(label, {"rows": m, "cols": n}, dt) for label, m, n in shapes for dt in ("float32", "float16")
    )


SPEC = register(
    OpSpec(
        name="residual_add",
        dtypes=("float32", "float16"),
        make_problem=_make_problem,
        launch=_spec_launch,
        flops=lambda c: float(_elems(c)),
        bytes=lambda c: float(3 * _elems(c) * np.dtype(c.dtype).itemsize),
        tolerance={"float32": 1e-6, "float16": 1e-3},
        sim_cases=_cases([("tiny-odd", 3, 37)]),
        verify_cases=_cases([("odd", 37, 1001), ("tall", 4099, 257)]),
        # 16384 x 4096: fp32 moves 805 MB, fp16 403 MB
        bench_cases=_cases([("16384x4096", 16384, 4096)]),
        cupy=_cupy,
        bound="memory",
        ptx_kernels=tuple(
            (f"residual_add_{dt.name}", _residual_add_kernel, sig) for dt, sig in _SIGS.items()
        ),
    )
)
