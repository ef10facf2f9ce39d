"""Warp-specialized TMA + wgmma GEMM through numba-cuda (lab): a numba kernel of 384 threads around the linked
CUDA C in kernels/ops/gemm/wgmma_tma.cu (the product's copy of this lab's kernel, the one source of both).

C[M, N] = A[M, K] @ B (+ R), bf16 / fp16 in, fp32 accumulation, fp32 or 16-bit out; B [K, N] ("nn") or [N, K]
("nt"). sm_90a only. Host side: two CUtensorMaps per (A, B) pair, encoded by cuTensorMapEncodeTiled through
ctypes on libcuda, copied into one 256-byte device buffer whose address is the kernel's first argument (numba
cannot pass a __grid_constant__ CUtensorMap). The maps are cached per (pointers, shape, layout, tile): a new
operand address costs one encode and one small host->device copy.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from numba import cuda

CU_FILE = Path(__file__).resolve().parents[2] / "kernels" / "ops" / "gemm" / "wgmma_tma.cu"
DEVICE_SIG = "int32(int64, int64, int64, int64, int64, int64, int64)"
KERNEL_SIG = "void(int64, int64, int64, int64, int64, int64, int64)"  # maps, c, bias, res, m, n, k
THREADS = 384
BM = 128
BK = 64
_MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_SMEM_LIMIT = 227 * 1024
DTYPES = ("bf16", "f16")
# cuda.h enums (CUDA 13.0 header, checked)
_DT_F16, _DT_BF16 = 6, 9
_SWIZZLE_128B = 3
_L2_PROMO_256B = 3
_OOB_ZERO = 0


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
    dtype: str = "bf16"
    out16: bool = False
    layout: str = "nn"
    res: bool = False
    bn: int = 256
    stages: int = 4
    persist: bool = False
    group_m: int = 8
    prod_regs: int = 40
    cons_regs: int = 232
    cluster: int = 1  # 2: 2-CTA clusters along M, B multicast (nn, non-persistent only)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r}")
        if self.layout not in ("nn", "nt"):
            raise ValueError(f"layout {self.layout!r}")
        if self.bn not in (128, 256):
            raise ValueError(f"bn {self.bn}")
        if self.cluster not in (1, 2) or (self.cluster == 2 and (self.layout != "nn" or self.persist)):
            raise ValueError(f"cluster {self.cluster}: 1, or 2 with layout nn and no persist")
        if self.smem_bytes > _SMEM_LIMIT:
            raise ValueError(f"{self.tag}: {self.smem_bytes} B of shared memory > {_SMEM_LIMIT}")

    @property
    def stage_bytes(self) -> int:
        return (BM * BK + BK * self.bn) * 2

    @property
    def smem_bytes(self) -> int:
        # stages, 2 mbarriers per stage, 1 KB to align the first stage to 1024 bytes
        return self.stages * self.stage_bytes + 16 * self.stages + 1024

    @property
    def tag(self) -> str:
        out = "o16" if self.out16 else "o32"
        res = "_res" if self.res else ""
        p = ("_p" if self.persist else "") + ("_c2" if self.cluster == 2 else "")
        regs = "" if (self.prod_regs, self.cons_regs) == (40, 232) else f"_r{self.prod_regs}-{self.cons_regs}"
        return f"ws_{self.dtype}_{out}_{self.layout}{res}_n{self.bn}_s{self.stages}{p}_g{self.group_m}{regs}"

    @property
    def name(self) -> str:
        return f"wsgemm_{self.tag}"

    def tiles(self, m: int, n: int) -> int:
        bm = BM * self.cluster  # a cluster takes 256 rows
        return ((m + bm - 1) // bm) * ((n + self.bn - 1) // self.bn)

    def grid(self, m: int, n: int, sms: int) -> int:
        t = self.tiles(m, n)
        return max(1, min(t, sms)) if self.persist else t * self.cluster

    def defines(self) -> str:
        d = {
            "WS_BN": self.bn,
            "WS_STAGES": self.stages,
            "WS_DT": 0 if self.dtype == "bf16" else 1,
            "WS_OUT": int(self.out16),
            "WS_BT": int(self.layout == "nt"),
            "WS_RES": int(self.res),
            "WS_PERSIST": int(self.persist),
            "WS_GROUP_M": self.group_m,
            "WS_PROD_REGS": self.prod_regs,
            "WS_CONS_REGS": self.cons_regs,
            "WS_CLUSTER": self.cluster,
            "WS_NAME": self.name,
        }
        return "".join(f"#define {k} {v}\n" for k, v in d.items())


def source(v: Variant) -> str:
    from kernels.ops.gemm.wgmma import cu_text  # the wgmma wrappers spliced in (wgmma_ops.cuh)

    return v.defines() + cu_text(CU_FILE)


@cache
def available() -> bool:
    if cuda.config.ENABLE_CUDASIM or not cuda.is_available():
        return False
    return tuple(cuda.get_current_device().compute_capability) == (9, 0)


def device_function(v: Variant) -> Any:
    return cuda.declare_device(v.name, DEVICE_SIG, link=[cuda.CUSource(source(v), name=f"{v.name}.cu")])


def py_kernel(fn: Any) -> Any:
    def ws_tile(tm, c, bias, r, m, n, k):  # type: ignore[no-untyped-def]
        fn(tm, c, bias, r, m, n, k)

    return ws_tile


@cache
def _libcuda() -> ctypes.CDLL:
    drv = ctypes.CDLL("libcuda.so.1")
    drv.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    drv.cuFuncSetAttribute.restype = ctypes.c_int
    drv.cuTensorMapEncodeTiled.argtypes = [
        ctypes.c_void_p,  # CUtensorMap*
        ctypes.c_int,  # data type
        ctypes.c_uint32,  # rank
        ctypes.c_void_p,  # global address
        ctypes.POINTER(ctypes.c_uint64),  # globalDim[rank]
        ctypes.POINTER(ctypes.c_uint64),  # globalStrides[rank - 1] (bytes)
        ctypes.POINTER(ctypes.c_uint32),  # boxDim[rank]
        ctypes.POINTER(ctypes.c_uint32),  # elementStrides[rank]
        ctypes.c_int,  # interleave
        ctypes.c_int,  # swizzle
        ctypes.c_int,  # l2 promotion
        ctypes.c_int,  # oob fill
    ]
    drv.cuTensorMapEncodeTiled.restype = ctypes.c_int
    return drv


@cache
def sm_count() -> int:
    return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)


def _cufunc(kern: Any) -> int:
    handle = int(kern._codelibrary.get_cufunc().handle)
    func = ctypes.c_void_p()
    rc = _libcuda().cuKernelGetFunction(ctypes.byref(func), ctypes.c_void_p(handle))
    return int(func.value) if rc == 0 and func.value else handle


@cache
def _kernel(v: Variant) -> tuple[Any, Any]:
    if not available():
        raise RuntimeError("the ws kernels need a cc 9.0 (sm_90a) GPU")
    disp = cuda.jit(launch_bounds=(THREADS, 1))(py_kernel(device_function(v)))
    kern = disp.compile(KERNEL_SIG)
    rc = _libcuda().cuFuncSetAttribute(ctypes.c_void_p(_cufunc(kern)), _MAX_DYNAMIC_SHARED, v.smem_bytes)
    if rc != 0:
        raise RuntimeError(f"cuFuncSetAttribute(max dynamic shared = {v.smem_bytes} B): CUresult {rc}")
    return disp, kern


class _AttrValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("align", ctypes.c_void_p), ("dims", ctypes.c_uint * 3)]


class _LaunchAttr(ctypes.Structure):  # CUlaunchAttribute: id, 4 bytes of padding, a 64-byte union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _AttrValue)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig (cuda.h 13.0)
    _fields_ = [
        ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_LaunchAttr)), ("numAttrs", ctypes.c_uint),
    ]  # fmt: skip


assert ctypes.sizeof(_LaunchAttr) == 72 and ctypes.sizeof(_LaunchConfig) == 56
_CLUSTER_DIMENSION = 4  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION


@cache
def _cluster_func(v: Variant) -> ctypes.c_void_p:
    drv = _libcuda()
    drv.cuLaunchKernelEx.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    drv.cuLaunchKernelEx.restype = ctypes.c_int
    return ctypes.c_void_p(_cufunc(_kernel(v)[1]))


def launch_cluster(v: Variant, grid: int, args: tuple[int, ...], stream: int = 0) -> None:
    """cuLaunchKernelEx with a (v.cluster, 1, 1) cluster on numba's CUfunction. The numba kernel's parameters
    are its seven int64 arguments, 8 bytes each (kernels/runtime/launch.py's ABI notes)."""
    func = _cluster_func(v)
    vals = [ctypes.c_int64(a) for a in args]
    params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.pointer(x), ctypes.c_void_p) for x in vals])
    attr = _LaunchAttr()
    attr.id = _CLUSTER_DIMENSION
    attr.value.dims[0], attr.value.dims[1], attr.value.dims[2] = v.cluster, 1, 1
    cfg = _LaunchConfig(grid, 1, 1, THREADS, 1, 1, v.smem_bytes, ctypes.c_void_p(stream or None),
                        ctypes.pointer(attr), 1)  # fmt: skip
    rc = _libcuda().cuLaunchKernelEx(ctypes.byref(cfg), func, params, None)
    if rc != 0:
        raise RuntimeError(f"cuLaunchKernelEx (cluster {v.cluster}, grid {grid}) failed: CUresult {rc}")


