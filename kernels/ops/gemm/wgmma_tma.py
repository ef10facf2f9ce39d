"""Hopper's fastest gemm tile here: TMA loads, a producer warpgroup and two wgmma consumer warpgroups, a
persistent grid (wgmma_tma.cu).

C = act(A @ B (+ bias) (+ R)) with bf16 or fp16 A [M, K] and B [K, N] (or [N, K]: `wgmma.Key.bt`, linear's
torch weight), fp32 accumulation, fp32 output (gemm) or output in the input type (o_proj, linear): the
cp.async tile's epilogue (`wg_epilogue` of wgmma_epi.cuh, which both tiles splice in: bias, then R, then the
activation, then one rounding). A kernel is specialised to a `wgmma.Key`, as the cp.async tile's are: where
this tile has no tensor maps for the operands, the caller runs the cp.async kernel of the same key. sm_90a
code, so cc 9.0 only, as wgmma.py; `auto`'s tile for gemm, o_proj and linear there.

Measured (benchmarks/h100/README.md; an H100 80GB HBM3, 2026-12-05, medians interleaved with cuBLAS through
torch, every timed output checked against float64): 0.953x cuBLAS at 4096^3 (708 TF, bf16 in, fp32 out),
0.940x at 8192 x 2560 x 2560, fp16 0.954x; linear (NT, SiLU / GELU) 0.96-0.98x torch's F.linear +
activation; the cp.async tile 0.62-0.69x in the same runs. o_proj [16, 512, 2560] x [2560, 2560] with the
residual 1.004-1.012x cuBLAS's addmm (2026-12-06, `benchmarks/h100/2026-12-06/tenth/`) since the epilogue
reads each chunk's bias and R words before storing any (`wg_epilogue` of wgmma_epi.cuh, WS_EPI_J); 0.83-0.84x
before. The cp.async tile shares that epilogue since 2026-12-06 (o_proj on it 0.62x -> 0.72x addmm).

Tensor maps. TMA reads A and B through two CUtensorMaps (128 bytes each) that name their base addresses.
numba cannot pass a __grid_constant__ map, so the kernel takes the address of a 256-byte device buffer
holding both (A's at +0, B's at +128). `MapTable` keeps one such slot per (kernel key, A, B, shapes) in each
context (the maps depend on A, B, shapes, dtype and layout alone; a pair used under two epilogues takes two
slots, which keeps each key's first call a visible map write), written once and never freed or overwritten
while the process lives, so a kernel in flight (or a caller's CUDA graph that captured it) can never read a
map that changed under it. Its size is bounded (MAPS_PER_CONTEXT slots of 256 B): past it, for a pair whose
maps are not written yet while the caller's stream is being captured into a graph, and where a write fails,
the launch returns False and the caller runs the cp.async tile instead: slower, never wrong.
"""

from __future__ import annotations

import ctypes
import threading
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from numba import cuda
from numba.cuda.cudadrv.driver import CudaAPIError
from numba.cuda.cudadrv.error import CudaSupportError

from kernels.ops.gemm import wgmma
from kernels.runtime import launch as _launch
from kernels.runtime.launch import Kernel

CU_FILE = Path(__file__).with_name("wgmma_tma.cu")
_SIG = "int32(int64, int64, int64, int64, int64, int64, int64)"
KERNEL_SIG = "void(int64, int64, int64, int64, int64, int64, int64)"  # maps, c, bias, res, m, n, k
THREADS = 384  # 3 warpgroups: 1 producer, 2 consumers
BM, BN, BK = 128, 256, 64
STAGES = 4
GROUP_M = 8  # tile-rows walked before moving right (L2 reuse of B)
PROD_REGS, CONS_REGS = 40, 232  # setmaxnreg: 128 x 40 + 256 x 232 = 384 x 168, the register file at entry
# a mbarrier wait longer than this traps (a launch error instead of a hung GPU); no legitimate wait comes
# near it (the lab's 2 s caught bugs; 60 s leaves room for time-slicing with other processes)
TIMEOUT_NS = 60_000_000_000
ARCH = wgmma.ARCH
SMEM_BYTES = STAGES * (BM * BK + BK * BN) * 2 + 16 * STAGES + 1024  # stages, 2 mbarriers each, alignment
MAPS_PER_CONTEXT = 4096  # 1 MB of maps per context at most

