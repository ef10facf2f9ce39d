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
from kernels import launch as _launch
from kernels.arrays import Operand
from kernels.launch import Kernel
from kernels.ops import cast, clip_grad_norm, gemm, layernorm, o_proj, residual_add, rmsnorm, softmax
from kernels.ops.cuda import mma


class _Pointer:
    def __init__(self, p: int) -> None:
        self.device_pointer = p


class FakeDeviceArray:
    """Looks like a numba DeviceNDArray to kernels.arrays (same attributes, numba.cuda module name)."""

    device_ctypes_pointer = None  # class-level marker, as on numba's DeviceNDArray

    def __init__(self, shape: tuple[int, ...], dtype: Any, ptr: int = 1 << 40) -> None:
        self.shape = shape
        self.dtype = np.dtype(dtype)
        self.strides = arrays.c_strides(shape, self.dtype.itemsize)
        self.gpu_data = _Pointer(ptr)


FakeDeviceArray.__module__ = "numba.cuda.fake"


def _stub(k: Kernel) -> None:
    k.build_plan()
    k._func = 0
    k._ready = True
    k._launch = lambda *a: 0


def _fake_op(name: str, shape: tuple[int, ...], dtype: Any, ptr: int) -> Operand:
    dt = np.dtype(dtype)
    return Operand(name, ptr, shape, (dt.itemsize,), dt, None, None, None)


def _stub_gpu_state() -> None:
    """What the mma and clip_grad_norm launchers ask the GPU for, filled in with stand-ins (132 SMs)."""
    _launch._SM = 132
    mma.available = lambda: True  # type: ignore[assignment]  # gemm reads it through the module
    for cfg in (mma.DEFAULT, mma.DEFAULT.unaligned):
        for key, k in mma._kernels(cfg).items():
            _stub(k)
            mma._ready.add((cfg, *key))
    cg = clip_grad_norm
    _launch.GRAPH_REPLAY = False  # graphs need the real driver: time the direct launches
    cg._device_cc = lambda: (9, 0)  # type: ignore[assignment]  # the H200's, for v4_config
    cg._state["acc"] = _fake_op("acc", (2,), np.float64, 1 << 42)
    cg._state["bar"] = _fake_op("bar", (2,), np.int32, (1 << 42) + 256)
    for i, dt in enumerate((np.float32, np.float16)):
        cg._state[f"empty_{np.dtype(dt).name}"] = _fake_op("e", (0,), dt, (1 << 42) + 512 * (i + 2))
        cfg = cg.V4_DEFAULT[np.dtype(dt)]
        for name in ("norm", "scale"):
            _stub(cg._v4_kernel(np.dtype(dt), cfg, name))
            g = cg.v4_grid(np.dtype(dt), cfg, name)
            cg._v4_state.setdefault(("part", g), _fake_op("part", (g,), np.float32, 1 << 43))


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
    _stub_gpu_state()
    f16 = np.float16
    ma16, mb16 = FakeDeviceArray((128, 128), f16, 1 << 44), FakeDeviceArray((128, 128), f16, 1 << 45)
    mc = FakeDeviceArray((128, 128), f32, 1 << 46)
    attn16, res16 = FakeDeviceArray((2, 64, 128), f16, 1 << 44), FakeDeviceArray((2, 64, 128), f16, 1 << 47)
    oout16 = FakeDeviceArray((2, 64, 128), f16, 1 << 46)
    g32 = [FakeDeviceArray((1000,), f32, (1 << 40) + 4096 * i) for i in range(2)]
    g16 = [FakeDeviceArray((1000,), f16, (1 << 40) + 4096 * i) for i in range(2)]
    norm = FakeDeviceArray((1,), f32, 1 << 41)
    clip = clip_grad_norm.clip_grad_norm
    k = residual_add._KERNELS[np.dtype(f32)]
    flat = [arrays.operand(n, a).flat() for n, a in (("x", x), ("r", r), ("o", o))]
    rows = [
        ("residual_add", lambda: residual_add.residual_add(x, r, o)),
        ("rmsnorm", lambda: rmsnorm.rmsnorm(x, w, o)),
        ("layernorm", lambda: layernorm.layernorm(x, w, b, o)),
        ("softmax", lambda: softmax.softmax(x, o)),
        ("cast", lambda: cast.cast(x, o16)),
        ("gemm fp16 128^3 (mma)", lambda: gemm.gemm(ma16, mb16, mc)),
        ("o_proj fp16 [2,64,128]x[128,128] (mma)", lambda: o_proj.o_proj(attn16, mb16, res16, out=oout16)),
        ("clip_grad_norm fp32, 2 arrays (auto)", lambda: clip(g32, 1e9, norm_out=norm)),
        ("clip_grad_norm fp16, 2 arrays (auto)", lambda: clip(g16, 1e9, norm_out=norm)),
        ("Kernel.launch only (driver stubbed)", lambda: k.launch(1, 256, flat)),
    ]
    for label, fn in rows:
        try:
            print(f"{label:<42}{best_us(fn):8.2f} us")
        except Exception as e:  # a kernel this script does not stub (e.g. the row kernels): needs a GPU
            print(f"{label:<42}     n/a ({type(e).__name__})")


if __name__ == "__main__":
    main()
