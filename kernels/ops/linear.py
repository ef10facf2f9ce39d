"""linear: out = act(x @ weight.T (+ bias)), torch's `nn.Linear` (and its activation) in ONE kernel.

x [M, K] or [B, S, K]; weight [N, K], as a torch `Linear` stores it (the NT layout: no transposed copy);
bias [N] (optional); all float16 or all bfloat16; out [..., N] in the input type. `activation`:
  "none"       out = x @ W.T (+ bias)
  "silu"       out = silu(y) = y * sigmoid(y)                         (Llama's MLP gate)
  "gelu_tanh"  out = 0.5 y (1 + tanh(sqrt(2/pi) (y + 0.044715 y^3)))  (torch's gelu(approximate="tanh"))
The product is accumulated in fp32; bias and the activation are applied to the accumulator in registers
(both activations as y * sigmoid(z): gelu_tanh's 0.5 (1 + tanh(u)) is sigmoid(2u) exactly, which has no
cancellation for negative y), then one rounding to the output type: the [M, N] product never goes through
device memory, and no separate activation pass reads it back.

Paths (`PATHS`): "wgmma" (kernels/ops/gemm/wgmma.cu with B [N, K] K-major in shared memory and the
activation epilogue; sm_90a, cc 9.0 only, K and N multiples of 8, 16-byte aligned operands), "wgmma_tma"
(the same epilogue on gemm's TMA tile, kernels/ops/gemm/wgmma_tma.cu, with wgmma's shape rule; where it has
no tensor maps for the operands the wgmma tile runs instead) and "portable" (kernels/ops/gemm/portable.py
`make_linear_kernel`: the simulator, other GPUs, and shapes the wgmma tiles cannot take). "auto" takes
wgmma_tma wherever it can run. On an H100 (2026-12-05, bench shape below, medians beside torch's F.linear
then the activation): wgmma_tma 0.96-0.98x of cuBLAS + eager, the wgmma tile 0.68-0.69x; the activation
costs 0.6-0.8 % (SiLU) and 1.9-2.1 % (GELU) over the plain linear on the same tile (wgmma_epi.cuh). There
is no mma.sync kernel for this layout: on cc 8.x linear is the portable kernel (a fallback tier in `kernels
info`; gemm / o_proj keep mma.sync there).

Floors (H200, bench shape: Llama-3-8B's MLP up / gate projection, 4096 tokens, x [4096, 4096], W [14336,
4096]): 481 GFLOP -> 450 us at the 1070 TFLOP/s dense bf16 peak (~520 us at the ~1.7 GHz of a long GEMM);
bytes (MK + NK + MN) * 2 = 268 MB -> 64 us at 4.2 TB/s: compute-bound by ~7x.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from kernels.ops.gemm import (
    GEMM_OVERLAPS,
    WGMMA_PATHS,
    _placeholder_1d,
    portable,
    resolved_on_device,
    run_hopper,
    wgmma,
    wgmma_tma,
)
from kernels.ops.gemm import select_path as _gemm_select
from kernels.registry import SPECIALS, Case, Choice, OpSpec, Problem, poison, register
from kernels.runtime import arrays
from kernels.runtime.arrays import BF16, SIMULATED, HostSync
from kernels.runtime.device import compute_capability
from kernels.runtime.launch import FastCache, OverlapGuard, kernel

PATHS = ("auto", "portable", "wgmma", "wgmma_tma")
ACTIVATIONS = wgmma.ACTIVATIONS  # "none", "silu", "gelu_tanh"
F16 = np.dtype(np.float16)
DTYPES = (F16, BF16)


def select_path(*, path: str, dtype: np.dtype, cc: tuple[int, int] | None, simulated: bool) -> str:
    """What `path` means for `dtype` inputs on a device of compute capability `cc` (a pure function): "auto"
    is wgmma_tma on cc 9.0, portable elsewhere and under the simulator; an explicit path that cannot run there
    (wgmma and wgmma_tma: cc 9.0 only) raises ValueError naming what it needs."""
    if path not in PATHS:
        raise ValueError(f"path: {path!r} is not a linear path; allowed: {', '.join(PATHS)}")
    if path == "auto":
        return "wgmma_tma" if not simulated and wgmma.supported(cc) else "portable"
    if path in WGMMA_PATHS:
        _gemm_select(path=path, dtype=dtype, cc=cc, simulated=simulated)  # its error names what it needs
    return path


def shape_path(path: str, n: int, k: int) -> str:
    """`path` after the wgmma tiles' shape rule (K and N multiples of 8; device allocations are aligned)."""
    return "portable" if path in WGMMA_PATHS and not wgmma.fits(1, n, k, ()) else path


