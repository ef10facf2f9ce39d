"""softmax: cases against the float64 reference, overflow-prone inputs, validation errors."""

from __future__ import annotations

import numpy as np
import pytest
from opcheck import assert_case_passes, case_id, needs_device, needs_gpu, run_rows, small_cases

from kernels.ops import softmax as op


@needs_device
@pytest.mark.parametrize("case", small_cases(op.SPEC), ids=case_id)
def test_cases(case):  # type: ignore[no-untyped-def]
    assert_case_passes(op.SPEC, case)


@needs_device
def test_stable_for_large_and_minus_inf_inputs():  # type: ignore[no-untyped-def]
    x = np.array([[1000.0, 999.0, -np.inf, 998.0] * 20, [-50.0] * 80], np.float32)
    got = op.softmax(x)
    ref = op.reference(x)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got.sum(axis=-1), 1.0, rtol=1e-5)


@needs_device
def test_validation_errors():  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError, match="x: dtype float64 is not supported"):
        op.softmax(np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"out: expected shape \(2, 3\)"):
        op.softmax(np.ones((2, 3), np.float32), np.ones((3, 2), np.float32))
    with pytest.raises(ValueError, match="x: expected a non-empty array"):
        op.softmax(np.ones((0, 3), np.float32))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("case", op.SPEC.bench_cases, ids=case_id)
def test_bench_shapes(case):  # type: ignore[no-untyped-def]
    assert_case_passes(op.SPEC, case)


# v5 register-row kernels (make_rows_blocked: block max, exp once, block sum; two barriers): grid-stride rows,
# alternating reduction slots, partial vectors (an all -inf row is left out: under the simulator its NaN
# raises numpy's invalid-value warning).
@needs_device
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize(("per", "fastmath", "rows", "cols", "grid"),
                         [(16, True, 5, 136, 5), (16, False, 5, 136, 2), (8, True, 4, 256, 3)])  # fmt: skip
def test_make_rows_blocked_variants(dtype, per, fastmath, rows, cols, grid):  # type: ignore[no-untyped-def]
    from kernels.primitives.reductions import BLOCK
    from kernels.primitives.vector import WIDTH

    rng = np.random.default_rng()
    dt = np.dtype(dtype)
    x = (rng.standard_normal((rows, cols)) * 4 + 40).astype(dt)
    x[0, ::3] = -np.inf  # masked positions
    got = run_rows(op.make_rows_blocked(WIDTH[dt], BLOCK, per, 1, fastmath), op._SIGS[dt], grid, (x,))
    ref = op.reference(x)
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < (2e-3 if dt == np.float16 else 1e-5)
