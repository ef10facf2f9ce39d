"""Tensor-core matmul: thin numba kernels around the linked CUDA C block tile in `hgemm_mma.cu`.

C = A @ B (+ bias) (+ residual) with fp16 A [M, K] and B [K, N], fp32 accumulation, fp32 or fp16 output.
The CUDA C is compiled by NVRTC and linked with LTO on (numba's default when nvJitLink is present): without
LTO the call is not inlined and the accumulators go to local memory.

Pointers cross into CUDA C as int64 device addresses, so the kernels take no array arguments at all: the
launch writes nine integers into a prepared parameter block (kernels.runtime.launch). The simulator cannot
link CUDA C; callers check `available()`.

Tile shapes are compile-time macros of the .cu; `Config` names one set. `DEFAULT` matches the macros' own
defaults, so the production kernel links the file as it is; other configurations (timed side by side in
benchmarks/notes-mma.md) link the same source with #defines in front.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache, cached_property
from pathlib import Path
from typing import Any

from numba import cuda

from kernels.runtime import launch as _launch
from kernels.runtime.device import compute_capability
from kernels.runtime.launch import Kernel

CU_FILE = Path(__file__).with_name("mma.cu")
_SIG = "int32(int64, int64, int64, int64, int64, int64, int64, int64)"
KERNEL_SIG = "void(int64, int64, int64, int64, int64, int64, int64, int64)"


@dataclass(frozen=True)
class Config:
    """One tile configuration of hgemm_mma.cu: block tile bm x bn, `stages` K-slices of bk in flight, warps
    arranged wm x wn (each warp owns a (bm/wm) x (bn/wn) sub-tile). `epi`: the aligned kernels' epilogue moves
    column pairs in one access with the residual loads batched first (HG_EPI); `late`: a slice's prefetch goes
    out after the first k-step's fragment loads, branch-free (HG_LATE); `cpy32`: 32-bit copy-plan arithmetic
    (HG_CPY32); `minb` > 0: launch bounds asking for that many blocks per SM (caps the registers at
    64K / (threads * minb)); `group_m`: tile-rows walked before moving right (L2 reuse of B, HG_GROUP_M).
    The defaults are the production tile (its H200 figures against cublasGemmEx, and the variants that lost,
    are in benchmarks/notes-mma.md)."""

    bm: int = 128
    bn: int = 128
    stages: int = 3
    wm: int = 2
    wn: int = 2
    bk: int = 64
    epi: bool = True
    late: bool = True
    cpy32: bool = True
    minb: int = 0
    group_m: int = 8

    @property
    def threads(self) -> int:
        return 32 * self.wm * self.wn

    @property
    def smem_bytes(self) -> int:
        return self.stages * (self.bm + self.bn) * self.bk * 2

    @property
    def tag(self) -> str:
        extra = ("_epi" if self.epi else "") + ("_late" if self.late else "") + ("_c32" if self.cpy32 else "")
        extra += f"_g{self.group_m}" if self.group_m != 8 else ""
        extra += f"_b{self.minb}" if self.minb else ""
        return f"{self.bm}x{self.bn}x{self.bk}_s{self.stages}_w{self.wm}x{self.wn}{extra}"

    def grid(self, m: int, n: int) -> int:
        return ((m + self.bm - 1) // self.bm) * ((n + self.bn - 1) // self.bn)

    @cached_property
    def unaligned(self) -> Config:
        """The configuration whose scalar-load kernels serve the unaligned shapes of this one: 32-wide slices
        (with 64 the scalar-load kernel needs 255 registers and spills 472 bytes; the switches only change the
        aligned kernels, so they are dropped too)."""
        return replace(self, bk=32, stages=3, minb=0) if self.bk != 32 else self


DEFAULT = Config()


def available() -> bool:
    """Tensor cores through mma.sync need a real GPU of compute capability >= 8.0 (and no simulator): the
    current device's, asked once per context (`device.compute_capability`: the driver query costs ~20 us,
    more than a whole launch is allowed)."""
    cc = compute_capability()
    return cc is not None and cc >= (8, 0)


def link_code(cfg: Config) -> Any:
    """What numba links for `cfg`: the file itself for DEFAULT, else the source with #defines in front."""
    if cfg == DEFAULT:
        return str(CU_FILE)
    head = (
        f"#define HG_BM {cfg.bm}\n#define HG_BN {cfg.bn}\n#define HG_STAGES {cfg.stages}\n"
        f"#define HG_WM {cfg.wm}\n#define HG_WN {cfg.wn}\n#define HG_BK {cfg.bk}\n"
        f"#define HG_EPI {int(cfg.epi)}\n#define HG_LATE {int(cfg.late)}\n"
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
    """The four kernels of `cfg` by (out_half, aligned); each context's CUfunction gets its shared-memory
    limit raised when it is loaded (`Kernel.on_load`)."""
    smem = _launch.dynamic_smem(cfg.smem_bytes)
    return {key: _launch.kernel(d, KERNEL_SIG, on_load=smem) for key, d in dispatchers(cfg).items()}


def _select(a: int, b: int, bias: int, res: int, out: int, m: int, n: int, k: int, out_half: bool,
            cfg: Config) -> tuple[Kernel, int, Config]:  # fmt: skip
    """(kernel, grid, configuration) of one matmul; the rules are `launch`'s docstring."""
    aligned = k % 8 == 0 and n % 8 == 0 and (a | b) % 16 == 0
    aligned = aligned and (not cfg.epi or (out | res | bias) % 16 == 0)
    aligned = aligned and (not cfg.cpy32 or (k * cfg.bm < 2**31 and n * cfg.bk < 2**31))
    if not aligned:
        cfg = cfg.unaligned
    return _kernels(cfg)[(out_half, aligned)], cfg.grid(m, n), cfg


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
    kern, grid, cfg = _select(a, b, bias, res, out, m, n, k, out_half, cfg)
    args = (a, b, bias, res, out, m, n, k)
    kern.launch(grid, cfg.threads, args, shared=cfg.smem_bytes, stream=stream)


def bind(
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
    ptr_args: tuple[int, ...],
    cfg: Config = DEFAULT,
) -> _launch.Bound:
    """`launch`'s kernel, grid and parameter block for these operands, resolved and packed once: the
    returned `Bound.launch(ptrs, stream)` writes only the pointers (to the kernel arguments `ptr_args`
    names: 0 a, 1 b, 2 bias, 3 res, 4 out) and launches. Valid for pointers that take the same kernel: with
    `cfg.epi`, all of a, b, bias, res, out 16-byte aligned or not (the gemm / o_proj FastCache keys hold
    that); a replay must not rely on it otherwise (see gemm.run_matmul)."""
    kern, grid, cfg = _select(a, b, bias, res, out, m, n, k, out_half, cfg)
    args = (a, b, bias, res, out, m, n, k)
    return kern.bind(grid, cfg.threads, args, shared=cfg.smem_bytes, ptr_args=ptr_args)
