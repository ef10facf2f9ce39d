"""cast: out = fp16(x) or bf16(x) for fp32 x (round to nearest even), any shape (C-contiguous).

Floors per element: 1 conversion (counted as 1 FLOP); bytes = 4 + 2 (one fp32 read, one 16-bit write).
Kernel: one block per contiguous tile of THREADS x 8 elements, all 8 loads in flight, like residual_add.
The target type is `out`'s dtype (float16 by default). bf16 is written as raw 16-bit words with integer
round-to-nearest-even (kernels.primitives.bf16), so the simulator runs the same kernel; its OpSpec is
`cast_bf16` (the registry keys an op's cases by input dtype, and both casts read fp32).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda, float32
from numba.core.types import float16

from kernels.primitives.bf16 import f32_to_bf16
from kernels.primitives.reductions import BLOCK
from kernels.registry import SPECIALS, Case, OpSpec, Problem, poison, register
from kernels.runtime import arrays
from kernels.runtime.arrays import BF16, HostSync
from kernels.runtime.launch import FastCache, kernel

THREADS = BLOCK  # 256 on a GPU, 32 under the simulator (kernels.primitives.reductions)
UNROLL = 8  # one input stream of 4-byte loads: 8 in flight per thread, as residual_add's fp16 path
F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)


@cuda.jit
def _cast_kernel(x, out):  # type: ignore[no-untyped-def]
    a = cuda.local.array(UNROLL, float32)
    n = x.shape[0]
    tid = cuda.threadIdx.x
    tile = THREADS * UNROLL
    chunk = cuda.blockIdx.x
    while chunk * tile < n:
        base = chunk * tile + tid
        if base + (UNROLL - 1) * THREADS < n:
            for u in range(UNROLL):
                a[u] = x[base + u * THREADS]
            for u in range(UNROLL):
                out[base + u * THREADS] = float16(a[u])
        else:
            for u in range(UNROLL):
                i = base + u * THREADS
                if i < n:
                    out[i] = float16(x[i])
        chunk += cuda.gridDim.x


@cuda.jit
def _cast_bf16_kernel(x, out):  # type: ignore[no-untyped-def]
    a = cuda.local.array(UNROLL, float32)
    n = x.shape[0]
    tid = cuda.threadIdx.x
    tile = THREADS * UNROLL
    chunk = cuda.blockIdx.x
    while chunk * tile < n:
        base = chunk * tile + tid
        if base + (UNROLL - 1) * THREADS < n:
            for u in range(UNROLL):
                a[u] = x[base + u * THREADS]
            for u in range(UNROLL):
                out[base + u * THREADS] = f32_to_bf16(a[u])
        else:
            for u in range(UNROLL):
                i = base + u * THREADS
                if i < n:
                    out[i] = f32_to_bf16(x[i])
        chunk += cuda.gridDim.x


_SIG = "void(float32[::1], float16[::1])"
_KERNEL = kernel(_cast_kernel, _SIG)
_BF16_SIG = "void(float32[::1], uint16[::1])"
_BF16_KERNEL = kernel(_cast_bf16_kernel, _BF16_SIG)
MAX_GRID = 2**31 - 1
_FAST = FastCache()  # validated launches by operand layout (kernels.runtime.launch.FastCache)


def cast(x: Any, out: Any = None, *, stream: int = 0, dtype: Any = None) -> Any:
    """fp32 -> fp16 or bf16, elementwise: to `out`'s dtype, else to `dtype` (default float16). Returns `out`
    (a new array when None)."""
    if out is not None:
        bound, ptrs = _FAST.find((x, out), None)
        if bound is not None:
            bound.launch(ptrs, stream)
            return out
    sync = HostSync()
    xo = arrays.operand("x", x, sync)
    arrays.check_dtype(xo, (F32,))
    arrays.check_contiguous(xo)
    arrays.check_nonempty(xo)
    target = np.dtype(dtype) if dtype is not None else F16
    if out is not None:
        target = arrays.operand("out", out).dtype if dtype is None else target
    if target not in (F16, BF16):
        what = "dtype" if dtype is not None else "out"
        raise TypeError(f"{what}: dtype {target} is not allowed; expected float16 or bfloat16")
    oo = arrays.output("out", out, sync, xo.shape, target)
    k = _BF16_KERNEL if target == BF16 else _KERNEL
    n = xo.size
    grid = max(1, min(MAX_GRID, (n + THREADS * UNROLL - 1) // (THREADS * UNROLL)))
    k.launch(grid, THREADS, (xo, oo), stream=stream)  # 1-d slots see the operands flat
    if out is not None and xo.host is None and oo.host is None:
        _FAST.store((x, out), None, k.bind(grid, THREADS, (xo, oo)))
    return arrays.finish(sync, oo, out, xo)


def _make_problem(case: Case, rng: np.random.Generator) -> Problem:
    shape = (case.params["rows"], case.params["cols"])
    # a spread of magnitudes (1e-3 .. 1e3) so rounding at every exponent is exercised
    x = rng.standard_normal(shape, dtype=np.float32) * np.exp(rng.uniform(-7, 7, shape).astype(np.float32))
    if case.params.get(SPECIALS):
        x = poison(x, case.params[SPECIALS])
        x[1, :3] = [70000.0, -1e30, 65519.0]  # past fp16's range: +-inf; 65519 still rounds to 65504
    return Problem(
        inputs={"x": x},
        outputs={"out": (shape, F16)},
        reference={"out": x.astype(np.float16).astype(np.float64)},
    )


def _spec_launch(a: dict[str, Any]) -> None:
    cast(a["x"], a["out"])


def _cupy(a: dict[str, Any]) -> None:
    a["out"][...] = a["x"].astype("float16")


def _elems(c: Case) -> int:
    return c.params["rows"] * c.params["cols"]


def _case(label: str, m: int, n: int) -> Case:
    return Case(label, {"rows": m, "cols": n}, "float32")


SPEC = register(
    OpSpec(
        name="cast",
        dtypes=("float32",),
        make_problem=_make_problem,
        launch=_spec_launch,
        flops=lambda c: float(_elems(c)),
        bytes=lambda c: float(6 * _elems(c)),
        # the reference is numpy's own fp32 -> fp16 rounding: the kernel must match it exactly
        tolerance={"float32": 0.0},
        elem_tolerance={"float32": 0.0},  # round to nearest even: exact
        sim_cases=(_case("tiny-odd", 3, 37),),
        verify_cases=(_case("odd", 37, 1001), _case("tall", 4099, 257)),
        special_cases=(Case("specials", {"rows": 4, "cols": 136, SPECIALS: 1}, "float32"),),
        # 16384 x 4096: reads 268 MB, writes 134 MB
        bench_cases=(_case("16384x4096", 16384, 4096),),
        cupy=_cupy,
        bound="memory",
        ptx_kernels=(("cast_float32_float16", _cast_kernel, _SIG),),
    )
)


def _make_problem_bf16(case: Case, rng: np.random.Generator) -> Problem:
    shape = (case.params["rows"], case.params["cols"])
    x = rng.standard_normal(shape, dtype=np.float32) * np.exp(rng.uniform(-40, 40, shape).astype(np.float32))
    if case.params.get(SPECIALS):
        x = poison(x, case.params[SPECIALS])
        # past bf16's largest finite (3.3895e38) by more than half an ulp: inf; a subnormal; a tie to even
        x[1, :4] = np.array([3.3999e38, -3.3e38, 1e-40, 1.00390625], dtype=np.float32)
    return Problem(
        inputs={"x": x},
        outputs={"out": (shape, BF16)},
        reference={"out": x.astype(BF16).astype(np.float64)},  # ml_dtypes' round to nearest even
    )


def _spec_launch_bf16(a: dict[str, Any]) -> None:
    cast(a["x"], a["out"])


SPEC_BF16 = register(
    OpSpec(
        name="cast_bf16",
        dtypes=("float32",),
        make_problem=_make_problem_bf16,
        launch=_spec_launch_bf16,
        flops=lambda c: float(_elems(c)),
        bytes=lambda c: float(6 * _elems(c)),
        # the reference is ml_dtypes' own fp32 -> bf16 rounding: exact
        tolerance={"float32": 0.0},
        elem_tolerance={"float32": 0.0},
        sim_cases=(_case("tiny-odd", 3, 37),),
        verify_cases=(_case("odd", 37, 1001), _case("tall", 4099, 257)),
        special_cases=(Case("specials", {"rows": 4, "cols": 136, SPECIALS: 1}, "float32"),),
        bench_cases=(_case("16384x4096", 16384, 4096),),
        cupy=None,  # CuPy has no bfloat16 (benchmarks/h200_bf16.py times torch's .to(bfloat16))
        bound="memory",
        ptx_kernels=(("cast_float32_bfloat16", _cast_bf16_kernel, _BF16_SIG),),
    )
)
