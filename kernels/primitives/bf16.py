"""bfloat16 as raw 16-bit words: the conversions the bf16 kernels use, on `uint16` arrays.

Why words: numba-cuda 0.30.4 types `ml_dtypes.bfloat16` arrays, but its bf16 conversions are extern shims
(fast only when LTO inlines them) and the CUDA simulator has no bf16 type at all (FACTS.md). A bf16 value is
the upper half of the fp32 with the same bits, so both conversions are integer arithmetic on the fp32 bit
pattern, which numba compiles to a handful of integer instructions and which the simulator runs as it is:
the same kernel bodies are tested in CI and run on the GPU.

  bf16_to_f32(w) = the fp32 whose bits are w << 16 (exact)
  f32_to_bf16(x) = round to nearest even of x's bits to the upper 16: (u + 0x7FFF + ((u >> 16) & 1)) >> 16,
                   NaN kept NaN (quiet bit 0x0040 set, so a payload in the low half cannot round to infinity);
                   overflow rounds to +-inf as IEEE rounding does. The same result as ml_dtypes' astype. On
                   sm_80 and newer the GPU rounds with cvt.rn.bf16x2.f32 instead (below): the same words,
                   except that every NaN becomes the canonical 0x7fff (sign and payload not kept).

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


# --- rounding in hardware on sm_80 and newer ----------------------------------------------------------------
#
# The integer rounding above is ~7 instructions per element (shift, and, two adds, shift, the NaN compare
# and select). sm_80 and newer round two values in one `cvt.rn.bf16x2.f32`, with the same results except a
# NaN's payload: the hardware gives its canonical NaN 0x7fff (NaN stays NaN, which is what the checks ask).
# Which one a kernel gets is decided when it is compiled, for the architecture it is compiled for: NVVM
# replaces `__nvvm_reflect("__CUDA_ARCH")` by that architecture (750, 800, 900, ...) and drops the branch not
# taken, so code for older GPUs never holds the instruction. The LLVM helpers below are for intrinsics
# (kernels.primitives.vector's 16-byte stores use `round_pair`).
CVT_FROM_ARCH = 800  # the first __CUDA_ARCH with cvt.rn.bf16x2.f32 (a lab A/B sets it past any GPU)


def _llvm() -> tuple[Any, Any]:
    from llvmlite import ir

    i8, i32 = ir.IntType(8), ir.IntType(32)

    def cuda_arch(builder: Any) -> Any:
        """`__nvvm_reflect("__CUDA_ARCH")`: an i32 that NVVM folds to the target architecture."""
        mod = builder.module
        fn = mod.globals.get("__nvvm_reflect")
        if fn is None:
            fn = ir.Function(mod, ir.FunctionType(i32, [ir.PointerType(i8)]), "__nvvm_reflect")
        name = "solfleet.reflect.cuda_arch"
        g = mod.globals.get(name)
        if g is None:
            text = bytearray(b"__CUDA_ARCH\0")
            g = ir.GlobalVariable(mod, ir.ArrayType(i8, len(text)), name=name)
            g.initializer = ir.Constant(ir.ArrayType(i8, len(text)), text)
            g.global_constant = True
            g.linkage = "internal"
        return builder.call(fn, [builder.bitcast(g, ir.PointerType(i8))])

    def soft_word(builder: Any, x: Any) -> Any:
        """f32_to_bf16 of an fp32 LLVM value in integer arithmetic, as the low 16 bits of an i32."""
        u = builder.bitcast(x, i32)
        hi = builder.lshr(u, ir.Constant(i32, 16))
        odd = builder.and_(hi, ir.Constant(i32, 1))
        rne = builder.lshr(builder.add(builder.add(u, ir.Constant(i32, 0x7FFF)), odd), ir.Constant(i32, 16))
        mag = builder.and_(u, ir.Constant(i32, 0x7FFFFFFF))
        nan = builder.icmp_unsigned(">", mag, ir.Constant(i32, 0x7F800000))
        return builder.select(nan, builder.or_(hi, ir.Constant(i32, 0x40)), rne)

    # d = {bf16(a) in the high half, bf16(b) in the low half}
    f32 = ir.FloatType()
    cvt = ir.InlineAsm(ir.FunctionType(i32, [f32, f32]), "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f")

    def round_pair(builder: Any, lo: Any, hi: Any) -> Any:
        """The bf16 words of two fp32 LLVM values packed in an i32 (lo's in the low half): cvt.rn.bf16x2.f32
        where the target has it (CVT_FROM_ARCH), integer rounding elsewhere."""
        hw = builder.call(cvt, [hi, lo])
        soft = builder.or_(builder.shl(soft_word(builder, hi), ir.Constant(i32, 16)), soft_word(builder, lo))
        new = builder.icmp_signed(">=", cuda_arch(builder), ir.Constant(i32, CVT_FROM_ARCH))
        return builder.select(new, hw, soft)

    return round_pair, soft_word


def _gpu_f32_to_bf16() -> Any:
    from llvmlite import ir
    from numba.core import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def f32_to_bf16(typingctx, x):  # type: ignore[no-untyped-def]
        if not isinstance(x, (types.Float, types.Integer)):  # what the simulator's float32(x) takes
            raise TypeError(f"f32_to_bf16 rounds a number, got {x}")
        sig = types.uint16(x)

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            v = context.cast(builder, args[0], sig.args[0], types.float32)
            return builder.trunc(round_pair(builder, v, v), ir.IntType(16))

        return sig, codegen

    return f32_to_bf16


# On a GPU both are inline: bf16_to_f32 a device function, f32_to_bf16 an intrinsic (round_pair of the value
# with itself, the low word kept). Under the simulator they stay plain Python: a simulated device-function
# call takes a per-module lock that the block's 32 threads contend for, each hand-over waiting on CPython's
# 5 ms GIL switch interval (a bf16 clip_grad_norm over 3 arrays of ~2000 elements: 43 s as device
# functions, 1.3 s as plain functions, this 2-core machine).
if not SIMULATED:
    round_pair, soft_word = _llvm()
    bf16_to_f32 = cuda.jit(device=True, inline="always")(bf16_to_f32)
    f32_to_bf16 = _gpu_f32_to_bf16()
