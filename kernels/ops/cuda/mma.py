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
_SIG = "int32(int64, int64, int64, int64, int64, int64, int64, int64)"
KERNEL_SIG = "void(int64, int64, int64, int64, int64, int64, int64, int64)"
_STATIC_SMEM_LIMIT = 48 * 1024
_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


@dataclass(frozen=True)
class Config:
    """One tile configuration of hgemm_mma.cu: block tile bm x bn, `stages` K-slices of bk in flight, warps
    arranged wm x wn (each warp owns a (bm/wm) x (bn/wn) sub-tile). `mbar`: the aligned kernels pace their
    stages with mbarriers instead of a block barrier per slice (HG_MBAR); `epi`: their epilogue moves column
    pairs in one access with the residual loads batched first (HG_EPI); `late`: a slice's prefetch goes out
    after the first k-step's fragment loads, branch-free (HG_LATE); `cpy32`: 32-bit copy-plan arithmetic
    (HG_CPY32); `minb` > 0: launch bounds asking for that many blocks per SM (caps the registers at
    64K / (threads * minb)); `group_m`: tile-rows walked before moving right (L2 reuse of B, HG_GROUP_M)."""

    bm: int = 128
    bn: int = 128
    stages: int = 3
    wm: int = 2
    wn: int = 2
    bk: int = 32
    mbar: bool = False
    epi: bool = False
    late: bool = False
    cpy32: bool = False
    minb: int = 0
    group_m: int = 8

    @property
    def threads(self) -> int:
        return 32 * self.wm * self.wn

    @property
    def smem_bytes(self) -> int:
        # HG_MBAR: two 8-byte mbarriers per stage after the B stages
        return self.stages * (self.bm + self.bn) * self.bk * 2 + (16 * self.stages if self.mbar else 0)

    @property
    def tag(self) -> str:
        extra = ("_mbar" if self.mbar else "") + ("_epi" if self.epi else "") + ("_late" if self.late else "")
        extra += ("_c32" if self.cpy32 else "") + (f"_g{self.group_m}" if self.group_m != 8 else "")
        extra += f"_b{self.minb}" if self.minb else ""
        return f"{self.bm}x{self.bn}x{self.bk}_s{self.stages}_w{self.wm}x{self.wn}{extra}"

    def grid(self, m: int, n: int) -> int:
        return ((m + self.bm - 1) // self.bm) * ((n + self.bn - 1) // self.bn)


DEFAULT = Config()


@cache
def available() -> bool:
    """Tensor cores through mma.sync need a real GPU of compute capability >= 8.0 (and no simulator).
    Cached: asking the driver costs ~20 us, more than the whole launch is allowed (issue 4: <= 10 us)."""
    if cuda.config.ENABLE_CUDASIM or not cuda.is_available():
        return False
    return bool(cuda.get_current_device().compute_capability >= (8, 0))


def link_code(cfg: Config) -> Any:
    """What numba links for `cfg`: the file itself for DEFAULT, else the source with #defines in front."""
    if cfg == DEFAULT:
        return str(CU_FILE)
    head = (
        f"#define HG_BM {cfg.bm}\n#define HG_BN {cfg.bn}\n#define HG_STAGES {cfg.stages}\n"
        f"#define HG_WM {cfg.wm}\n#define HG_WN {cfg.wn}\n#define HG_BK {cfg.bk}\n"
        f"#define HG_MBAR {int(cfg.mbar)}\n#define HG_EPI {int(cfg.epi)}\n#define HG_LATE {int(cfg.late)}\n"
        f"#define HG_CPY32 {int(cfg.cpy32)}\n#define HG_GROUP_M {cfg.group_m}\n"
        f"#define HG_SUFFIX _{cfg.tag}\n"
    )
    return cuda.CUSource(head + CU_FILE.read_text(), name=f"hgemm_mma_{cfg.tag}.cu")


def dispatchers(cfg: Config) -> dict[tuple[bool, bool], Any]:
    """The numba kernels of `cfg`, uncompiled, by (fp16 output, aligned)."""
    suffix = "" if cfg == DEFAULT else f"_{cfg.tag}"
    code = link_code(cfg)
    out: dict[tuple[bool, bool], Any] = {}
    for half in (False, True):
        for aligned in (False, True):
            name = f"hgemm_mma_{'f16' if half else 'f32'}out_{'a' if aligned else 'u'}{suffix}"
            out[(half, aligned)] = _wrap(cuda.declare_device(name, _SIG, link=[code]), cfg)
    return out


def _wrap(fn: Any, cfg: Config) -> Any:
    # launch bounds reach the linked code through LTO: ptxas allocates registers for the whole kernel
    bounds = (cfg.threads, cfg.minb) if cfg.minb else None

    @cuda.jit(launch_bounds=bounds)
    def mma_tile(a, b, bias, res, out, m, n, k):  # type: ignore[no-untyped-def]
        fn(a, b, bias, res, out, m, n, k)

    return mma_tile


@cache
def _kernels(cfg: Config) -> dict[tuple[bool, bool], Kernel]:
    return {key: _launch.kernel(d, KERNEL_SIG) for key, d in dispatchers(cfg).items()}


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


_ready: set[tuple[Config, bool, bool]] = set()


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
    row starts 16-byte aligned (K and N multiples of 8, aligned base pointers); otherwise scalar loads. With
    `cfg.epi` the aligned kernels also move output / residual / bias column pairs in one access, so those
    pointers must be 16-byte aligned as well (0, absent, is); with `cfg.cpy32` the copy plan's offsets must
    fit 32 bits (bm * K and bk * N < 2^31; larger shapes take the scalar-load kernels)."""
    aligned = k % 8 == 0 and n % 8 == 0 and (a | b) % 16 == 0
    aligned = aligned and (not cfg.epi or (out | res | bias) % 16 == 0)
    aligned = aligned and (not cfg.cpy32 or (k * cfg.bm < 2**31 and n * cfg.bk < 2**31))
    key = (out_half, aligned)
    kern = _kernels(cfg)[key]
    if (cfg, *key) not in _ready:
        _allow_dynamic_smem(kern, cfg.smem_bytes)
        _ready.add((cfg, *key))
    args = (a, b, bias, res, out, m, n, k)
    kern.launch(cfg.grid(m, n), cfg.threads, args, shared=cfg.smem_bytes, stream=stream)
