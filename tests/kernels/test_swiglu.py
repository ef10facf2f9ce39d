"""swiglu: every case (three dtypes, partial and full tiles, NaN / inf) against the float64 reference, N-d
and device arrays, out over an input, aliasing and validation errors."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from numba import cuda
from opcheck import assert_case_passes, case_id, needs_device, needs_gpu, small_cases

from kernels.ops import swiglu as op
from kernels.runtime import arrays

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]


@needs_device
@pytest.mark.parametrize("case", small_cases(op.SPEC) + op.SPEC.special_cases, ids=case_id)
def test_cases(case):  # type: ignore[no-untyped-def]
    assert_case_passes(op.SPEC, case)


def _inputs(shape, dt, seed: int = 0):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 3).astype(dt), rng.standard_normal(shape).astype(dt)


@needs_device
@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: np.dtype(d).name)
def test_nd_numpy_and_rounding(dt):  # type: ignore[no-untyped-def]
    """Any C-contiguous shape; the result is the fp32 value rounded once to the dtype (within one rounding
    of the float64 reference, element by element)."""
    a, b = _inputs((2, 3, 41), dt)
    got = op.swiglu(a, b)
    assert isinstance(got, np.ndarray) and got.shape == a.shape and got.dtype == np.dtype(dt)
    ref = op.reference(a, b)
    ulp = {np.float32: 2**-23, np.float16: 2**-10, ml_dtypes.bfloat16: 2**-7}[dt]
    err = np.abs(got.astype(np.float64) - ref) / (np.abs(ref) + 1e-30)
    assert err.max() <= 2 * ulp  # one rounding (half an ulp) plus fp32 math, far under a wrong element


@needs_device
def test_device_arrays_and_out_over_an_input():  # type: ignore[no-untyped-def]
    a, b = _inputs((5, 123), np.float16, seed=1)
    want = op.swiglu(a, b)
    da, db = cuda.to_device(a), cuda.to_device(b)
    out = cuda.to_device(np.full(a.shape, np.nan, np.float16))
    assert op.swiglu(da, db, out) is out  # device in -> the same device out, no copy
    np.testing.assert_array_equal(out.copy_to_host(), want)
    assert op.swiglu(da, db, da) is da  # over the gate
    np.testing.assert_array_equal(da.copy_to_host(), want)
    da = cuda.to_device(a)
    op.swiglu(da, db, db)  # over the up projection
    np.testing.assert_array_equal(db.copy_to_host(), want)


@needs_device
@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: np.dtype(d).name)
def test_vector_path_matches_scalar_bit_for_bit(dt):  # type: ignore[no-untyped-def]
    """The 16-byte kernel computes the same fp32 silu(a) * b and rounds it the same way as the scalar tiles:
    2 x 33 x 31 = 2046 elements are whole vector tiles, then a partial tile that is not a whole vector
    (done element by element). Out over the gate as well."""
    a, b = _inputs((2, 33, 31), dt, seed=2)
    want = op.swiglu(a, b, path="scalar")
    np.testing.assert_array_equal(op.swiglu(a, b, path="vector").view(np.uint8), want.view(np.uint8))
    da, db = arrays.to_device(a), arrays.to_device(b)  # (bf16 through its words: numba's copies refuse it)
    op.swiglu(da, db, da, path="vector")
    np.testing.assert_array_equal(arrays.to_host(da).view(np.uint8), want.view(np.uint8))


@needs_gpu  # the simulator's device views do not carry their offset into the pointer
def test_vector_path_refuses_unaligned_operands():  # type: ignore[no-untyped-def]
    a, b = _inputs((4097,), np.float16, seed=3)
    da, db = cuda.to_device(a), cuda.to_device(b)
    with pytest.raises(ValueError, match="path: 'vector' needs 16-byte aligned pointers"):
        op.swiglu(da[1:], db[1:], path="vector")  # 2 bytes past an aligned allocation
    want = op.reference(a[1:], b[1:])
    got = op.swiglu(da[1:], db[1:]).copy_to_host()  # auto: the scalar tiles
    assert np.abs(got.astype(np.float64) - want).max() <= 2e-3 * (np.abs(want).max() + 1)


@needs_device
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the simulator's numpy on NaN / inf (its threads)
@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: np.dtype(d).name)
def test_nan_and_inf(dt):  # type: ignore[no-untyped-def]
    """silu(+inf) * b = +-inf, silu(-inf) = -inf * 0 = NaN, NaN in a or b gives NaN, a finite gate times an
    infinite b is +-inf; a very negative gate gives (-)0, not NaN."""
    a = np.array([[np.nan, 1.0, np.inf, np.inf, -np.inf, 2.0, -2.0, -120.0, 0.5]], np.float32).astype(dt)
    b = np.array([[1.0, np.nan, 2.0, -2.0, 1.0, np.inf, np.inf, 3.0, -np.inf]], np.float32).astype(dt)
    got = op.swiglu(a, b).astype(np.float64)[0]
    assert np.isnan(got[[0, 1, 4]]).all()
    assert got[2] == np.inf and got[3] == -np.inf
    assert got[5] == np.inf and got[6] == -np.inf  # silu(-2) < 0
    assert got[7] == 0.0
    assert got[8] == -np.inf


@needs_device
def test_validation_errors():  # type: ignore[no-untyped-def]
    a, b = _inputs((4, 6), np.float32)
    with pytest.raises(TypeError, match="a: dtype float64 is not supported"):
        op.swiglu(np.ones((4, 6)), np.ones((4, 6)))
    with pytest.raises(TypeError, match="b: dtype float16 must match a's dtype float32"):
        op.swiglu(a, b.astype(np.float16))
    with pytest.raises(ValueError, match=r"b: expected shape \(4, 6\) \(same as a\), got \(4, 5\)"):
        op.swiglu(a, np.ones((4, 5), np.float32))
    with pytest.raises(ValueError, match="a: expected a C-contiguous array"):
        op.swiglu(np.ones((6, 4), np.float32).T, a)
    with pytest.raises(ValueError, match="b: expected a C-contiguous array"):
        op.swiglu(a, cuda.to_device(np.ones((4, 12), np.float32))[:, ::2])
    with pytest.raises(ValueError, match="a: expected a non-empty array"):
        op.swiglu(np.ones((0, 6), np.float32), np.ones((0, 6), np.float32))
    with pytest.raises(TypeError, match="a: expected a numpy array"):
        op.swiglu([1.0, 2.0], a)
    with pytest.raises(ValueError, match=r"out: expected shape \(4, 6\)"):
        op.swiglu(a, b, np.empty((4, 7), np.float32))
    with pytest.raises(TypeError, match="out: dtype float16 is not allowed; expected float32"):
        op.swiglu(a, b, np.empty((4, 6), np.float16))
    with pytest.raises(ValueError, match="path: 'fast' is not a path; expected one of"):
        op.swiglu(a, b, path="fast")


@needs_device
def test_aliasing_errors():  # type: ignore[no-untyped-def]
    buf = cuda.to_device(np.ones(40, np.float32))
    a, b = buf[:32].reshape(4, 8), cuda.to_device(np.ones((4, 8), np.float32))
    with pytest.raises(ValueError, match=r"out: must be a itself or not overlap it \(each element is read"):
        op.swiglu(a, b, buf[8:].reshape(4, 8))
    with pytest.raises(ValueError, match="out: must be b itself or not overlap it"):
        op.swiglu(b, a, buf[8:].reshape(4, 8))
    host = np.ones(40, np.float32)  # numpy views: each gets its own device copy, but both are copied back
    with pytest.raises(ValueError, match="out: must be a itself or not overlap it"):
        op.swiglu(host[:32].reshape(4, 8), np.ones((4, 8), np.float32), host[8:].reshape(4, 8))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("case", op.SPEC.bench_cases, ids=case_id)
def test_bench_shapes(case):  # type: ignore[no-untyped-def]
    assert_case_passes(op.SPEC, case)
