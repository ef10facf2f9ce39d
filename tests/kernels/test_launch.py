"""The fast launch path: on a GPU it must compute exactly what numba's dispatcher computes with the same
compiled kernel, for 1-d and 2-d arrays and float32 scalars; and it is faster. Under the simulator the
same `Kernel.launch` goes through the dispatcher (covered by every op test)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from numba import cuda
from opcheck import needs_gpu

from kernels import arrays, launch
from kernels.ops import rmsnorm


@pytest.mark.gpu
@needs_gpu
def test_fast_path_matches_dispatcher():  # type: ignore[no-untyped-def]
    rng = np.random.default_rng()
    x = cuda.to_device(rng.standard_normal((37, 1001), dtype=np.float32))
    w = cuda.to_device(rng.standard_normal(1001, dtype=np.float32))
    a = cuda.device_array((37, 1001), np.float32)
    b = cuda.device_array((37, 1001), np.float32)
    k = launch.kernel(rmsnorm._rmsnorm_kernel, rmsnorm._SIGS[np.dtype(np.float32)])
    ops = [arrays.operand(n, v) for n, v in (("x", x), ("w", w), ("a", a))]
    k.launch(37, 256, (*ops, 1e-3))
    rmsnorm._rmsnorm_kernel[37, 256](x, w, b, np.float32(1e-3))
    cuda.synchronize()
    np.testing.assert_array_equal(a.copy_to_host(), b.copy_to_host())


@pytest.mark.gpu
@needs_gpu
def test_fast_path_host_overhead_below_dispatcher():  # type: ignore[no-untyped-def]
    x = cuda.to_device(np.ones((4, 256), np.float32))
    w = cuda.to_device(np.ones(256, np.float32))
    out = cuda.device_array((4, 256), np.float32)

    def per_call(fn) -> float:  # type: ignore[no-untyped-def]
        for _ in range(20):
            fn()
        t0 = time.perf_counter()
        for _ in range(500):
            fn()
        dt = (time.perf_counter() - t0) / 500
        cuda.synchronize()
        return dt

    fast = per_call(lambda: rmsnorm.rmsnorm(x, w, out))
    slow = per_call(lambda: rmsnorm._rmsnorm_kernel[4, 256](x, w, out, np.float32(1e-6)))
    assert fast < slow, (fast, slow)


def test_parameter_block_follows_numba_abi():  # type: ignore[no-untyped-def]
    # numba-cuda's _Kernel._prepare_args flattens an array into meminfo, parent, nitems, itemsize, data,
    # shape..., strides...; scalars follow as their own parameters. Built and packed with no GPU.
    k = launch.Kernel(rmsnorm._rmsnorm_kernel, "void(float16[:, ::1], float32[::1], float64, float32)")
    k.build_plan()
    x = arrays.Operand("x", 0xABC000, (3, 5), (10, 2), np.dtype(np.float16), None)
    w = arrays.Operand("w", 0xDEF000, (7,), (4,), np.dtype(np.float32), None)
    k.pack((x, w, 2.5, 0.25))
    blk = list(k._block)
    assert blk[:9] == [0, 0, 15, 2, 0xABC000, 3, 5, 10, 2]
    assert blk[9:16] == [0, 0, 7, 4, 0xDEF000, 7, 4]
    assert np.frombuffer(bytes(k._block), np.float64)[16] == 2.5
    assert k._scalars[0].value == 0.25
    assert len(k._params) == 9 + 7 + 1 + 1


def test_numba_device_arrays_take_the_direct_extractor():  # type: ignore[no-untyped-def]
    # checked in a subprocess without the simulator: the real DeviceNDArray class is what matters
    import os
    import subprocess
    import sys

    code = (
        "from numba.cuda.cudadrv.devicearray import DeviceNDArray\n"
        "from kernels import arrays\n"
        "ex = arrays._extractor_for(DeviceNDArray)\n"
        "assert ex is arrays._from_numba, ex\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                       check=False)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]


def test_one_d_slot_takes_nd_operand_flat():  # type: ignore[no-untyped-def]
    k = launch.Kernel(rmsnorm._rmsnorm_kernel, "void(float32[::1])")
    k.build_plan()
    x = arrays.Operand("x", 0x1000, (3, 5, 7), (140, 28, 4), np.dtype(np.float32), None)
    k.pack((x,))
    assert list(k._block) == [0, 0, 105, 4, 0x1000, 105, 4]