# cuda.h (CUDA 12 / 13): CUtensorMapDataType, swizzle, L2 promotion, out-of-bounds fill
_DT_CODE = {"f16": 6, "bf16": 9}
_SWIZZLE_128B = 3
_L2_PROMOTION_256B = 3
_OOB_FILL_ZERO = 0


def name_of(key: wgmma.Key) -> str:
    return f"wgmma_tma_gemm_{key.tag}_n{BN}_s{STAGES}_g{GROUP_M}"


def source(key: wgmma.Key) -> str:
    """wgmma_tma.cu with the #defines of one kernel in front."""
    d = {
        "WS_BN": BN, "WS_STAGES": STAGES, "WS_DT": 0 if key.dtype == "bf16" else 1, "WS_OUT": int(key.out16),
        "WS_BT": int(key.bt), "WS_RES": int(key.res), "WS_BIAS": int(key.bias),
        "WS_ACT": wgmma.ACTIVATIONS.index(key.act), "WS_PERSIST": 1, "WS_GROUP_M": GROUP_M,
        "WS_PROD_REGS": PROD_REGS, "WS_CONS_REGS": CONS_REGS, "WS_CLUSTER": 1,
        "WS_TIMEOUT_NS": f"{TIMEOUT_NS}ull", "WS_NAME": name_of(key),
    }  # fmt: skip
    return "".join(f"#define {k} {v}\n" for k, v in d.items()) + wgmma.cu_text(CU_FILE)


def dispatcher(key: wgmma.Key) -> Any:
    """The numba kernel of `key`, uncompiled (compiling it needs the sm_90a target)."""
    name = name_of(key)
    fn = cuda.declare_device(name, _SIG, link=[cuda.CUSource(source(key), name=f"{name}.cu")])

    # launch_bounds (384, 1): ptxas then knows the register count at entry (65536 / 384 = 168) and honours
    # the warpgroups' setmaxnreg (without it: warning C7508 and no register reallocation)
    @cuda.jit(launch_bounds=(THREADS, 1))
    def wgmma_tma_tile(maps, c, bias, res, m, n, k):  # type: ignore[no-untyped-def]
        fn(maps, c, bias, res, m, n, k)

    return wgmma_tma_tile


