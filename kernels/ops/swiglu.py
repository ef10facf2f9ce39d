"""swiglu: out = silu(a) * b elementwise, silu(a) = a * sigmoid(a) = a / (1 + exp(-a)): the gate of a Llama
MLP (a = x @ W_gate, b = x @ W_up), any shape (C-contiguous; a and b alike), fp32, fp16 or bf16 I/O.

fp32 math: each element is widened exactly, silu(a) * b is computed in fp32 (`math.exp`: expf on a GPU, no
fastmath) and rounded once to the input dtype on the store (fp16: numba's cast, bf16: round to nearest even
on the raw words, kernels/primitives/bf16.py).
Floors per element: 4 FLOP (exp counted as one, add, divide, multiply); bytes = 3 * itemsize (two reads,
one write). Bandwidth-bound: one expf per element through the SFUs is far below the memory time.
Kernels: residual_add's elementwise tiles with `silu_mul` in place of the add, built per RowIO (NATIVE for
fp32 / fp16, WORDS for bf16):
  - scalar (`make_tiles`): THREADS x UNROLL elements per block, every load of a tile in flight before the
    first exp;
  - vector (`make_vec_tiles`): THREADS x VEC_UNROLL 16-byte vectors per operand per block (8 halves or
    bf16 words, 4 floats per `ld.global.v4.b32`), the last partial tile in scalar. Needs 16-byte aligned
    a, b, out.
`path="auto"` takes the vector kernel for fp16 / bf16 on a GPU when aligned
(kernels.primitives.vector.choose), as residual_add does; "scalar" and "vector" stay selectable so they
can be timed side by side.
Aliasing: out may be a or b itself (each element, or 16-byte vector, is read before the same thread writes
it); any other overlap of out with a or b is refused.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda, float32

from kernels.ops.residual_add import (
    THREADS,
    UNROLL,
    VEC_UNROLL,
    grid_for,
    make_tiles,
    make_vec_tiles,
    tiles_choice,
)
from kernels.ops.rows import BF16_ELEM_TOL, BF16_TOL, IO_OF
from kernels.primitives.vector import WIDTH, choose, vector_ok
from kernels.registry import SPECIALS, Case, OpSpec, Problem, poison, register
from kernels.runtime import arrays
from kernels.runtime.arrays import BF16, FLOAT_IO_BF16, HostSync
from kernels.runtime.launch import FastCache, OverlapGuard, kernel


@cuda.jit(device=True, inline="always")
def silu_mul(a, b):  # type: ignore[no-untyped-def]
    """silu(a) * b in fp32. a = +inf gives inf * b; a = -inf gives NaN (-inf / inf), as a * sigmoid(a) does
    in IEEE arithmetic (-inf * 0); a below about -88.7 gives -0 * b (exp(-a) overflows to inf), so NaN for
    b = +-inf where float64 gives -+inf (docs/ops.md)."""
    return a / (float32(1.0) + math.exp(-a)) * b


_SIGS: dict[np.dtype, str] = {
    np.dtype(np.float32): "void(float32[::1], float32[::1], float32[::1])",
    np.dtype(np.float16): "void(float16[::1], float16[::1], float16[::1])",
    BF16: "void(uint16[::1], uint16[::1], uint16[::1])",  # bf16 as words (kernels.primitives.bf16)
}
# one dispatcher per (RowIO, unroll): fp32 and fp16 share NATIVE's body, bf16 takes WORDS
_DISPATCHERS = {dt: make_tiles(UNROLL[dt], IO_OF[dt], silu_mul) for dt in _SIGS}
_KERNELS = {dt: kernel(_DISPATCHERS[dt], sig) for dt, sig in _SIGS.items()}
_VEC_DISPATCHERS = {dt: make_vec_tiles(WIDTH[dt], VEC_UNROLL, IO_OF[dt], silu_mul) for dt in _SIGS}
_VEC = {dt: kernel(_VEC_DISPATCHERS[dt], sig) for dt, sig in _SIGS.items()}
_FAST = FastCache()  # validated launches by operand layout (kernels.runtime.launch.FastCache)
# aliasing, over the operands (a, b, out): kernels.runtime.arrays.Overlap
_OVERLAPS: tuple[arrays.Overlap, ...] = (
    (2, 0, True, "each element is read before it is written, by the same thread, no other"),
    (2, 1, True, "each element is read before it is written, by the same thread, no other"),
)


def swiglu(a: Any, b: Any, out: Any = None, *, stream: int = 0, path: str = "auto") -> Any:
    """out = silu(a) * b. Returns `out` (a new device array when None; a numpy array when the inputs are
    numpy). `out` may be a or b itself. `path`: "auto", "scalar" or "vector"
    (kernels.primitives.vector.choose; "vector" needs 16-byte aligned operands)."""
    if out is not None:
        bound, ptrs = _FAST.find((a, b, out), path)
        if bound is not None:
            bound.launch(ptrs, stream)
            return out
    sync = HostSync()
    ao = arrays.operand("a", a, sync)
    bo = arrays.operand("b", b, sync)
    arrays.check_dtype(ao, FLOAT_IO_BF16)
    arrays.check_contiguous(ao)
    arrays.check_nonempty(ao)
    arrays.check_like(bo, ao, "same as a")
    oo = arrays.output("out", out, sync, ao.shape, ao.dtype)
    arrays.check_overlaps((ao, bo, oo), _OVERLAPS)
    dt = ao.dtype
    if choose(path, dt, vector_ok((ao.ptr, bo.ptr, oo.ptr), 0)):
        k, grid = _VEC[dt], grid_for(ao.size, VEC_UNROLL * WIDTH[dt])
    else:
        k, grid = _KERNELS[dt], grid_for(ao.size, UNROLL[dt])
    k.launch(grid, THREADS, (ao, bo, oo), stream=stream)
    if out is not None and ao.host is None and bo.host is None and oo.host is None:
        ops = (ao, bo, oo)
        _FAST.store((a, b, out), path, OverlapGuard.over(k.bind(grid, THREADS, ops), ops, _OVERLAPS))
    return arrays.finish(sync, oo, out, ao)


def reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64 = a.astype(np.float64)
    out: np.ndarray = a64 * (1.0 / (1.0 + np.exp(-a64))) * b.astype(np.float64)
    return out


# --- registry ---------------------------------------------------------------------------------------------


def _poison_both(a: np.ndarray, b: np.ndarray, kind: int) -> tuple[np.ndarray, np.ndarray]:
    """`poison(a)` (NaN first, +inf middle, -inf last) and b poisoned on all but its first and last
    elements: NaN at element 1 (a finite there), +inf in the middle (where a's +inf lands: inf * inf; for
    odd sizes one after it), -inf next to last. So every output special comes from a alone, b alone or
    both: NaN from a NaN, a -inf (silu(-inf) is NaN), a b NaN; +-inf from a +inf or a b +-inf."""
    pb = np.array(b, copy=True)
    flat = pb.reshape(-1)
    flat[1:-1] = poison(flat[1:-1], kind)
    return poison(a, kind), pb


def _make_problem(case: Case, rng: np.random.Generator) -> Problem:
    shape = (case.params["rows"], case.params["cols"])
    dt = np.dtype(case.dtype)
    # a: gate pre-activations over silu's bend and both tails (|a| up to ~12: exp(-a) far from 1 either way)
    a = (rng.standard_normal(shape, dtype=np.float32) * 3.0).astype(dt)
    b = rng.standard_normal(shape, dtype=np.float32).astype(dt)
    if case.params.get(SPECIALS):
        a, b = _poison_both(a, b, case.params[SPECIALS])
    return Problem(inputs={"a": a, "b": b}, outputs={"out": (shape, dt)}, reference={"out": reference(a, b)})


def _spec_launch(args: dict[str, Any]) -> None:
    swiglu(args["a"], args["b"], args["out"])


def _cupy(args: dict[str, Any]) -> None:
    """CuPy's elementwise expression in fp32 (CuPy's fp16 math would round each step)."""
    import cupy as cp

    af = args["a"].astype(cp.float32, copy=False)
    cp.multiply(af / (1.0 + cp.exp(-af)), args["b"], out=args["out"], casting="unsafe")


def _elems(c: Case) -> int:
    return c.params["rows"] * c.params["cols"]


def _cases(shapes: list[tuple[str, int, int]], **extra: int) -> tuple[Case, ...]:
    return tuple(
        Case(label, {"rows": m, "cols": n, **extra}, dt)
        for label, m, n in shapes
        for dt in ("float32", "float16", "bfloat16")
    )


SPEC = register(
    OpSpec(
        name="swiglu",
        dtypes=("float32", "float16", "bfloat16"),
        make_problem=_make_problem,
        launch=_spec_launch,
        flops=lambda c: 4.0 * _elems(c),
        bytes=lambda c: float(3 * _elems(c) * np.dtype(c.dtype).itemsize),
        # measured in the simulator (sim and special cases, 12 seeds), norm / per element: fp32 7.9e-8 /
        # 1.2e-7, fp16 2.5e-4 / 3.9e-4, bf16 2.2e-3 / 3.3e-3 (one rounding of the output: under 2^-8 = 3.9e-3
        # for bf16, kernels.ops.rows.BF16_TOL). fp32 gets 1e-5: the simulator's exp is float64, a GPU's expf
        # is off by up to 2 ulps; the default per-element bounds (registry.ELEM_TOLERANCE) hold fp32 / fp16
        tolerance={"float32": 1e-5, "float16": 1e-3, "bfloat16": BF16_TOL},
        elem_tolerance={"bfloat16": BF16_ELEM_TOL},
        # simulator: 3 x 37 (the partial tile only: 111 elements, under one tile of 32 x 4 / 32 x 8), 5 x 123
        # (full tiles of every dtype, then a partial one)
        sim_cases=_cases([("tiny-odd", 3, 37), ("tiles-odd", 5, 123)]),
        verify_cases=_cases([("odd", 37, 1001), ("tall", 4099, 257), ("mlp-odd", 7, 14335)]),
        special_cases=_cases([("specials", 4, 136), ("specials-odd", 3, 601)], **{SPECIALS: 1}),
        # 16384 x 4096: fp32 moves 805 MB, fp16 / bf16 403 MB; 4096 tokens x a Llama-3 8B MLP width of 14336:
        # fp32 705 MB, fp16 / bf16 352 MB
        bench_cases=_cases([("16384x4096", 16384, 4096), ("4096x14336", 4096, 14336)]),
        cupy=_cupy,
        bound="memory",
        ptx_kernels=(
            *((f"swiglu_{dt.name}", _DISPATCHERS[dt], sig) for dt, sig in _SIGS.items()),
            *((f"swiglu_vec_{dt.name}", _VEC_DISPATCHERS[dt], sig) for dt, sig in _SIGS.items()),
        ),
        path=lambda c: tiles_choice(c).path,
        choose=tiles_choice,
    )
)
