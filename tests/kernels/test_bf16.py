"""bf16 as raw words (kernels.primitives.bf16) through the launchers, in the simulator and on a GPU alike:
fp32 -> bf16 rounding bit-exact against ml_dtypes on ties, subnormals, overflow and NaN; residual_add and
gemm on numpy bf16 arrays against float64."""

from __future__ import annotations

import numpy as np

from kernels.ops.cast import cast
from kernels.ops.gemm import gemm
from kernels.ops.o_proj import o_proj
from kernels.ops.residual_add import residual_add
from kernels.runtime.arrays import BF16


def test_cast_rounds_like_ml_dtypes_bit_for_bit():  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(7)
    # ties (low half exactly 0x8000, both parities), one below / above a tie, the overflow edge, subnormals
    hi = rng.integers(0, 0x10000, 40, dtype=np.uint32) << 16
    bits = np.concatenate([hi | 0x8000, hi | 0x7FFF, hi | 0x8001, hi,
                           np.array([0x7F7F8000, 0x7F7F7FFF, 0xFF7F8000, 0x00000001, 0x80008000, 0x7FC00001,
                                     0x7F800001, 0xFF800000, 0x7F800000], dtype=np.uint32)])  # fmt: skip
    x = bits.view(np.float32)
    got = cast(x, dtype=BF16)
    with np.errstate(invalid="ignore"):  # numpy warns on casting NaN
        want = x.astype(BF16)
    g, w = got.view(np.uint16), want.view(np.uint16)
    nan = (w & 0x7FFF) > 0x7F80  # NaN payloads may differ; NaN-ness may not
    assert nan.sum() >= 2 and np.array_equal((g & 0x7FFF) > 0x7F80, nan)
    assert np.array_equal(g[~nan], w[~nan])


def test_residual_add_bf16_matches_float64():  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(8)
    x = rng.standard_normal((3, 41)).astype(BF16)
    r = rng.standard_normal((3, 41)).astype(BF16)
    out = residual_add(x, r)
    assert out.dtype == BF16
    ref = (x.astype(np.float64) + r.astype(np.float64)).astype(BF16)  # one rounding of the exact sum
    assert np.array_equal(out.view(np.uint16), ref.view(np.uint16))


def test_gemm_and_o_proj_bf16_match_float64():  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(9)
    a = rng.standard_normal((9, 19)).astype(BF16)
    b = rng.standard_normal((19, 13)).astype(BF16)
    c = gemm(a, b)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert c.dtype == np.float32
    assert np.abs(c - ref).max() <= 1e-5 * np.abs(ref).max()
    res = rng.standard_normal((9, 13)).astype(BF16)
    out = o_proj(a, b, res)
    assert out.dtype == BF16
    want = ref + res.astype(np.float64)
    assert np.abs(out.astype(np.float64) - want).max() <= 2**-8 * np.abs(want).max()
