"""kernels.primitives.fp8.markstein, the quotient the cast_fp8 kernels take on a GPU instead of dividing each
element: it must be x / scale correctly rounded, bit for bit, for every finite normal scale.

The function's own Python body runs here with float32 numpy scalars (their products round once, as the
GPU's do) and an fma emulated exactly (rational arithmetic, one rounding to nearest even), so every
rounding is the GPU's. numba's simulator cannot do this: its fma is a * b + c, two roundings. The
cases: scales at the bottom, middle and top of their binades over 2^-120 .. 2^100, x at and one ulp
around e4m3 rounding midpoints (where a wrong last bit changes a code), random x, and a sweep of x's
mantissas against the hardest scales (mantissa all ones, 1 + ulp).
"""

from __future__ import annotations

from fractions import Fraction
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from kernels.primitives import fp8

F32 = np.float32
INF = F32(np.inf)


def rn32(v: Fraction) -> np.float32:
    """v rounded to the nearest float32, ties to even (float(v) is exact-then-rounded to float64; the
    three float32 candidates around it are compared exactly, so there is no double rounding)."""
    c = F32(float(v))
    cands = (c, np.nextafter(c, -INF), np.nextafter(c, INF))
    return min(cands, key=lambda f: (abs(Fraction(float(f)) - v), int(np.array(f, F32).view(np.uint32)) & 1))


def exact_fma(a: np.float32, b: np.float32, c: np.float32) -> np.float32:
    v = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    if v == 0:  # IEEE's zero: -0 only when both the product and c are -0 (or -0 + +0 ... is +0 under RN)
        product_neg = bool(np.signbit(a)) != bool(np.signbit(b))
        return F32(-0.0) if product_neg and np.signbit(c) and c == 0 else F32(0.0)
    return rn32(v)


@pytest.fixture
def gpu_fma(monkeypatch: pytest.MonkeyPatch) -> None:
    libdevice = SimpleNamespace(fmul_rn=lambda a, b: F32(a) * F32(b))  # one rounding, as mul.rn.f32
    monkeypatch.setattr(fp8, "cuda", SimpleNamespace(fma=exact_fma, libdevice=libdevice))


def quotient(x: np.float32, scale: np.float32) -> np.float32:
    inv = rn32(Fraction(1) / Fraction(float(scale)))  # the kernel's float32(1.0) / scale
    assert inv == F32(1.0) / scale
    return fp8.markstein(F32(x), F32(scale), inv)


def divided(x: np.float32, scale: np.float32) -> np.float32:
    if x == 0:
        return F32(x) / scale  # the signed zero (a Fraction has no sign of zero)
    return rn32(Fraction(float(x)) / Fraction(float(scale)))


def _midpoints() -> np.ndarray:
    codes = np.arange(0, 0x7F, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return (codes[:-1] + codes[1:]) / 2


def _check(pairs: list[tuple[np.float32, np.float32]]) -> None:
    bad = [(float(x), float(s)) for x, s in pairs if not _same(quotient(x, s), divided(x, s))]
    assert not bad, f"{len(bad)} of {len(pairs)} quotients differ from x / scale, e.g. {bad[:5]}"


def _same(a: np.float32, b: np.float32) -> bool:
    return bool(np.array(a, F32).view(np.uint32) == np.array(b, F32).view(np.uint32))


def test_at_and_around_every_e4m3_midpoint(gpu_fma: None) -> None:
    rng = np.random.default_rng(11)
    mids = _midpoints()
    pairs = []
    top = float(np.nextafter(F32(2), F32(0)))
    for e in (-92, -60, -9, 0, 1, 23, 99):  # the ends of fp8.exact_scale's range included
        for m in (1.0, top, float(rng.uniform(1, 2)), float(rng.uniform(1, 2))):
            s = F32(m * 2.0**e)
            assert fp8.exact_scale.py_func(s)
            for mid in mids[rng.choice(mids.size, 24, replace=False)]:
                c = F32(mid * float(s))
                for x in (c, np.nextafter(c, -INF), np.nextafter(c, INF)):
                    pairs += [(x, s), (-x, s)]
            pairs += [(F32(448 * float(s)), s), (F32(-0.0), s), (F32(0.0), s)]
    _check(pairs)


def test_random_x_and_scales(gpu_fma: None) -> None:
    rng = np.random.default_rng(12)
    pairs = []
    for _ in range(400):
        s = F32(rng.uniform(1, 2) * 2.0 ** rng.integers(-92, 100))
        for x in rng.uniform(-448, 448, 8) * float(s):
            pairs.append((F32(x), s))
    _check(pairs)


def test_mantissa_sweep_against_the_hardest_scales(gpu_fma: None) -> None:
    """Every 4099th float32 mantissa of [1, 2) and [1.5, 3), against scales with a mantissa of all ones,
    1 + ulp, and two irrational-looking ones."""
    xs = np.arange(0x3F800000, 0x3F800000 + (1 << 23), 4099, dtype=np.uint32).view(F32)
    scales = [np.nextafter(F32(2), F32(0)), np.nextafter(F32(1), F32(2)), F32(1.7320508), F32(1.3333334)]
    _check([(x, s) for s in scales for x in np.concatenate([xs, xs * F32(1.5)])])


def test_a_zero_quotient_keeps_its_sign(gpu_fma: None) -> None:
    s = F32(3.0)
    for x in (F32(-0.0), F32(0.0)):
        assert np.signbit(quotient(x, s)) == np.signbit(x)


def test_below_the_range_the_identity_breaks_and_exact_scale_refuses(gpu_fma: None) -> None:
    """Why exact_scale has a floor: at scale ~2^-119 the remainder of a quotient near an e4m3 midpoint is
    under fp32's subnormal grain and the corrected quotient is off by an ulp. The kernels divide there."""
    s = F32(1.5046326793694263e-36)  # ~2^-119
    assert not fp8.exact_scale.py_func(s)
    xs = [F32(m * float(s)) for m in _midpoints()]
    wrong = [y for x in xs for y in (x, np.nextafter(x, INF)) if not _same(quotient(y, s), divided(y, s))]
    assert wrong, "the identity held at 2^-119: exact_scale's floor could come down"
    for bad in (F32(2.0**-93), F32(2.0**101), INF, F32(np.nan)):
        assert not fp8.exact_scale.py_func(bad)


def test_subnormal_x_and_tiny_quotients_give_the_divisions_codes(gpu_fma: None) -> None:
    """Under |x / scale| < 2^-11 the fp32 quotient may differ from the division's in its last bits (a
    subnormal x, r under fp32's grain); the e4m3 code may not: both are a zero of x's sign."""
    rng = np.random.default_rng(13)
    tiny = np.concatenate(
        [np.array([2.0**-149, 2.0**-140, 2.0**-127, 1e-39, 1e-30, 1e-20]), rng.uniform(0, 1e-6, 40)]
    )
    for s in (F32(3.0e-3 / 448), F32(1.7320508), F32(2.0**-92), F32(5.0e5)):
        for t in tiny:
            for x in (F32(t), F32(-t), F32(t * float(s)), F32(-t * float(s))):
                got = np.array([quotient(x, s)], F32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
                want = np.array([divided(x, s)], F32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
                assert got[0] == want[0], (float(x), float(s))
