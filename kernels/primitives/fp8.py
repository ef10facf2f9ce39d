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

import numpy as np
from numba import cuda, float32, uint8, uint32

from kernels.primitives.bf16 import f32_bits

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
