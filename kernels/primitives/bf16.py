"""bfloat16 as raw 16-bit words: the conversions the bf16 kernels use, on `uint16` arrays.

Why words: numba-cuda 0.30.4 types `ml_dtypes.bfloat16` arrays, but its bf16 conversions are extern shims
(fast only when LTO inlines them) and the CUDA simulator has no bf16 type at all (FACTS.md). A bf16 value is
the upper half of the fp32 with the same bits, so both conversions are integer arithmetic on the fp32 bit
pattern, which numba compiles to a handful of integer instructions and which the simulator runs as it is:
the same kernel bodies are tested in CI and run on the GPU.

  bf16_to_f32(w) = the fp32 whose bits are w << 16 (exact)
  f32_to_bf16(x) = round to nearest even of x's bits to the upper 16: (u + 0x7FFF + ((u >> 16) & 1)) >> 16,
                   NaN kept NaN (quiet bit 0x0040 set, so a payload in the low half cannot round to infinity);
                   overflow rounds to +-inf as IEEE rounding does. The same result as ml_dtypes' astype.

Only the bit reinterpretation (fp32 <-> uint32) needs an intrinsic (an LLVM bitcast: no instruction at all);
under the simulator it is numpy's view of the same 4 bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda, float32, uint16, uint32

from kernels.runtime.arrays import SIMULATED

WORD = np.dtype(np.uint16)  # how a bf16 array reaches the kernels


def _bitcast_intrinsics() -> tuple[Any, Any]:
    from llvmlite import ir
    from numba.core import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def f32_bits(typingctx, x):  # type: ignore[no-untyped-def]
        if x != types.float32:
            raise TypeError(f"f32_bits needs a float32, got {x}")
        sig = types.uint32(types.float32)

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            return builder.bitcast(args[0], ir.IntType(32))

        return sig, codegen

    @intrinsic
    def bits_f32(typingctx, u):  # type: ignore[no-untyped-def]
        # numba widens unsigned shifts and sums to 64 bits: take any integer, keep its low 32 bits
        if not isinstance(u, types.Integer):
            raise TypeError(f"bits_f32 needs an integer, got {u}")
        sig = types.float32(u)

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            low = context.cast(builder, args[0], sig.args[0], types.uint32)
            return builder.bitcast(low, ir.FloatType())

        return sig, codegen

    return f32_bits, bits_f32


if SIMULATED:

    def f32_bits(x):  # type: ignore[no-untyped-def]
        return np.float32(x).view(np.uint32)

    def bits_f32(u):  # type: ignore[no-untyped-def]
        return np.uint32(u).view(np.float32)

else:
    f32_bits, bits_f32 = _bitcast_intrinsics()


def bf16_to_f32(w: Any) -> Any:
    return bits_f32(uint32(w) << uint32(16))  # type: ignore[no-untyped-call]


def f32_to_bf16(x: Any) -> Any:
    u = f32_bits(float32(x))  # type: ignore[no-untyped-call]
    if (u & uint32(0x7FFFFFFF)) > uint32(0x7F800000):
        return uint16((u >> uint32(16)) | uint32(0x40))
    return uint16((u + uint32(0x7FFF) + ((u >> uint32(16)) & uint32(1))) >> uint32(16))


# On a GPU both are inline device functions. Under the simulator they stay plain Python: a simulated
# device-function call takes a per-module lock that the block's 32 threads contend for, each hand-over
# waiting on CPython's 5 ms GIL switch interval (a bf16 clip_grad_norm over 3 arrays of ~2000 elements:
# 43 s as device functions, 1.3 s as plain functions, this 2-core machine).
if not SIMULATED:
    bf16_to_f32 = cuda.jit(device=True, inline="always")(bf16_to_f32)
    f32_to_bf16 = cuda.jit(device=True, inline="always")(f32_to_bf16)
