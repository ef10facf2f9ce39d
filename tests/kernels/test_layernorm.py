"""layernorm: cases against the float64 reference, a large mean offset, validation errors."""

from __future__ import annotations

import numpy as np
import pytest
from opcheck import assert_case_passes, case_id, needs_device, needs_gpu, small_cases

from kernels.ops import layernorm as op


@needs_device
@pytest.mark.parametrize("case", small_cases(op.SPEC), ids=case_id)
def test_cases(case):  # type: ignore[no-untyped-def]
    assert_case_passes(op.SPEC, case)


@needs_device
def test_large_mean_small_spread():  # type: ignore[no-untyped-def]
    # |mean| / std = 1e4: the unshifted one-pass E[x^2] - E[x]^2 would lose every digit in fp32
    rng = np.random.default_rng()
    x = (1000.0 + 0.1 * rng.standard_normal((3, 200))).astype(np.float32)
    w = np.ones(200, np.float32)
    b = np.zeros(200, np.float32)
    got = op.layernorm(x, w, b)
    ref = op.reference(x, w, b, 1e-5)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-3


@needs_device
def test_validation_errors():  # type: ignore[no-untyped-def]
    x = np.ones((4, 6), np.float32)
    w = np.ones(6, np.float32)
    with pytest.raises(ValueError, match=r"bias: expected shape \(6,\) \(x's last dimension\), got \(7,\)"):
        op.layernorm(x, w, np.ones(7, np.float32))
    with pytest.raises(TypeError, match="bias: dtype float16 must match x's dtype float32"):
        op.layernorm(x, w, np.ones(6, np.float16))
    with pytest.raises(ValueError, match="x: expected a C-contiguous array"):
        op.layernorm(np.ones((6, 4), np.float32).T, w, w)
    with pytest.raises(TypeError, match="out: dtype float16 is not allowed; expected float32"):
        op.layernorm(x, w, w, np.ones((4, 6), np.float16))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("case", op.SPEC.bench_cases, ids=case_id)
def test_bench_shapes(case):  # type: ignore[no-untyped-def]
    assert_case_passes(op.SPEC, case)
