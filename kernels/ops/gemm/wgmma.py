"""Hopper tensor-core matmul: thin numba kernels around the linked CUDA C block tile in `wgmma.cu`.

C = A @ B (+ bias) (+ residual) with bf16 or fp16 A [M, K] and B [K, N], fp32 accumulation, fp32 output
(gemm) or output in the input type (o_proj). The tile issues `wgmma.mma_async`, which exists only on sm_90a:
the code is compiled for, and loaded on, cc 9.0 devices alone (`supported`), where numba-cuda targets sm_90a
at run time; everywhere else gemm's selection (kernels/ops/gemm/__init__.py) takes mma.sync or the portable
kernel, and nothing here is compiled. The simulator cannot link CUDA C either.

As in mma.py: pointers cross into CUDA C as int64 device addresses, the NVRTC-compiled source is linked with
LTO, and the tile's shared memory (6 stages x 32 KB + 1 KB for alignment) is dynamic, past numba's 48 KB
static limit: the launcher raises the kernel's limit through the driver (cuFuncSetAttribute), which numba
does not expose.

Operands the tile cannot take (K or N not a multiple of 8, a base pointer not 16-byte aligned, a dimension
past 2^31) are for the caller to route elsewhere: `fits`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from numba import cuda

from kernels.runtime import launch as _launch
from kernels.runtime.arrays import BF16
from kernels.runtime.device import compute_capability
from kernels.runtime.launch import Kernel

CU_FILE = Path(__file__).with_name("wgmma.cu")
# the headers both Hopper tiles splice in (`cu_text`): the wgmma wrappers; the epilogue (`wg_epilogue`)
HEADERS = (Path(__file__).with_name("wgmma_ops.cuh"), Path(__file__).with_name("wgmma_epi.cuh"))
_SIG = "int32(int64, int64, int64, int64, int64, int64, int64, int64)"
KERNEL_SIG = "void(int64, int64, int64, int64, int64, int64, int64, int64)"
THREADS = 256
BM = 128
BK = 64
ARCH = (9, 0, "a")  # the only target wgmma compiles for
_SMEM_LIMIT = 227 * 1024  # per block on cc 9.0
F16 = np.dtype(np.float16)
DTYPES: dict[np.dtype, str] = {BF16: "bf16", F16: "f16"}


def supported(cc: tuple[int, ...] | None) -> bool:
    """Whether a device of compute capability `cc` can run these kernels: sm_90a code runs on cc 9.0 only
    (not on 8.x, and not on 10.x / 12.x, whose 'a' targets are other instruction sets)."""
    return cc is not None and tuple(cc[:2]) == (9, 0)


def available() -> bool:
    """The current device is a real cc 9.0 GPU (and no simulator): asked once per context
    (`device.compute_capability`; the driver query costs ~20 us)."""
    return supported(compute_capability())


@dataclass(frozen=True)
class Config:
    """One tile of wgmma.cu: 128 x `bn` per block, `stages` K-slices of 64 in shared memory, `inflight` wgmma
    groups left running across the loop barrier, `group_m` tile-rows walked before moving right (L2 reuse of
    B). The defaults are the production tile; benchmarks/PERF.md has the others' H200 figures."""

    bn: int = 128
    stages: int = 6
    inflight: int = 1
    group_m: int = 8

    def __post_init__(self) -> None:
        if self.bn not in (128, 256):
            raise ValueError(f"bn: {self.bn} is not a tile width; allowed: 128, 256")
        if self.inflight not in (0, 1) or self.stages - 1 - self.inflight < 1:
            raise ValueError(
                f"stages {self.stages} / inflight {self.inflight}: need stages - 1 - inflight >= 1"
            )
        if self.smem_bytes > _SMEM_LIMIT:
            raise ValueError(f"stages {self.stages} x bn {self.bn}: {self.smem_bytes} B of shared memory, "
                             f"the block limit is {_SMEM_LIMIT} B")  # fmt: skip

    @property
    def smem_bytes(self) -> int:
        return self.stages * (BM * BK + BK * self.bn) * 2 + 1024  # 1 KB to align the first stage

    @property
    def tag(self) -> str:
        return f"n{self.bn}_s{self.stages}_i{self.inflight}_g{self.group_m}"

    def grid(self, m: int, n: int) -> int:
        return ((m + BM - 1) // BM) * ((n + self.bn - 1) // self.bn)


DEFAULT = Config()


ACTIVATIONS = ("none", "silu", "gelu_tanh")  # wgmma.cu's WG_ACT 0, 1, 2


@dataclass(frozen=True)
class Key:
    """What one compiled kernel is specialised to besides the tile: the input type, fp32 or 16-bit output,
    which epilogue operands it reads, B's layout (`bt`: [N, K], a torch Linear weight) and the activation
    applied before the rounding (ACTIVATIONS)."""

    dtype: str  # "bf16" | "f16"
    out16: bool
    bias: bool
    res: bool
    bt: bool = False
    act: str = "none"

    def __post_init__(self) -> None:
        if self.act not in ACTIVATIONS:
            raise ValueError(f"activation: {self.act!r} is not supported; allowed: {', '.join(ACTIVATIONS)}")

    @property
    def tag(self) -> str:
        epi = ("_bias" if self.bias else "") + ("_res" if self.res else "")
        epi += ("_nt" if self.bt else "") + ("" if self.act == "none" else f"_{self.act}")
        return f"{self.dtype}_{'o16' if self.out16 else 'o32'}{epi}"


def key_of(dtype: np.dtype, out16: bool, bias: bool, res: bool, bt: bool = False, act: str = "none") -> Key:
    name = DTYPES.get(np.dtype(dtype))
    if name is None:
        allowed = ", ".join(str(d) for d in DTYPES)
        raise TypeError(f"wgmma: dtype {dtype} is not supported; expected one of: {allowed}")
    return Key(name, out16, bias, res, bt, act)


def source(key: Key, cfg: Config) -> str:
    """wgmma.cu with the #defines of one kernel in front."""
    d = {
        "WG_BN": cfg.bn, "WG_STAGES": cfg.stages, "WG_INFLIGHT": cfg.inflight, "WG_GROUP_M": cfg.group_m,
        "WG_DT": 0 if key.dtype == "bf16" else 1, "WG_OUT": int(key.out16), "WG_BT": int(key.bt),
        "WG_RES": int(key.res), "WG_BIAS": int(key.bias), "WG_ACT": ACTIVATIONS.index(key.act),
        "WG_NAME": name_of(key, cfg),
    }  # fmt: skip
    return "".join(f"#define {k} {v}\n" for k, v in d.items()) + cu_text(CU_FILE)


def cu_text(path: Path) -> str:
    """A Hopper tile's .cu with each of HEADERS spliced in place of its one `#include "<name>"` line: NVRTC
    gets a single source and needs no include path."""
    text = path.read_text()
    for header in HEADERS:
        line = f'#include "{header.name}"\n'
        if text.count(line) != 1:
            raise RuntimeError(f"{path}: expected one line '{line.strip()}'")
        text = text.replace(line, header.read_text())
    return text


def name_of(key: Key, cfg: Config) -> str:
    return f"wgmma_gemm_{key.tag}_{cfg.tag}"


def dispatcher(key: Key, cfg: Config = DEFAULT) -> Any:
    """The numba kernel of (key, cfg), uncompiled (compiling it needs the sm_90a target)."""
    name = name_of(key, cfg)
    fn = cuda.declare_device(name, _SIG, link=[cuda.CUSource(source(key, cfg), name=f"{name}.cu")])

    # one block per SM by design (the tile's shared memory): launch bounds let ptxas use up to 255 registers
    @cuda.jit(launch_bounds=(THREADS, 1))
    def wgmma_tile(a, b, bias, res, out, m, n, k):  # type: ignore[no-untyped-def]
        fn(a, b, bias, res, out, m, n, k)

    return wgmma_tile


def fits(m: int, n: int, k: int, ptrs: tuple[int, ...]) -> bool:
    """Whether the tile takes these operands: 16-byte rows and base pointers (its cp.async chunks and paired
    epilogue stores), and 32-bit dimensions (its index arithmetic)."""
    if k % 8 or n % 8 or max(m, n, k) >= 2**31:
        return False
    acc = 0
    for p in ptrs:
        acc |= p
    return acc % 16 == 0


@cache
def _template(key: Key, cfg: Config) -> Kernel:
    """The kernel of (key, cfg); each context's CUfunction gets its shared-memory limit raised on load."""
    return _launch.kernel(dispatcher(key, cfg), KERNEL_SIG, on_load=_launch.dynamic_smem(cfg.smem_bytes))


def _kernel(key: Key, cfg: Config) -> Kernel:
    """`_template`, after checking the current device: sm_90a code is compiled and loaded on cc 9.0 only,
    whatever device another context of this process runs."""
    if not available():
        raise RuntimeError(
            "wgmma kernels need a cc 9.0 (sm_90a) GPU; this device is not one: gemm's auto path takes "
            "mma.sync or the portable kernel here"
        )
    return _template(key, cfg)


def launch(*, a: int, b: int, bias: int, res: int, out: int, m: int, n: int, k: int, key: Key,
           stream: Any = 0, cfg: Config = DEFAULT) -> None:  # fmt: skip
    """One matmul on device addresses (bias / res = 0 when absent; `key` says which are read). The caller
    has checked `fits`."""
    kern = _kernel(key, cfg)
    kern.launch(
        cfg.grid(m, n), THREADS, (a, b, bias, res, out, m, n, k), shared=cfg.smem_bytes, stream=stream
    )


def bind(*, a: int, b: int, bias: int, res: int, out: int, m: int, n: int, k: int, key: Key,
         ptr_args: tuple[int, ...], cfg: Config = DEFAULT) -> _launch.Bound:  # fmt: skip
    """`launch` packed once: `Bound.launch(ptrs, stream)` writes only the pointers, to the kernel arguments
    `ptr_args` names (0 a, 1 b, 2 bias, 3 res, 4 out). Valid while the pointers keep `fits` (the gemm /
    o_proj FastCache keys hold the shapes and the pointers' 16-byte alignment)."""
    kern = _kernel(key, cfg)
    args = (a, b, bias, res, out, m, n, k)
    return kern.bind(cfg.grid(m, n), THREADS, args, shared=cfg.smem_bytes, ptr_args=ptr_args)
