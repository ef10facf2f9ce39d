"""float8 e4m3fn as raw 8-bit words: the fp32 -> e4m3fn conversion the fp8 kernels use, on `uint8` arrays.

Why words: numba has no fp8 type at all (ml_dtypes' float8_e4m3fn cannot be typed), and the CUDA simulator
runs only what numba's Python semantics allow. As for bf16 (kernels.primitives.bf16), the conversion is
integer arithmetic on the fp32 bit pattern, so the simulator runs the same kernel body the GPU runs.

e4m3fn: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; NaN is S.1111.111 (0x7f /
0xff); largest finite 448 (0x7e = 1.75 * 2^8); smallest normal 2^-6 (0x08); subnormals m * 2^-9, m = 1..7.

  f32_to_e4m3(x) = round to nearest even of x, saturated ("satfinite", what PTX's cvt.rn.satfinite.e4m3x2.f32
                   and Transformer Engine's casts do):
                   NaN            -> sign | 0x7f (NaN stays NaN)
                   |x| >= 448     -> sign | 0x7e (+-448; +-inf included: e4m3fn has no infinity)
                   |x| >= 2^-6    -> normal: the exponent rebiased (127 -> 7) and the 20 dropped mantissa bits
                                     rounded to nearest even; a carry moves into the exponent (below 448
                                     nothing can round past 0x7e)
                   |x| <  2^-6    -> subnormal: round(|x| / 2^-9) to nearest even, 0..8 (8 = 0x08 = 2^-6,
                                     the smallest normal), which is the code itself; 2^-10 and below round to
                                     a signed zero (2^-10 is the tie between 0 and 2^-9: to even, 0)
                   The same codes as ml_dtypes' astype(float8_e4m3fn) of the value clipped to [-448, 448]
                   (ml_dtypes does not saturate: past 464 it gives NaN). tests/kernels/test_cast_fp8.py checks
                   every fp32 rounding boundary of the format against it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda, float32, uint8, uint32
from numba.cuda import libdevice  # noqa: F401  (cuda.libdevice in markstein)

from kernels.primitives.bf16 import f32_bits
from kernels.runtime.arrays import SIMULATED

WORD = np.dtype(np.uint8)  # how an fp8 array reaches the kernels
E4M3_MAX = 448.0  # largest finite e4m3fn


@cuda.jit(device=True, inline="always")
def f32_to_e4m3(x):  # type: ignore[no-untyped-def]
    u = f32_bits(float32(x))  # type: ignore[no-untyped-call]
    sign = (u >> uint32(24)) & uint32(0x80)
    a = u & uint32(0x7FFFFFFF)
    if a > uint32(0x7F800000):  # NaN
        return uint8(sign | uint32(0x7F))
    if a >= uint32(0x43E00000):  # >= 448, +-inf included: saturate
        return uint8(sign | uint32(0x7E))
    if a >= uint32(0x3C800000):  # >= 2^-6: normal in e4m3 (rebias: minus 120 << 23)
        r = a - uint32(0x3C000000)
        r = (r + uint32(0x7FFFF) + ((r >> uint32(20)) & uint32(1))) >> uint32(20)
        return uint8(sign | r)
    if a < uint32(0x3A800000):  # < 2^-10: zero (fp32 subnormals and zeros included)
        return uint8(sign)
    # 2^-10 <= |x| < 2^-6: the significand 1.m (24 bits) shifted down to units of 2^-9
    e = a >> uint32(23)
    m = (a & uint32(0x7FFFFF)) | uint32(0x800000)
    sh = uint32(141) - e  # 21 (|x| in [2^-7, 2^-6)) .. 24 ([2^-10, 2^-9))
    q = m >> sh
    rem = m & ((uint32(1) << sh) - uint32(1))
    half = uint32(1) << (sh - uint32(1))
    if rem > half or (rem == half and (q & uint32(1)) != uint32(0)):
        q += uint32(1)
    return uint8(sign | q)


# --- x / scale without a division per element -------------------------------------------------------------
#
# An IEEE fp32 division (div.rn.f32) is a reciprocal, four FMAs, a range check with a slow-path branch and a
# convergence barrier in SASS: 36 of them in one thread's tile of the cast kernel took it to 55 registers
# (4 of its 8 blocks per SM resident). The scale is the same for every element, so the kernels take its
# reciprocal once and correct each product (Markstein's division, one correction: inv = RN(1 / scale),
# q0 = RN(x * inv), r = x - q0 * scale exact in one fma, q = RN(q0 + r * inv)). q0 is not always within an
# ulp, so Markstein's theorem does not cover it as such; one correction can only miss where x / scale lies
# within a few half-ulps' perturbation of an fp32 rounding midpoint, and lab/fp8_quotient_exhaustive.py lists
# every such pair of mantissas (11.6 million) and finds the corrected quotient equal to x / scale in each:
#
#   quotient(x, scale, inv) -> x / scale correctly rounded, for an exact_scale, inv = 1 / scale and
#                              |x / scale| >= 2^-11. Below that (a subnormal x, a tiny quotient) the fp32
#                              value may differ in its last bits, but every such quotient converts to a zero
#                              of x's sign, as the division's does: the e4m3 codes are the same for all x.
#                              r == 0 returns q0, which keeps the sign of a zero quotient (fma(+0, inv, -0)
#                              is +0). Under the simulator, x / scale: its fma is a * b + c, two roundings.
#   exact_scale(scale)      -> whether quotient holds: 2^-92 <= scale <= 2^100. Below, the remainder r of a
#                              quotient >= 2^-11 falls under fp32's subnormal grain and is no longer exact;
#                              above, 1 / scale nears the subnormals. NaN and inf scales (an inf or NaN in x)
#                              are outside too. There the cast kernel divides instead (amax under 448 * 2^-92
#                              ~ 9e-26 or over 448 * 2^100 ~ 5.7e32: never in a trained model's tensors).
#
# tests/kernels/test_fp8_quotient.py runs the shipped body with an exact fma against rational division: the
# range's ends, binade edges, x at and around e4m3's rounding midpoints, subnormal x; on a GPU the cast's
# verify cases and tests compare every code with numpy's division.

SCALE_MIN = 2.0**-92  # exponent(q) + exponent(scale) - 46 >= -149 for every q >= 2^-11: r is exact
SCALE_MAX = 2.0**100  # 1 / scale >= 2^-100, far from the subnormals


@cuda.jit(device=True, inline="always")
def exact_scale(scale):  # type: ignore[no-untyped-def]
    return scale >= float32(SCALE_MIN) and scale <= float32(SCALE_MAX)  # False for NaN


def markstein(x, scale, inv):  # type: ignore[no-untyped-def]
    """quotient's body on a GPU (plain Python here, so the test can run it with an exact fma). The product
    is libdevice's fmul_rn (PTX mul.rn.f32): a plain mul.f32 would leave ptxas free to contract it."""
    q0 = cuda.libdevice.fmul_rn(x, inv)
    r = cuda.fma(-q0, scale, x)
    if r == float32(0.0):
        return q0
    return cuda.fma(r, inv, q0)