def tiles(m: int, n: int) -> int:
    return ((m + BM - 1) // BM) * ((n + BN - 1) // BN)


def grid(m: int, n: int, sms: int) -> int:
    """Persistent: one block per SM at most (the tile's shared memory allows one), each walking its tiles."""
    return max(1, min(tiles(m, n), sms))


@cache
def _template(key: wgmma.Key) -> Kernel:
    return _launch.kernel(dispatcher(key), KERNEL_SIG, on_load=_launch.dynamic_smem(SMEM_BYTES))


def _kernel(key: wgmma.Key) -> Kernel:
    if not wgmma.available():
        raise RuntimeError(
            "wgmma_tma kernels need a cc 9.0 (sm_90a) GPU; this device is not one: gemm's auto path takes "
            "mma.sync or the portable kernel here"
        )
    return _template(key)


@cache
def _encoder() -> Any:
    """cuTensorMapEncodeTiled from the driver (its own CDLL handle: the argtypes set here are this
    function's alone)."""
    fn = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
    fn.argtypes = [
        ctypes.c_void_p,  # CUtensorMap* (64-byte aligned)
        ctypes.c_int,  # data type
        ctypes.c_uint32,  # rank
        ctypes.c_void_p,  # global address
        ctypes.POINTER(ctypes.c_uint64),  # globalDim[rank], innermost first
        ctypes.POINTER(ctypes.c_uint64),  # globalStrides[rank - 1], bytes
        ctypes.POINTER(ctypes.c_uint32),  # boxDim[rank]
        ctypes.POINTER(ctypes.c_uint32),  # elementStrides[rank]
        ctypes.c_int,  # interleave (none)
        ctypes.c_int,  # swizzle
        ctypes.c_int,  # L2 promotion
        ctypes.c_int,  # out-of-bounds fill
    ]
    fn.restype = ctypes.c_int
    return fn


def encode_2d(ptr: int, dtype: str, inner: int, outer: int, box_inner: int, box_outer: int) -> bytes:
    """The 128-byte CUtensorMap of a row-major [outer, inner] 16-bit array at `ptr`: boxes of `box_outer`
    rows x `box_inner` elements (box_inner x 2 = 128 bytes, the 128-byte swizzle's span), zeros out of range
    (so M, N and K need not be tile multiples)."""
    raw = ctypes.create_string_buffer(128 + 64)
    addr = (ctypes.addressof(raw) + 63) & ~63
    rc = _encoder()(
        ctypes.c_void_p(addr), _DT_CODE[dtype], 2, ctypes.c_void_p(ptr),
        (ctypes.c_uint64 * 2)(inner, outer), (ctypes.c_uint64 * 1)(inner * 2),
        (ctypes.c_uint32 * 2)(box_inner, box_outer), (ctypes.c_uint32 * 2)(1, 1),
        0, _SWIZZLE_128B, _L2_PROMOTION_256B, _OOB_FILL_ZERO,
    )  # fmt: skip
    if rc != 0:
        raise RuntimeError(
            f"cuTensorMapEncodeTiled(address {ptr:#x}, {inner} x {outer}, box {box_inner} x {box_outer}) "
            f"failed with CUresult {rc}"
        )
    return ctypes.string_at(addr, 128)


def maps_of(key: wgmma.Key, a: int, b: int, m: int, n: int, k: int) -> bytes:
    """A's and B's tensor maps, 256 bytes: A [M, K] in boxes of 128 rows x 64 k; NN B [K, N] in boxes of 64
    k-rows x 64 n (BN / 64 per stage), NT B [N, K] in boxes of BN rows x 64 k."""
    ta = encode_2d(a, key.dtype, k, m, BK, BM)
    tb = encode_2d(b, key.dtype, k, n, BK, BN) if key.bt else encode_2d(b, key.dtype, n, k, 64, BK)
    return ta + tb


MAP_BYTES = 256  # A's map at +0, B's at +128
_CU_STREAM_NON_BLOCKING = 1
_CU_STREAM_CAPTURE_MODE_RELAXED = 2


class MapTable:
    """The tensor maps of one context, by (key, A, B, M, N, K), in slots of one device slab (`size` x 256
    bytes, allocated on the first write). A slot is written once and never reused while the process lives
    (module docstring). `address` returns a slot's device address, or None where the caller must take the
    cp.async tile: the table is full, the caller's stream is being captured into a CUDA graph, or the write
    failed.

    The write is the one a library may make while another thread captures a graph: the thread's capture
    mode relaxed around it (cuThreadExchangeStreamCaptureMode), the copy on a private non-blocking stream
    (no implicit order with a capturing blocking stream), and a wait on that stream alone."""

    def __init__(self, size: int = MAPS_PER_CONTEXT) -> None:
        self.size = size
        self._slots: dict[tuple[Any, ...], int] = {}
        self._slab: Any = None  # numba device array, size x MAP_BYTES
        self._stream = ctypes.c_void_p()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._slots)

    def address(self, key: wgmma.Key, a: int, b: int, m: int, n: int, k: int, stream: Any = 0) -> int | None:
        entry = (key, a, b, m, n, k)
        hit = self._slots.get(entry)
        if hit is not None:
            return hit
        h = stream if type(stream) is int else _launch._stream_handle(stream)
        if h and _launch.capturing(ctypes.c_void_p(h)):
            return None  # the caller is recording a graph on this stream: nothing may run on it now
        with self._lock:
            hit = self._slots.get(entry)
            if hit is not None:
                return hit
            if len(self._slots) >= self.size:
                return None
            addr = self._write(len(self._slots), maps_of(key, a, b, m, n, k))
            if addr is not None:
                self._slots[entry] = addr
            return addr

    def _write(self, slot: int, maps: bytes) -> int | None:
        lib = _launch._driver()
        mode = ctypes.c_int(_CU_STREAM_CAPTURE_MODE_RELAXED)
        if lib.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode)) != 0:
            return None
        try:
            if self._slab is None:
                slab = cuda.device_array(self.size * MAP_BYTES, np.uint8)  # >= 256-byte aligned
                rc = lib.cuStreamCreate(ctypes.byref(self._stream), ctypes.c_uint(_CU_STREAM_NON_BLOCKING))
                if rc != 0:
                    return None
                self._slab = slab
            dst = int(self._slab.device_ctypes_pointer.value) + slot * MAP_BYTES
            src = ctypes.create_string_buffer(maps, MAP_BYTES)
            rc = lib.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(dst), src, ctypes.c_size_t(MAP_BYTES), self._stream)
            if rc == 0:
                rc = lib.cuStreamSynchronize(self._stream)  # the maps are on the device before any launch
            return dst if rc == 0 else None
        except (CudaAPIError, CudaSupportError):  # e.g. no memory for the slab: the cp.async tile runs
            return None
        finally:
            lib.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))  # the thread's own mode back