def explain(*, n: int, k: int, cc: tuple[int, int] | None, simulated: bool) -> Choice:
    """What "auto" runs for rows of K = `k` into N = `n` outputs on a device of compute capability `cc`, and
    why (a pure function)."""
    if simulated:
        return Choice("portable", "simulated", "the CUDA simulator runs the portable kernel")
    where = f"cc {cc[0]}.{cc[1]}" if cc is not None else "no compute capability"
    path = select_path(path="auto", dtype=F16, cc=cc, simulated=False)
    if path in WGMMA_PATHS:
        if shape_path(path, n, k) == path:
            why = f"{where}: Hopper TMA loads, warpgroup tensor cores (sm_90a), activation in the epilogue"
            return Choice(path, "primary", why)
        why = f"N={n}, K={k}: not multiples of 8, which the Hopper tiles need; the portable CUDA-core kernel"
        return Choice("portable", "fallback", why)
    why = f"linear's tensor-core kernels are the Hopper tiles (cc 9.0 only); this is {where}: portable kernel"
    return Choice(path, "fallback", why)


@cache
def _portable(has_bias: bool, act: str, dt: np.dtype) -> Any:
    t = "uint16" if dt == BF16 else "float16"  # bf16 as its words (kernels.primitives.bf16)
    sig = f"void({t}[:, ::1], {t}[:, ::1], {t}[::1], {t}[:, ::1], int64, int64, int64)"
    return kernel(portable.make_linear_kernel(has_bias, act, dt == BF16), sig)


_RESOLVED: dict[tuple[int, str, np.dtype], str] = {}  # by context: its device's compute capability decides


def _resolve(path: str, dt: np.dtype) -> str:
    return resolved_on_device(_RESOLVED, select_path, path, dt)


def linear(
    x: Any,
    weight: Any,
    bias: Any = None,
    out: Any = None,
    *,
    activation: str = "none",
    path: str = "auto",
    stream: int = 0,
) -> Any:
    """out = activation(x @ weight.T (+ bias)) in one kernel; weight [N, K] as torch's Linear holds it.
    Returns `out` (a new device array when None; numpy when the inputs are numpy)."""
    if (
        out is not None
    ):  # hot path: a layout validated before, new pointers (kernels.runtime.launch.FastCache)
        objs = (x, weight, out) if bias is None else (x, weight, out, bias)
        hit, ptrs = _FAST.find(objs, (activation, path))
        if hit is not None:
            hit.launch(ptrs, stream)
            return out
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: {activation!r} is not supported; allowed: {', '.join(ACTIVATIONS)}")
    sync = HostSync()
    xo = arrays.operand("x", x, sync)
    wo = arrays.operand("weight", weight, sync)
    arrays.check_dtype(xo, DTYPES)
    arrays.check_ndim(xo, (2, 3))
    arrays.check_nonempty(xo)
    arrays.check_contiguous(xo)
    arrays.check_same_dtype(wo, xo)
    arrays.check_ndim(wo, (2,))
    arrays.check_nonempty(wo)
    arrays.check_contiguous(wo)
    k = xo.shape[-1]
    n = wo.shape[0]
    if wo.shape[1] != k:
        raise ValueError(
            f"weight: shape {wo.shape} does not match x's last dimension {k}; expected ({n}, {k})"
        )
    bo = None
    if bias is not None:
        bo = arrays.operand("bias", bias, sync)
        arrays.check_same_dtype(bo, xo)
        arrays.check_shape(bo, (n,), "weight's rows")
        arrays.check_contiguous(bo)
    resolved = _resolve(path, xo.dtype)
    oo = arrays.output("out", out, sync, (*xo.shape[:-1], n), xo.dtype)
    ops = (xo, wo, oo) if bo is None else (xo, wo, oo, bo)
    rules = _OVERLAPS if bo is None else _OVERLAPS_BIAS
    arrays.check_overlaps(ops, rules)
    m = xo.size // k
    x2, o2 = xo.reshaped((m, k)), oo.reshaped((m, n))
    addrs = (x2.ptr, wo.ptr, o2.ptr) + ((bo.ptr,) if bo is not None else ())
    device = out is not None and not SIMULATED and all(a.host is None for a in (xo, wo, oo))
    keep = device and (bo is None or bo.host is None)
    objs = (x, weight, out) if bias is None else (x, weight, out, bias)
    if resolved in WGMMA_PATHS and wgmma.fits(m, n, k, addrs):
        key = wgmma.key_of(xo.dtype, True, bo is not None, False, bt=True, act=activation)
        # FastCache pointers come in (x, weight, out[, bias]) order: gemm's (a, b, out[, res][, bias])
        hop = run_hopper(a=x2.ptr, b=wo.ptr, bias=bo.ptr if bo else 0, res=0, out=o2.ptr, m=m, n=n, k=k,
                         key=key, path=resolved, stream=stream, replay=keep)  # fmt: skip
        if hop is not None:
            _FAST.store(objs, (activation, path), OverlapGuard.over(hop, ops, rules))
    else:
        kern = _portable(bo is not None, activation, xo.dtype)
        pt = portable.PT
        grid, block = ((n + pt - 1) // pt, (m + pt - 1) // pt), (pt, pt)
        bias_op = bo if bo is not None else _placeholder_1d(xo.dtype)
        args = (x2, wo, bias_op, o2, m, n, k)
        kern.launch(grid, block, args, stream=stream)
        if keep:
            go = kern.bind(grid, block, args).launch
            ph = bias_op.ptr
            rep: Any = (
                _Replay(lambda p, s=0: go((p[0], p[1], p[3], p[2]), s))
                if bo is not None
                else _Replay(lambda p, s=0: go((p[0], p[1], ph, p[2]), s))
            )
            _FAST.store(objs, (activation, path), OverlapGuard.over(rep, ops, rules))
    return arrays.finish(sync, oo, out, xo)


class _Replay:
    """A validated portable launch replayed with new pointers, given in the FastCache key's order."""

    __slots__ = ("launch",)

    def __init__(self, fn: Any) -> None:
        self.launch = fn


# aliasing, over the operands (x, weight, out[, bias]) in the FastCache key's order: out overlaps none of
# them (kernels.runtime.arrays.Overlap; gemm's rules, the bias read by every tile)
_OVERLAPS: tuple[arrays.Overlap, ...] = GEMM_OVERLAPS
_OVERLAPS_BIAS: tuple[arrays.Overlap, ...] = (*GEMM_OVERLAPS, (2, 3, False, "every tile reads the bias"))
_FAST = FastCache()  # validated linear launches by operand layout, activation and path


# --- registry ----------------------------------------------------------------------------------------------


def reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, activation: str) -> np.ndarray:
    """The float64 result: act(x @ w.T + bias), the activations in the same algebraic form as the kernels."""
    y = x.reshape(-1, x.shape[-1]).astype(np.float64) @ w.astype(np.float64).T
    if bias is not None:
        y = y + bias.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if activation == "silu":
            y = y / (1.0 + np.exp(-y))
        elif activation == "gelu_tanh":
            y = y / (1.0 + np.exp(-2.0 * np.sqrt(2.0 / np.pi) * (y + 0.044715 * y**3)))
    out: np.ndarray = y.reshape(*x.shape[:-1], w.shape[0])
    return out