if SIMULATED:

    @cuda.jit(device=True, inline="always")
    def quotient(x, scale, inv):  # type: ignore[no-untyped-def]
        return x / scale

else:
    quotient = cuda.jit(device=True, inline="always")(markstein)


# --- 8 codes at a time: the cast_fp8 vector kernel's conversion and its 8-byte store ----------------------
#
#   pack8(a, off, scale, inv) -> (lo, hi): the codes of a[off + k] / scale, k < 8, as two little-endian
#                           uint32 words (k = 0 in the lowest byte of lo): f32_to_e4m3 of each quotient(),
#                           bit for bit; scale an exact_scale, inv = 1 / scale
#   pack8_cvt(...)       -> the same words through PTX's cvt.rn.satfinite.e4m3x2.f32 (sm_89 and newer; one
#                           instruction per two codes): the same codes, except that a NaN is 0x7f whatever its
#                           sign (the hardware's canonical NaN)
#   store8(out, i, lo, hi): out[i .. i + 7] = the bytes of lo, hi, as one 8-byte `st.global.v2.b32` (out a
#                           uint8 array, element i on an 8-byte boundary)
#
# Under the simulator pack8_cvt is pack8 and store8 stores byte by byte (no PTX there); the GPU variants are
# checked on a GPU against pack8 (tests/kernels/test_cast_fp8.py) and by the registry's verify cases.


