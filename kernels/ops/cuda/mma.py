"""Tensor-core matmul: thin numba kernels around the linked CUDA C block tile in `hgemm_mma.cu`.

C = A @ B (+ bias) (+ residual) with fp16 A [M, K] and B [K, N], fp32 accumulation, fp32 or fp16 output.
The CUDA C is compiled by NVRTC and linked with LTO on (numba's default when nvJitLink is present): without
LTO the call is not inlined and the 128 accumulators per thread go to local memory.

Pointers cross into CUDA C as int64 device addresses, so the kernels take no array arguments at all: the
launch marshals nine integers and nothing else. The simulator cannot link CUDA C; callers check `available()`.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from numba import cuda

from kernels.launch import Kernel, kernel

CU_FILE = Path(__file__).with_name("hgemm_mma.cu")
BLOCK_M = 128
BLOCK_N = 128
THREADS = 128
_SIG = "int32(int64, int64, int64, int64, int64, int64, int64, int64, int32)"
_KSIG = "void(int64, int64, int64, int64, int64, int64, int64, int64, int32)"


def available() -> bool:
    """Tensor cores through mma.sync need a real GPU of compute capability >= 8.0 (and no simulator)."""
    if cuda.config.ENABLE_CUDASIM or not cuda.is_available():
        return False
    return cuda.get_current_device().compute_capability >= (8, 0)


@cache
def _kernels() -> tuple[Kernel, Kernel]:
    f32out = cuda.declare_device("hgemm_mma_f32out", _SIG, link=[str(CU_FILE)])
    f16out = cuda.declare_device("hgemm_mma_f16out", _SIG, link=[str(CU_FILE)])

    @cuda.jit
    def mma_f32out(a, b, bias, res, out, m, n, k, aligned):  # type: ignore[no-untyped-def]
        f32out(a, b, bias, res, out, m, n, k, aligned)

    @cuda.jit
    def mma_f16out(a, b, bias, res, out, m, n, k, aligned):  # type: ignore[no-untyped-def]
        f16out(a, b, bias, res, out, m, n, k, aligned)

    # fast launch (kernels.launch): nine integer parameters written into a prepared block, one cuLaunchKernel
    return kernel(mma_f32out, _KSIG), kernel(mma_f16out, _KSIG)


def grid(m: int, n: int) -> int:
    return ((m + BLOCK_M - 1) // BLOCK_M) * ((n + BLOCK_N - 1) // BLOCK_N)


def launch(
    *, a: int, b: int, bias: int, res: int, out: int, m: int, n: int, k: int, out_half: bool, stream: int = 0
) -> None:
    """Run one matmul on device addresses (bias / res = 0 when absent). 16-byte chunks are used when every
    row starts 16-byte aligned (K and N multiples of 8, aligned base pointers); otherwise scalar loads."""
    aligned = int(k % 8 == 0 and n % 8 == 0 and a % 16 == 0 and b % 16 == 0)
    kern = _kernels()[1 if out_half else 0]
    kern.launch(grid(m, n), THREADS, (a, b, bias, res, out, m, n, k, aligned), stream=stream)
