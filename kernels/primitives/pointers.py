"""Arrays at raw device addresses, inside a kernel: the device side of a table of pointers.

A kernel that walks hundreds of arrays (clip_grad_norm over a model's gradients) cannot take each as an
argument: a launch's parameters are capped at 4 KB (32 KB from CUDA 12.1 on Volta+, but numba spells every
array as 7 words), and one launch per array costs the host ~5 us each. Instead the host writes one int64
table of (address, elements) rows to the device, and the kernel turns a row back into an array:

  at = view_at(dtype)      # once per element type, outside the kernel
  g = at(addr, n)          # in a kernel: the 1-d C-contiguous array of n elements at addr

`g` is an ordinary numba array (the array struct numba's `carray` builds, over an `inttoptr`), so every
device helper written for array arguments (kernels.primitives.vector's 16-byte loads included) runs on it
unchanged. The address must
be a device pointer of that element type, valid for n elements, and, for the 16-byte helpers, aligned as
they require; the caller's table builder checks that (nothing is checked on the device).

bf16 arrays are their uint16 words here, as everywhere in the kernels (kernels.primitives.bf16).

Under the CUDA simulator the "device" arrays are numpy arrays in host memory and the table holds their host
addresses (`address_of`); `at` is then a numpy view over those bytes, so the same kernel reads and writes
the caller's arrays in place, as it does on the GPU.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from kernels.primitives.bf16 import WORD
from kernels.runtime.arrays import BF16, SIMULATED

# the element types a table may hold, as the kernels see them (bf16: its words)
ELEMENT: dict[np.dtype, np.dtype] = {
    np.dtype(np.float32): np.dtype(np.float32),
    np.dtype(np.float16): np.dtype(np.float16),
    BF16: WORD,
}


def address_of(dev: Any) -> int:
    """The address a table row holds for device array `dev`: its device pointer on a GPU; on the simulator
    the host address of the numpy array behind the fake device array."""
    if SIMULATED:
        ary = getattr(dev, "_ary", dev)
        return int(np.asarray(ary).__array_interface__["data"][0])
    return int(dev.__cuda_array_interface__["data"][0] or 0)


def _gpu_view_at(elem: np.dtype) -> Any:
    from llvmlite import ir
    from numba.core import types
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic
    from numba.cuda.np.numpy_support import from_dtype

    nb_elem = from_dtype(elem)
    arr_ty = types.Array(nb_elem, 1, "C")

    @intrinsic
    def at(typingctx, addr, n):  # type: ignore[no-untyped-def]
        if not isinstance(addr, types.Integer) or not isinstance(n, types.Integer):
            raise TypeError(f"at(addr, n) takes two integers, got {addr}, {n}")
        sig = arr_ty(addr, n)

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            # what numba's carray does for a C-contiguous 1-d view: data, shape, strides; no owner
            a = context.cast(builder, args[0], sig.args[0], types.int64)
            count = context.cast(builder, args[1], sig.args[1], types.intp)
            data = builder.inttoptr(a, ir.PointerType(context.get_data_type(nb_elem)))
            ary = context.make_array(arr_ty)(context, builder)
            itemsize = cgutils.intp_t(elem.itemsize)
            context.populate_array(
                ary, data=data, shape=[count], strides=[itemsize], itemsize=itemsize, meminfo=None
            )
            return ary._getvalue()

        return sig, codegen

    return at


def _sim_view_at(elem: np.dtype) -> Any:
    def at(addr, n):  # type: ignore[no-untyped-def]
        n = int(n)
        buf = (ctypes.c_char * (n * elem.itemsize)).from_address(int(addr))
        return np.frombuffer(buf, dtype=elem, count=n)

    return at


_VIEWS: dict[np.dtype, Any] = {}


def view_at(dtype: np.dtype) -> Any:
    """The device function at(addr, n) for arrays of `dtype` (float32, float16 or bf16), made once."""
    elem = ELEMENT[np.dtype(dtype)]
    fn = _VIEWS.get(elem)
    if fn is None:
        fn = _VIEWS[elem] = _sim_view_at(elem) if SIMULATED else _gpu_view_at(elem)
    return fn