def compiled(v: Variant) -> Any:
    return _kernel(v)[1]


def encode_2d(ptr: int, dtype: str, inner: int, outer: int, box_inner: int, box_outer: int) -> bytes:
    """A 2-d tiled CUtensorMap (128 bytes) of a row-major [outer, inner] 16-bit array at `ptr`, boxes of
    box_outer rows x box_inner elements (box_inner * 2 == 128 bytes: the 128-byte swizzle span), zero fill
    out of range."""
    buf = (ctypes.c_uint64 * 16)()  # 128 bytes; ctypes aligns to 8, the driver needs 64: use an aligned copy
    raw = ctypes.create_string_buffer(128 + 64)
    addr = (ctypes.addressof(raw) + 63) & ~63
    dims = (ctypes.c_uint64 * 2)(inner, outer)
    strides = (ctypes.c_uint64 * 1)(inner * 2)
    box = (ctypes.c_uint32 * 2)(box_inner, box_outer)
    estr = (ctypes.c_uint32 * 2)(1, 1)
    rc = _libcuda().cuTensorMapEncodeTiled(
        ctypes.c_void_p(addr),
        _DT_BF16 if dtype == "bf16" else _DT_F16,
        2,
        ctypes.c_void_p(ptr),
        dims,
        strides,
        box,
        estr,
        0,
        _SWIZZLE_128B,
        _L2_PROMO_256B,
        _OOB_ZERO,
    )
    if rc != 0:
        raise RuntimeError(
            f"cuTensorMapEncodeTiled(ptr {ptr:#x}, dims {inner}x{outer}, box {box_inner}x{box_outer}): CUresult {rc}"
        )
    ctypes.memmove(buf, addr, 128)
    return bytes(buf)


