"""Hopper wgmma GEMM through numba-cuda: a thin numba kernel around the linked CUDA C tile in gemm_wgmma.cu.

C[M, N] = A[M, K] @ B (+ R) with bf16 or fp16 A and B, fp32 accumulation, fp32 or 16-bit output; B is
[K, N] ("nn") or [N, K] ("nt", a torch Linear weight). sm_90a only: `available()` is False anywhere else,
and nothing here compiles or loads the kernel on another architecture.

The CUDA C is compiled by NVRTC and linked with LTO (numba's default when nvJitLink is present); numba-cuda
targets sm_90a on a cc 9.0 device, which wgmma needs. Pointers cross as int64 device addresses. The tile
needs more than numba's 48 KB of static shared memory: it uses dynamic shared memory, and the launcher
raises the function's limit through the driver (cuFuncSetAttribute), which numba does not expose.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from numba import cuda

CU_FILE = Path(__file__).with_name("gemm_wgmma.cu")
DEVICE_SIG = "int32(int64, int64, int64, int64, int64, int64, int64)"
KERNEL_SIG = "void(int64, int64, int64, int64, int64, int64, int64)"
THREADS = 256
BM = 128
_MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
DTYPES = ("bf16", "f16")


def bf16_dtype() -> np.dtype[Any]:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def np_dtype(name: str) -> np.dtype[Any]:
    if name == "bf16":
        return bf16_dtype()
    if name == "f16":
        return np.dtype(np.float16)
    raise ValueError(f"dtype {name!r}: expected one of {DTYPES}")


@dataclass(frozen=True)
class Variant:
    """One compiled kernel: input type, output in the input type (`out16`) or fp32, B layout ("nn": [K, N],
    "nt": [N, K]), residual epilogue, and the tile: 128 x `bn` per block, `stages` K-slices of 64 in shared
    memory, `inflight` wgmma groups left running across the loop barrier, `group_m` tile-rows per L2 group."""

    dtype: str = "bf16"
    out16: bool = False
    layout: str = "nn"
    res: bool = False
    bn: int = 256
    stages: int = 4
    inflight: int = 1
    group_m: int = 8
    swap_nn: bool = False  # diagnostic: the N-major B descriptor with LBO / SBO exchanged

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r}: expected one of {DTYPES}")
        if self.layout not in ("nn", "nt"):
            raise ValueError(f"layout {self.layout!r}: expected 'nn' ([K, N]) or 'nt' ([N, K])")
        if self.bn not in (128, 256):
            raise ValueError(f"bn {self.bn}: expected 128 or 256")
        if self.inflight not in (0, 1) or self.stages - 1 - self.inflight < 1:
            raise ValueError(
                f"stages {self.stages} / inflight {self.inflight}: need stages - 1 - inflight >= 1"
            )
        if self.smem_bytes > 227 * 1024:
            raise ValueError(f"{self.tag}: {self.smem_bytes} B of shared memory, the block limit is 227 KB")

    @property
    def stage_bytes(self) -> int:
        return (BM * 64 + 64 * self.bn) * 2

    @property
    def smem_bytes(self) -> int:
        return self.stages * self.stage_bytes + 1024  # 1 KB to align the first stage to 1024 bytes

    @property
    def tag(self) -> str:
        out = "o16" if self.out16 else "o32"
        res = "_res" if self.res else ""
        tile = f"n{self.bn}_s{self.stages}_i{self.inflight}_g{self.group_m}"
        return f"{self.dtype}_{out}_{self.layout}{res}_{tile}" + ("_swapnn" if self.swap_nn else "")

    @property
    def name(self) -> str:
        return f"wg_gemm_{self.tag}"

    def grid(self, m: int, n: int) -> int:
        return ((m + BM - 1) // BM) * ((n + self.bn - 1) // self.bn)

    def defines(self) -> str:
        d = {
            "WG_BN": self.bn,
            "WG_STAGES": self.stages,
            "WG_INFLIGHT": self.inflight,
            "WG_DT": 0 if self.dtype == "bf16" else 1,
            "WG_OUT": int(self.out16),
            "WG_BT": int(self.layout == "nt"),
            "WG_RES": int(self.res),
            "WG_GROUP_M": self.group_m,
            "WG_SWAP_NN": int(self.swap_nn),
            "WG_NAME": self.name,
        }
        return "".join(f"#define {k} {v}\n" for k, v in d.items())


def source(v: Variant) -> str:
    return v.defines() + CU_FILE.read_text()


@cache
def available() -> bool:
    """wgmma needs sm_90a: a real cc 9.0 device (numba-cuda then compiles for sm_90a), no simulator."""
    if cuda.config.ENABLE_CUDASIM or not cuda.is_available():
        return False
    return tuple(cuda.get_current_device().compute_capability) == (9, 0)


def device_function(v: Variant) -> Any:
    return cuda.declare_device(v.name, DEVICE_SIG, link=[cuda.CUSource(source(v), name=f"{v.name}.cu")])


def py_kernel(fn: Any) -> Any:
    """The Python kernel body around device function `fn` (compiled by numba, or offline by build_check)."""

    def wgmma_tile(a, b, c, r, m, n, k):  # type: ignore[no-untyped-def]
        fn(a, b, c, r, m, n, k)

    return wgmma_tile


@cache
def _kernel(v: Variant) -> tuple[Any, Any]:
    if not available():
        raise RuntimeError("the wgmma kernels need a cc 9.0 (sm_90a) GPU; use the mma.sync path elsewhere")
    disp = cuda.jit(launch_bounds=(THREADS, 1))(py_kernel(device_function(v)))
    kern = disp.compile(KERNEL_SIG)
    _allow_dynamic_smem(_cufunc(kern), v.smem_bytes)
    return disp, kern


@cache
def _libcuda() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def _cufunc(kern: Any) -> int:
    """The CUfunction of a compiled kernel (numba's handle may be a CUkernel of the library API)."""
    handle = int(kern._codelibrary.get_cufunc().handle)
    func = ctypes.c_void_p()
    rc = _libcuda().cuKernelGetFunction(ctypes.byref(func), ctypes.c_void_p(handle))
    return int(func.value) if rc == 0 and func.value else handle


def _allow_dynamic_smem(func: int, nbytes: int) -> None:
    drv = _libcuda()
    drv.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    rc = drv.cuFuncSetAttribute(ctypes.c_void_p(func), _MAX_DYNAMIC_SHARED, nbytes)
    if rc != 0:
        raise RuntimeError(f"cuFuncSetAttribute(max dynamic shared = {nbytes} B) failed with CUresult {rc}")


def compiled(v: Variant) -> Any:
    """numba's compiled kernel of `v` (for inspect_sass / registers)."""
    return _kernel(v)[1]


def _ptr(x: Any) -> int:
    return int(x.__cuda_array_interface__["data"][0])


def _dtype(x: Any) -> np.dtype[Any]:
    return np.dtype(x.dtype)


def gemm(
    *,
    a: Any,
    b: Any,
    out: Any,
    res: Any = None,
    layout: str = "nn",
    variant: Variant | None = None,
    stream: int = 0,
) -> None:
    """out = a @ b (+ res) on device arrays (numba device arrays, or any __cuda_array_interface__ object):
    a [M, K], b [K, N] ("nn") or [N, K] ("nt"), all C-contiguous, bf16 (ml_dtypes.bfloat16) or fp16;
    out [M, N] fp32 or the input type; res [M, N] of the input type. K and N must be multiples of 8 and every
    base address 16-byte aligned. `variant` fixes the tile (its dtype / layout / epilogue must match)."""
    dt = _dtype(a)
    name = {bf16_dtype(): "bf16", np.dtype(np.float16): "f16"}.get(dt)
    if name is None:
        raise TypeError(f"a: dtype {dt}, expected bfloat16 (ml_dtypes) or float16")
    if _dtype(b) != dt:
        raise TypeError(f"b: dtype {_dtype(b)}, expected a's {dt}")
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise ValueError(f"a {a.shape}, b {b.shape}: expected 2-d arrays")
    m, k = a.shape
    if layout == "nn":
        kb, n = b.shape
    elif layout == "nt":
        n, kb = b.shape
    else:
        raise ValueError(f"layout {layout!r}: expected 'nn' or 'nt'")
    if kb != k:
        raise ValueError(f"b {b.shape}: its K is {kb}, a's is {k} (layout {layout})")
    if tuple(out.shape) != (m, n):
        raise ValueError(f"out {out.shape}: expected {(m, n)}")
    od = _dtype(out)
    if od not in (np.dtype(np.float32), dt):
        raise TypeError(f"out: dtype {od}, expected float32 or {dt}")
    if res is not None and (tuple(res.shape) != (m, n) or _dtype(res) != dt):
        raise ValueError(f"res {res.shape} {_dtype(res)}: expected {(m, n)} {dt}")
    if k % 8 or n % 8:
        raise ValueError(f"K={k}, N={n}: both must be multiples of 8 (16-byte rows)")
    ptrs = [_ptr(a), _ptr(b), _ptr(out)] + ([_ptr(res)] if res is not None else [])
    if any(p % 16 for p in ptrs):
        raise ValueError("a, b, out, res: every base address must be 16-byte aligned")
    want = dict(dtype=name, out16=od == dt, layout=layout, res=res is not None)
    if variant is None:
        variant = Variant(**want)  # type: ignore[arg-type]
    elif {f: getattr(variant, f) for f in want} != want:
        raise ValueError(f"variant {variant.tag} does not fit these operands ({want})")
    if m == 0 or n == 0:
        return
    disp, _ = _kernel(variant)
    r = _ptr(res) if res is not None else 0
    disp[variant.grid(m, n), THREADS, stream, variant.smem_bytes](ptrs[0], ptrs[1], ptrs[2], r, m, n, k)
