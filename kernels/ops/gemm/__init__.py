"""gemm: C = A @ B with fp32 accumulation; A [M, K], B [K, N] fp32, fp16 or bf16 (row-major), C [M, N] fp32.

This package owns the matmul kernels; `o_proj` reuses them with its fused epilogue (bias, residual).

Floors (H200): FLOPs 2*M*N*K; bytes (M*K + K*N) * itemsize + 4*M*N. 4096^3: 137 GFLOP over 0.20 GB fp32 ->
2.05 ms at the 66.9 TFLOP/s fp32 FMA peak vs 0.05 ms at 4.1 TB/s: compute-bound by ~40x. fp16 inputs on
tensor cores are compute-bound too. Measured figures: benchmarks/notes-matmul.md, benchmarks/notes-mma.md.

Five strategies, one contract (`PATHS`):
  - "portable" (gemm/portable.py): shared-memory tiles, one output per thread; the simulator, fp16 on GPUs
    without tensor cores, and bf16 on GPUs other than cc 9.0.
  - "simt" (gemm/simt.py, fp32): generated register-blocked CUDA-core kernel.
  - "mma" (gemm/mma.py + mma.cu, fp16): tensor cores (mma.sync m16n8k16, fp32 accumulate) through linked
    CUDA C, cc >= 8.0. Not available under the simulator, which cannot link CUDA C.
  - "wgmma" (gemm/wgmma.py + wgmma.cu, fp16 and bf16): Hopper's warpgroup tensor-core instructions, sm_90a
    code, so cc 9.0 only: a cp.async-fed tile (0.68x cuBLAS, o_proj 0.72x), which carries every epilogue.
    Operands neither Hopper tile can take (K or N not a multiple of 8, unaligned pointers) run on the path
    auto would take without them (mma for fp16, portable for bf16): `fallback_path`.
  - "wgmma_tma" (gemm/wgmma_tma.py + wgmma_tma.cu, fp16 and bf16, cc 9.0 only): TMA loads, a producer
    warpgroup and two wgmma consumers, a persistent grid: 0.93-0.95x cuBLAS at 4096^3 and 8192x2560x2560,
    1.00-1.01x cuBLAS's addmm for o_proj with its residual (an H100, 2026-12-06, since its epilogue reads R
    before storing: benchmarks/h100/2026-12-06/tenth/; 0.83x before). The wgmma tile's
    epilogues (bias, residual, fp32 or 16-bit output; linear's activation), the same `wgmma.Key`; where it
    has no tensor maps for the operands (wgmma_tma.MapTable), the "wgmma" tile runs the same key instead (a
    layout whose first call found none keeps the "wgmma" tile in its FastCache replay: slower, never wrong).
"auto" (`select_path`, a pure function of the device's compute capability and the input dtype): portable
under the simulator; wgmma_tma for fp16 / bf16 on cc 9.0; mma for fp16 on other cc >= 8.0; portable for fp16
below that and for bf16 off cc 9.0; simt for fp32. An sm_90a kernel is never compiled or loaded elsewhere.

Host overhead: a launcher call with `out` on device arrays whose layout (shapes, strides, dtypes, 16-byte
alignment) and path were validated before replays that launch from a `kernels.runtime.launch.FastCache`.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from kernels.ops.gemm import mma, portable, simt, wgmma, wgmma_tma
from kernels.registry import SPECIALS, Case, Choice, OpSpec, Problem, poison, register
from kernels.runtime import arrays
from kernels.runtime import launch as _launch
from kernels.runtime.arrays import BF16, FLOAT_IO_BF16, SIMULATED, HostSync, Operand
from kernels.runtime.device import compute_capability
from kernels.runtime.launch import FastCache, OverlapGuard, kernel

PATHS = ("auto", "portable", "simt", "mma", "wgmma", "wgmma_tma")
WGMMA_PATHS = ("wgmma", "wgmma_tma")  # Hopper's tensor-core tiles, cc 9.0 only
F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)

_NB = {F32: "float32", F16: "float16", BF16: "uint16"}  # bf16 kernels take the raw words


def _sig(in_dt: np.dtype, out_dt: np.dtype) -> str:
    i, o = _NB[in_dt], _NB[out_dt]
    return f"void({i}[:, ::1], {i}[:, ::1], {o}[::1], {o}[:, ::1], {o}[:, ::1], int64, int64, int64)"


@cache
def _portable(has_bias: bool, has_res: bool, in_dt: np.dtype, out_dt: np.dtype) -> Any:
    if in_dt == BF16:
        return kernel(portable.make_words_kernel(has_bias, has_res, out_dt == BF16), _sig(in_dt, out_dt))
    return kernel(portable.make_kernel(has_bias, has_res), _sig(in_dt, out_dt))


# (context, path, input dtype) -> path, for paths that can run on that context's device
_RESOLVED: dict[tuple[int, str, np.dtype], str] = {}


def resolve_path(path: str, in_dtype: np.dtype) -> str:
    """The path `path` means on the current device (`select_path` with its compute capability). An explicit
    path that cannot run here raises ValueError."""
    return resolved_on_device(_RESOLVED, select_path, path, in_dtype)


def resolved_on_device(
    table: dict[tuple[int, str, np.dtype], str], select: Any, path: str, dtype: np.dtype
) -> str:
    """`select(path=, dtype=, cc=, simulated=)` for the current device, remembered in `table` per context:
    each GPU's compute capability decides its own (gemm's and linear's selection rules)."""
    key = (_launch.context(), path, dtype)
    hit = table.get(key)
    if hit is None:
        cc = None if SIMULATED else compute_capability()
        hit = table[key] = select(path=path, dtype=dtype, cc=cc, simulated=SIMULATED)
    return hit


