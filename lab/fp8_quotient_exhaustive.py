# ruff: noqa: E501, E701, E702, E731, SIM300
"""The exhaustive check behind kernels.primitives.fp8.quotient (a reviewer's proof sketch, run on CPU):

One Markstein correction, q = RN(q0 + r * inv) with q0 = RN(x * inv), inv = RN(1 / scale), r = fma(-q0,
scale, x), can differ from RN(x / scale) only where x / scale lies within a few half-ulps' perturbation of an
fp32 rounding midpoint: the perturbation is at most (B 2^-23 + 1) B 2^-48 half-ulps (B the scale's 24-bit
integer mantissa), the distance of x / scale from a midpoint at least |k| / B half-ulps, so only |k| < 3,
k = +-2^v2(B), can fail. This script lists every (x mantissa A, scale mantissa B) pair with such a k (both
mantissas in [2^23, 2^24), the quotient's two binades) and compares the corrected quotient with x / scale
bit for bit, with an exact fp32 fma emulated in float64 (a * b exact, TwoSum, round-to-odd to 53 bits, then
round to nearest fp32; checked against rational arithmetic on 3000 random triples first). Exponents only
shift the picture while nothing under- or overflows, which fp8.exact_scale's range and |x / scale| >= 2^-11
keep (tests/kernels/test_fp8_quotient.py covers the range's ends).

    python lab/fp8_quotient_exhaustive.py      (~10 s; prints the pairs checked and how many were wrong)
"""

from fractions import Fraction

import numpy as np

F32 = np.float32


def fma32(a, b, c):
    """exact fp32 fma, vectorized: a*b exact in f64; TwoSum; round-to-odd to 53 bits; then RN to f32."""
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    c = c.astype(np.float64)
    p = a * b
    s = p + c
    bb = s - p
    e = (p - (s - bb)) + (c - bb)
    bits = s.view(np.uint64)
    even = (bits & 1) == 0
    fix = (e != 0) & even
    s2 = np.where(fix, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)
    return s2.astype(np.float32)


def marks(x, s, inv):
    q0 = (x * inv).astype(F32)
    r = fma32(-q0, np.broadcast_to(s, x.shape), x)
    q = fma32(r, np.broadcast_to(inv, x.shape), q0)
    return np.where(r == 0, q0, q), q0


# validate fma32 against Fraction on random
rng = np.random.default_rng(0)


def rn32(v):
    c = F32(float(v))
    cands = (c, np.nextafter(c, F32(-np.inf)), np.nextafter(c, F32(np.inf)))
    return min(cands, key=lambda f: (abs(Fraction(float(f)) - v), int(np.array(f, F32).view(np.uint32)) & 1))


A = (rng.standard_normal(3000) * 2.0 ** rng.integers(-30, 30, 3000)).astype(F32)
B = (rng.standard_normal(3000)).astype(F32)
C = (rng.standard_normal(3000) * 2.0 ** rng.integers(-60, 10, 3000)).astype(F32)
got = fma32(A, B, C)
for i in range(3000):
    w = rn32(Fraction(float(A[i])) * Fraction(float(B[i])) + Fraction(float(C[i])))
    assert got[i].view(np.uint32) == w.view(np.uint32), (A[i], B[i], C[i])
print("fma32 ok")
LO, HI = 1 << 23, 1 << 24
total = 0
bad = 0
nonfaith = 0
ex = []
for j in (0, 1):
    B = np.arange(LO, HI, dtype=np.uint64)
    B = B[(B & np.uint64((1 << (j + 1)) - 1)) == np.uint64(1 << j)]
    Bo = B >> np.uint64(j)
    inv2 = (Bo + np.uint64(1)) // np.uint64(2)
    for sgn in (1, -1):
        for d in (24, 25):
            n = d - j - 1
            c = ((Bo + np.uint64(1)) // np.uint64(2)) if sgn == 1 else ((Bo - np.uint64(1)) // np.uint64(2))
            p = np.ones_like(Bo)
            for _ in range(n):
                p = (p * inv2) % Bo
            A0 = (c * p) % Bo
            for m in range(0, (1 << (j + 1)) + 3):
                # A = A0 + m*Bo shifted to start at LO
                start = (np.uint64(LO) - A0 + Bo - np.uint64(1)) // Bo  # smallest t with A0+t*Bo>=LO
                A = A0 + (start + np.uint64(m)) * Bo
                ok = np.uint64(HI) > A
                ok &= (A >= B) if d == 24 else (A < B)
                if not ok.any():
                    continue
                a = A[ok].astype(np.uint32)
                b = B[ok].astype(np.uint32)
                # check the residual really is sgn*2^j and the multiplier odd
                num = a.astype(object) * (1 << d) - sgn * (1 << j)
                assert all(
                    ((num[i]) % int(b[i]) == 0 and (num[i] // int(b[i])) % 2 == 1)
                    for i in range(0, len(a), max(1, len(a) // 50))
                )
                x = ((a - np.uint32(LO)) | np.uint32(0x3F800000)).view(F32)
                s = ((b - np.uint32(LO)) | np.uint32(0x3F800000)).view(F32)
                inv = (F32(1) / s).astype(F32)
                q0 = (x * inv).astype(F32)
                r = fma32(-q0, s, x)
                q = np.where(r == 0, q0, fma32(r, inv, q0))
                ref = x / s
                nb = np.count_nonzero(q.view(np.int32) != ref.view(np.int32))
                total += len(a)
                bad += nb
                if nb and len(ex) < 5:
                    i = np.nonzero(q != ref)[0][0]
                    ex.append((float(x[i]), float(s[i]), float(q[i]), float(ref[i])))
print("pairs", total, "wrong", bad, ex)
