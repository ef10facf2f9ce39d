"""Python-side cost of the op launchers with the driver call stubbed out, on any machine (no GPU): fake
numba-like device arrays, the parameter block built and packed for real, cuLaunchKernel replaced by a no-op.
Used for benchmarks/notes-memory.md (host overhead); the GPU figure is `python -m kernels bench --overhead`.

    .venv/bin/python benchmarks/overhead_stubbed.py
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from kernels import arrays
from kernels.launch import Kernel
from kernels.ops import cast, layernorm, residual_add, rmsnorm, softmax


class _Pointer:
    def __init__(self, p: int) -> None:
        self.device_pointer = p


class FakeDeviceArray:
    """Looks like a numba DeviceNDArray to kernels.arrays (same attributes, numba.cuda module name)."""

    device_ctypes_pointer = None  # class-level marker, as on numba's DeviceNDArray

    def __init__(self, shape: tuple[int, ...], dtype: Any) -> None:
        self.shape = shape
        self.dtype = np.dtype(dtype)
        self.strides = arrays.c_strides(shape, self.dtype.itemsize)
        self.gpu_data = _Pointer(1 << 40)


FakeDeviceArray.__module__ = "numba.cuda.fake"


def _stub(k: Kernel) -> None:
    k.build_plan()
    k._func = 0
    k._ready = True
    k._launch = lambda *a: 0


def best_us(fn: Callable[[], Any], calls: int = 2000, reps: int = 15) -> float:
    for _ in range(200):
        fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def main() -> None:
    for table in (residual_add._KERNELS, rmsnorm._REG, softmax._REG, layernorm._REG):
        for k in table.values():
            _stub(k)
    _stub(cast._KERNEL)
    f32 = np.float32
    x, r, o = (FakeDeviceArray((4, 256), f32) for _ in range(3))
    w, b = FakeDeviceArray((256,), f32), FakeDeviceArray((256,), f32)
    o16 = FakeDeviceArray((4, 256), np.float16)
    k = residual_add._KERNELS[np.dtype(f32)]
    flat = [arrays.operand(n, a).flat() for n, a in (("x", x), ("r", r), ("o", o))]
    rows = [
        ("residual_add", lambda: residual_add.residual_add(x, r, o)),
        ("rmsnorm", lambda: rmsnorm.rmsnorm(x, w, o)),
        ("layernorm", lambda: layernorm.layernorm(x, w, b, o)),
        ("softmax", lambda: softmax.softmax(x, o)),
        ("cast", lambda: cast.cast(x, o16)),
        ("Kernel.launch only (driver stubbed)", lambda: k.launch(1, 256, flat)),
    ]
    for label, fn in rows:
        print(f"{label:<38}{best_us(fn):8.2f} us")


if __name__ == "__main__":
    main()