@cuda.jit(device=True, inline="always")
def pack8(a, off, scale, inv):  # type: ignore[no-untyped-def]
    lo = uint32(0)
    hi = uint32(0)
    for k in range(4):
        lo |= uint32(f32_to_e4m3(quotient(a[off + k], scale, inv))) << uint32(8 * k)
        hi |= uint32(f32_to_e4m3(quotient(a[off + 4 + k], scale, inv))) << uint32(8 * k)
    return lo, hi


def _gpu_intrinsics() -> tuple[Any, Any]:
    from llvmlite import ir
    from numba.core import types
    from numba.cuda.extending import intrinsic

    i16, i32 = ir.IntType(16), ir.IntType(32)
    f32 = ir.FloatType()
    # d = {cvt(a) in the high byte, cvt(b) in the low byte}
    cvt = ir.InlineAsm(ir.FunctionType(i16, [f32, f32]), "cvt.rn.satfinite.e4m3x2.f32 $0, $1, $2;", "=h,f,f")

    @intrinsic
    def e4m3x4(typingctx, a0, a1, a2, a3):  # type: ignore[no-untyped-def]
        if any(t != types.float32 for t in (a0, a1, a2, a3)):
            raise TypeError("e4m3x4 converts four float32 values")
        sig = types.uint32(types.float32, types.float32, types.float32, types.float32)

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            lo = builder.zext(builder.call(cvt, [args[1], args[0]]), i32)
            hi = builder.zext(builder.call(cvt, [args[3], args[2]]), i32)
            return builder.or_(lo, builder.shl(hi, ir.Constant(i32, 16)))

        return sig, codegen

    @intrinsic
    def store8(typingctx, out, idx, lo, hi):  # type: ignore[no-untyped-def]
        if not isinstance(out, types.Array) or out.dtype != types.uint8:
            raise TypeError(f"store8 needs a uint8 array, got {out}")
        sig = types.void(out, idx, types.uint32, types.uint32)

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            i = context.cast(builder, args[1], sig.args[1], types.intp)
            p = builder.addrspacecast(builder.gep(ary.data, [i]), ir.PointerType(ir.IntType(8), 1))
            vp = builder.bitcast(p, ir.PointerType(ir.VectorType(i32, 2), 1))
            v = ir.Constant(ir.VectorType(i32, 2), ir.Undefined)
            v = builder.insert_element(v, args[2], ir.Constant(i32, 0))
            v = builder.insert_element(v, args[3], ir.Constant(i32, 1))
            builder.store(v, vp, align=8)
            return context.get_dummy_value()

        return sig, codegen

    return e4m3x4, store8


if SIMULATED:
    pack8_cvt = pack8

    @cuda.jit(device=True)
    def store8(out, i, lo, hi):  # type: ignore[no-untyped-def]
        for k in range(4):
            out[i + k] = uint8((lo >> uint32(8 * k)) & uint32(0xFF))
            out[i + 4 + k] = uint8((hi >> uint32(8 * k)) & uint32(0xFF))

else:
    e4m3x4, store8 = _gpu_intrinsics()

    @cuda.jit(device=True, inline="always")
    def pack8_cvt(a, off, scale, inv):  # type: ignore[no-untyped-def]
        lo = e4m3x4(
            quotient(a[off], scale, inv),
            quotient(a[off + 1], scale, inv),
            quotient(a[off + 2], scale, inv),
            quotient(a[off + 3], scale, inv),
        )
        hi = e4m3x4(
            quotient(a[off + 4], scale, inv),
            quotient(a[off + 5], scale, inv),
            quotient(a[off + 6], scale, inv),
            quotient(a[off + 7], scale, inv),
        )
        return lo, hi
