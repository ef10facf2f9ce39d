"""cast: fp32 -> fp16 must round exactly as numpy does; validation errors."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda
from opcheck import assert_case_passes, case_id, needs_device, needs_gpu, small_cases

from kernels.ops import cast as op


@needs_device
@pytest.mark.parametrize("case", small_cases(op.SPEC), ids=case_id)
def test_cases(case):  # type: ignore[no-untyped-def]
    assert_case_passes(op.SPEC, case)


@needs_device
# the simulator converts with numpy, which warns when 1e6 overflows to inf: that overflow is the point here
@pytest.mark.filterwarnings("ignore:.*overflow encountered in cast:RuntimeWarning")
def test_rounding_edges_match_numpy():  # type: ignore[no-untyped-def]
    # ties, the largest finite half, overflow to inf, subnormals and signed zero
    x = np.array([1 + 2**-11, 1 + 3 * 2**-11, 65504.0, 65520.0, 1e6, -1e6, 2**-24, 2**-25 * 1.5, -0.0,
                  6.1e-5, np.inf, -np.inf], np.float32)  # fmt: skip
    got = op.cast(x)
    np.testing.assert_array_equal(got.view(np.uint16), x.astype(np.float16).view(np.uint16))
    nan = op.cast(np.array([np.nan], np.float32))
    assert np.isnan(nan).all()


@needs_device
def test_validation_errors():  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError, match="x: dtype float16 is not supported; expected one of: float32"):
        op.cast(np.ones(4, np.float16))
    with pytest.raises(TypeError, match="out: dtype float32 is not allowed; expected float16"):
        op.cast(np.ones(4, np.float32), np.ones(4, np.float32))
    with pytest.raises(ValueError, match=r"out: expected shape \(4,\)"):
        op.cast(np.ones(4, np.float32), cuda.device_array(5, np.float16))
    with pytest.raises(ValueError, match="x: expected a non-empty array"):
        op.cast(np.ones(0, np.float32))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("case", op.SPEC.bench_cases, ids=case_id)
def test_bench_shapes(case):  # type: ignore[no-untyped-def]
    assert_case_passes(op.SPEC, case)