def _act(c: Case) -> str:
    return ACTIVATIONS[c.params.get("act", 0)]


def _make_problem(case: Case, rng: np.random.Generator) -> Problem:
    b, s, k, n = (case.params[p] for p in ("B", "S", "K", "N"))
    dt = np.dtype(case.dtype)
    x = rng.standard_normal((b, s, k)).astype(dt)
    if case.params.get(SPECIALS):
        x = poison(x, case.params[SPECIALS])
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(dt)  # y ~ N(0, 1): the activations' curved part
    inputs = {"x": x, "weight": w}
    bias = None
    if case.params.get("bias", 0):
        bias = (0.5 * rng.standard_normal(n)).astype(dt)
        inputs["bias"] = bias
    return Problem(
        inputs=inputs,
        outputs={"out": ((b, s, n), dt)},
        reference={"out": reference(x, w, bias, _act(case))},
        scalars={"activation": _act(case)},
    )


def _spec_launch(a: dict[str, Any]) -> None:
    linear(a["x"], a["weight"], a.get("bias"), a["out"], activation=a["activation"])


def _cupy(a: dict[str, Any]) -> None:
    import cupy as cp

    # the unfused baseline: cuBLAS x @ W.T (+ bias), then the activation as separate CuPy kernels
    x = a["x"].reshape(-1, a["x"].shape[-1])
    y = cp.matmul(x, a["weight"].T).astype(cp.float32)
    if a.get("bias") is not None:
        y += a["bias"]
    if a["activation"] == "silu":
        y = y / (1 + cp.exp(-y))
    elif a["activation"] == "gelu_tanh":
        y = y / (1 + cp.exp(-2 * np.sqrt(2 / np.pi) * (y + 0.044715 * y**3)))
    a["out"][...] = y.reshape(a["out"].shape)


def _mnk(c: Case) -> tuple[int, int, int]:
    return c.params["B"] * c.params["S"], c.params["N"], c.params["K"]