_TMAPS: dict[tuple[Any, ...], Any] = {}


def tensor_maps(v: Variant, a_ptr: int, b_ptr: int, m: int, n: int, k: int) -> Any:
    """Device buffer of A's and B's tensor maps (A at +0, B at +128), cached."""
    key = (a_ptr, b_ptr, m, n, k, v.layout, v.dtype, v.bn)
    buf = _TMAPS.get(key)
    if buf is None:
        ta = encode_2d(a_ptr, v.dtype, k, m, BK, BM)  # A [M, K]: boxes of 128 rows x 64 k
        if v.layout == "nn":
            tb = encode_2d(b_ptr, v.dtype, n, k, 64, BK)  # B [K, N]: boxes of 64 k-rows x 64 n
        else:
            tb = encode_2d(b_ptr, v.dtype, k, n, BK, v.bn)  # B [N, K]: boxes of bn rows x 64 k
        host = np.frombuffer(ta + tb, dtype=np.uint8).copy()
        buf = cuda.to_device(host)  # numba allocations are >= 256-byte aligned
        cuda.synchronize()
        _TMAPS[key] = buf
    return buf


def _ptr(x: Any) -> int:
    return int(x.__cuda_array_interface__["data"][0])


def gemm(*, a: Any, b: Any, out: Any, res: Any = None, variant: Variant, stream: int = 0) -> None:
    """out = a @ b (+ res) with the tile `variant` (its dtype / layout / out16 / res must fit the operands).
    a [M, K]; b [K, N] (nn) or [N, K] (nt); out [M, N] fp32 or 16-bit; all C-contiguous, 16-byte aligned."""
    v = variant
    m, k = a.shape
    if v.layout == "nn":
        kb, n = b.shape
    else:
        n, kb = b.shape
    if kb != k or tuple(out.shape) != (m, n):
        raise ValueError(f"shapes a {a.shape} b {b.shape} out {out.shape} ({v.layout})")
    if k % 8 or n % 8 or k == 0:
        raise ValueError(f"K={k}, N={n}: both must be positive multiples of 8")
    if (res is not None) != v.res:
        raise ValueError(f"variant {v.tag}: res given {res is not None}")
    if (np.dtype(out.dtype).itemsize == 2) != v.out16:
        raise ValueError(f"variant {v.tag}: out dtype {out.dtype}")
    ptrs = [_ptr(a), _ptr(b), _ptr(out)] + ([_ptr(res)] if res is not None else [])
    if any(p % 16 for p in ptrs):
        raise ValueError("every base address must be 16-byte aligned")
    if m == 0 or n == 0:
        return
    disp, _ = _kernel(v)
    tm = tensor_maps(v, ptrs[0], ptrs[1], m, n, k)
    r = ptrs[3] if res is not None else 0
    if v.cluster > 1:
        launch_cluster(v, v.grid(m, n, sm_count()), (_ptr(tm), ptrs[2], 0, r, m, n, k), stream)
    else:
        disp[v.grid(m, n, sm_count()), THREADS, stream, v.smem_bytes](_ptr(tm), ptrs[2], 0, r, m, n, k)