def select_path(*, path: str, dtype: np.dtype, cc: tuple[int, int] | None, simulated: bool) -> str:
    """The kernel family `path` means for `dtype` inputs on a device of compute capability `cc` (None: no
    GPU), or under the simulator: the whole of gemm's selection rule, no device queried. "auto": portable
    under the simulator; wgmma_tma for fp16 / bf16 on cc 9.0 (sm_90a code runs nowhere else); mma for fp16 on
    other cc >= 8.0; portable for fp16 below 8.0 and for bf16 off 9.0; simt for fp32. An explicit path that
    cannot run there raises ValueError naming what it needs."""
    if path not in PATHS:
        raise ValueError(f"path: {path!r} is not a gemm path; allowed: {', '.join(PATHS)}")
    dt = np.dtype(dtype)
    if dt not in (F32, F16, BF16):
        raise TypeError(f"dtype {dt} is not supported; expected one of: float32, float16, bfloat16")
    tensor_cores = not simulated and cc is not None and tuple(cc) >= (8, 0)
    if path == "auto":
        if simulated:
            return "portable"
        if dt == F32:
            return "simt"
        if wgmma.supported(cc):
            return "wgmma_tma"
        return "mma" if dt == F16 and tensor_cores else "portable"
    if path == "simt" and dt != F32:
        raise ValueError(f"path: 'simt' needs float32 inputs; got {dt} inputs")
    if simulated and path in ("mma", *WGMMA_PATHS):
        raise ValueError(
            f"path: {path!r} needs a real GPU; under the simulator only 'portable' and 'simt' run"
        )
    if path == "mma" and (dt != F16 or not tensor_cores):
        raise ValueError(
            f"path: 'mma' needs float16 inputs and tensor cores (cc >= 8.0); got {dt} inputs"
            + ("" if tensor_cores else " on a device without them")
        )
    if path in WGMMA_PATHS and (dt == F32 or not wgmma.supported(cc)):
        where = "" if wgmma.supported(cc) else f" on a device of cc {cc}"
        raise ValueError(
            f"path: {path!r} needs float16 or bfloat16 inputs and a cc 9.0 (sm_90a) GPU; "
            f"got {dt} inputs{where}"
        )
    return path


def fallback_path(dtype: np.dtype, cc: tuple[int, int] | None) -> str:
    """Where operands go that the wgmma tile cannot take (`wgmma.fits`): what auto would pick without it."""
    return "mma" if np.dtype(dtype) == F16 and cc is not None and tuple(cc) >= (8, 0) else "portable"


