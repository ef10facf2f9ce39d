"""Host time of clip_grad_norm's lean calls on a machine without a GPU: the Python the call runs, with every
driver entry point it reaches replaced by a C call of the same arity through ctypes (glibc's
`feclearexcept`, which returns 0 and does nothing that matters here), so the figure is our Python plus the
ctypes crossings, not the driver's own work (cuGraphLaunch / cuLaunchKernel: ~2-3 us each on the H200
host, FACTS.md). A proxy, for comparing the variants in one process; the H200 figure comes from
`python -m kernels bench --overhead` there.

    NUMBA_ENABLE_CUDASIM=1 PYTHONPATH=$PWD .venv/bin/python lab/clip_host_proxy.py [--calls 3000]

Rows: the lean table call keyed by the arrays' ids (what `clip_grad_norm(grads, ...)` does for more than
SLOTS arrays), with max_norm fixed and new each call, against `prepare(grads)` then `prepared(max_norm)`;
two_pass's lean call on 2 arrays for scale; `launch.context()` with one ctypes call. Not part of the suite.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import os
import statistics
import time
from typing import Any

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np  # noqa: E402

from kernels.ops import clip_grad_norm as op  # noqa: E402
from kernels.runtime import arrays, launch  # noqa: E402

_libm = ctypes.CDLL("libm.so.6")
_noop = _libm.feclearexcept  # int feclearexcept(int): returns 0; extra arguments are ignored (SysV ABI)
_noop.restype = ctypes.c_int


class _Ptr:
    def __init__(self, p: int) -> None:
        self.device_pointer = p


class FakeDeviceArray:
    """A numba-like device array (the fields kernels.runtime.arrays reads), never dereferenced."""

    device_ctypes_pointer = None

    def __init__(self, shape: tuple[int, ...], dtype: Any, ptr: int) -> None:
        self.shape = shape
        self.dtype = np.dtype(dtype)
        self.strides = arrays.c_strides(shape, self.dtype.itemsize)
        self.gpu_data = _Ptr(ptr)

    def reshape(self, shape: tuple[int, ...]) -> FakeDeviceArray:
        return FakeDeviceArray(shape, self.dtype, self.gpu_data.device_pointer)


FakeDeviceArray.__module__ = "numba.cuda.fake"  # what clip's lean calls accept (an immutable layout)


class ProxyGraph(launch.LaunchGraph):
    """LaunchGraph as captured (no capture here): its own launch and in-place update code, the driver's
    entry points no-op C calls."""

    def __init__(self, record: Any, *, updatable: bool = False) -> None:
        self._exec = ctypes.c_void_p(1)
        self._call = _noop
        self._graph = None
        self._nodes = (ctypes.c_void_p(1), ctypes.c_void_p(2))
        self._updates = {}


class _Driver:
    """What launch._driver() returns here: the entry points the lean calls reach, as no-op C calls."""

    cuGraphExecKernelNodeSetParams_v2 = _noop
    cuLaunchKernel = _noop
    cuStreamIsCapturing = _noop
    cuGraphExecDestroy = _noop
    cuGraphDestroy = _noop


_STUB_C = "int cuCtxGetCurrent(void **ctx) { *ctx = (void *)0x5000; return 0; }\n"


def _ctx_stub() -> Any:
    """A C cuCtxGetCurrent that reports one context (compiled here with the system's cc): the real
    launch.context() then runs as on a GPU, its one ctypes crossing included."""
    import subprocess
    import tempfile

    d = tempfile.mkdtemp(prefix="ctxstub-")
    src, lib = os.path.join(d, "stub.c"), os.path.join(d, "libstub.so")
    with open(src, "w") as fh:
        fh.write(_STUB_C)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", lib, src], check=True)
    return ctypes.CDLL(lib).cuCtxGetCurrent


def install() -> None:
    launch.USE_DISPATCHER = False
    op.USE_DISPATCHER = False
    _Driver.cuCtxGetCurrent = _ctx_stub()
    launch._libcuda = _Driver()  # type: ignore[assignment]
    launch.SIMULATED = False  # the real context() (the kernels themselves never run here)
    launch._SM[0x5000] = 132  # the H200's SMs, for the stub's context (the simulator's device has none)

    def prepare(self: launch.Kernel) -> None:
        self._func = ctypes.c_void_p(1)
        self.build_plan()
        self._launch = _noop
        self._ready = True

    launch.Kernel._prepare = prepare  # type: ignore[method-assign]
    launch.LaunchGraph = ProxyGraph  # type: ignore[assignment,misc]


def timed(fn: Any, calls: int) -> float:
    for _ in range(200):
        fn()
    ns = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        ns.append(time.perf_counter_ns() - t0)
    return statistics.median(ns) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=3000)
    args = ap.parse_args()
    install()
    bf16 = arrays.BF16
    sizes = op.llama3_8b_sizes(4096)
    g_llama = [FakeDeviceArray((n,), bf16, (1 << 40) + (i << 24)) for i, n in enumerate(sizes)]
    g2 = [FakeDeviceArray((1000,), np.float16, (1 << 42) + (i << 24)) for i in range(2)]
    norm = FakeDeviceArray((1,), np.float32, 1 << 43)
    assert all(arrays.is_device_array(a) for a in (*g_llama, *g2, norm))  # registers the extractor
    prepared = op.prepare(g_llama, norm_out=norm)
    mx = itertools.count(1e9)
    clip = op.clip_grad_norm
    rows = [
        ("clip_grad_norm bf16, 291 arrays (table, ids key)", lambda: clip(g_llama, 1e9, norm_out=norm)),
        (
            "clip_grad_norm bf16, 291 arrays, max_norm new each call",
            lambda: clip(g_llama, next(mx), norm_out=norm),
        ),
        ("prepared bf16, 291 arrays", lambda: prepared(1e9)),
        ("prepared bf16, 291 arrays, max_norm new", lambda: prepared(next(mx))),
        ("clip_grad_norm fp16, 2 arrays (two_pass)", lambda: clip(g2, 1e9, norm_out=norm)),
        ("launch.context()", launch.context),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'call':<{width}}  median us ({args.calls} calls)")
    for label, fn in rows:
        print(f"{label:<{width}}  {timed(fn, args.calls):8.2f}")


if __name__ == "__main__":
    main()
