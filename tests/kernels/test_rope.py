"""rope: NeoX rotate-half rotation in place, fp32 / fp16 / bf16, against the float64 reference at odd
shapes; heads x half-dims past one block (the division-free (head, j) walk); NaN / inf; validation errors."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda
from opcheck import assert_case_passes, case_id, needs_device, needs_gpu, small_cases

from kernels.ops import rope as op
from kernels.primitives.reductions import BLOCK
from kernels.runtime import arrays
from kernels.runtime.arrays import BF16

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
DTYPES = [np.float32, np.float16, BF16]
IDS = ["float32", "float16", "bfloat16"]
TOL = {np.dtype(np.float32): 1e-6, np.dtype(np.float16): 1e-3, BF16: 4e-3}
HALF_ULP = {np.dtype(np.float32): 2.0**-24, np.dtype(np.float16): 2.0**-11, BF16: 2.0**-8}  # unit roundoff


@needs_device
@pytest.mark.parametrize("case", small_cases(op.SPEC) + op.SPEC.special_cases, ids=case_id)
def test_cases(case):  # type: ignore[no-untyped-def]
    assert_case_passes(op.SPEC, case)


def _problem(tokens: int, heads: int, d: int, dtype, seed: int = 0):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, heads, d)).astype(np.float32).astype(dtype)
    cos, sin = op.tables(rng.integers(0, 4096, tokens), d)
    return x, cos, sin


@needs_device
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize(
    ("tokens", "heads", "d"),
    # pairs per token below, equal to and past one block; h dividing BLOCK or not; head_dim 2
    [(2, 1, 2), (3, 3, 22), (2, 5, 2 * BLOCK // 4), (1, 3, 2 * BLOCK + 6), (5, 2, 2 * BLOCK)],
)
def test_shapes_against_reference(dtype, tokens, heads, d):  # type: ignore[no-untyped-def]
    x, cos, sin = _problem(tokens, heads, d, dtype)
    ref = op.reference(x, cos, sin)
    got = op.rope(x.copy(), cos, sin).astype(np.float64)
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert err <= TOL[np.dtype(dtype)], err
    # every element rounded once, to nearest, from the fp32 rotation: within half an ulp of the dtype of the
    # exact value, plus the fp32 arithmetic's few ulps of its terms (a truncating store errs a whole ulp)
    xa = np.abs(x.astype(np.float64))
    h = d // 2
    c, s = np.abs(cos)[:, None, :], np.abs(sin)[:, None, :]
    terms = np.concatenate([xa[..., :h] * c + xa[..., h:] * s, xa[..., h:] * c + xa[..., :h] * s], axis=-1)
    allow = HALF_ULP[np.dtype(dtype)] * np.abs(ref) + 2**-22 * terms + 2**-25
    assert (np.abs(got - ref) <= allow).all(), float(np.max(np.abs(got - ref) / allow))


@needs_device
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize(
    ("tokens", "heads", "d"),
    # pair vectors: fewer than one block's threads; a token's pair vectors across block boundaries (the
    # uint32 (token, head, j) split); head_dim 128 (Llama); NaN / inf in x
    [(1, 1, 16), (3, 5, 48), (9, 4, 128)],
)
def test_vector_path_matches_scalar_bit_for_bit(dtype, tokens, heads, d):  # type: ignore[no-untyped-def]
    """The 16-byte kernel does the same fp32 rotation per element as the scalar one (the same expressions,
    rounded once), so the two agree bit for bit, NaN and inf included."""
    x, cos, sin = _problem(tokens, heads, d, dtype, seed=d)
    x.reshape(-1)[[0, 5, -1]] = [np.nan, np.inf, -np.inf]
    want = op.rope(x.copy(), cos, sin, path="scalar")
    got = op.rope(x.copy(), cos, sin, path="vector")
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    dx = arrays.to_device(x)  # (bf16 through its words: numba's copies refuse it)
    assert op.rope(dx, cos, sin, path="vector") is dx
    np.testing.assert_array_equal(arrays.to_host(dx).view(np.uint8), want.view(np.uint8))


@needs_device
def test_vector_path_refuses_head_dims_it_cannot_take():  # type: ignore[no-untyped-def]
    x, cos, sin = _problem(2, 3, 20, np.float16)  # h = 10 halves: 20 bytes
    with pytest.raises(ValueError, match="path: 'vector' needs 16-byte aligned pointers"):
        op.rope(x, cos, sin, path="vector")
    with pytest.raises(ValueError, match="path: 'fast' is not a path; expected one of"):
        op.rope(x, cos, sin, path="fast")


@needs_device
def test_in_place_and_device_arrays():  # type: ignore[no-untyped-def]
    x, cos, sin = _problem(4, 3, 10, np.float32)
    ref = op.reference(x, cos, sin)
    host = x.copy()
    assert op.rope(host, cos, sin) is host  # numpy x: rotated in place (copied back)
    np.testing.assert_allclose(host, ref, rtol=1e-6, atol=1e-6)
    dx = cuda.to_device(x)
    assert op.rope(dx, cuda.to_device(cos), cuda.to_device(sin)) is dx
    np.testing.assert_allclose(dx.copy_to_host(), ref, rtol=1e-6, atol=1e-6)


@needs_device
def test_zero_angle_is_identity_and_quarter_turn_swaps():  # type: ignore[no-untyped-def]
    x, _, _ = _problem(2, 2, 8, np.float32)
    one, zero = np.ones((2, 4), np.float32), np.zeros((2, 4), np.float32)
    np.testing.assert_array_equal(op.rope(x.copy(), one, zero), x)
    got = op.rope(x.copy(), zero, one)  # cos 0, sin 1: (x1, x2) -> (-x2, x1)
    np.testing.assert_array_equal(got, np.concatenate([-x[..., 4:], x[..., :4]], axis=-1))


@needs_device
def test_nan_and_inf_follow_ieee():  # type: ignore[no-untyped-def]
    x = np.ones((1, 1, 6), np.float32)
    x[0, 0, 0] = np.nan  # x1[0]: both outputs of pair 0 NaN
    x[0, 0, 4] = np.inf  # x2[1]: pair 1 -> (-inf * sin, inf * cos)
    cos = np.full((1, 3), 0.5, np.float32)
    sin = np.full((1, 3), 0.25, np.float32)
    got = op.rope(x, cos, sin)[0, 0]
    assert np.isnan(got[[0, 3]]).all()
    assert got[1] == -np.inf and got[4] == np.inf
    assert np.isfinite(got[[2, 5]]).all()


@needs_device
def test_validation_errors():  # type: ignore[no-untyped-def]
    x, cos, sin = _problem(3, 2, 8, np.float32)
    with pytest.raises(TypeError, match="x: dtype float64 is not supported; expected one of: float32"):
        op.rope(x.astype(np.float64), cos, sin)
    with pytest.raises(ValueError, match=r"x: expected 3 dimensions, got shape \(3, 16\)"):
        op.rope(x.reshape(3, 16), cos, sin)
    with pytest.raises(ValueError, match="x: head_dim .* must be even"):
        op.rope(np.ones((3, 2, 7), np.float32), cos, sin)
    with pytest.raises(ValueError, match="x: expected a C-contiguous array"):
        op.rope(np.ones((3, 2, 16), np.float32)[..., ::2], cos, sin)
    with pytest.raises(ValueError, match="x: expected a non-empty array"):
        op.rope(np.ones((0, 2, 8), np.float32), cos[:0], sin[:0])
    with pytest.raises(TypeError, match="cos: dtype float16 is not supported; expected one of: float32"):
        op.rope(x, cos.astype(np.float16), sin)
    with pytest.raises(ValueError, match=r"sin: expected shape \(3, 4\) \(x's tokens by head_dim / 2\)"):
        op.rope(x, cos, sin[:2])
    with pytest.raises(ValueError, match="cos: expected a C-contiguous array"):
        op.rope(x, np.ones((3, 8), np.float32)[:, ::2], sin)
    buf = np.ones(60, np.float32)  # x rewritten in place over the table it still reads: refused
    with pytest.raises(ValueError, match=r"x: must not overlap cos \(x is written while cos is still"):
        op.rope(buf[:48].reshape(3, 2, 8), buf[40:52].reshape(3, 4), sin)
    with pytest.raises(ValueError, match="x: must not overlap sin"):
        op.rope(buf[:48].reshape(3, 2, 8), cos, buf[44:56].reshape(3, 4))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("case", op.SPEC.bench_cases, ids=case_id)
def test_bench_shapes(case):  # type: ignore[no-untyped-def]
    assert_case_passes(op.SPEC, case)
