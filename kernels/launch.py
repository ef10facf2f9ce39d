"""A fast launch path for compiled numba kernels: compile once per signature, pack arguments into a
pre-built parameter block and call the driver's `cuLaunchKernel` through ctypes.

Why: numba's dispatcher re-types every argument, wraps it, and builds cuda.core launch objects on each call:
about 29 us per launch on the H200 host (FACTS.md). Host overhead matters for small ops, and the issue's goal
is <= 10 us per op call on device arrays. Here a call costs: one Python loop over the arguments writing
int64 slots, and one ctypes call.

Parameter ABI (numba-cuda 0.30.4, `_Kernel._prepare_args`): every argument is flattened into 8-byte
parameters; an array of ndim d becomes 5 + 2d of them: meminfo (0), parent (0), nitems, itemsize, data
pointer, shape[0..d), strides[0..d) in bytes. Scalars: float32 -> 4 bytes, float64/int64 -> 8 bytes.

Under the CUDA simulator (or with SOLFLEET_LAUNCH=dispatcher) the same `Kernel.launch` goes through numba's
dispatcher, so the simulator and the GPU run one kernel body.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from typing import Any

from numba import cuda, types
from numba.core import sigutils

from kernels.arrays import SIMULATED, Operand

USE_DISPATCHER: bool = SIMULATED or os.environ.get("SOLFLEET_LAUNCH", "") == "dispatcher"

_libcuda: ctypes.CDLL | None = None


def _driver() -> ctypes.CDLL:
    global _libcuda
    if _libcuda is None:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuLaunchKernel.argtypes = [
            ctypes.c_void_p,
            ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
            ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
            ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
        ]  # fmt: skip
        lib.cuLaunchKernel.restype = ctypes.c_int
        lib.cuKernelGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        lib.cuKernelGetFunction.restype = ctypes.c_int
        _libcuda = lib
    return _libcuda


class LaunchError(RuntimeError):
    pass


class Kernel:
    """One numba kernel specialised to one signature, launched with low host overhead.

    `launch(grid, block, args, shared=0, stream=0)`: `args` follow the signature; array slots take an
    `Operand`, scalar slots a Python number. The caller has validated shapes: nothing is re-checked here.
    """

    def __init__(self, dispatcher: Any, sig: str) -> None:
        self.dispatcher = dispatcher
        self.sig = sig
        argtypes, _ = sigutils.normalize_signature(sig)
        self.argtypes: tuple[Any, ...] = tuple(argtypes)
        self._ready = False

    # compiled lazily: importing an op module must not need a GPU (the fleet imports them for PTX builds)
    def _prepare(self) -> None:
        if USE_DISPATCHER:
            self._ready = True
            return
        kern = self.dispatcher.compile(self.sig)
        cufunc = kern._codelibrary.get_cufunc()
        handle = int(cufunc.handle)
        func = ctypes.c_void_p()
        # cuda.core loads modules as libraries, so the handle is a CUkernel; resolve it to the CUfunction of
        # the current context (a CUkernel is also accepted by cuLaunchKernel on CUDA >= 12, the fallback)
        rc = _driver().cuKernelGetFunction(ctypes.byref(func), ctypes.c_void_p(handle))
        self._func = ctypes.c_void_p(func.value if rc == 0 and func.value else handle)
        self.regs = cufunc.attrs.regs
        # parameter slots: int64 block for the 8-byte ones, one ctypes object per 4-byte float scalar
        slots: list[ctypes._SimpleCData] = []
        self._plan: list[tuple[str, int, int]] = []  # (kind, first slot, ndim)
        n8 = 0
        layout: list[tuple[str, int]] = []
        for t in self.argtypes:
            if isinstance(t, types.Array):
                layout.append(("a", t.ndim))
                n8 += 5 + 2 * t.ndim
            elif t == types.float32:
                layout.append(("f", 0))
            elif t in (types.float64, types.int64, types.intp, types.uint64):
                layout.append(("d" if t == types.float64 else "i", 0))
                n8 += 1
            elif t in (types.int32, types.uint32):
                layout.append(("i32", 0))
            else:
                raise LaunchError(f"fast launch: unsupported argument type {t} in {self.sig}")
        self._block = (ctypes.c_int64 * max(n8, 1))()
        self._scalars: list[ctypes._SimpleCData] = []
        ptrs: list[int] = []
        base = ctypes.addressof(self._block)
        i8 = 0
        for kind, ndim in layout:
            if kind == "a":
                self._plan.append(("a", i8, ndim))
                for j in range(5 + 2 * ndim):
                    ptrs.append(base + 8 * (i8 + j))
                i8 += 5 + 2 * ndim
            elif kind in ("i", "d"):
                self._plan.append((kind, i8, 0))
                ptrs.append(base + 8 * i8)
                i8 += 1
            else:
                obj: ctypes._SimpleCData = ctypes.c_float() if kind == "f" else ctypes.c_int32()
                self._plan.append((kind, len(self._scalars), 0))
                self._scalars.append(obj)
                ptrs.append(ctypes.addressof(obj))
        slots.extend(self._scalars)
        self._params = (ctypes.c_void_p * max(len(ptrs), 1))(*ptrs)
        self._launch = _driver().cuLaunchKernel
        self._ready = True

    def launch(
        self,
        grid: int | tuple[int, ...],
        block: int | tuple[int, ...],
        args: Sequence[Any],
        shared: int = 0,
        stream: int = 0,
    ) -> None:
        if not self._ready:
            self._prepare()
        if USE_DISPATCHER:
            dev = [a.dev if isinstance(a, Operand) else a for a in args]
            self.dispatcher[grid, block, stream, shared](*dev)
            return
        blk = self._block
        for (kind, at, ndim), a in zip(self._plan, args, strict=True):
            if kind == "a":
                n = 1
                for s in a.shape:
                    n *= s
                blk[at] = 0
                blk[at + 1] = 0
                blk[at + 2] = n
                blk[at + 3] = a.dtype.itemsize
                blk[at + 4] = a.ptr
                blk[at + 5 : at + 5 + ndim] = a.shape
                blk[at + 5 + ndim : at + 5 + 2 * ndim] = a.strides
            elif kind == "i":
                blk[at] = int(a)
            elif kind == "d":
                ctypes.c_double.from_buffer(blk, 8 * at).value = float(a)
            else:
                self._scalars[at].value = a
        g = grid if isinstance(grid, tuple) else (grid, 1, 1)
        b = block if isinstance(block, tuple) else (block, 1, 1)
        g = g + (1,) * (3 - len(g))
        b = b + (1,) * (3 - len(b))
        h = stream if type(stream) is int else _stream_handle(stream)
        p = self._params
        rc = self._launch(self._func, g[0], g[1], g[2], b[0], b[1], b[2], shared, h or None, p, None)
        if rc != 0:
            raise LaunchError(f"cuLaunchKernel failed with CUresult {rc} for {self.sig}")


def _stream_handle(stream: Any) -> int:
    """The CUstream address of a numba Stream, a CuPy Stream (`.ptr`) or a raw handle."""
    h = getattr(stream, "handle", None)
    if h is None:
        h = getattr(stream, "ptr", stream)
    h = getattr(h, "value", h)
    return int(h or 0)


def kernel(dispatcher: Any, sig: str) -> Kernel:
    """The fast-launch handle of `dispatcher` at `sig` (compiled on first launch)."""
    return Kernel(dispatcher, sig)


def sm_count() -> int:
    """Multiprocessors of the current device (a small fixed number under the simulator)."""
    global _SM
    if _SM is None:
        _SM = 4 if SIMULATED else int(cuda.get_current_device().MULTIPROCESSOR_COUNT)
    return _SM


_SM: int | None = None
