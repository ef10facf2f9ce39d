"""Tensor-core matmul: thin numba kernels around the linked CUDA C block tile in `hgemm_mma.cu`.

C = A @ B (+ bias) (+ residual) with fp16 A [M, K] and B [K, N], fp32 accumulation, fp32 or fp16 output.
The CUDA C is compiled by NVRTC and linked with LTO on (numba's default when nvJitLink is present): without
LTO the call is not inlined and the accumulators go to local memory.

Pointers cross into CUDA C as int64 device addresses, so the kernels take no array arguments at all: the
launch writes nine integers into a prepared parameter block (kernels.launch). The simulator cannot link CUDA
C; callers check `available()`.

Tile shapes are compile-time macros of the .cu; `Config` names one set. `DEFAULT` matches the macros' own
defaults, so the production kernel links the file as it is; other configurations (benchmarks/matmul_probe.py)
link the same source with #defines in front.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from numba import cuda

from kernels import launch as _launch
from kernels.launch import Kernel

CU_FILE = Path(__file__).with_name("hgemm_mma.cu")
BLOCK_K = 32
_SIG = "int32(int64, int64, int64, int64, int64, int64, int64, int64, int32)"
KERNEL_SIG = "void(int64, int64, int64, int64, int64, int64, int64, int64, int32)"
_STATIC_SMEM_LIMIT = 48 * 1024
_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


@dataclass(frozen=True)
class Config:
    """One tile configuration of hgemm_mma.cu: block tile bm x bn, `stages` K-slices of 32 in flight, warps
    arranged wm x wn (each warp owns a (bm/wm) x (bn/wn) sub-tile)."""

    bm: int = 128
    bn: int = 128
    stages: int = 3
    wm: int = 2
    wn: int = 2

    @property
    def threads(self) -> int:
        return 32 * self.wm * self.wn

    @property
    def smem_bytes(self) -> int:
        return self.stages * (self.bm + self.bn) * BLOCK_K * 2

    @property
    def tag(self) -> str:
        return f"{self.bm}x{self.bn}x{BLOCK_K}_s{self.stages}_w{self.wm}x{self.wn}"

    def grid(self, m: int, n: int) -> int:
        return ((m + self.bm - 1) // self.bm) * ((n + self.bn - 1) // self.bn)


DEFAULT = Config()


def available() -> bool:
    """Tensor cores through mma.sync need a real GPU of compute capability >= 8.0 (and no simulator)."""
    if cuda.config.ENABLE_CUDASIM or not cuda.is_available():
        return False
    return bool(cuda.get_current_device().compute_capability >= (8, 0))


def link_code(cfg: Config) -> Any:
    """What numba links for `cfg`: the file itself for DEFAULT, else the source with #defines in front."""
    if cfg == DEFAULT:
        return str(CU_FILE)
    head = (
        f"#define HG_BM {cfg.bm}\n#define HG_BN {cfg.bn}\n#define HG_STAGES {cfg.stages}\n"
        f"#define HG_WM {cfg.wm}\n#define HG_WN {cfg.wn}\n#define HG_SUFFIX _{cfg.tag}\n"
    )
    return cuda.CUSource(head + CU_FILE.read_text(), name=f"hgemm_mma_{cfg.tag}.cu")


def dispatchers(cfg: Config) -> tuple[Any, Any]:
    """The two numba kernels (fp32 output, fp16 output) of `cfg`, uncompiled."""
    suffix = "" if cfg == DEFAULT else f"_{cfg.tag}"
    code = link_code(cfg)
    f32out = cuda.declare_device(f"hgemm_mma_f32out{suffix}", _SIG, link=[code])
    f16out = cuda.declare_device(f"hgemm_mma_f16out{suffix}", _SIG, link=[code])

    @cuda.jit
    def mma_f32out(a, b, bias, res, out, m, n, k, aligned):  # type: ignore[no-untyped-def]
        f32out(a, b, bias, res, out, m, n, k, aligned)

    @cuda.jit
    def mma_f16out(a, b, bias, res, out, m, n, k, aligned):  # type: ignore[no-untyped-def]
        f16out(a, b, bias, res, out, m, n, k, aligned)

    return mma_f32out, mma_f16out


@cache
def _kernels(cfg: Config) -> tuple[Kernel, Kernel]:
    f32, f16 = dispatchers(cfg)
    return _launch.kernel(f32, KERNEL_SIG), _launch.kernel(f16, KERNEL_SIG)


def _allow_dynamic_smem(k: Kernel, nbytes: int) -> None:
    """Raise the kernel's dynamic shared-memory limit past the default 48 KB (numba exposes no setter)."""
    if nbytes <= _STATIC_SMEM_LIMIT:
        return
    kern = k.dispatcher.compile(k.sig)
    handle = int(kern._codelibrary.get_cufunc().handle)
    drv = _launch._driver()
    func = ctypes.c_void_p()
    rc = drv.cuKernelGetFunction(ctypes.byref(func), ctypes.c_void_p(handle))
    target = func.value if rc == 0 and func.value else handle
    drv.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    attr = _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    rc = drv.cuFuncSetAttribute(ctypes.c_void_p(target), attr, nbytes)
    if rc != 0:
        raise RuntimeError(f"cuFuncSetAttribute(max dynamic shared = {nbytes} B) failed with CUresult {rc}")


_ready: set[tuple[Config, bool]] = set()


def launch(
    *,
    a: int,
    b: int,
    bias: int,
    res: int,
    out: int,
    m: int,
    n: int,
    k: int,
    out_half: bool,
    stream: int = 0,
    cfg: Config = DEFAULT,
) -> None:
    """Run one matmul on device addresses (bias / res = 0 when absent). 16-byte chunks are used when every
    row starts 16-byte aligned (K and N multiples of 8, aligned base pointers); otherwise scalar loads."""
    aligned = int(k % 8 == 0 and n % 8 == 0 and a % 16 == 0 and b % 16 == 0)
    kern = _kernels(cfg)[1 if out_half else 0]
    if (cfg, out_half) not in _ready:
        _allow_dynamic_smem(kern, cfg.smem_bytes)
        _ready.add((cfg, out_half))
    args = (a, b, bias, res, out, m, n, k, aligned)
    kern.launch(cfg.grid(m, n), cfg.threads, args, shared=cfg.smem_bytes, stream=stream)