def run_matmul(
    a: Operand,
    b: Operand,
    bias: Operand | None,
    res: Operand | None,
    out: Operand,
    path: str,
    stream: int = 0,
    replay: bool = False,
) -> Replay | None:
    """out = a @ b (+ bias) (+ res) on validated 2-D operands; `path` already resolved. With `replay`, also
    returns the same launch as a `Replay` for the launcher's FastCache (device operands only)."""
    m, k = a.shape
    n = b.shape[1]
    if path in WGMMA_PATHS:
        ptrs = (a.ptr, b.ptr, out.ptr) + ((bias.ptr,) if bias else ()) + ((res.ptr,) if res else ())
        if wgmma.fits(m, n, k, ptrs):
            key = wgmma.key_of(a.dtype, out.dtype != F32, bias is not None, res is not None)
            bp, rp = bias.ptr if bias else 0, res.ptr if res else 0
            return run_hopper(a=a.ptr, b=b.ptr, bias=bp, res=rp, out=out.ptr, m=m, n=n, k=k, key=key,
                              path=path, stream=stream, replay=replay)  # fmt: skip
        path = fallback_path(a.dtype, (9, 0))  # wgmma runs on cc 9.0 only
    if path == "mma":
        mma.launch(
            a=a.ptr, b=b.ptr, bias=bias.ptr if bias else 0, res=res.ptr if res else 0, out=out.ptr,
            m=m, n=n, k=k, out_half=out.dtype == F16, stream=stream,
        )  # fmt: skip
        return _mma_replay(a, b, bias, res, out) if replay else None
    # absent epilogue operands: the kernel is compiled without the read, any array of the right type will do
    bias_op = bias if bias is not None else _placeholder_1d(out.dtype)
    res_op = res if res is not None else out
    block: Any
    grid: Any
    if path == "simt":
        ptrs = (a.ptr, b.ptr, out.ptr) + ((bias.ptr,) if bias else ()) + ((res.ptr,) if res else ())
        vec = simt.vec_ok(m, n, k, ptrs)
        kern = simt.compiled(vec, bias is not None, res is not None)
        bn = 16 * simt.config_for(vec, res is not None).tn
        grid = ((m + simt.BM - 1) // simt.BM) * ((n + bn - 1) // bn)
        block = simt.THREADS
    else:
        kern = _portable(bias is not None, res is not None, a.dtype, out.dtype)
        pt = portable.PT
        grid, block = ((n + pt - 1) // pt, (m + pt - 1) // pt), (pt, pt)
    args = (a, b, bias_op, res_op, out, m, n, k)
    kern.launch(grid, block, args, stream=stream)
    if not replay:
        return None
    return _kernel_replay(kern.bind(grid, block, args), bias_op.ptr, res is not None, bias is not None)


class Replay:
    """A validated matmul launch, replayed with new device pointers: the value the gemm / o_proj launchers
    keep in their FastCache (kernels.runtime.launch). `launch(ptrs, stream)` takes the pointers of the cache
    key's operands in the order (a, b, out[, res][, bias])."""

    __slots__ = ("launch",)

    def __init__(self, fn: Any) -> None:
        self.launch = fn


def _kernel_replay(bound: Any, bias_ph: int, has_res: bool, has_bias: bool) -> Replay:
    # the kernels' array slots are (a, b, bias, res, out); absent ones hold the placeholder / out
    go = bound.launch
    if has_res and has_bias:
        return Replay(lambda p, s=0: go((p[0], p[1], p[4], p[3], p[2]), s))
    if has_res:
        return Replay(lambda p, s=0: go((p[0], p[1], bias_ph, p[3], p[2]), s))
    if has_bias:
        return Replay(lambda p, s=0: go((p[0], p[1], p[3], p[2], p[2]), s))
    return Replay(lambda p, s=0: go((p[0], p[1], bias_ph, p[2], p[2]), s))


def run_hopper(*, a: int, b: int, bias: int, res: int, out: int, m: int, n: int, k: int, key: wgmma.Key,
               path: str, stream: Any = 0, replay: bool = False) -> Replay | None:  # fmt: skip
    """One matmul on a Hopper tile (gemm, o_proj, linear; device addresses, 0 for an absent bias / R, that
    `wgmma.fits` took): the TMA tile for path "wgmma_tma" where it has tensor maps for A and B, else the
    cp.async tile of the same key. With `replay`, also the same launch as a `Replay` taking pointers in the
    FastCache order (a, b, out[, res][, bias]). `fits` depends on the shapes and on the pointers' 16-byte
    alignment, both in the FastCache key, so a replay takes the same kernel."""
    if path == "wgmma_tma" and wgmma_tma.launch(
        a=a, b=b, bias=bias, res=res, out=out, m=m, n=n, k=k, key=key, stream=stream
    ):
        return _tma_replay(a=a, b=b, bias=bias, res=res, out=out, m=m, n=n, k=k, key=key) if replay else None
    wgmma.launch(a=a, b=b, bias=bias, res=res, out=out, m=m, n=n, k=k, key=key, stream=stream)
    if not replay:
        return None
    # the kernel's arguments are (a, b, bias, res, out)
    order = (0, 1, 4) + ((3,) if key.res else ()) + ((2,) if key.bias else ())
    bound = wgmma.bind(a=a, b=b, bias=bias, res=res, out=out, m=m, n=n, k=k, key=key, ptr_args=order)
    return Replay(bound.launch)


def _tma_replay(*, a: int, b: int, bias: int, res: int, out: int, m: int, n: int, k: int,
                key: wgmma.Key) -> Replay:  # fmt: skip
    """The TMA tile's launch (gemm, o_proj, linear) packed once, from a launch that found its maps. The maps
    name A's and B's addresses: each replay looks up those of its own A and B in the context's MapTable;
    where none can be made (the table full, or a caller's graph capture on a pair not seen before) it runs
    the cp.async tile of the same key instead. p = (a, b, out[, res][, bias]), `key` saying which."""
    go = wgmma_tma.bind(a=a, b=b, bias=bias, res=res, out=out, m=m, n=n, k=k, key=key).launch
    maps_of = wgmma_tma.table().address
    ri = 3 if key.res else -1
    bi = (4 if key.res else 3) if key.bias else -1

    def launch(p: Any, s: Any = 0) -> None:
        maps = maps_of(key, p[0], p[1], m, n, k, s)
        if maps is not None:
            go((maps, *p[2:]), s)  # the Bound's pointer arguments: maps, out[, res][, bias]
        else:
            wgmma.launch(a=p[0], b=p[1], bias=p[bi] if bi >= 0 else 0, res=p[ri] if ri >= 0 else 0, out=p[2],
                         m=m, n=n, k=k, key=key, stream=s)  # fmt: skip

    return Replay(launch)


def _mma_replay(a: Operand, b: Operand, bias: Operand | None, res: Operand | None, out: Operand) -> Replay:
    """The mma launch as a Replay. With the production tile's `epi` the kernel choice depends on the shapes
    and on whether all five pointers are 16-byte aligned, which the FastCache key holds (shapes, pointers
    OR-ed & 15): so the choice, grid and whole parameter block are made once here, and a replay writes only
    the pointers (the per-call selection cost ~3 us of host time on the H200, issue 4)."""
    m, k = a.shape
    n = b.shape[1]
    half = out.dtype == F16
    ri = 3 if res is not None else -1
    bi = (4 if res is not None else 3) if bias is not None else -1
    if mma.DEFAULT.epi:
        # p = (a, b, out[, res][, bias]) -> the kernel's arguments (a 0, b 1, bias 2, res 3, out 4)
        order = (0, 1, 4) + ((3,) if res is not None else ()) + ((2,) if bias is not None else ())
        bound = mma.bind(
            a=a.ptr, b=b.ptr, bias=bias.ptr if bias else 0, res=res.ptr if res else 0, out=out.ptr,
            m=m, n=n, k=k, out_half=half, ptr_args=order,
        )  # fmt: skip
        return Replay(bound.launch)

    def go(p: Any, s: Any = 0) -> None:  # the choice depends on a and b alone: decide per call
        mma.launch(
            a=p[0], b=p[1], bias=p[bi] if bi >= 0 else 0, res=p[ri] if ri >= 0 else 0, out=p[2],
            m=m, n=n, k=k, out_half=half, stream=s,
        )  # fmt: skip

    return Replay(go)


_PLACEHOLDERS: dict[tuple[int, np.dtype], Operand] = {}


def _placeholder_1d(dtype: np.dtype) -> Operand:
    """A one-element device array standing for an absent bias, one per context and dtype (never read)."""
    key = (_launch.context(), dtype)
    op = _PLACEHOLDERS.get(key)
    if op is None:
        op = _PLACEHOLDERS[key] = arrays.empty_like_device("bias", (1,), dtype)
    return op


def check_matmul_operands(a: Operand, b: Operand, a_name: str = "a", b_name: str = "b") -> None:
    """dtype, contiguity and inner-dimension checks shared by gemm and o_proj (a may be N-d: rows x K).
    One comparison chain on the hot path (host overhead); the detailed checks and messages on a miss."""
    dt = a.dtype
    if (
        (dt is F32 or dt is F16 or dt is BF16)
        and b.dtype is dt
        and len(b.shape) == 2
        and a.shape[-1] == b.shape[0]
        and 0 not in a.shape
        and 0 not in b.shape
        and a.strides == arrays.c_strides(a.shape, dt.itemsize)
        and b.strides == arrays.c_strides(b.shape, dt.itemsize)
    ):
        return
    arrays.check_dtype(a, FLOAT_IO_BF16)
    arrays.check_same_dtype(b, a)
    arrays.check_ndim(b, (2,))
    arrays.check_contiguous(a)
    arrays.check_contiguous(b)
    arrays.check_nonempty(a)
    arrays.check_nonempty(b)
    if a.shape[-1] != b.shape[0]:
        raise ValueError(
            f"{b_name}: inner dimensions do not match: {a_name} has K = {a.shape[-1]} (shape {a.shape}), "
            f"{b_name} has {b.shape[0]} rows (shape {b.shape}); expected {b_name}.shape[0] == {a.shape[-1]}"
        )


def gemm(a: Any, b: Any, out: Any = None, *, path: str = "auto", stream: int = 0) -> Any:
    """C = a @ b, fp32 output. a [M, K], b [K, N], both float32, float16 or bfloat16 (ml_dtypes),
    C-contiguous.
    Returns `out` (a new device array when None; numpy when the inputs are numpy)."""
    if (
        out is not None
    ):  # hot path: a layout validated before, new pointers (kernels.runtime.launch.FastCache)
        hit, ptrs = _FAST_GEMM.find((a, b, out), path)
        if hit is not None:
            hit.launch(ptrs, stream)
            return out
    sync = HostSync()
    ao = arrays.operand("a", a, sync)
    bo = arrays.operand("b", b, sync)
    arrays.check_ndim(ao, (2,))
    check_matmul_operands(ao, bo)
    resolved = resolve_path(path, ao.dtype)
    oo = arrays.output("out", out, sync, (ao.shape[0], bo.shape[1]), F32)
    arrays.check_overlaps((ao, bo, oo), GEMM_OVERLAPS)
    keep = out is not None and ao.host is None and bo.host is None and oo.host is None and not SIMULATED
    rep = run_matmul(ao, bo, None, None, oo, resolved, stream, replay=keep)
    if rep is not None:
        _FAST_GEMM.store((a, b, out), path, OverlapGuard.over(rep, (ao, bo, oo), GEMM_OVERLAPS))
    return arrays.finish(sync, oo, out, ao)


# aliasing, over gemm's operands (a, b, out): every tile reads a row band of a and a column band of b while
# other tiles write C, so C may overlap neither (kernels.runtime.arrays.Overlap)
_TILES_READ = "other tiles still read it while this one writes"
GEMM_OVERLAPS: tuple[arrays.Overlap, ...] = ((2, 0, False, _TILES_READ), (2, 1, False, _TILES_READ))
_FAST_GEMM = FastCache()  # validated gemm launches by operand layout and path


# --- registry ----------------------------------------------------------------------------------------------


def _make_problem(case: Case, rng: np.random.Generator) -> Problem:
    m, n, k = case.params["M"], case.params["N"], case.params["K"]
    dt = np.dtype(case.dtype)
    a = rng.standard_normal((m, k)).astype(dt)
    b = rng.standard_normal((k, n)).astype(dt)
    if case.params.get(SPECIALS):
        a = poison(a, case.params[SPECIALS])
    ref = a.astype(np.float64) @ b.astype(np.float64)  # on the rounded inputs: only the kernel's error counts
    return Problem(inputs={"a": a, "b": b}, outputs={"c": ((m, n), F32)}, reference={"c": ref})


def _spec_launch(args: dict[str, Any]) -> None:
    gemm(args["a"], args["b"], args["c"])


def _cupy(args: dict[str, Any]) -> None:
    """cuBLAS through CuPy, writing the same fp32 C. fp32: SGEMM (`a @ b`, no TF32 unless CUPY_TF32 is set).
    fp16: cublasGemmEx with fp16 A/B, fp32 C and fp32 compute, the same computation as ours (cupy's own
    `a @ b` on fp16 would round C to fp16)."""
    import cupy as cp

    a, b, c = args["a"], args["b"], args["c"]
    if a.dtype == cp.float32:
        cp.matmul(a, b, out=c)
        return
    cublas_gemm_f16_f32(a, b, c)


def cublas_gemm_f16_f32(a: Any, b: Any, c: Any) -> None:
    """c[M, N] (fp32) = a[M, K] (fp16) @ b[K, N] (fp16) with cublasGemmEx, fp32 accumulate, on CuPy arrays.
    Row-major C = A B is column-major C^T = B^T A^T: cuBLAS sees B as the first operand."""
    import cupy as cp
    from cupy.cuda import cublas
    from cupy.cuda import runtime as rt

    m, k = a.shape
    n = b.shape[1]
    one = np.ones(1, dtype=np.float32)
    zero = np.zeros(1, dtype=np.float32)
    handle = cp.cuda.device.get_cublas_handle()  # cupy binds it to the current stream on each call
    compute_32f = getattr(cublas, "CUBLAS_COMPUTE_32F", 68)
    cublas.gemmEx(
        handle, cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_N, n, m, k,
        one.ctypes.data, b.data.ptr, rt.CUDA_R_16F, n, a.data.ptr, rt.CUDA_R_16F, k,
        zero.ctypes.data, c.data.ptr, rt.CUDA_R_32F, n, compute_32f, cublas.CUBLAS_GEMM_DEFAULT,
    )  # fmt: skip


def _cases(shapes: list[tuple[str, int, int, int]], **extra: int) -> tuple[Case, ...]:
    dts = ("float32", "float16", "bfloat16")
    return tuple(
        Case(label, {"M": m, "N": n, "K": k, **extra}, dt) for label, m, n, k in shapes for dt in dts
    )


def path_for(case: Case) -> str:
    """The path "auto" takes for `case` on this machine (reported by verify/bench)."""
    return shape_path(resolve_path("auto", np.dtype(case.dtype)), np.dtype(case.dtype),
                      case.params["N"], case.params["K"])  # fmt: skip


def explain(*, dtype: np.dtype, n: int, k: int, cc: tuple[int, int] | None, simulated: bool) -> Choice:
    """What "auto" runs for `dtype` operands with N = `n`, K = `k` on a device of compute capability `cc`,
    and why: `select_path` and `shape_path`'s rule in words (a pure function, like them)."""
    dt = np.dtype(dtype)
    path = select_path(path="auto", dtype=dt, cc=cc, simulated=simulated)
    where = f"cc {cc[0]}.{cc[1]}" if cc is not None else "no compute capability"
    if simulated:
        return Choice(path, "simulated", "the CUDA simulator runs the portable kernel")
    if path == "simt":
        return Choice(path, "primary", "float32: register-blocked CUDA-core tiles (no fp32 tensor-core path)")
    if path in WGMMA_PATHS:
        if shape_path(path, dt, n, k) == path:
            return Choice(path, "primary", f"{where}: Hopper TMA loads and warpgroup tensor cores (sm_90a)")
        fallback = fallback_path(dt, (9, 0))
        return Choice(
            fallback,
            "primary" if fallback == "mma" else "fallback",
            f"N={n}, K={k}: not multiples of 8, which the Hopper tiles need; "
            + ("mma.sync tensor cores" if fallback == "mma" else "the portable CUDA-core kernel"),
        )
    if path == "mma":
        return Choice(path, "primary", f"{where} >= 8.0: mma.sync tensor cores (wgmma is cc 9.0 only)")
    if dt == BF16:
        return Choice(
            path, "fallback", f"bfloat16 has tensor-core code for cc 9.0 only (wgmma); this is {where}"
        )
    return Choice(path, "fallback", f"float16 tensor cores need cc >= 8.0; this is {where}")


def choose_for(case: Case) -> Choice:
    """`explain` for a registry case on this machine (`kernels info`, verify records; bench records the
    path)."""
    cc = None if SIMULATED else compute_capability()
    return explain(dtype=np.dtype(case.dtype), n=case.params["N"], k=case.params["K"], cc=cc,
                   simulated=SIMULATED)  # fmt: skip


def shape_path(path: str, dtype: np.dtype, n: int, k: int) -> str:
    """`path` after the wgmma tile's shape rule (device allocations are aligned: only N and K decide)."""
    if path in WGMMA_PATHS and not wgmma.fits(1, n, k, ()):
        return fallback_path(dtype, (9, 0))
    return path


def _flops(c: Case) -> float:
    return 2.0 * c.params["M"] * c.params["N"] * c.params["K"]


def _bytes(c: Case) -> float:
    m, n, k = c.params["M"], c.params["N"], c.params["K"]
    return float((m * k + k * n) * np.dtype(c.dtype).itemsize + 4 * m * n)


def ptx_kernels(op: str, has_bias: bool, has_res: bool, out_same_dtype: bool) -> tuple[tuple[Any, ...], ...]:
    """Offline-PTX entries (kernels.runtime.ptx) for the kernels `auto` runs on a GPU: simt (fp32, its
    16-byte and 4-byte variants), mma (fp16, aligned and unaligned operands: linked CUDA C, the 4th item
    names the file) and, on cc 9.0, the TMA tile and the cp.async tile it falls back to."""
    out: list[tuple[Any, ...]] = [
        (f"{op}_simt_float32", simt.dispatcher(True, has_bias, has_res), simt.SIG),
        (f"{op}_simt_scalar_float32", simt.dispatcher(False, has_bias, has_res), simt.SIG),
    ]
    kernels = mma.dispatchers(mma.DEFAULT)
    out.append((f"{op}_mma_float16", kernels[(out_same_dtype, True)], mma.KERNEL_SIG, (mma.CU_FILE,)))
    out.append(
        (f"{op}_mma_unaligned_float16", kernels[(out_same_dtype, False)], mma.KERNEL_SIG, (mma.CU_FILE,))
    )
    # sm_90a kernels: the 5th item is the one target they compile for (kernels.runtime.ptx lists them only
    # for cc 9.0, compiled for sm_90a, and records them as arch-specific); the name says so too
    for dt, tag in ((F16, "float16"), (BF16, "bfloat16")):
        key = wgmma.key_of(dt, out_same_dtype, has_bias, has_res)  # auto's tile, and the one where it has
        out.append((f"{op}_wgmma_tma_sm90a_{tag}", wgmma_tma.dispatcher(key), wgmma_tma.KERNEL_SIG,  # no maps
                    (wgmma_tma.CU_FILE,), wgmma_tma.ARCH))  # fmt: skip
        out.append((f"{op}_wgmma_sm90a_{tag}", wgmma.dispatcher(key), wgmma.KERNEL_SIG, (wgmma.CU_FILE,),
                    wgmma.ARCH))  # fmt: skip
    return tuple(out)


SPEC = register(
    OpSpec(
        name="gemm",
        dtypes=("float32", "float16", "bfloat16"),
        make_problem=_make_problem,
        launch=_spec_launch,
        flops=_flops,
        bytes=_bytes,
        # fp32 accumulation over K <= 4096 lands near 1e-6; TF32 (3e-4) or a wrong tile fails
        # bf16: rounded inputs, fp32 accumulation and output: the same error as fp16 (measured ~1e-6)
        tolerance={"float32": 2e-5, "float16": 1e-4, "bfloat16": 1e-4},
        elem_tolerance={"bfloat16": 4e-3},
        sim_cases=_cases([("tiny-odd", 19, 23, 17)]),
        # odd (unaligned: scalar-load path of mma) and multiple-of-8 but not of the tile (cp.async zero-fill)
        verify_cases=_cases([("odd", 257, 129, 67), ("edge8", 520, 392, 264)]),
        # rows 0, M/2, M-1 of a: NaN, +inf, -inf (aligned shapes: the GPU's simt / mma kernels)
        special_cases=_cases([("specials", 24, 40, 32)], **{SPECIALS: 1}),
        bench_cases=_cases([("4096^3", 4096, 4096, 4096), ("8192x2560x2560", 8192, 2560, 2560)]),
        cupy=_cupy,
        bound="compute",
        path=path_for,
        choose=choose_for,
        ptx_kernels=() if SIMULATED else ptx_kernels("gemm", False, False, False),
    )
)
