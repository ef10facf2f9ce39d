"""Host overhead of one op call on device arrays: the Python time from the call to the return of the
(asynchronous) launch, at a tiny shape so the GPU never holds the host back.

Compared in the same process: the op launchers (validation + fast launch), `Kernel.launch` alone with
pre-resolved operands, and numba's own dispatcher launching the very same compiled kernel.

Most rows call with the same arrays every time, as a loop over fixed buffers does: from the second call on,
the launchers replay a CUDA graph (kernels.runtime.launch.Bound, clip_grad_norm's plan). The rows marked "new
each call" alternate between two arrays (or two max_norm values), so no graph is built and every call takes
the direct cuLaunchKernel path: the figure for calls whose pointers change (clip: max_norm new on every call).
Then one row per op x dtype of the registry (`registry_rows`: bf16, the LLM ops and linear included), each
through the op's registry `launch` at its smallest case.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import cuda

from kernels.runtime import arrays
from kernels.runtime.arrays import operand

CALLS = 2000
SYNC_EVERY = 200  # drain the queue now and then, outside the timed region


def _warm(fn: Callable[[], Any], seconds: float = 0.2) -> None:
    """Call `fn` for `seconds` (not a fixed count: a host still ramping up its clock), draining the queue."""
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        for _ in range(50):
            fn()
        cuda.synchronize()


def _time(fn: Callable[[], Any], calls: int) -> dict[str, float]:
    # warm up for 0.2 s right before the timed calls; `measure` has also run one warm-up pass over every row
    # first, so the first row is not timed on a host (and process) still settling: residual_add, row 1,
    # read 10.11 us on numba arrays next to 6.79 us on CuPy arrays in the same run (H200, 2026-11-30)
    _warm(fn)
    gc.collect()  # every row starts its timed calls with the same (empty) garbage-collector state
    ns = []
    for i in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        ns.append(time.perf_counter_ns() - t0)
        if i % SYNC_EVERY == SYNC_EVERY - 1:
            cuda.synchronize()
    cuda.synchronize()
    us = np.asarray(ns) / 1e3
    return {
        "median_us": round(float(np.median(us)), 2),
        "p10_us": round(float(np.percentile(us, 10)), 2),
        "p90_us": round(float(np.percentile(us, 90)), 2),
    }


def measure(calls: int = CALLS, ops: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """The named calls below, then `registry_rows` (of `ops` only, when given)."""
    from kernels.ops import cast, clip_grad_norm, gemm, layernorm, o_proj, residual_add, rmsnorm, softmax

    rng = np.random.default_rng()
    f32 = np.float32
    x = cuda.to_device(rng.standard_normal((4, 256), dtype=f32))
    r = cuda.to_device(rng.standard_normal((4, 256), dtype=f32))
    w = cuda.to_device(rng.standard_normal(256, dtype=f32))
    b = cuda.to_device(rng.standard_normal(256, dtype=f32))
    out = cuda.device_array((4, 256), dtype=f32)
    out16 = cuda.device_array((4, 256), dtype=np.float16)
    g = [cuda.to_device(rng.standard_normal(1000, dtype=f32)) for _ in range(2)]
    norm = cuda.device_array(1, dtype=f32)
    n = 4 * 256
    xo, ro, oo = (operand(k, v).reshaped((n,)) for k, v in (("x", x), ("r", r), ("out", out)))
    grid = residual_add.grid_for(n, residual_add.UNROLL[np.dtype(f32)])
    fast = residual_add._KERNELS[np.dtype(f32)]
    disp = residual_add._DISPATCHERS[np.dtype(f32)]
    xf, rf, of = x.reshape(n), r.reshape(n), out.reshape(n)
    clip = clip_grad_norm.clip_grad_norm
    f16 = np.float16
    x16 = cuda.to_device(rng.standard_normal((4, 256), dtype=f32).astype(f16))
    w16 = cuda.to_device(rng.standard_normal(256, dtype=f32).astype(f16))
    b16 = cuda.to_device(rng.standard_normal(256, dtype=f32).astype(f16))
    g16 = [cuda.to_device(rng.standard_normal(1000, dtype=f32).astype(f16)) for _ in range(2)]
    # matmul operands: small, but multiples of every tile the gemm paths use
    ma = cuda.to_device(rng.standard_normal((128, 128), dtype=f32))
    mb = cuda.to_device(rng.standard_normal((128, 128), dtype=f32))
    mc = cuda.device_array((128, 128), dtype=f32)
    ma16 = cuda.to_device(rng.standard_normal((128, 128), dtype=f32).astype(f16))
    mb16 = cuda.to_device(rng.standard_normal((128, 128), dtype=f32).astype(f16))
    attn = cuda.to_device(rng.standard_normal((2, 64, 128), dtype=f32))
    resid = cuda.to_device(rng.standard_normal((2, 64, 128), dtype=f32))
    oout = cuda.device_array((2, 64, 128), dtype=f32)
    attn16 = cuda.to_device(rng.standard_normal((2, 64, 128), dtype=f32).astype(f16))
    resid16 = cuda.to_device(rng.standard_normal((2, 64, 128), dtype=f32).astype(f16))
    oout16 = cuda.device_array((2, 64, 128), dtype=f16)
    # Llama-3-8B's 291 gradient shapes / 4096, bf16: the table path (more arrays than two_pass's SLOTS)
    g_llama = [arrays.to_device(np.ones(k, dtype=arrays.BF16)) for k in clip_grad_norm.llama3_8b_sizes(4096)]
    prepared = clip_grad_norm.prepare(g_llama, norm_out=norm)  # the same set, resolved once
    mx_new = itertools.count(1e9)  # 1e9, 1e9 + 1, ...: never a repeat
    out_alt = itertools.cycle((out, cuda.device_array_like(out)))
    mc_alt = itertools.cycle((mc, cuda.device_array_like(mc)))
    rows: list[tuple[str, Callable[[], Any]]] = [
        ("residual_add, numba arrays", lambda: residual_add.residual_add(x, r, out)),
        # the output alternating between two arrays: no call repeats the pointers of the one before, so no
        # graph is built (kernels.runtime.launch.Bound): the direct cuLaunchKernel path of every launcher
        ("residual_add, pointers new each call", lambda: residual_add.residual_add(x, r, next(out_alt))),
        ("rmsnorm, numba arrays", lambda: rmsnorm.rmsnorm(x, w, out)),
        ("layernorm, numba arrays", lambda: layernorm.layernorm(x, w, b, out)),
        ("softmax, numba arrays", lambda: softmax.softmax(x, out)),
        ("cast, numba arrays", lambda: cast.cast(x, out16)),
        ("layernorm fp16, numba arrays", lambda: layernorm.layernorm(x16, w16, b16, out16)),
        ("rmsnorm fp16, numba arrays", lambda: rmsnorm.rmsnorm(x16, w16, out16)),
        ("softmax fp16, numba arrays", lambda: softmax.softmax(x16, out16)),
        ("residual_add fp16, numba arrays", lambda: residual_add.residual_add(x16, x16, out16)),
        ("clip_grad_norm fp32, 2 arrays (auto)", lambda: clip(g, 1e9, norm_out=norm)),
        ("clip_grad_norm fp16, 2 arrays (auto)", lambda: clip(g16, 1e9, norm_out=norm)),
        # max_norm new on every call: the plan's graphs are keyed by the arrays and max_norm, so these calls
        # take the table call over the same arrays (one graph, its scale launch updated in place per call)
        ("clip_grad_norm fp16, max_norm new each call", lambda: clip(g16, next(mx_new), norm_out=norm)),
        ("clip_grad_norm bf16, 291 arrays (table)", lambda: clip(g_llama, 1e9, norm_out=norm)),
        (
            "clip_grad_norm bf16, 291 arrays, max_norm new each call",
            lambda: clip(g_llama, next(mx_new), norm_out=norm),
        ),
        ("clip_grad_norm bf16, 291 arrays, prepared", lambda: prepared(1e9)),
        ("clip_grad_norm bf16, 291 arrays, prepared, max_norm new each call", lambda: prepared(next(mx_new))),
        ("gemm fp32 128^3", lambda: gemm.gemm(ma, mb, mc)),
        ("gemm fp16 128^3", lambda: gemm.gemm(ma16, mb16, mc)),
        ("gemm fp16 128^3, pointers new each call", lambda: gemm.gemm(ma16, mb16, next(mc_alt))),
        ("o_proj fp32 [2,64,128]x[128,128]", lambda: o_proj.o_proj(attn, mb, resid, out=oout)),
        ("o_proj fp16 [2,64,128]x[128,128]", lambda: o_proj.o_proj(attn16, mb16, resid16, out=oout16)),
        ("Kernel.launch only (residual_add)", lambda: fast.launch(grid, 256, (xo, ro, oo))),
        ("numba dispatcher, same kernel", lambda: disp[grid, 256](xf, rf, of)),
    ]
    try:
        import cupy as cp

        cx, cr, cout = cp.asarray(x), cp.asarray(r), cp.asarray(out)
        rows.insert(1, ("residual_add, cupy arrays", lambda: residual_add.residual_add(cx, cr, cout)))
        rows.append(("cupy.add, cupy arrays (for scale)", lambda: cp.add(cx, cr, out=cout)))
    except ImportError:
        pass
    # one untimed warm-up pass over all rows first (compiles, caches, clocks), then the timed pass: every row
    # is timed after the same warm-up, the first one included; a row that fails here fails again below
    for _label, fn in rows:
        with contextlib.suppress(Exception):
            _warm(fn)
    res: list[dict[str, Any]] = []
    for label, fn in rows:
        try:
            res.append({"call": label, **_time(fn, calls)})
        except Exception as e:  # one op that cannot run here (e.g. no tensor cores) must not hide the rest
            nan = float("nan")
            err = f"{type(e).__name__}: {e}"[:200]
            res.append({"call": label, "error": err, "median_us": nan, "p10_us": nan, "p90_us": nan})
    # the timed calls must also be right: the last residual_add / rmsnorm wrote `out`
    residual_add.residual_add(x, r, out)
    ok = np.allclose(out.copy_to_host(), x.copy_to_host() + r.copy_to_host(), rtol=1e-6, atol=1e-6)
    if not ok:
        raise RuntimeError("overhead measurement: residual_add produced wrong values")
    return res + registry_rows(calls, ops)


def registry_rows(calls: int = CALLS, ops: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """Every op x dtype of the registry (or of `ops`), at its first simulator case of that dtype (a few
    hundred elements: the host, not the GPU, sets the time), called through the op's registry `launch`
    (the op's own function on the case's staged arguments, plus one dict lookup per operand). The same
    arrays every call, so the launchers replay their graph from the second call on, as in the rows above.
    The rows above name the calls that matter most; these cover what they leave out (bf16, the LLM ops,
    linear)."""
    from kernels.harness.verify import stage
    from kernels.registry import all_ops

    rng = np.random.default_rng(0)
    res: list[dict[str, Any]] = []
    for spec in all_ops().values():
        if ops is not None and spec.name not in ops:
            continue
        for dtype in spec.dtypes:
            case = next((c for c in spec.sim_cases if c.dtype == dtype), None)
            if case is None:
                continue
            label = f"{spec.name} {dtype}, registry launch ({case.label} {dict(case.params)})"
            try:
                args = stage(spec.make_problem(case, rng))
                res.append({"call": label, **_time(functools.partial(spec.launch, args), calls)})
            except Exception as e:  # an op that cannot run here (e.g. no tensor cores) must not hide the rest
                nan = float("nan")
                err = f"{type(e).__name__}: {e}"[:200]
                res.append({"call": label, "error": err, "median_us": nan, "p10_us": nan, "p90_us": nan})
    return res
