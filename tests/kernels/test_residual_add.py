"""residual_add: every case against the float64 reference, numpy and device arrays, validation errors."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda
from opcheck import assert_case_passes, case_id, needs_device, needs_gpu, small_cases

from kernels.ops import residual_add as op


@needs_device
@pytest.mark.parametrize("case", small_cases(op.SPEC), ids=case_id)
def test_cases(case):  # type: ignore[no-untyped-def]
    assert_case_passes(op.SPEC, case)


@needs_device
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_numpy_and_device_arrays(dtype):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng()
    x = rng.standard_normal((5, 3, 7)).astype(dtype)
    r = rng.standard_normal((5, 3, 7)).astype(dtype)
    got = op.residual_add(x, r)  # numpy in -> numpy out
    assert isinstance(got, np.ndarray) and got.shape == x.shape and got.dtype == x.dtype
    np.testing.assert_allclose(got, (x.astype(np.float64) + r).astype(dtype), rtol=1e-3)
    dx, dr = cuda.to_device(x), cuda.to_device(r)
    out = cuda.to_device(np.full(x.shape, np.nan, dtype=dtype))
    assert op.residual_add(dx, dr, out) is out  # device in -> the same device out, no copy
    np.testing.assert_array_equal(out.copy_to_host(), got)


@needs_device
def test_validation_errors():  # type: ignore[no-untyped-def]
    x = np.ones((4, 6), np.float32)
    with pytest.raises(ValueError, match=r"r: expected shape \(4, 6\)"):
        op.residual_add(x, np.ones((4, 5), np.float32))
    with pytest.raises(TypeError, match="r: dtype float16 must match x's dtype float32"):
        op.residual_add(x, np.ones((4, 6), np.float16))
    with pytest.raises(TypeError, match="x: dtype float64 is not supported"):
        op.residual_add(np.ones((4, 6)), np.ones((4, 6)))
    with pytest.raises(ValueError, match="x: expected a C-contiguous array"):
        op.residual_add(np.ones((6, 4), np.float32).T, x)
    with pytest.raises(ValueError, match="x: expected a C-contiguous array"):
        op.residual_add(cuda.to_device(np.ones((4, 12), np.float32))[:, ::2], x)  # strided device view
    with pytest.raises(TypeError, match="x: expected a numpy array"):
        op.residual_add([1.0, 2.0], x)
    with pytest.raises(ValueError, match=r"out: expected shape \(4, 6\)"):
        op.residual_add(x, x, np.empty((4, 7), np.float32))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("case", op.SPEC.bench_cases, ids=case_id)
def test_bench_shapes(case):  # type: ignore[no-untyped-def]
    assert_case_passes(op.SPEC, case)