def _flops(c: Case) -> float:
    m, n, k = _mnk(c)
    epi = (1 if c.params.get("bias", 0) else 0) + {"none": 0, "silu": 4, "gelu_tanh": 9}[_act(c)]
    return 2.0 * m * n * k + float(epi) * m * n


def _bytes(c: Case) -> float:
    m, n, k = _mnk(c)
    elems = m * k + n * k + m * n + (n if c.params.get("bias", 0) else 0)
    return float(elems * np.dtype(c.dtype).itemsize)


def path_for(case: Case) -> str:
    """The path "auto" takes for `case` on this machine (reported by verify/bench)."""
    return shape_path(_resolve("auto", np.dtype(case.dtype)), case.params["N"], case.params["K"])


def choose_for(case: Case) -> Choice:
    cc = None if SIMULATED else compute_capability()
    return explain(n=case.params["N"], k=case.params["K"], cc=cc, simulated=SIMULATED)


def _cases(shapes: list[tuple[str, int, int, int, int, int, str]], **extra: int) -> tuple[Case, ...]:
    return tuple(
        Case(
            label, {"B": b, "S": s, "K": k, "N": n, "bias": bias, "act": ACTIVATIONS.index(act), **extra}, dt
        )
        for label, b, s, k, n, bias, act in shapes
        for dt in ("float16", "bfloat16")
    )


def ptx_kernels() -> tuple[tuple[Any, ...], ...]:
    """Offline-PTX entries: the SiLU bench case's kernels on the TMA tile (auto's) and on the cp.async tile
    (where no tensor maps can be made), sm_90a only (the 5th item; the other epilogues differ from them in
    one or two epilogue lines), and the portable kernel every other GPU runs."""
    out: list[tuple[Any, ...]] = []
    for dt, tag in ((F16, "float16"), (BF16, "bfloat16")):
        key = wgmma.key_of(dt, True, False, False, bt=True, act="silu")
        out.append((f"linear_wgmma_tma_sm90a_{tag}", wgmma_tma.dispatcher(key), wgmma_tma.KERNEL_SIG,
                    (wgmma_tma.CU_FILE,), wgmma_tma.ARCH))  # fmt: skip
        out.append((f"linear_wgmma_sm90a_{tag}", wgmma.dispatcher(key), wgmma.KERNEL_SIG, (wgmma.CU_FILE,),
                    wgmma.ARCH))  # fmt: skip
        pk = _portable(False, "silu", dt)
        out.append((f"linear_portable_silu_{tag}", pk.dispatcher, pk.sig))
    return tuple(out)


SPEC = register(
    OpSpec(
        name="linear",
        dtypes=("float16", "bfloat16"),
        make_problem=_make_problem,
        launch=_spec_launch,
        flops=_flops,
        bytes=_bytes,
        # one rounding of an fp32-accumulated result: fp16 2^-11, bf16 2^-8 relative per element at most
        tolerance={"float16": 1e-3, "bfloat16": 8e-3},
        elem_tolerance={"float16": 2e-3, "bfloat16": 8e-3},
        sim_cases=_cases(
            [
                ("tiny-odd+bias-silu", 2, 5, 17, 23, 1, "silu"),
                ("tiny-gelu", 1, 9, 24, 16, 0, "gelu_tanh"),
                ("tiny", 1, 3, 8, 8, 0, "none"),
            ]
        ),
        # odd: the portable fallback on a GPU; edge8: wgmma with zero-filled tile edges; mlp: a Llama-like
        # MLP projection at 1/16 of the bench shape
        verify_cases=_cases(
            [
                ("odd+bias-silu", 2, 37, 67, 129, 1, "silu"),
                ("edge8-gelu", 3, 67, 136, 200, 0, "gelu_tanh"),
                ("edge8+bias", 1, 200, 264, 392, 1, "none"),
                ("mlp-silu", 1, 256, 1024, 896, 0, "silu"),
            ]
        ),
        # rows 0, M/2, M-1 of x: NaN, +inf, -inf
        special_cases=_cases([("specials+bias-silu", 1, 24, 32, 40, 1, "silu")], **{SPECIALS: 1}),
        # Llama-3-8B's MLP gate / up projection over 4096 tokens, with and without the fused SiLU
        bench_cases=_cases(
            [
                ("4096x14336x4096-silu", 1, 4096, 4096, 14336, 0, "silu"),
                ("4096x14336x4096", 1, 4096, 4096, 14336, 0, "none"),
            ]
        ),
        cupy=_cupy,
        bound="compute",
        path=path_for,
        choose=choose_for,
        ptx_kernels=() if SIMULATED else ptx_kernels(),
    )
)