_TABLES: dict[int, MapTable] = {}
_TABLES_LOCK = threading.Lock()


def table(ctx: int | None = None) -> MapTable:
    """The current context's MapTable."""
    if ctx is None:
        ctx = _launch.context()
    t = _TABLES.get(ctx)
    if t is None:
        with _TABLES_LOCK:
            t = _TABLES.setdefault(ctx, MapTable())
    return t


def launch(*, a: int, b: int, bias: int, res: int, out: int, m: int, n: int, k: int, key: wgmma.Key,
           stream: Any = 0) -> bool:  # fmt: skip
    """One matmul on device addresses (bias / res = 0 when absent; `key` says which are read); the caller has
    checked `wgmma.fits`. False, and nothing launched, where the tile has no maps for these operands
    (`MapTable.address`): the caller runs the cp.async tile."""
    ctx = _launch.context()
    maps = table(ctx).address(key, a, b, m, n, k, stream)
    if maps is None:
        return False
    _kernel(key).launch(grid(m, n, _launch.sm_count(ctx)), THREADS, (maps, out, bias, res, m, n, k),
                        shared=SMEM_BYTES, stream=stream, ctx=ctx)  # fmt: skip
    return True


def bind(
    *, a: int, b: int, bias: int, res: int, out: int, m: int, n: int, k: int, key: wgmma.Key
) -> _launch.Bound:
    """The launch packed once with A's and B's maps (which must be in the table); `Bound.launch(ptrs,
    stream)` takes (maps, out[, res][, bias]), the FastCache order after A and B: the replay looks the maps
    of its A and B up per call."""
    ctx = _launch.context()
    maps = table(ctx).address(key, a, b, m, n, k)
    if maps is None:
        raise RuntimeError("wgmma_tma.bind: no tensor maps for these operands (launch returned False)")
    # kernel arguments: maps 0, c 1, bias 2, res 3
    ptr_args = (0, 1) + ((3,) if key.res else ()) + ((2,) if key.bias else ())
    return _kernel(key).bind(grid(m, n, _launch.sm_count(ctx)), THREADS, (maps, out, bias, res, m, n, k),
                             shared=SMEM_BYTES, ptr_args=ptr_args)  # fmt: skip
